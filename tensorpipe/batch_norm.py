"""Batch normalisation the GPipe way: micro-batch statistics, moving averages from the mini-batch.

In training, a batch-norm layer normalises each micro-batch with that micro-batch's mean and
variance (as the paper does). Its moving averages, used in evaluation, must not depend on K or M, so
they are updated once per mini-batch from the statistics of the whole mini-batch. Every batch-norm
layer, Lingvo's stock ones (bn_layers.BatchNormLayer and the layers built on it, e.g. ConvLayer) and
this module's `BatchNorm` alike, asks for its update through `py_utils.UpdateBatchNormVars`:

- Inside a TensorPipeLayer's partition that call is routed here (`stateful_ops`, route 1) and
  `Record`s the statistic into the trace context's `StatsCollector` (see `trace_context`) instead
  of updating anything: a partition's forward function returns the statistics as outputs (see
  `partition_function`), and the pipeline adds each call's records to its own collector. After the
  last micro-batch the pipeline calls `StatsCollector.Finish` (step (7) of docs/design.md, "One
  training step"), which combines the M micro-batches' statistics exactly (weighted by their
  non-padded positions where the layer's moments say so, else by their examples, equally when
  micro-batches are equal: mean = avg_t mean_t, var = avg_t (var_t + mean_t^2) - mean^2) and
  registers one Lingvo batch-norm update per variable, which Lingvo's training step applies like
  any other. A re-computation runs under a `Discarding` collector, so it records nothing.
- Outside a TensorPipeLayer the call updates the moving averages from the layer's own batch
  statistics, as it always does, so an unpipelined model gets the same moving averages.

In evaluation (`do_eval`) the layers normalise with the moving averages and record nothing.
"""

import collections
import contextlib
import dataclasses
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Type

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils

from tensorpipe import trace_context

# Types whose equal weights are one numpy constant: numpy divides in them as TensorFlow does (IEEE
# division, rounded once). Other types keep TensorFlow's own division.
_EQUAL_WEIGHT_DTYPES: Dict[Any, Type[np.floating]] = {tf.float32: np.float32,
                                                     tf.float64: np.float64}


def _Weighted(means, counts):
  """(the groups' means stacked, each group's weight in the union, broadcastable to them)."""
  num_groups = len(means)
  if counts is not None:
    counts = tf.stack([tf.cast(c, m.dtype) * tf.ones_like(m) for c, m in zip(counts, means)])
  means = tf.stack(means)
  if counts is None:
    if means.dtype in _EQUAL_WEIGHT_DTYPES:
      # One constant: 1 / num_groups rounded once in the means' type, as ones / num_groups is.
      dtype = _EQUAL_WEIGHT_DTYPES[means.dtype]
      return means, tf.constant(dtype(1.0) / dtype(num_groups), means.dtype)
    return means, tf.ones_like(means) / float(num_groups)
  return means, counts / tf.maximum(tf.reduce_sum(counts, axis=0), 1.0)


