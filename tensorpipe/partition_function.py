"""A partition as graph functions: traced once whatever M is, called once per micro-batch.

`PartitionFunctions` turns a partition (its layers, each a function (theta, inputs) -> outputs) into
TensorFlow graph functions placed on the partition's device:

  forward(offset[, step], theta, x) -> (y, batch-norm statistics)
  backward(offset[, step], theta, x, dy, sums) -> (dx, sums + dtheta)
  zeros() -> sums, all zero (a new buffer per weight every step)
and, for schedules that split backward passes (see `schedule`), backward's two halves:
  input_backward(offset[, step], theta, x, dy) -> (dx, kept)
  weight_backward(offset[, step], theta, x, dy, kept, sums) -> sums + dtheta
where `kept` is the input and output gradient of each layer that has weights; weight_backward
re-runs each such layer from its kept input (one layer's activations at a time) and differentiates
it with respect to its weights only.

`backward` re-computes the partition from its saved boundary input x and differentiates it layer by
layer, so only boundary activations are kept between the passes (GPipe's re-computation). It adds
the weight gradients into the running sums it is given (see `accumulation`); the first backward pass
of a step gets them from `zeros`. Without re-computation, the forward call is differentiated by
TensorFlow's own function gradient instead (`NeverRecomputeBackward`): that forward call then also
outputs what its backward call needs, and `accumulate(sums, dtheta) -> sums` adds the gradients.

What differs per micro-batch is a function input: `offset`, the index of the micro-batch's first
example in the mini-batch, so that dropout masks are the same in the forward pass, in its
re-computation and for any K and M (see `randomness`); and the global step. Batch-norm statistics
are function outputs (see `batch_norm`). Stock Lingvo dropout and batch-norm updates are routed to
those while the partition is traced, and other stateful ops that would differ between a forward pass
and its re-computation are refused when the forward function is traced (see `stateful_ops`). The
functions are never inlined nor specialised per call (see _FUNCTION_ATTRS), so the graph TensorFlow
optimises and runs does not grow with M either.

The executor calls `Forward` in step (3) and the backward methods in step (5) of docs/design.md,
"One training step"; "Inside a partition's functions" there gives the reason for each order and
attribute below.
"""

import contextlib
import dataclasses
import weakref
from typing import Any, Callable, List, Optional, Sequence, Tuple

import tensorflow as tf2
from lingvo import compat as tf
from lingvo.core import py_utils

from tensorpipe import accumulation
from tensorpipe import batch_norm
from tensorpipe import leaves
from tensorpipe import stateful_ops
from tensorpipe import tf_internals
from tensorpipe import trace_context


# A partition's layers: (layer name, function (theta NestedMap, inputs structure) -> outputs).
LayerFunctions = Sequence[Tuple[str, Callable[[py_utils.NestedMap, Any], Any]]]
# One entry per leaf (or per weight), None where it has none.
_PerLeaf = List[Optional[tf.Tensor]]


def _IsDifferentiable(t):
  return t.dtype.is_floating or t.dtype.is_complex


# Per traced function graph: {op name: the layer whose trace made it}, to name a shortcut's source.
_PRODUCERS = weakref.WeakKeyDictionary()


def _DependsOn(op, sources):
  """Whether `op` is computed (by data) from any of the ops `sources`."""
  seen, todo = set(), [op]
  while todo:
    top = todo.pop()
    if top in sources:
      return True
    if top in seen:
      continue
    seen.add(top)
    todo.extend(x.op for x in top.inputs)
  return False


def _Spec(t):
  return tf.TensorSpec(t.shape, t.dtype)


# Attributes of every partition function: TensorFlow would otherwise inline each call into the
# session's graph, and grappler would make a specialised copy of the function for each call (each
# gets its own constant example offset): either way the graph TensorFlow optimises and runs would
# grow with M. Not inlining also keeps grappler from merging re-computed ops with the forward
# pass's, which would keep the forward activations alive.
_FUNCTION_ATTRS = {'_noinline': True, '_nospecialize': True}


