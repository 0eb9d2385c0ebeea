"""The papers' image classifier task, for pipelined AmoebaNet and ResNet: label smoothing, an
auxiliary head, bfloat16 activations, top-5 accuracy.

`ImageClassifier` is a `pipelined_classifier.PipelinedClassifier` whose pipeline returns either
logits or (logits, aux_logits) (AmoebaNet's auxiliary head; aux_logits is None in evaluation). Its
per-example loss (`pipelined_classifier.PerExampleXent`) is the label-smoothed softmax cross-entropy
of the logits plus `aux_loss_weight` times that of the auxiliary logits, computed in float32, in
the pipeline's last partition for schedules other than 'gpipe'. Metrics: loss, log_pplx
(unsmoothed cross-entropy), accuracy, top-5 accuracy, error. With `bfloat16_activations` the
network runs on bfloat16 activations (the paper's setting on TPUs); weights, batch-norm statistics
and the loss stay float32.
"""

from lingvo import compat as tf

from tensorpipe.tasks.image import pipelined_classifier

BFLOAT16_MODES = ('never', 'accelerators', 'always')


def UsesBfloat16(mode, devices):
  """bfloat16 activations for `mode` when partitions run on `devices` ('accelerators': TPU/GPU)."""
  if mode == 'accelerators':
    return all(('TPU' in d.upper() or 'GPU' in d.upper()) for d in devices)
  return mode == 'always'


class ImageClassifier(pipelined_classifier.PipelinedClassifier):
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
    if params.bfloat16_activations not in BFLOAT16_MODES:
      raise ValueError('ImageClassifier %r: bfloat16_activations=%r is not one of %s' %
                       (params.name, params.bfloat16_activations, BFLOAT16_MODES))
    super().__init__(params)

  def _LossParams(self):
    p = self.params
    return super()._LossParams().Set(label_smoothing=p.label_smoothing,
                                     aux_loss_weight=p.aux_loss_weight)

  def UsesBfloat16(self):
    """Whether activations are bfloat16 (per `bfloat16_activations` and the partitions' devices)."""
    return UsesBfloat16(self.params.bfloat16_activations, self.pipeline.devices)

  def _Images(self, input_batch):
    if self.UsesBfloat16():
      return tf.cast(input_batch.image, tf.bfloat16)
    return input_batch.image

  def _ExtraMetrics(self, logits, labels, weights, denom):
    top5 = tf.math.in_top_k(predictions=logits, targets=labels, k=min(5, self.params.num_classes))
    return {'accuracy_top5': tf.reduce_sum(tf.cast(top5, tf.float32) * weights) / denom}
