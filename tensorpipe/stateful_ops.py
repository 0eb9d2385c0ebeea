"""Stateful ops in a partition: made exact where TensorPipe can, refused where it cannot.

A pipeline runs each partition's forward pass once per micro-batch and, with re-computation, once
more in backprop. Stateful ops in a partition would then make training depend on K and M, or be
wrong:

  - a stateful random op (tf.nn.dropout's RandomUniform, tf.random.normal, ...) draws other numbers
    in the re-computation than in the forward pass, so the gradient belongs to another network;
  - a batch-norm update (Lingvo's py_utils.UpdateBatchNormVars) would move the moving averages once
    per call: 2M times a step, from micro-batch statistics;
  - any other variable write in FProp would also happen M or 2M times a step.

While a partition's functions are traced (`trace_context.Partition` with `Routes`), TensorPipe
routes the common entry points (the routes of docs/design.md, "Stateful ops"):

  Route 1: py_utils.UpdateBatchNormVars, which every stock Lingvo batch-norm layer and TensorPipe's
    own BatchNorm call, records the statistics into the trace context's collector instead: the
    forward function outputs them, the re-computation drops them, and the pipeline registers one
    update per variable from the whole mini-batch (see `batch_norm`).
  Route 2: bn_layers.ComputeMoments also records how many non-padded positions the statistics
    cover, so that padded micro-batches combine into exactly the mini-batch's statistics.
  Route 3: tf.nn.dropout (TensorFlow 1 and 2 signatures) and py_utils.DeterministicDropout become
    randomness.Dropout, whose mask hashes (global step, site, example, position): the same in a
    forward pass and its re-computation, and for any K and M.

The routed entry points keep their state in the partition's `trace_context.Routing`.
`trace_context.LayerScope` scopes one top-level layer of the partition: the sites of route 3 are
named after that layer and the order of dropout uses within it, and Lingvo's step seed restarts
from a value derived from the layer's name, so stateless ops seeded by
py_utils.GenerateStepSeedPair draw the same numbers in the forward pass, in the re-computation and
whatever partition the layer lands in.

After the forward function is traced, `Check` refuses what is left (a stateful random op; a variable
write), with one line naming the layer, the op and what to do instead. Other stateful ops (reads,
CheckNumerics, Print) run twice harmlessly.

The routing replaces module attributes for the duration of one (outermost) partition's trace:
graph building is single threaded, and `trace_context.Partition` restores the attributes on exit
even if the trace fails.
"""

import inspect
from typing import Any, List, Sequence, Set, Tuple

import tensorflow as tf2
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import bn_layers
from lingvo.core import py_utils

from tensorpipe import batch_norm
from tensorpipe import randomness
from tensorpipe import body_cache
from tensorpipe import tf_internals
from tensorpipe import trace_context

# Module attributes that hold tf.nn.dropout: TensorFlow 2's and 1's API modules (Lingvo's compat.nn
# is TensorFlow 2's), and nn_ops for code that imports it directly.
_DROPOUT_V2_HOMES = (tf2.nn, tf2.compat.v2.nn, tf.nn)
_DROPOUT_V1_HOMES = (tf2.compat.v1.nn,)

_RANDOM_TYPES = frozenset(['Multinomial', 'TruncatedNormal', 'ParameterizedTruncatedNormal',
                           'RngSkip', 'RngReadAndSkip', 'NonDeterministicInts',
                           'SampleDistortedBoundingBox', 'SampleDistortedBoundingBoxV2'])
_WRITE_TYPES = frozenset(['Assign', 'AssignAdd', 'AssignSub', 'AssignVariableOp',
                          'AssignAddVariableOp', 'AssignSubVariableOp',
                          'ResourceStridedSliceAssign', 'StridedSliceAssign'])
_WRITE_PREFIXES = ('ResourceScatter', 'ResourceApply', 'ResourceSparseApply', 'Scatter', 'Apply',
                   'SparseApply')
_CALLED_FUNCTION_ATTRS = ('f', 'body', 'cond', 'then_branch', 'else_branch', 'branches')


def _Routing() -> trace_context.Routing:
  """The routing state of the partition being traced."""
  context = trace_context.Current()
  if context is None or context.routing is None:
    raise AssertionError('a routed entry point ran outside any partition trace')
  return context.routing


def Routes() -> List[trace_context.Route]:
  """(module, attribute, replacement) for routes 1-3 of the module docstring, for
  `trace_context.Partition`."""
  routes = [(py_utils, 'UpdateBatchNormVars', _UpdateBatchNormVars),  # Route 1.
            (bn_layers, 'ComputeMoments', _MomentsWithCount(bn_layers.ComputeMoments)),  # Route 2.
            (py_utils, 'DeterministicDropout', _DeterministicDropout),  # Route 3.
            (tf_internals.nn_ops, 'dropout_v2', _DropoutV2),
            (tf_internals.nn_ops, 'dropout', _DropoutV1)]
  homes = set()
  for homes_of, function in ((_DROPOUT_V2_HOMES, _DropoutV2), (_DROPOUT_V1_HOMES, _DropoutV1)):
    for module in homes_of:
      if id(module) not in homes:
        homes.add(id(module))
        routes.append((module, 'dropout', function))
  return routes