def _CombineMean(means: Sequence[tf.Tensor], counts: Optional[Sequence[tf.Tensor]] = None
                 ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """(CombineMoments(means, variances, counts)[0], which does not depend on the variances, and the
  stacked means and weights it came from, for `_CombineVariance`)."""
  means, weights = _Weighted(means, counts)
  return tf.reduce_sum(weights * means, axis=0), means, weights


def _CombineVariance(mean, means, weights, variances):
  """CombineMoments' variance from _CombineMean's results and the groups' variances."""
  second_moment = tf.reduce_sum(weights * (tf.stack(variances) + tf.square(means)), axis=0)
  return tf.maximum(second_moment - tf.square(mean), 0.0)


def CombineMoments(means: Sequence[tf.Tensor], variances: Sequence[tf.Tensor],
                   counts: Optional[Sequence[tf.Tensor]] = None) -> Tuple[tf.Tensor, tf.Tensor]:
  """Mean and (biased) variance of the union of groups with the given means and variances.

  Args:
    means, variances: per group, tensors of the same shape.
    counts: per group, how many values it has (tensors broadcastable to the means); None: equal.
  """
  mean, means, weights = _CombineMean(means, counts)
  return mean, _CombineVariance(mean, means, weights, variances)


@dataclasses.dataclass(frozen=True)
class Update:
  """One py_utils.UpdateBatchNormVars call of one forward pass of a micro-batch."""
  variable: object  # The moving-average variable.
  value: object  # The micro-batch's statistic (tensor).
  decay: object  # The decay the layer asked for.
  count: object = None  # Non-padded positions the statistic covers (tensor), or None: all alike.


def VariableName(variable):
  """The name of a batch-norm variable, without Lingvo's '/var' suffix."""
  name = variable.op.name
  return name[:-len('/var')] if name.endswith('/var') else name


class StatsCollector:
  """Gathers the micro-batch statistics of every batch-norm update in one pipelined forward pass."""

  def __init__(self, num_micro_batches: int, where: str = 'TensorPipeLayer',
               sizes: Optional[Sequence[Any]] = None):
    """`sizes`: each micro-batch's examples (ints or tensors) when they may differ, else None."""
    self._num_micro_batches = num_micro_batches
    self._where = where
    self._sizes = None if sizes is None else list(sizes)
    self._updates: Dict[int, List[Any]] = collections.OrderedDict()  # id(variable) -> [Update]
    self._closed = False

  @contextlib.contextmanager
  def Collecting(self) -> Iterator[None]:
    """Batch-norm updates recorded in this context go to this collector (nowhere once closed)."""
    with trace_context.Collecting(self):
      yield

  def Add(self, update: Update) -> None:
    """Adds one micro-batch's record, unless the collector is closed."""
    if self._closed:
      return  # A re-computation: the forward pass already recorded these statistics.
    self._updates.setdefault(id(update.variable), []).append(update)

  def Records(self) -> List[Update]:
    """Every Update in the order added (e.g. to return them from a function)."""
    return [u for updates in self._updates.values() for u in updates]

  def _Counts(self, updates):
    counts = [u.count for u in updates]
    if any(c is None for c in counts):
      return self._sizes  # Micro-batches of different sizes weigh by their examples.
    return counts

  def _Combined(self, updates: List[Any], by_name: Dict[str, List[Any]],
                means_done: Dict[int, Tuple[Any, Any, Any]]) -> Any:
    """The mini-batch statistic of one variable from its M micro-batch `updates`.

    means_done: id(mean variable) -> _CombineMean's results, kept for its variance's combination.
    """
    variable = updates[0].variable
    name = VariableName(variable)
    counts = self._Counts(updates)
    values = [u.value for u in updates]
    if not name.endswith('variance'):
      # Only the mean: no zero variances nor second moment for M values of each of the many
      # batch-norm variables (in the outer graph, built once per training graph).
      means_done[id(variable)] = _CombineMean(values, counts)
      return means_done[id(variable)][0]
    partner = by_name.get(name[:-len('variance')] + 'mean')
    if partner is None:
      raise ValueError('%s: cannot combine the micro-batch statistics of batch-norm variable %r: '
                       'a variance needs the matching mean (a variable named %r) updated beside '
                       'it' % (self._where, name, name[:-len('variance')] + 'mean'))
    done = means_done.get(id(partner[0].variable))
    partner_counts = self._Counts(partner)
    if (done is not None and partner[0].variable.device == variable.device and
        (counts is None) == (partner_counts is None) and
        (counts is None or all(a is b for a, b in zip(counts, partner_counts)))):
      # The mean's combination, on the same device from the same tensors: the same values.
      return _CombineVariance(*done, values)
    return CombineMoments([u.value for u in partner], values, counts)[1]

  def Finish(self, outputs: Any) -> Any:
    """Registers one moving-average update per variable; returns `outputs` made to depend on them.

    The dependency makes Lingvo count the updates as relevant to the loss (it applies only
    batch-norm updates whose statistics the loss depends on).

    Raises:
      ValueError: if a variable got a number of updates other than M (e.g. a layer reused).
    """
    self._closed = True
    by_name = {VariableName(u[0].variable): u for u in self._updates.values()}
    combined: List[Any] = []
    means_done: Dict[int, Tuple[Any, Any, Any]] = {}
    for updates in self._updates.values():
      variable = updates[0].variable
      if len(updates) != self._num_micro_batches:
        raise ValueError('%s: batch-norm variable %r was updated %d times for %d micro-batches; '
                         'each batch-norm layer must run once per micro-batch' %
                         (self._where, VariableName(variable), len(updates),
                          self._num_micro_batches))
      with tf.ops.colocate_with(variable), tf.name_scope('batch_norm_stats'):
        value = self._Combined(updates, by_name, means_done)
      py_utils.UpdateBatchNormVars(variable, value, updates[0].decay)
      combined.append(value)
    if not combined:
      return outputs
    with tf.control_dependencies(combined):
      return tf.nest.map_structure(lambda x: None if x is None else tf.identity(x), outputs)


def Discarding() -> StatsCollector:
  """A closed collector: batch-norm updates recorded in its `Collecting()` go nowhere.

  For re-computations, whose statistics the forward pass has already recorded.
  """
  collector = StatsCollector(1)
  collector._closed = True  # pylint: disable=protected-access
  return collector


def Record(variable: tf.Variable, value: tf.Tensor, decay: Any,
           count: Optional[tf.Tensor] = None) -> None:
  """Records a batch-norm update into the current trace context's collector (see `stateful_ops`)."""
  context = trace_context.Current()
  if context is None or context.collector is None:
    raise AssertionError('a batch-norm update was recorded outside any StatsCollector')
  context.collector.Add(Update(variable, value, decay, count))


class BatchNorm(base_layer.BaseLayer):
  """Batch normalisation over all but the last axis, with GPipe's moving-average semantics."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 0, 'Number of channels (the last axis of the input).')
    p.Define('decay', 0.9997, 'Decay of the moving averages, applied once per mini-batch.')
    p.Define('epsilon', 1e-3, 'Added to the variance to avoid dividing by zero.')
    p.Define('gamma_init', 1.0,
             'Initial value of the scale gamma (0 for a zero-initialised residual).')
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

  def UpdateMovingAverages(self, mean: tf.Tensor, variance: tf.Tensor) -> None:
    """Registers Lingvo batch-norm updates moving the averages towards (mean, variance)."""
    py_utils.UpdateBatchNormVars(self.vars.moving_mean, mean, self.params.decay)
    py_utils.UpdateBatchNormVars(self.vars.moving_variance, variance, self.params.decay)

  def FProp(self, theta: py_utils.NestedMap, x: tf.Tensor) -> tf.Tensor:
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
        # The fused op returns the Bessel-corrected variance; the moving average takes the biased
        # one.
        n = x.shape[:3].num_elements()
        if n is None:
          n = tf.cast(tf.reduce_prod(tf.shape(x)[:3]), tf.float32)
          variance *= (n - 1.0) / tf.maximum(n, 1.0)
        else:
          variance *= (n - 1.0) / max(n, 1.0)
      else:
        mean, variance = tf.nn.moments(x, list(range(x.shape.rank - 1)))
        y = tf.nn.batch_normalization(x, mean, variance, theta.beta, theta.gamma, p.epsilon)
      self.UpdateMovingAverages(mean, variance)
      return tf.cast(y, dtype)

  @classmethod
  def FPropMeta(cls, p, x):
    py_utils.CheckShapes((x,))
    return py_utils.NestedMap(flops=x.num_elements() * 10, out_shapes=(x,))
