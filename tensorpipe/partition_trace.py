"""A partition's layers run inside a trace: the context they see, and the checks on what they use.

`PartitionBody` runs a partition's layers, in order, inside the body of one of its graph functions
(see `partition_function`): in one trace context (`trace_context.Partition`: no Lingvo asserts or
summaries, the global step and example offset of the call, batch-norm statistics to a collector,
stateful entry points routed, 2-D weight gradients), each layer with the same dropout masks and
seeds whenever it runs. Every layer is checked for shortcuts: a tensor an earlier layer computed
used other than through the layer's inputs, whose gradient the layer-by-layer backward pass would
lose. `RunInline` runs the same layers on a whole mini-batch outside any function, as an unpipelined
reference; `InlinePartition` runs them so on one micro-batch, for a decode step. """

import contextlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from lingvo import compat as tf
from lingvo.core import py_utils

from tensorpipe import batch_norm
from tensorpipe import layer_gradients
from tensorpipe import leaves
from tensorpipe import partition_spec
from tensorpipe import per_graph
from tensorpipe import stateful_ops
from tensorpipe import tf_internals
from tensorpipe import trace_context

# A partition's layers: (layer name, function (theta NestedMap, inputs structure) -> outputs).
LayerFunctions = Sequence[Tuple[str, Callable[[py_utils.NestedMap, Any], Any]]]
# (layer name, the ops its trace made), per layer of one run.
LayerOps = List[Tuple[str, List[tf.Operation]]]

# Per traced function graph: {op name: the layer whose trace made it}, to name a shortcut's source.
_PRODUCERS: per_graph.PerGraph[Dict[str, str]] = per_graph.PerGraph('partition_trace', dict)


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


@contextlib.contextmanager
def _LayerContext(spec, step, offset, collector, check_numerics):
  """What a partition's layers run in (see `trace_context.Partition`), with the stateful entry
  points routed (see `stateful_ops`); yields what the trace noted (`trace_context.Routing`)."""
  with trace_context.Partition(spec, step, offset, collector, check_numerics,
                               routes=stateful_ops.Routes) as context:
    yield context.routing


def _RunLayer(layer, scope, theta, inputs, place):
  """One layer (name, function) on `inputs`: the same dropout masks and seeds whenever it runs.

  `scope`: the pipeline's variable scope, which with the layer's name keys its dropout sites. An
  error raised inside the layer gets a note naming the layer and `place` (the partition), which
  Python prints under the error's own message.
  """
  name, fn = layer
  with trace_context.LayerScope('%s/%s' % (scope, name)):
    try:
      return fn(theta, inputs)
    except Exception as e:  # pylint: disable=broad-except
      e.add_note('(raised by layer %r while %s was traced)' % (name, place))
      raise


def RunInline(layers: LayerFunctions, theta: py_utils.NestedMap, inputs: Any,
              step: Optional[tf.Tensor], collector: batch_norm.StatsCollector,
              spec: partition_spec.PartitionSpec) -> Any:
  """Runs `layers` in order on one whole mini-batch in the current graph, as a partition's forward
  function would run them on a micro-batch starting at example 0: the same dropout masks, seeds
  and batch-norm records, with TensorFlow's own gradients (an unpipelined reference)."""
  out = inputs
  with _LayerContext(spec, step, tf.constant(0, tf.int64), collector, True):
    for layer in layers:
      out = _RunLayer(layer, spec.scope, theta, out, 'the unpipelined %s' % spec.where)
  return out


class InlinePartition:
  """A partition's layers built as ops of the caller's graph, called as PartitionFunctions.Forward
  is: a decode step's partitions (see TensorPipeLayer.ExtendStep).

  A decode step is built once, in its loop's body, so its graph does not grow with the number of
  steps; inline ops spare each call the cost of a function call and let ops of neighbouring
  micro-batches interleave. The loop body holds one copy of the partition per micro-batch.

  Args:
    body: the partition's layers (a PartitionBody), run on its spec's device.
  """

  def __init__(self, body: 'PartitionBody'):
    self._body = body

  def Forward(self, step: Optional[tf.Tensor], offset: tf.Tensor,
              theta_leaves: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor],
              differentiable: bool = False) -> Tuple[Any, list, List[tf.Tensor], list]:
    """The layers on one micro-batch, on the partition's device: (outputs, no batch-norm records,
    the output tensors, no kept outputs). `offset` and `differentiable` are not used: nothing here
    is re-computed or differentiated by the pipeline."""
    del offset, differentiable
    with tf.device(self._body.spec.device):
      out = self._body.RunInline(step, theta_leaves, x_leaves)
    return out, [], leaves.Present(out), []


