"""An image classification task whose network is one TensorPipeLayer (GPipe pipeline on K devices).

`PipelinedClassifier` is a Lingvo BaseTask: ComputePredictions runs the pipeline (the last partition
emits logits) and ComputeLoss computes a weighted softmax cross-entropy and accuracy on the last
partition's device. Small conv layers with FPropMeta (so the pipeline can balance partitions by
cost) are defined here too; `TinyConvLayers` is the tiny conv net used by params/digits.py.
"""

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import base_model
from lingvo.core import py_utils
from lingvo.core import tshape

from tensorpipe import layer as layer_lib
from tensorpipe.tasks.image import conv_layers


class ConvBlock(base_layer.BaseLayer):
  """y = maxpool(relu(conv(x) + b)): a SAME-padded stride-1 conv, optionally 2x2 max-pooled."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('filter_shape', (3, 3, 1, 8), '(height, width, in_channels, out_channels).')
    p.Define('pool', False, 'If True, 2x2 max pooling with stride 2 after the activation.')
    p.Define('seed', None, 'Seed of the weight initialiser.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    kh, kw, cin, cout = p.filter_shape
    self.CreateVariable('w', py_utils.WeightParams(list(p.filter_shape),
                                                   conv_layers.HeInit(kh * kw * cin, p.seed)))
    self.CreateVariable('b', py_utils.WeightParams([cout], py_utils.WeightInit.Constant(0.0)))

  def FProp(self, theta, x):
    p = self.params
    with tf.name_scope(p.name):
      y = tf.nn.relu(tf.nn.conv2d(x, theta.w, strides=[1, 1, 1, 1], padding='SAME') + theta.b)
      if p.pool:
        y = tf.nn.max_pool2d(y, ksize=2, strides=2, padding='VALID')
      return y

  @classmethod
  def FPropMeta(cls, p, x):
    py_utils.CheckShapes((x,))
    kh, kw, cin, cout = p.filter_shape
    b, h, w = x[0], x[1], x[2]
    flops = 2 * b * h * w * kh * kw * cin * cout + 2 * b * h * w * cout
    if p.pool:
      h, w = h // 2, w // 2
    return py_utils.NestedMap(flops=flops, out_shapes=(tshape.Shape([b, h, w, cout]),))


class MlpHead(base_layer.BaseLayer):
  """Flattens [B, ...] and applies relu(x W1 + b1) W2 + b2: [B, num_classes] logits."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 0, 'Number of features per example after flattening.')
    p.Define('hidden_dim', 64, 'Width of the hidden layer.')
    p.Define('num_classes', 10, 'Number of output logits.')
    p.Define('seed', None, 'Seed of the weight initialiser.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    seed2 = None if p.seed is None else p.seed + 1
    self.CreateVariable('w1', py_utils.WeightParams([p.input_dim, p.hidden_dim],
                                                    conv_layers.HeInit(p.input_dim, p.seed)))
    self.CreateVariable('b1', py_utils.WeightParams([p.hidden_dim],
                                                    py_utils.WeightInit.Constant(0.0)))
    self.CreateVariable('w2', py_utils.WeightParams(
        [p.hidden_dim, p.num_classes],
        py_utils.WeightInit.Gaussian(float(np.sqrt(1.0 / p.hidden_dim)), seed=seed2)))
    self.CreateVariable('b2', py_utils.WeightParams([p.num_classes],
                                                    py_utils.WeightInit.Constant(0.0)))

  def FProp(self, theta, x):
    p = self.params
    with tf.name_scope(p.name):
      x = tf.reshape(x, [-1, p.input_dim])
      h = tf.nn.relu(tf.matmul(x, theta.w1) + theta.b1)
      return tf.matmul(h, theta.w2) + theta.b2

  @classmethod
  def FPropMeta(cls, p, x):
    py_utils.CheckShapes((x,))
    b = x[0]
    flops = 2 * b * (p.input_dim * p.hidden_dim + p.hidden_dim * p.num_classes)
    return py_utils.NestedMap(flops=flops, out_shapes=(tshape.Shape([b, p.num_classes]),))


def TinyConvLayers(image_shape=(8, 8, 1), channels=(16, 32, 64), hidden_dim=128, num_classes=10,
                   seed=1):
  """Four layers: conv, conv + pool, conv + pool, MLP head (so K = 1, 2 or 4 partitions all fit)."""
  h, w, cin = image_shape
  c1, c2, c3 = channels
  layers = [
      ConvBlock.Params().Set(name='conv1', filter_shape=(3, 3, cin, c1), seed=seed),
      ConvBlock.Params().Set(name='conv2', filter_shape=(3, 3, c1, c2), pool=True, seed=seed + 1),
      ConvBlock.Params().Set(name='conv3', filter_shape=(3, 3, c2, c3), pool=True, seed=seed + 2),
      MlpHead.Params().Set(name='head', input_dim=(h // 4) * (w // 4) * c3, hidden_dim=hidden_dim,
                           num_classes=num_classes, seed=seed + 3),
  ]
  return layers


class PerExampleXent(base_layer.BaseLayer):
  """Per-example softmax cross-entropy: (network output, labels) -> NestedMap(logits, xent, nll).

  The network output is logits, or (logits, auxiliary logits or None) for a network with an
  auxiliary head (then the map also has aux_logits). xent is the training loss per example
  (label-smoothed, plus `aux_loss_weight` times the auxiliary logits' loss); nll is the plain
  cross-entropy of the logits (log perplexity). Both are float32 whatever the logits' dtype. The
  task runs this layer inside the pipeline's last partition (as its loss layer) for schedules other
  than 'gpipe', so a micro-batch's loss is known as soon as its forward pass is done, and after the
  pipeline otherwise.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('num_classes', 10, 'Number of classes (the logits\' last dimension).')
    p.Define('label_smoothing', 0.0, 'Label smoothing epsilon of xent, in [0, 1).')
    p.Define('aux_loss_weight', 0.0, 'Weight of the auxiliary logits\' loss in xent, if any.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if not 0.0 <= p.label_smoothing < 1.0:
      raise ValueError('%s %r: label_smoothing must be in [0, 1), got %r' %
                       (type(self).__name__, p.name, p.label_smoothing))

  def _Xent(self, logits, labels):
    p = self.params
    logits = tf.cast(logits, tf.float32)
    if not p.label_smoothing:
      return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    onehot = tf.one_hot(labels, p.num_classes, dtype=tf.float32)
    onehot = onehot * (1.0 - p.label_smoothing) + p.label_smoothing / p.num_classes
    return tf.nn.softmax_cross_entropy_with_logits(labels=onehot, logits=logits)

  def FProp(self, theta, outputs, labels):
    p = self.params
    logits, aux = outputs if isinstance(outputs, tuple) else (outputs, None)
    with tf.name_scope(p.name):
      labels = tf.cast(labels, tf.int32)
      nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                           logits=tf.cast(logits, tf.float32))
      xent = self._Xent(logits, labels) if p.label_smoothing else nll
      if aux is not None and p.aux_loss_weight:
        xent += p.aux_loss_weight * self._Xent(aux, labels)
      out = py_utils.NestedMap(logits=logits, xent=xent, nll=nll)
      if isinstance(outputs, tuple):
        out.aux_logits = aux
      return out


class PipelinedClassifier(base_model.BaseTask):
  """Classifies input_batch.image into `num_classes` with a pipelined network.

  Expects input batches with `image` [B, ...], `label` [B] int ids and optionally `weight` [B] (0
  for padding). The per-example loss is `_LossParams()` (a PerExampleXent): in the pipeline's last
  partition (its loss_layer) with a schedule other than 'gpipe', else after the pipeline on the last
  partition's device. Metrics, weighted by `weight`: loss, log_pplx, accuracy, error,
  num_samples_in_batch (real examples), and what `_ExtraMetrics` adds.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('pipeline', layer_lib.TensorPipeLayer.Params(),
             'The network: a TensorPipeLayer whose last partition outputs [B, num_classes] logits.')
    p.Define('num_classes', 10, 'Number of classes.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if not p.pipeline.name:
      p.pipeline.name = 'pipeline'
    pipeline = p.pipeline.Copy()
    if pipeline.schedule != 'gpipe' and pipeline.loss_layer is None:
      pipeline.loss_layer = self._LossParams()
    self.CreateChild('pipeline', pipeline)
    if pipeline.loss_layer is None:
      self.CreateChild('xent', self._LossParams())

  def _LossParams(self):
    """The per-example loss layer's Params."""
    return PerExampleXent.Params().Set(name='xent', num_classes=self.params.num_classes)

  def _Images(self, input_batch):
    """The pipeline's input."""
    return input_batch.image

  def ComputePredictions(self, theta, input_batch):
    images = self._Images(input_batch)
    if self.pipeline.params.loss_layer is not None:
      return self.pipeline.FProp(theta.pipeline, images, input_batch.label)
    outputs = self.pipeline.FProp(theta.pipeline, images)
    with tf.device(self.pipeline.devices[-1]):
      return self.xent.FProp(theta.xent, outputs, input_batch.label)

  def _ExtraMetrics(self, logits, labels, weights, denom):
    """Further {name: weighted mean} metrics of a batch; none here."""
    del logits, labels, weights, denom
    return {}

  def ComputeLoss(self, theta, predictions, input_batch):
    p = self.params
    with tf.device(self.pipeline.devices[-1]), tf.name_scope('loss'):
      logits = py_utils.HasShape(tf.cast(predictions.logits, tf.float32), [-1, p.num_classes])
      labels = tf.cast(input_batch.label, tf.int32)
      if 'weight' in input_batch and input_batch.weight is not None:
        weights = tf.cast(input_batch.weight, tf.float32)
      else:
        weights = tf.ones(tf.shape(labels), tf.float32)
      num = tf.reduce_sum(weights)
      denom = tf.maximum(num, 1.0)
      loss = tf.reduce_sum(predictions.xent * weights) / denom
      log_pplx = tf.reduce_sum(predictions.nll * weights) / denom
      predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
      correct = tf.cast(tf.equal(predicted, labels), tf.float32)
      accuracy = tf.reduce_sum(correct * weights) / denom
      extra = self._ExtraMetrics(logits, labels, weights, denom)
    metrics = {
        'loss': (loss, num),
        'log_pplx': (log_pplx, num),
        'accuracy': (accuracy, num),
        'error': (1.0 - accuracy, num),
        'num_samples_in_batch': (num, tf.constant(1.0)),
    }
    metrics.update({name: (value, num) for name, value in extra.items()})
    return metrics, {'loss': predictions.xent, 'prediction': predicted}
