"""An image classifier task for pipelined AmoebaNet and ResNet: label smoothing and an auxiliary head.

`ImageClassifier` is a `classifier.PipelinedClassifier` whose pipeline returns either logits or
(logits, aux_logits) (AmoebaNet's auxiliary head; aux_logits is None in evaluation). The loss is the
label-smoothed softmax cross-entropy of the logits plus `aux_loss_weight` times that of the
auxiliary logits, computed in float32. Metrics: loss, log_pplx (unsmoothed cross-entropy), accuracy,
top-5 accuracy, error. With `bfloat16_activations` the network runs on bfloat16 activations (the
paper's setting on TPUs); weights, batch-norm statistics and the loss stay float32.
"""

from lingvo import compat as tf
from lingvo.core import py_utils

from tensorpipe.tasks.image import classifier

BFLOAT16_MODES = ('never', 'accelerators', 'always')


def UsesBfloat16(mode, devices):
  """bfloat16 activations for `mode` when the partitions run on `devices` ('accelerators': TPUs/GPUs)."""
  if mode == 'accelerators':
    return all(('TPU' in d.upper() or 'GPU' in d.upper()) for d in devices)
  return mode == 'always'


class ImageClassifier(classifier.PipelinedClassifier):
  """Pipelined image classification with label smoothing and an optional auxiliary loss."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('label_smoothing', 0.0, 'Label smoothing epsilon (0.1 in the GPipe ImageNet run).')
    p.Define('aux_loss_weight', 0.4, 'Weight of the auxiliary head\'s loss, if the net has one.')
    p.Define('bfloat16_activations', 'never',
             "Run the network on bfloat16 activations (weights stay float32): 'never', "
             "'accelerators' (only when every partition is on a TPU or GPU) or 'always'.")
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.bfloat16_activations not in BFLOAT16_MODES:
      raise ValueError('ImageClassifier %r: bfloat16_activations=%r is not one of %s' %
                       (p.name, p.bfloat16_activations, BFLOAT16_MODES))
    if not 0.0 <= p.label_smoothing < 1.0:
      raise ValueError('ImageClassifier %r: label_smoothing must be in [0, 1), got %r' %
                       (p.name, p.label_smoothing))

  def UsesBfloat16(self):
    """Whether activations are bfloat16 (per `bfloat16_activations` and the partitions' devices)."""
    return UsesBfloat16(self.params.bfloat16_activations, self.pipeline.devices)

  def ComputePredictions(self, theta, input_batch):
    image = input_batch.image
    if self.UsesBfloat16():
      image = tf.cast(image, tf.bfloat16)
    out = self.pipeline.FProp(theta.pipeline, image)
    logits, aux = (out if isinstance(out, tuple) else (out, None))
    return py_utils.NestedMap(logits=logits, aux_logits=aux)

  def _Xent(self, logits, labels):
    p = self.params
    onehot = tf.one_hot(labels, p.num_classes, dtype=tf.float32)
    if p.label_smoothing:
      onehot = onehot * (1.0 - p.label_smoothing) + p.label_smoothing / p.num_classes
    return tf.nn.softmax_cross_entropy_with_logits(labels=onehot, logits=tf.cast(logits, tf.float32))

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
      per_example = self._Xent(logits, labels)
      if predictions.aux_logits is not None and p.aux_loss_weight:
        per_example += p.aux_loss_weight * self._Xent(predictions.aux_logits, labels)
      loss = tf.reduce_sum(per_example * weights) / denom
      nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
      log_pplx = tf.reduce_sum(nll * weights) / denom
      predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
      correct = tf.cast(tf.equal(predicted, labels), tf.float32)
      accuracy = tf.reduce_sum(correct * weights) / denom
      top5 = tf.cast(tf.math.in_top_k(predictions=logits, targets=labels, k=min(5, p.num_classes)),
                     tf.float32)
      accuracy_top5 = tf.reduce_sum(top5 * weights) / denom
    metrics = {
        'loss': (loss, num),
        'log_pplx': (log_pplx, num),
        'accuracy': (accuracy, num),
        'accuracy_top5': (accuracy_top5, num),
        'error': (1.0 - accuracy, num),
        'num_samples_in_batch': (num, tf.constant(1.0)),
    }
    return metrics, {'loss': per_example, 'prediction': predicted}