class PartitionBody:
  """A partition's layers as its graph functions' bodies run them.

  Args:
    layers: (layer name, function (theta NestedMap, inputs structure) -> outputs structure), one
      per layer, applied in order. They must read the weights from theta only and get every tensor
      they use from their inputs or theta.
    theta: NestedMap of the partition's weights (only its structure counts).
    inputs: the inputs of a micro-batch (only its structure counts).
    spec: the partition (its pipeline's names, batch_dim, examples per micro-batch, ...).
  """

  def __init__(self, layers: LayerFunctions, theta: py_utils.NestedMap, inputs: Any,
               spec: partition_spec.PartitionSpec):
    self.layers = list(layers)
    self.spec = spec
    self._theta = theta
    self._in_template = inputs

  def Pack(self, theta_leaves: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor]
           ) -> Tuple[Any, Any]:
    """(theta NestedMap, inputs structure) from their leaves (the inputs' present leaves)."""
    return self._theta.Pack(list(theta_leaves)), leaves.Fill(self._in_template, x_leaves)

  def RunInline(self, step: Optional[tf.Tensor], theta_leaves: Sequence[tf.Tensor],
                x_leaves: Sequence[tf.Tensor]) -> Any:
    """The layers on `x_leaves` as ops of the caller's graph (see `RunInline`), in evaluation's
    terms: example offset 0, batch-norm statistics discarded."""
    theta, inputs = self.Pack(theta_leaves, x_leaves)
    return RunInline(self.layers, theta, inputs, step, batch_norm.Discarding(), self.spec)

  def Tracing(self, step, offset, collector, check_numerics):
    """The context the partition's layers are traced in, inside a function body."""
    return _LayerContext(self.spec, step, offset, collector, check_numerics)

  def RunLayer(self, j: int, theta: py_utils.NestedMap, inputs: Any) -> Any:
    """Layer j on `inputs`, within `Tracing`: the same dropout masks and seeds whenever it runs."""
    return _RunLayer(self.layers[j], self.spec.scope, theta, inputs,
                     '%s, partition function %s' % (self.spec.where, self.spec.function_name))

  def Run(self, step: Optional[tf.Tensor], offset: tf.Tensor, theta_leaves: Sequence[tf.Tensor],
          x_leaves: Sequence[tf.Tensor], collector: batch_norm.StatsCollector,
          boundaries: Optional[list] = None) -> Tuple[Any, LayerOps, List[str]]:
    """Runs the partition inside a function body.

    `boundaries`, if given, gets every layer's inputs and then the outputs: a re-computation, which
    skips Lingvo's CheckNumerics. Every layer is checked for shortcuts (`_CheckShortcuts`).

    Returns:
      (the outputs, each layer's ops, the layers whose dropout masks have no batch dimension).
    """
    theta, out = self.Pack(theta_leaves, x_leaves)
    graph = tf.get_default_graph()
    layer_ops = []
    producers = _PRODUCERS.Of(graph)
    with self.Tracing(step, offset, collector, check_numerics=boundaries is None) as notes:
      for j, (name, _) in enumerate(self.layers):
        if boundaries is not None:
          if boundaries:
            # LayerGradients stops each layer's differentiation at its inputs. tf.gradients
            # ignores stop_gradients at the outputs of a function call op (e.g. the layer norm of
            # Lingvo's py_utils.CallDefun) and would differentiate the layer before this one too.
            out = tf.nest.map_structure(lambda t: None if t is None else tf.identity(t), out)
          boundaries.append(out)
        first = len(graph.get_operations())
        captured = len(tf_internals.ExternalCaptures(graph))
        inputs = out
        out = self.RunLayer(j, theta, out)
        ops = graph.get_operations()[first:]
        self._CheckShortcuts(graph, j, ops, inputs, tf_internals.ExternalCaptures(graph)[captured:],
                             producers)
        producers.update((op.name, name) for op in ops)
        layer_ops.append((name, ops))
      masks = list(notes.whole_micro_batch_masks)
    if boundaries is not None:
      boundaries.append(out)
    return out, layer_ops, masks

  def _CheckShortcuts(self, graph, j, ops, inputs, captures, producers):
    """Refuses a layer that uses a tensor an earlier layer computed other than through its inputs.

    Its gradient would be lost (tf.gradients is taken layer by layer, from each layer's inputs), and
    across partitions the tensor lives in another function's graph (TensorFlow fails later with an
    unreadable error). Declared skip connections arrive as inputs, so they pass.
    """
    name = self.layers[j][0]
    outer = tf_internals.EnclosingGraphs(graph)
    for tensor in captures:
      if tensor.graph not in outer:
        source = (_PRODUCERS.Peek(tensor.graph) or {}).get(tensor.op.name)
        self._RaiseShortcut(name, tensor, source, 'another partition\'s function (%s)' %
                            tensor.graph.name)
    allowed = {x.ref() for x in leaves.Present(inputs)}
    arguments = tf_internals.ArgumentOps(graph)
    for op in ops:
      for x in op.inputs:
        source = producers.get(x.op.name)
        if (source is None or source == name or x.ref() in allowed or
            not layer_gradients.IsDifferentiable(x) or not _DependsOn(x.op, arguments)):
          continue
        self._RaiseShortcut(name, x, source, 'this partition')

  def _RaiseShortcut(self, name, tensor, source, place):
    raise ValueError(
        '%s: layer %r (in %s) uses tensor %r, which %s computed in %s, but not through its '
        'inputs: a shortcut the pipeline does not know of, whose gradient would be lost. Declare '
        'it as a skip connection, skip_connections=[(%r, %r)], and take it as the last argument '
        'of %r\'s FProp' % (self.spec.where, name, self.spec.function_name, tensor.name,
                              'layer %r' % source if source else 'an earlier layer', place,
                              source or 'SOURCE', name, name))

  def CheckCaptures(self, captured_inputs: Sequence[tf.Tensor]) -> None:
    """Refuses a trace that read trainable variables directly (their gradients would be lost)."""
    captured = {id(c) for c in captured_inputs}
    direct = [v.op.name for v in tf.trainable_variables() if id(v.handle) in captured]
    if direct:
      raise ValueError(
          '%s: a layer of %s reads trainable variables %s directly instead of through theta; '
          'their gradients would be lost. Use the theta passed to FProp.' %
          (self.spec.where, self.spec.function_name, direct))
