"""A partition's graph functions: one per task of the schedule, traced once whatever M is.

`PartitionFunctions` turns a partition (its layers, each a function (theta, inputs) -> outputs) into
TensorFlow graph functions placed on the partition's device, one per task (see `schedule.Task`),
each with a declared signature (`graph_function.Signature`) its trace and its calls share:

  forward          (offset, step, theta, x) -> (y, stats, kept_outputs)
  backward         (offset, step, theta, x, dy, sums, kept_outputs) -> (dx, sums)
  input_gradient   (offset, step, theta, x, dy) -> (dx, kept)
  weight_gradient  (offset, step, theta, x, dy, kept, sums) -> (sums)
  zeros            () -> (sums): a zero running sum per weight (a new buffer every step)
  accumulate       (sums, dtheta) -> (sums): for backward passes from kept activations

`step` is empty in a graph without a global step; `stats` are the forward pass's batch-norm
statistics (see `batch_norm`); `kept` is what input_gradient keeps for weight_gradient: per layer
that has weights, the gradients at the outputs of the ops that read them and those ops' other
inputs that their weight gradients need, or the layer's inputs and output gradients where the layer
must be re-run (see `layer_gradients.Keep`). `backward` re-computes the partition from
its saved boundary input x and differentiates it layer by layer (see `layer_gradients`), so only
boundary activations are kept between the passes (GPipe's re-computation); the weight gradients go
into the running sums it is given (see `accumulation`), which the first backward pass of a step gets
from `zeros`. With selective re-computation, `kept_outputs` are the forward pass's outputs of its
matmuls and convolutions, which the backward function puts in place of their re-computation (see
`selective_recompute`); else that group is empty. Without re-computation, the forward call is
differentiated by TensorFlow's own function gradient instead (`BackwardFromKept`), and `accumulate`
adds its gradients.

What differs per micro-batch is a function input: `offset`, the index of the micro-batch's first
example in the mini-batch, so that dropout masks are the same in the forward pass, in its
re-computation and for any K and M (see `randomness`); and the global step. Stateful ops that would
differ between a forward pass and its re-computation are refused when the forward function is
traced (see `stateful_ops`). The executor calls `Forward` in step (3) and the backward tasks in step
(5) of docs/design.md, "One training step"; "Inside a partition's functions" there gives the reason
for each order and attribute.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils

from tensorpipe import accumulation
from tensorpipe import batch_norm
from tensorpipe import graph_function
from tensorpipe import layer_gradients
from tensorpipe import leaves
from tensorpipe import partition_spec
from tensorpipe import partition_trace
from tensorpipe import schedule
from tensorpipe import selective_recompute
from tensorpipe import stateful_ops

PerLeaf = layer_gradients.PerLeaf
_Task = schedule.Task


@dataclasses.dataclass(frozen=True)
class _ForwardFacts:
  """What the forward trace finds: the outputs' structure (None leaves where none), and per
  batch-norm record (its variable, its decay, whether a count follows its value)."""
  out_template: Any
  stats_slots: tuple
  whole_micro_batch_masks: tuple  # Layers whose dropout masks have no batch dimension.
  kept_template: selective_recompute.KeptTemplate  # What a selective forward pass kept.


@dataclasses.dataclass(frozen=True)
class BackwardResult:
  """What a backward task gives: the input gradients (per input leaf, None where none), the
  running sums (per weight, None where none), which weights got a gradient, and the ops the task
  is done after."""
  dx: PerLeaf
  sums: PerLeaf
  got: Tuple[bool, ...]
  ops: List[tf.Operation]


class PartitionFunctions:
  """The graph functions of one partition (see the module docstring), traced on first use.

  Args:
    layers, theta, inputs, spec: as for partition_trace.PartitionBody; `inputs` are micro-batch 0's
      (every micro-batch has the same structure and shapes), and only theta's and their structure,
      shapes and dtypes count. The functions are placed on `spec.device` and named after
      `spec.function_name`; `spec.recomputes` says whether backward passes re-compute the partition
      (see stateful_ops.Check), `spec.kept_op_types` which ops' outputs a selective forward pass
      keeps.
  """

  def __init__(self, layers: partition_trace.LayerFunctions, theta: py_utils.NestedMap,
               inputs: Any, spec: partition_spec.PartitionSpec):
    self._body = partition_trace.PartitionBody(layers, theta, inputs, spec)
    self.spec = spec
    self._selective = spec.kept_op_types is not None
    self._theta_specs = [graph_function.Spec(t) for t in theta.Flatten()]
    in_leaves = tf.nest.flatten(inputs)
    self._in_index = [i for i, x in enumerate(in_leaves) if x is not None]  # The x leaves.
    self._x_specs = [graph_function.Spec(in_leaves[i]) for i in self._in_index]
    self._has_step = py_utils.GetGlobalStep() is not None
    # Which weights have running sums.
    self._theta_mask = tuple(layer_gradients.IsDifferentiable(t) for t in theta.Flatten())
    self._functions: Dict[Any, graph_function.GraphFunction] = {}  # (task, dy mask) -> function

  @property
  def num_inputs(self) -> int:
    """Non-None input leaves (the x of the functions)."""
    return len(self._x_specs)

  @property
  def num_weights(self) -> int:
    """Leaves of theta (the weights the functions take)."""
    return len(self._theta_specs)

  @property
  def has_batch_norm(self) -> bool:
    """Whether the forward function (traced) records batch-norm statistics."""
    return bool(self._ForwardFacts().stats_slots)

  @property
  def layer_names(self) -> List[str]:
    """The names of the partition's layers, in order."""
    return [name for name, _ in self._body.layers]

  def Probe(self, step: Optional[tf.Tensor], offset: tf.Tensor,
            theta_leaves: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor]
            ) -> List[List[tf.Tensor]]:
    """One call of a function that runs the partition and returns every layer's outputs (for
    `batch_dim_check`): per layer, its output leaves (None leaves left out).

    A partition with batch norm runs in evaluation mode: batch norm normalises with its moving
    statistics, so it keeps examples apart and only the other layers can mix them.

    Args:
      step, offset, theta_leaves, x_leaves: as for Forward.
    """
    if 'probe' not in self._functions:
      frozen = self.has_batch_norm

      def ProbeBody(args):
        boundaries: List[Any] = []
        with cluster_factory.SetEval(True if frozen else None):
          self._body.Run(self._Step(args), args['offset'][0], args['theta'], args['x'],
                         batch_norm.Discarding(), boundaries)
        outputs = [leaves.Present(b) for b in boundaries[1:]]
        return {'y': [y for ys in outputs for y in ys]}, [len(ys) for ys in outputs]

      self._functions['probe'] = self._Trace('probe', ProbeBody, self._Leading() + [
          ('theta', self._theta_specs), ('x', self._x_specs)])
    function = self._functions['probe']
    args = dict(self._LeadingValues(step, offset), theta=list(theta_leaves), x=list(x_leaves))
    with tf.device(self.spec.device):
      results, _ = function.Call(args, 'probe')
    ys, out = iter(results['y']), []
    for count in function.facts:
      out.append([next(ys) for _ in range(count)])
    return out

  def MicroBatchDependence(self) -> List[str]:
    """Why the partition's results depend on the micro-batches (empty if they do not): batch
    norm's micro-batch statistics, dropout masks keyed by the whole micro-batch."""
    facts = self._ForwardFacts()
    reasons = []
    for variable, _, _ in facts.stats_slots:
      reason = ('batch norm %s normalises each micro-batch with its own statistics' %
                batch_norm.VariableName(variable).rpartition('/')[0])
      if reason not in reasons:
        reasons.append(reason)
    reasons += ['the dropout mask of %s has no batch dimension, so it is drawn per micro-batch' %
                layer for layer in facts.whole_micro_batch_masks]
    return reasons

  # ------------------------------------------------------------------------------------------------
  # Signatures and traces.

  def _Sums(self, values):
    """The running sums (one per weight, None where a weight has none) as a group."""
    return [s if has else None for s, has in zip(values, self._theta_mask)]

  def _Leading(self):
    """The specs of the offset and step groups, the first of every task function's inputs."""
    spec = tf.TensorSpec([], tf.int64)
    return [('offset', [spec]), ('step', [spec] if self._has_step else [])]

  def _LeadingValues(self, step, offset):
    """A call's offset and step groups (see `_Leading`)."""
    if (step is not None) != self._has_step:
      raise ValueError('%s: %s was traced %s a global step' %
                       (self.spec.where, self.spec.function_name,
                        'with' if self._has_step else 'without'))
    return {'offset': [offset], 'step': [step] if self._has_step else []}

  @staticmethod
  def _Step(args):
    """The global step of a function body's input groups, or None in a graph without one."""
    return args['step'][0] if args['step'] else None

  def _DySpecs(self, dy_mask):
    ys = self._Function(_Task.FORWARD).outputs.groups[0][1]
    return [s if has else None for s, has in zip(ys, dy_mask)]

  def _Function(self, task: schedule.Task, dy_mask: Optional[Tuple[bool, ...]] = None
                ) -> graph_function.GraphFunction:
    """The traced function of `task` (for output gradients present as `dy_mask`), traced once."""
    key = (task, dy_mask)
    if key not in self._functions:
      # The tracers of the backward tasks take the output gradients' mask.
      tracers: Dict[schedule.Task, Callable[..., graph_function.GraphFunction]] = {
          _Task.FORWARD: self._TraceForward, _Task.BACKWARD: self._TraceBackward,
          _Task.INPUT_GRADIENT: self._TraceInputGradient,
          _Task.WEIGHT_GRADIENT: self._TraceWeightGradient}
      trace = tracers[task]
      self._functions[key] = trace(dy_mask) if dy_mask is not None else trace()
    return self._functions[key]

  def _Trace(self, task, body, groups):
    return graph_function.GraphFunction.Trace(
        '%s_%s' % (self.spec.function_name, task), body, graph_function.Signature.Of(groups),
        self.spec.device)

  def _ForwardFacts(self) -> _ForwardFacts:
    return self._Function(_Task.FORWARD).facts

  def _TraceForward(self):

    def Forward(args):
      step, offset = self._Step(args), args['offset'][0]
      recorder = batch_norm.StatsCollector(1, self.spec.where)
      out, layer_ops, masks = self._body.Run(step, offset, args['theta'], args['x'], recorder)
      ys = leaves.Present(out)
      for y in ys:
        if not isinstance(y, tf.Tensor):
          raise TypeError('%s: partition outputs must be tensors (None allowed), got %s' %
                          (self.spec.where, type(y).__name__))
      records = recorder.Records()
      stats = [t for u in records for t in [u.value] + ([u.count] if u.count is not None else [])]
      kept_types = self.spec.kept_op_types  # None unless re-computation is selective.
      kept, template = (selective_recompute.Kept(layer_ops, kept_types)
                        if kept_types is not None else ([], ()))
      facts = _ForwardFacts(out, tuple((u.variable, u.decay, u.count is not None) for u in records),
                            tuple(masks), template)
      return {'y': ys, 'stats': stats, 'kept_outputs': kept}, (facts, layer_ops)

    function = self._Trace('forward', Forward, self._Leading() + [
        ('theta', self._theta_specs), ('x', self._x_specs)])
    facts, layer_ops = function.facts
    stateful_ops.Check(function.concrete.graph, layer_ops, self.spec.recomputes,
                       '%s (%s)' % (self.spec.where, self.spec.function_name))
    self._body.CheckCaptures(function.captured_inputs)
    return dataclasses.replace(function, facts=facts)

  def _OutGrads(self, dys):
    """The gradient of each leaf of the partition's outputs (flattened), from the dy group."""
    return leaves.Fill(self._ForwardFacts().out_template, dys, flat=True)

  def _Recompute(self, args, boundaries):
    """The partition re-run in a backward function body from its saved inputs; returns each
    layer's ops."""
    step = self._Step(args)
    with tf.name_scope('recompute'):
      _, layer_ops, _ = self._body.Run(step, args['offset'][0], args['theta'], args['x'],
                                       batch_norm.Discarding(), boundaries)
    return layer_ops

  def _TraceBackward(self, dy_mask):
    forward = self._Function(_Task.FORWARD)
    where = '%s (%s)' % (self.spec.where, self.spec.function_name)

    def BackwardBody(args):
      boundaries: List[Any] = []
      layer_ops = self._Recompute(args, boundaries)
      replaced = []
      kept_types = self.spec.kept_op_types  # None unless re-computation is selective.
      if kept_types is not None:
        replaced = selective_recompute.Substitute(
            layer_ops, kept_types, forward.facts.kept_template, args['kept_outputs'],
            boundaries, where)
      sums = args['sums']
      grads, new_sums = layer_gradients.LayerGradients(
          boundaries, self._OutGrads(args['dy']), args['theta'], sums)
      selective_recompute.CheckUnread(replaced, where)
      assert new_sums is not None  # Given sums, LayerGradients returns them.
      got = tuple(a is not b for a, b in zip(new_sums, sums))
      return {'dx': [grads[0][i] for i in self._in_index], 'sums': new_sums}, got

    return self._Trace('backward', BackwardBody, self._Leading() + [
        ('theta', self._theta_specs), ('x', self._x_specs), ('dy', self._DySpecs(dy_mask)),
        ('sums', self._Sums(self._theta_specs)),
        ('kept_outputs', list(forward.outputs.groups[2][1]))])

  @staticmethod
  def _Shared(args):
    """The tensors both halves of a split backward pass get as arguments, in one order (see
    layer_gradients.Keep): what the input-gradient half need not keep for the other."""
    return [t for group in ('offset', 'step', 'theta', 'x', 'dy') for t in args[group]
            if t is not None]

  def _TraceInputGradient(self, dy_mask):

    def InputGradient(args):
      boundaries: List[Any] = []
      layer_ops = self._Recompute(args, boundaries)
      reads = layer_gradients.WeightReads(boundaries, layer_ops, args['theta'])
      grads, read_grads = layer_gradients.InputGradients(
          boundaries, self._OutGrads(args['dy']),
          layer_gradients.ReadOutputs(reads, len(layer_ops)))
      kept, layout = layer_gradients.Keep(boundaries, grads, reads, read_grads,
                                          self._Shared(args))
      return {'dx': [grads[0][i] for i in self._in_index], 'kept': kept}, layout

    return self._Trace('input_backward', InputGradient, self._Leading() + [
        ('theta', self._theta_specs), ('x', self._x_specs), ('dy', self._DySpecs(dy_mask))])

  def _TraceWeightGradient(self, dy_mask):
    # Where the kept tensors come from is what the input-gradient trace for the same dy mask found.
    input_function = self._Function(_Task.INPUT_GRADIENT, dy_mask)
    layout = input_function.facts

    def WeightGradient(args):
      step = self._Step(args)
      theta, _ = self._body.Pack(args['theta'], args['x'])
      with tf.name_scope('recompute') as scope:
        pass  # Every re-run below in this one scope, as in a backward function (for profiling).

      def RunLayer(j, inputs):
        with tf.name_scope(scope):
          return self._body.RunLayer(j, theta, inputs)

      with self._body.Tracing(step, args['offset'][0], batch_norm.Discarding(),
                              check_numerics=False):
        total = layer_gradients.WeightGradients(layout, args['kept'], self._Shared(args),
                                                RunLayer, args['theta'], args['sums'])
      got = tuple(a is not b for a, b in zip(total, args['sums']))
      return {'sums': total}, got

    return self._Trace('weight_backward', WeightGradient, self._Leading() + [
        ('theta', self._theta_specs), ('x', self._x_specs), ('dy', self._DySpecs(dy_mask)),
        ('kept', input_function.outputs.groups[1][1]), ('sums', self._Sums(self._theta_specs))])

  # ------------------------------------------------------------------------------------------------
  # Calls: one per task.

  def Forward(self, step: Optional[tf.Tensor], offset: tf.Tensor,
              theta_leaves: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor],
              differentiable: bool = False
              ) -> Tuple[Any, List[batch_norm.Update], List[tf.Tensor], List[tf.Tensor]]:
    """One call of the forward function on the partition's device (a forward task).

    Args:
      step: the global step (int64 scalar) or None if the graph has none.
      offset: the index of the micro-batch's first example in the mini-batch (int64 scalar).
      theta_leaves: the partition's weights (theta.Flatten()).
      x_leaves: the micro-batch's non-None input leaves.
      differentiable: make the call with TensorFlow's own call op, whose gradient
        `BackwardFromKept` uses; else a call op that tf.gradients cannot differentiate.

    Returns:
      (outputs structure, [batch_norm.Update] of the call, the call's output tensors, its kept
      outputs for a selective backward call (empty unless `selective`)).
    """
    function = self._Function(_Task.FORWARD)
    args = dict(self._LeadingValues(step, offset), theta=list(theta_leaves), x=list(x_leaves))
    with tf.device(self.spec.device):
      results, _ = (function.CallDifferentiable(args, 'forward') if differentiable else
                    function.Call(args, 'forward'))
    facts = function.facts
    records = []
    it = iter(results['stats'])
    for variable, decay, has_count in facts.stats_slots:
      value = next(it)
      records.append(batch_norm.Update(variable, value, decay, next(it) if has_count else None))
    return (leaves.Fill(facts.out_template, results['y']), records, results['y'],
            results['kept_outputs'])

  def Zeros(self) -> PerLeaf:
    """One call of the function that makes a zero running sum per weight (None where none)."""
    if 'zeros' not in self._functions:
      specs = [s for s in self._Sums(self._theta_specs) if s is not None]

      def MakeZeros(unused_args):
        return {'sums': [accumulation.Zeros(s.shape, s.dtype) for s in specs]}, None

      self._functions['zeros'] = self._Trace('zeros', MakeZeros, [])
    with tf.device(self.spec.device):
      results, _ = self._functions['zeros'].Call({}, 'zeros')
    return leaves.Spread(results['sums'], self._theta_mask)

  def _BackwardArgs(self, step, offset, theta_leaves, x_leaves, dys):
    dys = [accumulation.Dense(d) for d in dys]
    args = dict(self._LeadingValues(step, offset), theta=list(theta_leaves), x=list(x_leaves),
                dy=dys)
    return args, tuple(d is not None for d in dys)

  def Backward(self, step: Optional[tf.Tensor], offset: tf.Tensor,
               theta_leaves: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor],
               dys: Sequence[Optional[tf.Tensor]], sums: Optional[PerLeaf],
               kept_outputs: Sequence[tf.Tensor] = ()) -> BackwardResult:
    """One call of the re-computing backward function (a backward task).

    Args:
      step, offset, theta_leaves, x_leaves: what the forward call got.
      dys: the gradient of each output leaf of Forward (None where there is none).
      sums: the running sum of each weight (None for weights that are not floats) from the
        previous backward pass; written in place (nothing else may read them). None: start from
        zeros (the first backward pass of a step).
      kept_outputs: the forward call's kept outputs (Forward's fourth result; empty unless
        `selective`).
    """
    args, dy_mask = self._BackwardArgs(step, offset, theta_leaves, x_leaves, dys)
    function = self._Function(_Task.BACKWARD, dy_mask)
    args['sums'] = self._Sums(self.Zeros() if sums is None else sums)
    args['kept_outputs'] = list(kept_outputs)
    with tf.device(self.spec.device):
      results, op = function.Call(args, 'backward')
    return BackwardResult(results['dx'], results['sums'], function.facts, [op])

  def InputGradient(self, step: Optional[tf.Tensor], offset: tf.Tensor,
                    theta_leaves: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor],
                    dys: Sequence[Optional[tf.Tensor]]
                    ) -> Tuple[PerLeaf, List[tf.Tensor], List[tf.Operation]]:
    """One call of the input-gradient half of a re-computing backward pass (an input-gradient
    task): the input gradients, and what `WeightGradient` needs (see layer_gradients.Keep).

    Returns:
      (dx per input leaf or None, the kept tensors, the ops the task is done after).
    """
    args, dy_mask = self._BackwardArgs(step, offset, theta_leaves, x_leaves, dys)
    with tf.device(self.spec.device):
      results, op = self._Function(_Task.INPUT_GRADIENT, dy_mask).Call(args, 'backward')
    return results['dx'], results['kept'], [op]

  def WeightGradient(self, step: Optional[tf.Tensor], offset: tf.Tensor,
                     theta_leaves: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor],
                     dys: Sequence[Optional[tf.Tensor]], kept: Sequence[tf.Tensor],
                     sums: Optional[PerLeaf]) -> BackwardResult:
    """One call of the weight-gradient half (a weight-gradient task): adds each layer's weight
    gradients, from what InputGradient kept, to the running sums (see
    layer_gradients.WeightGradients).

    Args:
      step, offset, theta_leaves, x_leaves, dys: what the InputGradient call got.
      kept: its kept tensors.
      sums: as for Backward (None: start from zeros).
    """
    args, dy_mask = self._BackwardArgs(step, offset, theta_leaves, x_leaves, dys)
    function = self._Function(_Task.WEIGHT_GRADIENT, dy_mask)
    args['kept'] = list(kept)
    args['sums'] = self._Sums(self.Zeros() if sums is None else sums)
    with tf.device(self.spec.device):
      results, op = function.Call(args, 'weight')
    return BackwardResult([], results['sums'], function.facts, [op])

  def BackwardFromKept(self, forward_ys: Sequence[tf.Tensor], theta_leaves: Sequence[tf.Tensor],
                       x_leaves: Sequence[tf.Tensor], dys: Sequence[Optional[tf.Tensor]],
                       sums: Optional[PerLeaf]) -> BackwardResult:
    """The backward task of a forward call without re-computation (TensorFlow's function gradient).

    TensorFlow rewrites that forward call (made with `differentiable=True`) to also output the
    activations its backward call needs.

    Args:
      forward_ys: the output tensors of the forward call (Forward's third result).
      theta_leaves, x_leaves, dys, sums: as for Backward.
    """
    pairs = [(y, accumulation.Dense(d)) for y, d in zip(forward_ys, dys) if d is not None]
    weights = [t for t, has in zip(theta_leaves, self._theta_mask) if has]
    targets = [x for x in x_leaves if layer_gradients.IsDifferentiable(x)] + weights
    if sums is None:
      sums = self.Zeros()
    with tf.device(self.spec.device):
      grads = iter(tf.gradients([y for y, _ in pairs], targets, grad_ys=[d for _, d in pairs]))
      dx = [accumulation.Dense(next(grads)) if layer_gradients.IsDifferentiable(x) else None
            for x in x_leaves]
      own = [accumulation.Dense(g) for g in grads]
      got = tuple(bool(g) for g in leaves.Spread([g is not None for g in own], self._theta_mask))
      own = [tf.zeros_like(t) if g is None else g for t, g in zip(weights, own)]
      if 'accumulate' not in self._functions:

        def Accumulate(args):
          return {'sums': [accumulation.AddInPlace(s, g)
                           for s, g in zip(args['sums'], args['dtheta'])]}, None

        specs = [graph_function.Spec(g) for g in own]
        self._functions['accumulate'] = self._Trace('accumulate', Accumulate,
                                                    [('sums', specs), ('dtheta', specs)])
      results, op = self._functions['accumulate'].Call(
          {'sums': leaves.Present(sums), 'dtheta': own}, 'accumulate')
    dx_ops = [g.op for g in dx if g is not None]
    return BackwardResult(dx, leaves.Spread(results['sums'], self._theta_mask), got,
                    [op] + [o for i, o in enumerate(dx_ops) if o not in dx_ops[:i]])

  def WeightGradients(self, sums: Sequence[Optional[tf.Tensor]], got: Sequence[bool]) -> PerLeaf:
    """The final running sums as the weights' gradients: None for weights that got none."""
    return [s if has else None for s, has in zip(sums, got)]