@dataclasses.dataclass(frozen=True)
class GraphFunction:
  """`body(*args)` (args as `specs`) traced once as a graph function on `device`.

  As Lingvo's py_utils.Function does, the body gets a fresh step seed and no summaries collection
  of the outer graph. `Call` adds a call op of it; `concrete` is TensorFlow's ConcreteFunction of
  the same trace, whose own calls tf.gradients can differentiate.
  """
  concrete: Any  # A tf.function's ConcreteFunction.
  atomic: Any  # The function `Call` calls: the trace with _FUNCTION_ATTRS.

  @classmethod
  def Trace(cls, name: str, body: Callable[..., Sequence[tf.Tensor]],
            specs: Sequence[tf.TensorSpec], device: str) -> 'GraphFunction':
    """`body` traced on `device` for arguments of `specs`, as a function the graph keeps whole."""

    def Body(*args):
      py_utils.ResetStepSeed()
      tf.get_default_graph().clear_collection(tf.GraphKeys.SUMMARIES)
      with tf.device(device):
        return list(body(*args))

    Body.__name__ = name
    concrete = tf2.function(Body, input_signature=list(specs), autograph=False,
                            experimental_attributes={'_noinline': True}).get_concrete_function()
    atomic = tf_internals.FunctionFromGraph(concrete.name.decode() + '_call', concrete.graph,
                                            _FUNCTION_ATTRS)
    return cls(concrete, atomic)

  @property
  def outputs(self) -> List[tf.Tensor]:
    """The output tensors inside the traced function (their shapes and dtypes)."""
    return self.concrete.outputs

  @property
  def captured_inputs(self) -> List[tf.Tensor]:
    """The outer-graph tensors the body captured; every call passes them after `args`."""
    return self.concrete.captured_inputs


def _Ops(tensors):
  """The ops behind `tensors` (None skipped), without repeats."""
  ops = []
  for t in tensors:
    if t is not None and t.op not in ops:
      ops.append(t.op)
  return ops


def Call(function: GraphFunction, args: Sequence[Any], name: str = 'call') -> List[tf.Tensor]:
  """One call op of `function` (a GraphFunction) on `args`; returns its output tensors.

  The op TensorFlow's ConcreteFunction call adds, calling the function with _FUNCTION_ATTRS, with
  the shapes of the outputs taken from the trace, and marked so that graph construction does not run
  shape inference over the function's body again for every call (which would make building the
  graph grow with M).
  """
  args = [tf.convert_to_tensor(x) for x in list(args) + list(function.captured_inputs)]
  op = tf_internals.AddFunctionCall(tf.get_default_graph(), function.atomic, args, name)
  for out, traced in zip(op.outputs, function.outputs):
    out.set_shape(traced.shape)
  return list(op.outputs)


def _AddWeightGradients(total, grads, theta_leaves):
  """Adds `grads` (one per differentiable weight, None allowed) into the running sums `total` in
  place; returns the sums added to."""
  own = iter(grads)
  added = []
  for i, t in enumerate(theta_leaves):
    g = accumulation.Dense(next(own)) if _IsDifferentiable(t) else None
    if g is None:
      continue
    if total[i] is None:
      raise AssertionError('no running sum for weight %d (%s)' % (i, t.name))
    total[i] = accumulation.AddInPlace(total[i], g)
    added.append(total[i])
  return added


def _LayerGradients(boundaries, out_grads, theta_leaves, sums=None):
  """Gradients of a partition, differentiated layer by layer, last layer first.

  Each layer's backward pass waits until the weight gradients of the layer after it have been added
  to their sums. Left alone, the executor may run the chain of input gradients far ahead of the
  cheap weight-gradient ops beside it (a bias gradient's reduction, the additions), and every
  layer's output gradient and weight gradient would stay alive until they run.

  Args:
    boundaries: every layer's inputs, then the partition's outputs (structures).
    out_grads: the gradient of each leaf of the partition's outputs (flattened), None where none.
    theta_leaves: the partition's weights.
    sums: running sums per weight (None where a weight has no gradient), added to in place; None:
      input gradients only (a weight-gradient pass adds the weights' later, see `_WeightPass`).

  Returns:
    (per boundary, the gradient of each of its leaves (flattened) or None; the sums or None).
  """
  num_layers = len(boundaries) - 1
  targets = [t for t in theta_leaves if _IsDifferentiable(t)] if sums is not None else []
  total = None if sums is None else list(sums)
  done = []
  grads = [None] * num_layers + [list(out_grads)]
  for j in reversed(range(num_layers)):
    ins = tf.nest.flatten(boundaries[j])
    grads[j] = [None] * len(ins)
    pairs = [(y, d) for y, d in zip(tf.nest.flatten(boundaries[j + 1]), grads[j + 1])
             if y is not None and d is not None and _IsDifferentiable(y)]
    if not pairs:
      continue
    with tf.control_dependencies(done):
      grad_ys = [tf.identity(d) for _, d in pairs]
    diff = [i for i, x in enumerate(ins) if x is not None and _IsDifferentiable(x)]
    results = tf.gradients([y for y, _ in pairs], [ins[i] for i in diff] + targets,
                           grad_ys=grad_ys, stop_gradients=[ins[i] for i in diff])
    for i, g in zip(diff, results):
      grads[j][i] = accumulation.Dense(g)
    if total is not None:
      done = _AddWeightGradients(total, results[len(diff):], theta_leaves) or done
  return grads, total