# --------------------------------------------------------------------------------------------------
# Routes 1 and 2: batch-norm updates.


def _UpdateBatchNormVars(batch_norm_var, batch_norm_stats, decay):
  """py_utils.UpdateBatchNormVars in a partition: records the statistics; updates nothing here.

  Returns a no-op for callers that wait for the update, one per function body (`body_cache`).
  """
  count = _Routing().counts.get(id(batch_norm_stats))
  batch_norm.Record(batch_norm_var, batch_norm_stats, decay, count)
  return body_cache.Shared(('batch-norm update recorded',),
                               lambda: tf.no_op(name='batch_norm_update_recorded'))


def _MomentsWithCount(compute_moments):
  """bn_layers.ComputeMoments that also notes, per statistic, the non-padded positions it covers."""
  signature = inspect.signature(compute_moments)

  def ComputeMoments(*args, **kwargs):
    mean, variance = compute_moments(*args, **kwargs)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    if a['cumulative_axis'] is None and not a['keepdims']:
      count = tf.reduce_sum(py_utils.ApplyPadding(a['padding'], tf.ones_like(a['inputs'])),
                            a['reduce_over_dims'])
      counts = _Routing().counts
      counts[id(mean)] = counts[id(variance)] = count
    return mean, variance

  return ComputeMoments


# --------------------------------------------------------------------------------------------------
# Route 3: dropout.


def _MaskBatchDim(shape, routing):
  """The axis of a mask of static `shape` (ints or None) that indexes examples, or None.

  The pipeline's batch dimension if it has the micro-batch's size there, else the only axis of that
  size; None (no batch dimension) if there is none or several: the mask is then keyed by the
  micro-batch as a whole, still the same in the forward pass and its re-computation.
  """
  axis, count = routing.batch_dim, routing.example_count
  if count is None:
    return axis if axis < len(shape) and shape[axis] != 1 else None
  candidates = [a for a, d in enumerate(shape) if d == count]
  if axis in candidates:
    return axis
  return candidates[0] if len(candidates) == 1 else None


def _ReplacedDropout(x, keep_prob, noise_shape, where):
  routing = _Routing()
  if routing.layer is None:
    raise AssertionError('dropout traced in a partition outside any layer')
  site = randomness.NamedSite('%s|dropout %d' % (routing.layer, routing.uses))
  routing.uses += 1
  x = tf.convert_to_tensor(x)
  shape = noise_shape if noise_shape is not None else py_utils.GetShape(x)
  if isinstance(shape, tf.Tensor):
    static = tf.get_static_value(shape)
    static = [None] * (shape.shape[0] or 0) if static is None else [int(d) for d in static]
  else:
    static = [d if isinstance(d, int) else tf.get_static_value(d) for d in shape]
  axis = _MaskBatchDim(static, routing)
  if axis is None and routing.layer not in routing.whole_micro_batch_masks:
    routing.whole_micro_batch_masks.append(routing.layer)
  return randomness.Dropout(x, keep_prob, site, batch_dim=axis, noise_shape=noise_shape,
                            where=where)


def _KeepProbFromRate(rate, where):
  if isinstance(rate, (int, float)):
    if not 0.0 <= rate < 1.0:
      raise ValueError('%s: rate must be in [0, 1), got %r' % (where, rate))
    return 1.0 - rate
  return 1.0 - tf.cast(rate, tf.float32)


def _DropoutV2(x, rate, noise_shape=None, seed=None, name=None):
  """tf.nn.dropout (TensorFlow 2) inside a partition; `seed` has no use (masks are hashes)."""
  del seed
  with tf.name_scope(name or 'dropout'):
    return _ReplacedDropout(x, _KeepProbFromRate(rate, 'tf.nn.dropout'), noise_shape,
                            'tf.nn.dropout')


def _DropoutV1(x, keep_prob=None, noise_shape=None, seed=None, name=None, rate=None):
  """tf.compat.v1.nn.dropout inside a partition."""
  del seed
  if (keep_prob is None) == (rate is None):
    raise ValueError('tf.compat.v1.nn.dropout: set exactly one of keep_prob and rate')
  if keep_prob is None:
    keep_prob = _KeepProbFromRate(rate, 'tf.compat.v1.nn.dropout')
  with tf.name_scope(name or 'dropout'):
    return _ReplacedDropout(x, keep_prob, noise_shape, 'tf.compat.v1.nn.dropout')


def _DeterministicDropout(x, keep_prob, seeds, noise_shape=None, name=None):
  """py_utils.DeterministicDropout inside a partition; `seeds` has no use (masks are hashes)."""
  del seeds
  with tf.name_scope(name or 'dropout'):
    return _ReplacedDropout(x, keep_prob, noise_shape, 'py_utils.DeterministicDropout')


# --------------------------------------------------------------------------------------------------
# What is left: refused.


