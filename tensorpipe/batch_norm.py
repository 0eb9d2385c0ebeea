"""Batch normalisation the GPipe way: micro-batch statistics, moving averages from the whole mini-batch.

In training, `BatchNorm` normalises each micro-batch with that micro-batch's mean and variance (as the
paper does). Its moving averages, used in evaluation, must not depend on K or M, so they are updated
once per mini-batch from the statistics of the whole mini-batch:

- Inside a TensorPipeLayer, the layer's FProp records its micro-batch statistics into a
  `StatsCollector` instead of updating anything: a cell's forward function returns them as outputs
  (see `cell_function`), and the pipeline adds each call's statistics to its own collector. After the
  last micro-batch the pipeline calls `StatsCollector.Finish`, which combines the M equal-sized
  micro-batches' statistics exactly (mean = avg_t mean_t, var = avg_t (var_t + mean_t^2) - mean^2)
  and registers one Lingvo batch-norm update per layer (`py_utils.UpdateBatchNormVars`), which
  Lingvo's training step applies like any other. A re-computation runs under a `Discarding`
  collector, so it records nothing and adds no update.
- Outside a TensorPipeLayer the layer updates its moving averages from its own batch statistics, like
  an ordinary batch-norm layer, so an unpipelined model gets the same moving averages.

In evaluation (`do_eval`) the layer normalises with the moving averages.
"""

import collections
import contextlib
import threading

from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils

_STATE = threading.local()


def _Stack():
  if not hasattr(_STATE, 'collectors'):
    _STATE.collectors = []
  return _STATE.collectors


def CombineMoments(means, variances):
  """Mean and (biased) variance of the union of equal-sized groups with the given means/variances."""
  means = tf.stack(means)
  variances = tf.stack(variances)
  mean = tf.reduce_mean(means, axis=0)
  second_moment = tf.reduce_mean(variances + tf.square(means), axis=0)
  return mean, tf.maximum(second_moment - tf.square(mean), 0.0)


class StatsCollector:
  """Gathers the micro-batch statistics of every BatchNorm layer during one pipelined forward pass."""

  def __init__(self, num_micro_batches, where='TensorPipeLayer'):
    self._num_micro_batches = num_micro_batches
    self._where = where
    self._stats = collections.OrderedDict()
    self._closed = False

  @contextlib.contextmanager
  def Collecting(self):
    """BatchNorm layers run within this context record into this collector (nothing once closed)."""
    _Stack().append(self)
    try:
      yield
    finally:
      _Stack().pop()

  def Add(self, layer, mean, variance):
    if self._closed:
      return  # A re-computation: the forward pass already recorded these statistics.
    self._stats.setdefault(layer, []).append((mean, variance))

  def Records(self):
    """[(layer, mean, variance)] in the order they were added (e.g. to return them from a function)."""
    return [(layer, mean, variance) for layer, stats in self._stats.items()
            for mean, variance in stats]

  def Finish(self, outputs):
    """Registers one moving-average update per layer; returns `outputs` made to depend on the stats.

    The dependency makes Lingvo count the updates as relevant to the loss (it applies only batch-norm
    updates whose statistics the loss depends on).

    Raises:
      ValueError: if a layer recorded a number of micro-batches other than M (e.g. a layer reused).
    """
    self._closed = True
    combined = []
    for layer, stats in self._stats.items():
      if len(stats) != self._num_micro_batches:
        raise ValueError('%s: batch-norm layer %r recorded statistics %d times for %d micro-batches; '
                         'each batch-norm layer must run once per micro-batch' %
                         (self._where, layer.path, len(stats), self._num_micro_batches))
      with tf.ops.colocate_with(layer.vars.moving_mean), tf.name_scope(layer.params.name + '_stats'):
        mean, variance = CombineMoments([m for m, _ in stats], [v for _, v in stats])
      layer.UpdateMovingAverages(mean, variance)
      combined.extend([mean, variance])
    if not combined:
      return outputs
    with tf.control_dependencies(combined):
      return tf.nest.map_structure(lambda x: None if x is None else tf.identity(x), outputs)