@contextlib.contextmanager
def _LayerContext(step, offset, collector, check_numerics, example_axis, example_count, two_d):
  """What a partition's layers run in (see `trace_context.Partition`), with the stateful entry
  points routed (see `stateful_ops`); yields what the trace noted (`trace_context.Routing`)."""
  with trace_context.Partition(step, offset, collector, check_numerics, example_axis,
                               example_count, two_d, routes=stateful_ops.Routes) as context:
    yield context.routing


def _RunLayer(layer, site_prefix, theta, inputs, place):
  """One layer (name, function) on `inputs`: the same dropout masks and seeds whenever it runs.

  An error raised inside the layer gets a note naming the layer and `place` (the partition), which
  Python prints under the error's own message.
  """
  name, fn = layer
  with trace_context.LayerScope('%s/%s' % (site_prefix, name)):
    try:
      return fn(theta, inputs)
    except Exception as e:  # pylint: disable=broad-except
      e.add_note('(raised by layer %r while %s was traced)' % (name, place))
      raise


def RunInline(layers: LayerFunctions, theta: py_utils.NestedMap, inputs: Any,
              step: Optional[tf.Tensor], collector: batch_norm.StatsCollector,
              site_prefix: str = '', example_axis: int = 0, example_count: Optional[int] = None,
              two_d_weight_gradients: bool = True) -> Any:
  """Runs `layers` in order on one whole mini-batch in the current graph, as a partition's forward
  function would run them on a micro-batch starting at example 0: the same dropout masks, seeds
  and batch-norm records, with TensorFlow's own gradients (an unpipelined reference)."""
  out = inputs
  with _LayerContext(step, tf.constant(0, tf.int64), collector, True, example_axis, example_count,
                     two_d_weight_gradients):
    for layer in layers:
      out = _RunLayer(layer, site_prefix, theta, out, 'the unpipelined %s' % site_prefix)
  return out


@dataclasses.dataclass(frozen=True)
class _Kept:
  """What an input-gradient pass keeps for its weight-gradient pass (see `InputBackward`).

  layers: the layers that read weights, in order.
  inputs: layer -> (its inputs structure, which of its leaves (flattened) are not None), for the
    layers after the first (the first one's inputs are the partition's).
  grads: layer -> positions of its output leaves (flattened) that have gradients.
  specs: the kept tensors: per layer in `layers`, its input leaves (not for the first layer), then
    its output gradients (not for the last layer, whose are the partition's output gradients).
  """
  layers: tuple
  inputs: dict
  grads: dict
  specs: tuple