def _Kind(op_type):
  """'random', 'write' or None for an op type."""
  op_def = tf_internals.OpDef(op_type)
  if op_def is None or not op_def.is_stateful:
    return None
  if op_type in _WRITE_TYPES or op_type.startswith(_WRITE_PREFIXES):
    return 'write'
  if (op_type in _RANDOM_TYPES or 'Random' in op_type or 'CandidateSampler' in op_type or
      (op_type.startswith('Stateful') and op_type != 'StatefulPartitionedCall')):
    return 'random'
  return None


def _CalledFunctions(attrs):
  """Names of the functions an op's (or node's) attributes call."""
  names = []
  for key in _CALLED_FUNCTION_ATTRS:
    if key not in attrs:
      continue
    value = attrs[key]
    if value.HasField('func'):
      names.append(value.func.name)
    elif value.HasField('list'):
      names.extend(f.name for f in value.list.func)
  return names


class _Library:
  """The functions a traced function's ops call, looked up in its graph's function library."""

  def __init__(self, graph):
    self._graph = graph

  def _Definition(self, name):
    return tf_internals.GraphFunctionDefinition(self._graph, name)

  def Nodes(self, name, seen):
    """The nodes of function `name` and of the functions they call (each function once)."""
    if name in seen:
      return
    seen.add(name)
    definition = self._Definition(name)
    if definition is None:
      return
    for node in definition.node_def:
      yield node
      called = _CalledFunctions(node.attr)
      if self._Definition(node.op) is not None:
        called.append(node.op)
      for other in called:
        yield from self.Nodes(other, seen)


def _Offences(ops, library):
  """(kind, op type, op name, op or None) of each refused op in `ops` and the functions called."""
  found = []
  seen: Set[Any] = set()
  for op in ops:
    kind = _Kind(op.type)
    if kind:
      found.append((kind, op.type, op.name, op))
    for name in _CalledFunctions(op.node_def.attr):
      for node in library.Nodes(name, seen):
        kind = _Kind(node.op)
        if kind:
          found.append((kind, node.op, '%s/%s' % (name, node.name), None))
  return found


def _WrittenVariable(op, graph):
  """The name of the variable a write op in a function body writes, if it is a captured one."""
  if op is None or not op.inputs:
    return None
  target = op.inputs[0]
  for external, internal in tf_internals.CapturePairs(graph):
    if internal is target:
      return external.op.name
  return None


def CheckAccumulators(layer: base_layer.BaseLayer, where: str) -> None:
  """Raises ValueError if `layer` (of a partition) or a layer inside it has Lingvo accumulators.

  Accumulators (e.g. bn_layers.BatchNormLayerNoPadding's sufficient statistics) are Python-side
  per-step state that FProp sets; a partition's FProp runs inside a graph function, where that state
  cannot be carried from one micro-batch to the next.
  """
  names = sorted(layer.GetAccumulatorValues().FlattenItems())
  if names:
    raise ValueError(
        '%s: layer %r keeps Lingvo accumulators (%s), per-step state that a pipelined partition '
        'cannot carry between micro-batches; use bn_layers.BatchNormLayer or TensorPipe\'s '
        'BatchNorm for batch normalisation, or run the layer outside the TensorPipeLayer' %
        (where, layer.params.name, ', '.join(name for name, _ in names)))


def Check(graph: tf.Graph, layer_ops: Sequence[Tuple[str, Sequence[tf.Operation]]],
          recomputes: bool, where: str) -> None:
  """Raises ValueError for the first refused op in a traced forward function.

  Args:
    graph: the forward function's graph.
    layer_ops: [(layer name, the ops its trace created)] in order.
    recomputes: whether the partition is re-computed in backprop (random ops are refused only then).
    where: names the pipeline and partition in the message.
  """
  library = _Library(graph)
  for layer_name, ops in layer_ops:
    for kind, op_type, op_name, op in _Offences(ops, library):
      if kind == 'random' and recomputes:
        raise ValueError(
            '%s: layer %r draws random numbers with stateful op %s (%r): its re-computation in '
            'backprop would draw other numbers than its forward pass, so the gradients would be '
            'wrong. Use tf.nn.dropout or Lingvo\'s DropoutLayer (TensorPipe makes both exact), '
            'randomness.Dropout, a stateless op seeded by py_utils.GenerateStepSeedPair (for '
            'variational noise: p.vn.deterministic=True), or recompute=\'never\'' %
            (where, layer_name, op_type, op_name))
      if kind == 'write':
        variable = _WrittenVariable(op, graph)
        raise ValueError(
            '%s: layer %r writes %s in FProp (%s %r): a pipeline runs each partition\'s forward '
            'pass once per micro-batch and again when re-computing, so it would be written M or 2M '
            'times a step. Update it outside the TensorPipeLayer; for batch-norm statistics call '
            'py_utils.UpdateBatchNormVars (as Lingvo\'s BatchNormLayer and TensorPipe\'s '
            'BatchNorm do), which the pipeline applies once per step' %
            (where, layer_name, 'variable %r' % variable if variable else 'a variable', op_type,
             op_name))