def Discarding():
  """A closed collector: batch-norm layers run in its `Collecting()` record and update nothing.

  For re-computations, whose statistics the forward pass has already recorded.
  """
  collector = StatsCollector(1)
  collector._closed = True  # pylint: disable=protected-access
  return collector


def _ActiveCollector():
  stack = _Stack()
  return stack[-1] if stack else None


class BatchNorm(base_layer.BaseLayer):
  """Batch normalisation over all but the last axis, with GPipe's moving-average semantics."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 0, 'Number of channels (the last axis of the input).')
    p.Define('decay', 0.9997, 'Decay of the moving averages, applied once per mini-batch.')
    p.Define('epsilon', 1e-3, 'Added to the variance to avoid dividing by zero.')
    p.Define('gamma_init', 1.0, 'Initial value of the scale gamma (0 for a zero-initialised residual).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if not isinstance(p.dim, int) or p.dim <= 0:
      raise ValueError('BatchNorm %r: dim must be a positive integer, got %r' % (p.name, p.dim))

  def _CreateLayerVariables(self):
    super()._CreateLayerVariables()
    p = self.params
    self.CreateVariable('beta', py_utils.WeightParams([p.dim], py_utils.WeightInit.Constant(0.0)))
    self.CreateVariable('gamma', py_utils.WeightParams([p.dim],
                                                       py_utils.WeightInit.Constant(p.gamma_init)))
    moving = ['moving_vars', tf.GraphKeys.MOVING_AVERAGE_VARIABLES]
    self.CreateVariable('moving_mean', py_utils.WeightParams(
        [p.dim], py_utils.WeightInit.Constant(0.0), collections=moving), trainable=False,
                        aggregation=tf.VariableAggregation.MEAN)
    self.CreateVariable('moving_variance', py_utils.WeightParams(
        [p.dim], py_utils.WeightInit.Constant(1.0), collections=moving), trainable=False,
                        aggregation=tf.VariableAggregation.MEAN)

  def UpdateMovingAverages(self, mean, variance):
    """Registers Lingvo batch-norm updates moving the averages towards (mean, variance)."""
    py_utils.UpdateBatchNormVars(self.vars.moving_mean, mean, self.params.decay)
    py_utils.UpdateBatchNormVars(self.vars.moving_variance, variance, self.params.decay)

  def FProp(self, theta, x):
    p = self.params
    with tf.name_scope(p.name):
      dtype = x.dtype
      x = tf.cast(x, tf.float32)
      if self.do_eval:
        mean, variance = theta.moving_mean, theta.moving_variance
        y = tf.nn.batch_normalization(x, mean, variance, theta.beta, theta.gamma, p.epsilon)
        return tf.cast(y, dtype)
      if x.shape.rank == 4:
        # One fused op (and one for its gradient) instead of a dozen: much smaller graphs.
        y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
            x, theta.gamma, theta.beta, epsilon=p.epsilon, is_training=True)
        # The fused op returns the Bessel-corrected variance; the moving average takes the biased one.
        n = x.shape[:3].num_elements()
        if n is None:
          n = tf.cast(tf.reduce_prod(tf.shape(x)[:3]), tf.float32)
          variance *= (n - 1.0) / tf.maximum(n, 1.0)
        else:
          variance *= (n - 1.0) / max(n, 1.0)
      else:
        mean, variance = tf.nn.moments(x, list(range(x.shape.rank - 1)))
        y = tf.nn.batch_normalization(x, mean, variance, theta.beta, theta.gamma, p.epsilon)
      collector = _ActiveCollector()
      if collector is not None:
        collector.Add(self, mean, variance)
      else:
        self.UpdateMovingAverages(mean, variance)
      return tf.cast(y, dtype)

  @classmethod
  def FPropMeta(cls, p, x):
    py_utils.CheckShapes((x,))
    return py_utils.NestedMap(flops=x.num_elements() * 10, out_shapes=(x,))