class PartitionFunctions:
  """Forward and backward graph functions of one partition, traced on first use and then reused.

  Args:
    layers: the partition as a list of (layer name, function (theta NestedMap, inputs structure) ->
      outputs structure), one per layer, applied in order. They must read the weights from theta
      only and get every tensor they use from their inputs or theta.
    theta: NestedMap of the partition's weights (tensors); only the structure, shapes and dtypes
      count.
    inputs: the inputs of micro-batch 0 (every micro-batch has the same structure and shapes).
    device: the partition's device.
    name: a name for the functions (e.g. 'pipe_partition1').
    two_d_weight_gradients: trace under matmul_gradient.Scope().
    where: names the pipeline in error messages.
    site_prefix: names the pipeline in dropout sites and step seeds (the same whatever K is).
    example_axis: the batch dimension of the partition's inputs.
    example_count: examples per micro-batch (None if unknown when the graph is built).
    recomputes: whether backward passes re-compute the partition (see stateful_ops.Check).
  """

  def __init__(self, layers: LayerFunctions, theta: py_utils.NestedMap, inputs: Any, device: str,
               name: str, two_d_weight_gradients: bool = True, where: str = 'TensorPipeLayer',
               site_prefix: str = '', example_axis: int = 0, example_count: Optional[int] = None,
               recomputes: bool = True):
    self._layers = list(layers)
    self._site_prefix = site_prefix
    self._example_axis = example_axis
    self._example_count = example_count
    self._recomputes = recomputes
    self._layer_ops = None  # [(layer name, ops)] of the forward trace, for stateful_ops.Check
    self._theta = theta
    self._theta_specs = [_Spec(t) for t in theta.Flatten()]
    self._in_template = inputs
    in_leaves = tf.nest.flatten(inputs)
    self._in_index = [i for i, x in enumerate(in_leaves) if x is not None]
    self._x_specs = [_Spec(in_leaves[i]) for i in self._in_index]
    self._device = device
    self._name = name
    self._two_d = two_d_weight_gradients
    self._where = where
    self._has_step = py_utils.GetGlobalStep() is not None
    self._forward = None
    self._out_template = None
    self._num_y = None
    self._stats_slots = None  # [(variable, decay, has count)] per batch-norm output
    self._whole_micro_batch_masks = []  # Layers whose dropout masks have no example axis.
    self._theta_mask = tuple(_IsDifferentiable(t) for t in theta.Flatten())  # Which have sums.
    self._grad_mask = None  # Which weights get a gradient: known once a backward pass is traced.
    self._zeros = None
    self._backward = {}  # dy mask -> (function, dx mask)
    # dy mask -> (input-gradient function, dx mask, _Kept, weight-gradient function)
    self._split = {}
    self._accumulate = None

  @property
  def num_inputs(self) -> int:
    """Non-None input leaves (the x of the functions)."""
    return len(self._x_specs)

  @property
  def has_batch_norm(self) -> bool:
    """Whether the forward function (traced) records batch-norm statistics."""
    return bool(self._stats_slots)

  def MicroBatchDependence(self) -> List[str]:
    """Why the partition's results depend on the micro-batches (empty if they do not): batch
    norm's micro-batch statistics, dropout masks keyed by the whole micro-batch."""
    reasons = []
    for variable, _, _ in self._stats_slots or []:
      reason = ('batch norm %s normalises each micro-batch with its own statistics' %
                batch_norm.VariableName(variable).rpartition('/')[0])
      if reason not in reasons:
        reasons.append(reason)
    reasons += ['the dropout mask of %s has no example axis, so it is drawn per micro-batch' %
                layer for layer in self._whole_micro_batch_masks]
    return reasons

  @property
  def num_weights(self) -> int:
    """Leaves of theta (the weights the functions take)."""
    return len(self._theta_specs)

  def _Pack(self, theta_leaves, x_leaves):
    return self._theta.Pack(list(theta_leaves)), leaves.Fill(self._in_template, x_leaves)

  def _Tracing(self, step, offset, collector, check_numerics):
    """The context the partition's layers are traced in, inside a function body."""
    return _LayerContext(step, offset, collector, check_numerics, self._example_axis,
                         self._example_count, self._two_d)

  def _RunLayer(self, j, theta, inputs):
    """Layer j on `inputs`, within `_Tracing`: the same dropout masks and seeds whenever it runs."""
    return _RunLayer(self._layers[j], self._site_prefix, theta, inputs,
                     '%s, partition function %s' % (self._where, self._name))

  def _Run(self, step, offset, theta_leaves, x_leaves, collector, boundaries=None):
    """Runs the partition inside a function body; returns its outputs and each layer's ops.

    `boundaries`, if given, gets every layer's inputs and then the outputs: a re-computation, which
    skips Lingvo's CheckNumerics. Every layer is checked for shortcuts (`_CheckShortcuts`).
    """
    theta, out = self._Pack(theta_leaves, x_leaves)
    graph = tf.get_default_graph()
    layer_ops = []
    producers = _PRODUCERS.setdefault(graph, {})
    with self._Tracing(step, offset, collector, check_numerics=boundaries is None) as notes:
      for j, (name, _) in enumerate(self._layers):
        if boundaries is not None:
          if boundaries:
            # _LayerGradients stops each layer's differentiation at its inputs. tf.gradients
            # ignores stop_gradients at the outputs of a function call op (e.g. the layer norm of
            # Lingvo's py_utils.CallDefun) and would differentiate the layer before this one too.
            out = tf.nest.map_structure(lambda t: None if t is None else tf.identity(t), out)
          boundaries.append(out)
        first, captured = len(graph.get_operations()), len(graph.external_captures)
        inputs = out
        out = self._RunLayer(j, theta, out)
        ops = graph.get_operations()[first:]
        self._CheckShortcuts(graph, j, ops, inputs, graph.external_captures[captured:], producers)
        producers.update((op.name, name) for op in ops)
        layer_ops.append((name, ops))
    if boundaries is not None:
      boundaries.append(out)
    else:
      self._whole_micro_batch_masks = list(notes.whole_micro_batch_masks)
    return out, layer_ops

  def _CheckShortcuts(self, graph, j, ops, inputs, captures, producers):
    """Refuses a layer that uses a tensor an earlier layer computed other than through its inputs.

    Its gradient would be lost (tf.gradients is taken layer by layer, from each layer's inputs), and
    across partitions the tensor lives in another function's graph (TensorFlow fails later with an
    unreadable error). Declared skip connections arrive as inputs, so they pass.
    """
    name = self._layers[j][0]
    outer = []
    g = graph
    while g is not None:
      outer.append(g)
      g = getattr(g, 'outer_graph', None)
    for tensor in captures:
      if tensor.graph not in outer:
        source = _PRODUCERS.get(tensor.graph, {}).get(tensor.op.name)
        self._RaiseShortcut(name, tensor, source, 'another partition\'s function (%s)' %
                            tensor.graph.name)
    allowed = {x.ref() for x in leaves.Present(inputs)}
    arguments = {x.op for x in graph.inputs} - {x.op for x in graph.internal_captures}
    for op in ops:
      for x in op.inputs:
        source = producers.get(x.op.name)
        if (source is None or source == name or x.ref() in allowed or
            not _IsDifferentiable(x) or not _DependsOn(x.op, arguments)):
          continue
        self._RaiseShortcut(name, x, source, 'this partition')

  def _RaiseShortcut(self, name, tensor, source, place):
    raise ValueError(
        '%s: layer %r (in %s) uses tensor %r, which %s computed in %s, but not through its '
        'inputs: a shortcut the pipeline does not know of, whose gradient would be lost. Declare '
        'it as a skip connection, skip_connections=[(%r, %r)], and take it as the last argument '
        'of %r\'s FProp' % (self._where, name, self._name, tensor.name,
                              'layer %r' % source if source else 'an earlier layer', place,
                              source or 'SOURCE', name, name))

  def _Leading(self):
    """Specs of the example offset and, if the graph has one, the global step (int64 scalars)."""
    return [tf.TensorSpec([], tf.int64)] * (2 if self._has_step else 1)

  def _LeadingArgs(self, step, offset):
    if (step is not None) != self._has_step:
      raise ValueError('%s: %s was traced %s a global step' %
                       (self._where, self._name, 'with' if self._has_step else 'without'))
    return [offset] + ([step] if self._has_step else [])

  def _Split(self, args):
    """(step or None, offset, the rest) of a function body's arguments."""
    if self._has_step:
      return args[1], args[0], args[2:]
    return None, args[0], args[1:]

  def _BuildForward(self):
    num_theta = self.num_weights

    def Forward(*args):
      step, offset, args = self._Split(args)
      recorder = batch_norm.StatsCollector(1, self._where)
      out, self._layer_ops = self._Run(step, offset, args[:num_theta], args[num_theta:], recorder)
      ys = leaves.Present(out)
      for y in ys:
        if not isinstance(y, tf.Tensor):
          raise TypeError('%s: partition outputs must be tensors (None allowed), got %s' %
                          (self._where, type(y).__name__))
      self._out_template = out
      self._num_y = len(ys)
      records = recorder.Records()
      self._stats_slots = [(u.variable, u.decay, u.count is not None) for u in records]
      stats = [[u.value] + ([u.count] if u.count is not None else []) for u in records]
      return ys + [t for pair in stats for t in pair]

    self._forward = GraphFunction.Trace(self._name + '_forward', Forward,
                                  self._Leading() + self._theta_specs + self._x_specs, self._device)
    stateful_ops.Check(self._forward.concrete.graph, self._layer_ops, self._recomputes,
                       '%s (%s)' % (self._where, self._name))
    self._layer_ops = None
    self._CheckCaptures(self._forward)

  def _CheckCaptures(self, function):
    captured = {id(c) for c in function.captured_inputs}
    direct = [v.op.name for v in tf.trainable_variables() if id(v.handle) in captured]
    if direct:
      raise ValueError(
          '%s: a layer of %s reads trainable variables %s directly instead of through theta; '
          'their gradients would be lost. Use the theta passed to FProp.' %
          (self._where, self._name, direct))

  def Forward(self, step: Optional[tf.Tensor], offset: tf.Tensor,
              theta_leaves: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor],
              differentiable: bool = False
              ) -> Tuple[Any, List[batch_norm.Update], List[tf.Tensor]]:
    """One call of the forward function on the partition's device.

    Args:
      step: the global step (int64 scalar) or None if the graph has none.
      offset: the index of the micro-batch's first example in the mini-batch (int64 scalar).
      theta_leaves: the partition's weights (theta.Flatten()).
      x_leaves: the micro-batch's non-None input leaves.
      differentiable: make the call with TensorFlow's own call op, whose gradient
        `NeverRecomputeBackward` uses; else a call op that tf.gradients cannot differentiate.

    Returns:
      (outputs structure, [batch_norm.Update] of the call, the call's output tensors).
    """
    if self._forward is None:
      self._BuildForward()
    args = self._LeadingArgs(step, offset) + list(theta_leaves) + list(x_leaves)
    with tf.device(self._device):
      results = (self._forward.concrete(*args) if differentiable else
                 Call(self._forward, args, 'forward'))
    ys, stats = results[:self._num_y], results[self._num_y:]
    out = leaves.Fill(self._out_template, ys)
    records = []
    it = iter(stats)
    for variable, decay, has_count in self._stats_slots:
      value = next(it)
      records.append(batch_norm.Update(variable, value, decay, next(it) if has_count else None))
    return out, records, ys

  def Zeros(self) -> _PerLeaf:
    """One call of the function that makes a zero running sum per weight (None where none)."""
    if self._zeros is None:
      specs = [s for s, has in zip(self._theta_specs, self._theta_mask) if has]

      def MakeZeros():
        return [accumulation.Zeros(spec.shape, spec.dtype) for spec in specs]

      self._zeros = GraphFunction.Trace(self._name + '_zeros', MakeZeros, [], self._device)
    with tf.device(self._device):
      results = Call(self._zeros, [], 'zeros')
    return leaves.Spread(results, self._theta_mask)

  def _BuildBackward(self, dy_mask):
    num_theta, num_x = self.num_weights, self.num_inputs
    num_dy = sum(dy_mask)
    dx_mask = []
    theta_mask = self._theta_mask

    def Backward(*args):
      step, offset, args = self._Split(args)
      theta_leaves = args[:num_theta]
      x_leaves = args[num_theta:num_theta + num_x]
      dys = args[num_theta + num_x:num_theta + num_x + num_dy]
      sums = leaves.Spread(args[num_theta + num_x + num_dy:], theta_mask)
      boundaries = []
      with tf.name_scope('recompute'):
        self._Run(step, offset, theta_leaves, x_leaves, batch_norm.Discarding(), boundaries)
      grads, new_sums = _LayerGradients(boundaries, self._OutGrads(dys, dy_mask), theta_leaves,
                                        sums)
      dx = [grads[0][i] for i in self._in_index]
      dx_mask.extend(g is not None for g in dx)
      self._NoteGradients([a is not b for a, b in zip(new_sums, sums)])
      sums = new_sums
      return leaves.Present(dx) + leaves.Present(sums)

    specs = self._Leading() + self._theta_specs + self._x_specs + self._DySpecs(dy_mask) + [
        s for s, has in zip(self._theta_specs, theta_mask) if has]
    function = GraphFunction.Trace(self._name + '_backward', Backward, specs, self._device)
    self._backward[dy_mask] = (function, tuple(dx_mask))

  def _OutGrads(self, dys, dy_mask):
    """The gradient of each leaf of the partition's outputs (flattened), from `dys`, `dy_mask`."""
    return leaves.Fill(self._out_template, leaves.Spread(dys, dy_mask), flat=True)

  def _BuildSplitBackward(self, dy_mask):
    """Traces the input-gradient function and then the weight-gradient function for `dy_mask`."""
    num_theta, num_x = self.num_weights, self.num_inputs
    num_dy = sum(dy_mask)
    dx_mask, kept = [], []

    def InputBackward(*args):
      step, offset, args = self._Split(args)
      theta_leaves = args[:num_theta]
      x_leaves = args[num_theta:num_theta + num_x]
      dys = args[num_theta + num_x:]
      boundaries = []
      with tf.name_scope('recompute'):
        _, layer_ops = self._Run(step, offset, theta_leaves, x_leaves, batch_norm.Discarding(),
                                 boundaries)
      grads, _ = _LayerGradients(boundaries, self._OutGrads(dys, dy_mask), theta_leaves)
      dx = [grads[0][i] for i in self._in_index]
      dx_mask.extend(g is not None for g in dx)
      weights = {t.ref() for t in theta_leaves}
      last = len(self._layers) - 1
      layers, inputs, grad_index, tensors = [], {}, {}, []
      for j, (_, ops) in enumerate(layer_ops):
        if not any(x.ref() in weights for op in ops for x in op.inputs):
          continue  # No weights, nothing for a weight-gradient pass to do.
        layers.append(j)
        if j:
          template = tf.nest.map_structure(lambda _: None, boundaries[j])
          inputs[j] = (template, tuple(x is not None for x in tf.nest.flatten(boundaries[j])))
          tensors.extend(leaves.Present(boundaries[j]))
        grad_index[j] = tuple(i for i, g in enumerate(grads[j + 1]) if g is not None)
        if j < last:
          tensors.extend(grads[j + 1][i] for i in grad_index[j])
      kept.append(_Kept(tuple(layers), inputs, grad_index, tuple(_Spec(t) for t in tensors)))
      return leaves.Present(dx) + tensors

    specs = self._Leading() + self._theta_specs + self._x_specs + self._DySpecs(dy_mask)
    input_fn = GraphFunction.Trace(self._name + '_input_backward', InputBackward, specs,
                                   self._device)
    layout = kept[0]
    theta_mask = self._theta_mask

    def WeightBackward(*args):
      step, offset, args = self._Split(args)
      theta_leaves = args[:num_theta]
      x_leaves = args[num_theta:num_theta + num_x]
      out_grads = self._OutGrads(args[num_theta + num_x:num_theta + num_x + num_dy], dy_mask)
      rest = args[num_theta + num_x + num_dy:]
      tensors, sums = rest[:len(layout.specs)], leaves.Spread(rest[len(layout.specs):], theta_mask)
      theta, x = self._Pack(theta_leaves, x_leaves)
      total = list(sums)
      done = []
      it = iter(tensors)
      saved = {}
      for j in layout.layers:  # The order InputBackward kept them in.
        if j:
          mask = layout.inputs[j][1]
          saved[j] = [leaves.Spread([next(it) for _ in range(sum(mask))], mask)]
        else:
          saved[j] = [tf.nest.flatten(x)]
        if j < len(self._layers) - 1:
          saved[j].append([next(it) for _ in layout.grads[j]])
        else:
          saved[j].append([out_grads[i] for i in layout.grads[j]])
      targets = [t for t in theta_leaves if _IsDifferentiable(t)]
      with tf.name_scope('recompute') as scope:
        pass  # Every re-run below in this one scope, as in a backward function (for profiling).
      with self._Tracing(step, offset, batch_norm.Discarding(), check_numerics=False):
        for j in reversed(layout.layers):  # Last layer first, one layer's activations at a time.
          xs, grads = saved[j]
          with tf.control_dependencies(done):
            xs = [None if x is None else tf.identity(x) for x in xs]
          template = layout.inputs[j][0] if j else x
          with tf.name_scope(scope):
            out = self._RunLayer(j, theta, tf.nest.pack_sequence_as(template, xs))
          outs = tf.nest.flatten(out)
          pairs = [(outs[i], g) for i, g in zip(layout.grads[j], grads)
                   if _IsDifferentiable(outs[i])]
          if not pairs:
            continue
          results = tf.gradients([y for y, _ in pairs], targets, grad_ys=[g for _, g in pairs])
          done = _AddWeightGradients(total, results, theta_leaves) or done
      self._NoteGradients([a is not b for a, b in zip(total, sums)])
      return leaves.Present(total)

    specs = (self._Leading() + self._theta_specs + self._x_specs + self._DySpecs(dy_mask) +
             list(layout.specs) + [s for s, has in zip(self._theta_specs, theta_mask) if has])
    weight_fn = GraphFunction.Trace(self._name + '_weight_backward', WeightBackward, specs,
                                    self._device)
    self._split[dy_mask] = (input_fn, tuple(dx_mask), layout, weight_fn)

  def _DySpecs(self, dy_mask):
    return [_Spec(y) for y, has in zip(self._forward.outputs[:self._num_y], dy_mask) if has]

  def _NoteGradients(self, got):
    """Records which weights got a gradient (the same in every backward pass of the partition)."""
    got = tuple(got)
    if self._grad_mask is not None and self._grad_mask != got:
      raise AssertionError('%s: %s: weights with gradients differ between backward passes' %
                           (self._where, self._name))
    self._grad_mask = got

  def WeightGradients(self, sums: Sequence[Optional[tf.Tensor]]) -> _PerLeaf:
    """The final running sums as the weights' gradients: None for weights that got none."""
    return [s if has else None for s, has in zip(sums, self._grad_mask or [False] * len(sums))]

  def Backward(self, step: Optional[tf.Tensor], offset: tf.Tensor,
               theta_leaves: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor],
               dys: Sequence[Optional[tf.Tensor]], sums: Optional[Sequence[Optional[tf.Tensor]]]
               ) -> Tuple[_PerLeaf, _PerLeaf, List[tf.Operation]]:
    """One call of the re-computing backward function on the partition's device.

    Args:
      step, offset, theta_leaves, x_leaves: what the forward call got.
      dys: the gradient of each output leaf of Forward (None where there is none).
      sums: the running sum of each weight (None for weights that are not floats) from the
        previous backward pass; written in place (nothing else may read them). None: start from
        zeros (the first backward pass of a step).

    Returns:
      (dx per input leaf or None, running sum per weight or None, the ops the pass is done after).
    """
    dys = [accumulation.Dense(d) for d in dys]
    dy_mask = tuple(d is not None for d in dys)
    if dy_mask not in self._backward:
      self._BuildBackward(dy_mask)
    function, dx_mask = self._backward[dy_mask]
    if sums is None:
      sums = self.Zeros()
    args = (self._LeadingArgs(step, offset) + list(theta_leaves) + list(x_leaves) +
            leaves.Present(dys) + leaves.Present(sums))
    with tf.device(self._device):
      results = Call(function, args, 'backward')
    it = iter(results)
    dx = [next(it) if has else None for has in dx_mask]
    sums = leaves.Spread(list(it), self._theta_mask)
    return dx, sums, _Ops(results)

  def InputBackward(self, step: Optional[tf.Tensor], offset: tf.Tensor,
                    theta_leaves: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor],
                    dys: Sequence[Optional[tf.Tensor]]
                    ) -> Tuple[_PerLeaf, List[tf.Tensor], List[tf.Operation]]:
    """One call of the input-gradient half of a re-computing backward pass (a B action of a
    schedule that splits backward passes).

    It re-computes the partition and returns the input gradients, and keeps what `WeightBackward`
    needs: the inputs and output gradients of each layer that has weights.

    Args:
      step, offset, theta_leaves, x_leaves, dys: as for Backward.

    Returns:
      (dx per input leaf or None, the kept tensors, the ops the pass is done after).
    """
    dys = [accumulation.Dense(d) for d in dys]
    dy_mask = tuple(d is not None for d in dys)
    if dy_mask not in self._split:
      self._BuildSplitBackward(dy_mask)
    function, dx_mask, _, _ = self._split[dy_mask]
    args = (self._LeadingArgs(step, offset) + list(theta_leaves) + list(x_leaves) +
            leaves.Present(dys))
    with tf.device(self._device):
      results = Call(function, args, 'backward')
    num_dx = sum(dx_mask)
    dx = leaves.Spread(results[:num_dx], dx_mask)
    return dx, results[num_dx:], _Ops(results)

  def WeightBackward(self, step: Optional[tf.Tensor], offset: tf.Tensor,
                     theta_leaves: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor],
                     dys: Sequence[Optional[tf.Tensor]], kept: Sequence[tf.Tensor],
                     sums: Optional[Sequence[Optional[tf.Tensor]]]
                     ) -> Tuple[_PerLeaf, List[tf.Operation]]:
    """One call of the weight-gradient half (a W action): re-runs each layer that has weights from
    its kept inputs and adds its weight gradients to the running sums.

    Args:
      step, offset, theta_leaves, x_leaves, dys: what the InputBackward call got.
      kept: its kept tensors.
      sums: as for Backward (None: start from zeros).

    Returns:
      (running sum per weight or None, the ops the pass is done after).
    """
    dys = [accumulation.Dense(d) for d in dys]
    dy_mask = tuple(d is not None for d in dys)
    _, _, _, function = self._split[dy_mask]
    if sums is None:
      sums = self.Zeros()
    args = (self._LeadingArgs(step, offset) + list(theta_leaves) + list(x_leaves) +
            leaves.Present(dys) + list(kept) + leaves.Present(sums))
    with tf.device(self._device):
      results = Call(function, args, 'weight')
    return leaves.Spread(results, self._theta_mask), _Ops(results)

  def NeverRecomputeBackward(self, forward_ys: Sequence[tf.Tensor],
                             theta_leaves: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor],
                             dys: Sequence[Optional[tf.Tensor]],
                             sums: Optional[Sequence[Optional[tf.Tensor]]]
                             ) -> Tuple[_PerLeaf, _PerLeaf, List[tf.Operation]]:
    """The backward pass of a forward call without re-computation (TensorFlow's function gradient).

    TensorFlow rewrites that forward call (made with `differentiable=True`) to also output the
    activations its backward call needs.

    Args:
      forward_ys: the output tensors of the forward call (Forward's third result).
      theta_leaves, x_leaves, dys, sums: as for Backward.

    Returns:
      As Backward.
    """
    pairs = [(y, accumulation.Dense(d)) for y, d in zip(forward_ys, dys) if d is not None]
    weights = [t for t, has in zip(theta_leaves, self._theta_mask) if has]
    targets = [x for x in x_leaves if _IsDifferentiable(x)] + weights
    if sums is None:
      sums = self.Zeros()
    with tf.device(self._device):
      grads = iter(tf.gradients([y for y, _ in pairs], targets, grad_ys=[d for _, d in pairs]))
      dx = [accumulation.Dense(next(grads)) if _IsDifferentiable(x) else None for x in x_leaves]
      own = [accumulation.Dense(g) for g in grads]
      self._NoteGradients(
          [bool(g) for g in leaves.Spread([g is not None for g in own], self._theta_mask)])
      own = [tf.zeros_like(t) if g is None else g for t, g in zip(weights, own)]
      if self._accumulate is None:
        n = len(own)

        def Accumulate(*args):
          return [accumulation.AddInPlace(s, g) for s, g in zip(args[:n], args[n:])]

        self._accumulate = GraphFunction.Trace(self._name + '_accumulate', Accumulate,
                                         [_Spec(g) for g in own] * 2, self._device)
      results = Call(self._accumulate, leaves.Present(sums) + own, 'accumulate')
    return dx, leaves.Spread(results, self._theta_mask), _Ops(results) + _Ops(dx)
