"""One pipelined step's ops from a schedule: one op per action, one control dependency per edge.

The step numbers are those of docs/design.md, "One training step" (TensorPipeLayer builds steps (0)
and (7)); the rules are the schedule's (see `schedule` and docs/design.md). In training, FProp
builds:
  (1) Entry, on device 0: the mini-batch split into M micro-batches.
  (2) Anchor k, on device k: partition k's weights, as its calls read them.
  (3) Every forward action F(k, t), in the schedule's build order: one call of partition k's forward
      function (see `partition_function`), after the actions the schedule's edges name.
  (4) Exit, on the last device: the last partition's outputs joined into the pipeline's output.
When tf.gradients reaches Exit:
  (5) Exit's gradient cuts the output gradient into micro-batches and builds every backward action
      in build order: B(k, t) is one call of partition k's backward function (or, without
      re-computation, of TensorFlow's gradient of F(k, t)), after the actions its edges name; in a
      schedule that splits backward passes, B(k, t) calls the input-gradient function and W(k, t)
      the weight-gradient function on what that B call kept.
  (6) Anchor k's gradient returns partition k's summed weight gradients, and Entry's gradient joins
      the micro-batches' input gradients.

    Entry --x--> F(0,t) --y--> F(1,t) --y--> ... F(K-1,t) --y--> Exit --> loss
      |          Anchor 0 -/    Anchor 1 -/       Anchor K-1 -/    ^
      +-----------+--------------+--------------------+-- tokens --+

Entry and each anchor hand Exit a scalar token, so tf.gradients reaches Exit's gradient (5) before
theirs (6); Exit's gradient gives the calls' outputs none, so tf.gradients never differentiates the
calls (3) itself. The order of the step lives in the schedule only: `_After` turns its edges into
control dependencies, the one place where actions are ordered. Each action is built by the handler
of its task (`schedule.Task`; `_HANDLERS`), and each handler calls the one function of its partition
for that task (see `partition_function`). An edge into a forward action from a backward one (rule
IN_FLIGHT, in 1F1B and zero-bubble) is added to the forward call once step (5) has built the
backward action, which needs a loss gradient that does not wait for the forward passes (checked in
(5)).

A decode step (`DecodeStep`, for TensorPipeLayer.ExtendStep) builds only forward actions, of a
`schedule_builders.DecodeSchedule`, in the same build order and through the same `_After`: each runs
partition k's step on micro-batch t (its `make_partition` object's Forward), taking and returning
partition k's states for t on partition k's device.
"""

import dataclasses
import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from lingvo import compat as tf
from lingvo.core import py_utils

from tensorpipe import batch_dim_check
from tensorpipe import early_shapes
from tensorpipe import leaves
from tensorpipe import micro_batching
from tensorpipe import schedule as schedule_lib
from tensorpipe import tf_internals


def _Token():
  return tf.zeros([], tf.float32, name='token')


@dataclasses.dataclass
class _Call:
  """One forward action's call: what its backward actions re-run and differentiate.

  ys: the forward call's output tensors (set by the forward handler).
  origins: per input leaf, (the partition whose output it is, or -1 for the mini-batch's piece, and
    the index of the leaf among that output's leaves), so input gradients go back to their source.
  """
  k: int  # The partition's index.
  t: int  # The micro-batch's.
  partition: Any  # partition_function.PartitionFunctions
  theta: List[tf.Tensor]
  x_leaves: List[tf.Tensor]
  ys: List[tf.Tensor]
  step: Optional[tf.Tensor]
  offset: tf.Tensor
  origins: List[Tuple[int, int]]
  # The forward call's kept outputs for a selective backward call (see selective_recompute).
  kept: List[tf.Tensor] = dataclasses.field(default_factory=list)


def _Add(a, b):
  return b if a is None else a if b is None else a + b


def _Int64s(values: Sequence[Union[int, tf.Tensor]]) -> List[tf.Tensor]:
  """`values` (ints or integer tensors) as int64 tensors."""
  return [tf.constant(v, tf.int64) if isinstance(v, int) else tf.cast(v, tf.int64) for v in values]


class PipelineStep:
  """Builds the ops of one call of a TensorPipeLayer's FProp (see the module docstring).

  Args:
    sched: the schedule.Schedule to follow.
    make_partition: (k, t, theta NestedMap, inputs of micro-batch t) ->
      partition_function.PartitionFunctions (the same object for micro-batches of one shape).
    devices: the K device strings.
    batch_dim: the batch dimension of the inputs.
    where: names the pipeline in error messages.
    route: (k, micro-batch t's piece of the inputs, the outputs of partitions 0 .. k-1 for t) ->
      partition k's inputs for t, made of those tensors. Default: the piece for partition 0, else
      partition k - 1's outputs. Gradients flow back along the same tensors.
    output_batch_dim: the batch dimension of the outputs (default batch_dim; see
      micro_batching.OutputAxis).
    check_batch_dim: in training, check on the first step of every run that each partition keeps
      examples apart along batch_dim (see `batch_dim_check`).
  """

  def __init__(self, sched: schedule_lib.Schedule,
               make_partition: Callable[[int, int, py_utils.NestedMap, Any], Any],
               devices: Sequence[str], batch_dim: int, where: str,
               route: Optional[Callable[[int, Any, List[Any]], Any]] = None,
               output_batch_dim: Optional[int] = None, check_batch_dim: bool = False):
    self._sched = sched
    self._make_partition = make_partition
    self._devices = devices
    self._batch_dim = batch_dim
    self._output_batch_dim = batch_dim if output_batch_dim is None else output_batch_dim
    self._check_batch_dim = check_batch_dim
    self._where = where
    self._route = route or (lambda k, piece, earlier: earlier[-1] if k else piece)
    self._num_partitions = sched.num_partitions
    self._num_micro = sched.num_micro_batches
    # Set by Run and DecodeStep: per micro-batch its number of examples, and the number of input
    # leaves.
    self._sizes: List[Union[int, tf.Tensor]] = []
    self._num_inputs = 0
    # action -> the ops it is done after
    self._ops: Dict[schedule_lib.Action, List[Any]] = {}
    # action not built yet -> the already built actions that must wait for it
    self._late: Dict[schedule_lib.Action, List[schedule_lib.Action]] = {}
    # F(k, t) -> _Call: its partition functions and what it got and gave.
    self._calls: Dict[schedule_lib.Action, _Call] = {}
    # Step (6)'s gradients, once step (5) is built: per partition its weights', per micro-batch
    # its input leaves'.
    self._weight_grads: Optional[List[List[Optional[tf.Tensor]]]] = None
    self._input_grads: Optional[List[List[Optional[tf.Tensor]]]] = None
    self._exit_outputs: List[tf.Tensor] = []  # The joined outputs, as FProp returns them.
    self._output_names: List[str] = []
    self._checks: List[Any] = []  # Ops every step's weight gradients wait for.
    # Step (5)'s state: per partition its running weight-gradient sums and which weights got a
    # gradient; (k, t) -> (the output gradients B(k, t) got, what it kept for W(k, t), its scope).
    self._sums: List[Any] = []
    self._got: List[Any] = []
    self._kept: Dict[Tuple[int, int], Tuple[List[Any], Any, str]] = {}

  def _After(self, action):
    """Ops built in this context run after what `action` waits for: its edges in the schedule.

    An edge from an action not built yet is kept, and added by `_Built` once that action is.
    """
    for edge in self._sched.Waits(action):
      if edge.before not in self._ops:
        self._late.setdefault(edge.before, []).append(action)
    return tf.control_dependencies(
        [op for edge in self._sched.Waits(action) for op in self._ops.get(edge.before, [])])

  def _Built(self, action, ops):
    """Records `action`'s ops; the actions built earlier that wait for it now run after them."""
    self._ops[action] = ops
    for waiting in self._late.pop(action, []):
      for op in self._ops[waiting]:
        tf_internals.AddControlInputs(op, ops)

  def Run(self, partition_theta: Sequence[py_utils.NestedMap], plan: micro_batching.BatchPlan,
          collector: Any, training: bool) -> Any:
    """Builds the step; returns the pipeline's outputs (structured like the last partition's).

    Args:
      partition_theta: K NestedMaps, partition k's weights.
      plan: the mini-batch (its FProp inputs: tensors, tuples, NestedMaps; None allowed) and its
        micro-batches' sizes and offsets (micro_batching.Plan).
      collector: batch_norm.StatsCollector that gets every forward call's statistics.
      training: build the gradient machinery, steps (1)-(6); else only the forward calls (3)
        between a plain split and a plain join.
    """
    num_micro, num_partitions = self._num_micro, self._num_partitions
    args, self._sizes = plan.args, list(plan.sizes)
    self._num_inputs = len(leaves.Present(args))
    step = py_utils.GetGlobalStep()
    with tf.device(self._devices[0]):
      if step is not None:
        step = tf.cast(step, tf.int64)
      offsets = _Int64s(plan.offsets)
      if training:
        pieces, entry_token = self._Entry(args)  # Step (1).
      else:
        pieces = micro_batching.Split(args, num_micro, self._batch_dim, self._sizes)
    thetas, tokens = [], [entry_token] if training else []
    for k in range(num_partitions):
      theta_leaves = partition_theta[k].Flatten()
      if training and theta_leaves:
        with tf.device(self._devices[k]), tf.name_scope('partition%d_anchor' % k):
          theta_leaves, token = self._Anchor(k, theta_leaves)  # Step (2).
        tokens.append(token)
      thetas.append(theta_leaves)
    outputs = self._Forwards(partition_theta, thetas, pieces, step, offsets, training,
                             collector)  # Step (3).
    last = outputs[-1]
    with tf.device(self._devices[-1]):
      if not training:
        return micro_batching.Concat(last, self._output_batch_dim, self._where)
      out = self._Exit(last, tokens)  # Step (4).
    if self._check_batch_dim:
      self._checks.extend(self._BatchDimChecks(args))
    return out

  def _Forwards(self, partition_theta: Sequence[py_utils.NestedMap], thetas: List[Any],
                pieces: List[Any], step: Any, offsets: List[Any], training: bool, collector: Any,
                states: Optional[Sequence[Sequence[Any]]] = None,
                time_step: Optional[tf.Tensor] = None) -> List[List[Any]]:
    """Every forward action, in build order: step (3), or a decode step's actions when `states` (per
    partition and micro-batch) are given. Returns outputs[k][t]; in a decode step each is (the
    outputs, partition k's new states for micro-batch t)."""
    num_micro, num_partitions = self._num_micro, self._num_partitions
    decoding = states is not None
    outputs: List[List[Any]] = [[None] * num_micro for _ in range(num_partitions)]
    for action in self._sched.BuildOrder((schedule_lib.FORWARD,)):
      k, t = action.partition, action.micro_batch
      inputs = self._route(k, pieces[t], [outputs[j][t][0] if decoding else outputs[j][t]
                                          for j in range(k)])
      if states is not None:  # Decoding.
        # Partition k's decode function takes its states for t and the time step besides its
        # inputs, and returns its new states for t besides its outputs (and the time step).
        inputs = (inputs, states[k][t], time_step)
      x_leaves = leaves.Present(inputs)
      self._calls[action] = _Call(
          k, t, self._make_partition(k, t, partition_theta[k], inputs), thetas[k], x_leaves, [],
          step, offsets[t], [] if decoding else self._Origins(k, t, x_leaves, pieces[t]))
      # Rules FORWARD_INPUT and FORWARD_ORDER: after F(k-1, t) and the device's forward pass
      # before it. Rule IN_FLIGHT's edge from a backward action is added by `_Built` once that
      # action is built in step (5).
      with tf.name_scope('partition%d_mb%d' % (k, t)), self._After(action):
        out, records, ops = self._HANDLERS[self._sched.Task(action)](
            self, self._calls[action], training)
      self._Built(action, ops)
      outputs[k][t] = tuple(out[:2]) if decoding else out
      for update in records if collector is not None else []:
        collector.Add(update)
    return outputs

  def DecodeStep(self, partition_theta: Sequence[py_utils.NestedMap],
                 plan: micro_batching.BatchPlan, states: Sequence[Sequence[Any]],
                 time_step: tf.Tensor) -> Tuple[Any, List[List[Any]]]:
    """One decode step, on a forward-only schedule (`schedule_builders.DecodeSchedule`): micro-batch
    t of the step's inputs goes through the partitions, and partition k's step on it extends
    partition k's states for t. The states are inputs and outputs of ops on partition k's device,
    so they stay there; only the step's activations pass between partitions.

    Args:
      partition_theta: K NestedMaps, partition k's weights.
      plan: the step's inputs (tensors, tuples, NestedMaps; None allowed), split like FProp's,
        and its micro-batches (micro_batching.Plan).
      states: states[k][t], partition k's states for micro-batch t (any structure of tensors).
      time_step: the step's index (int32 scalar), given to every call.

    Returns:
      (the last partition's outputs joined along the output batch axis, the new states[k][t]).
    """
    self._sizes = list(plan.sizes)
    step = py_utils.GetGlobalStep()
    with tf.device(self._devices[0]):
      if step is not None:
        step = tf.cast(step, tf.int64)
      offsets = _Int64s(plan.offsets)
      pieces = micro_batching.Split(plan.args, self._num_micro, self._batch_dim, self._sizes)
    thetas = [theta.Flatten() for theta in partition_theta]
    outputs = self._Forwards(partition_theta, thetas, pieces, step, offsets, False, None, states,
                             time_step)
    with tf.device(self._devices[-1]):
      joined = micro_batching.Concat([out for out, _ in outputs[-1]], self._output_batch_dim,
                                     self._where)
    return joined, [[new for _, new in per_partition] for per_partition in outputs]

  def _BatchDimChecks(self, args):
    """On the first step of every run, each partition's check that it keeps examples apart
    (batch_dim_check), then the run's flag set: later steps skip the checks.

    The checks run one after another in partition order, so where several partitions mix examples
    the error always names the first of them (run side by side, whichever failed first would).
    """
    checks: List[Any] = []
    inputs = batch_dim_check.DescribeInputs(args)
    flag: List[Any] = []  # The run's flag (batch_dim_check.RunFlag), made with the first check.

    def Done():
      if not flag:
        flag.append(batch_dim_check.RunFlag(self._devices[0]))
        with tf.device(self._devices[0]), tf.control_dependencies(None):
          flag.append(batch_dim_check.Checked(flag[0]))
      return flag[1]

    frozen = []
    for k in range(self._num_partitions):
      call = self._calls[self._Forward(k, 0)]
      with tf.device(self._devices[k]), tf.name_scope('partition%d_batch_dim_check' % k), \
          tf.control_dependencies(checks[-1:]):
        check = batch_dim_check.Check(call.partition, call.step, call.offset, call.theta,
                                      call.x_leaves, inputs, Done)
      if check is not None:
        checks.append(check)
        if call.partition.has_batch_norm:
          frozen.append(k)
    if frozen:
      tf.logging.warning(
          '%s: partition(s) %s have batch norm: the batch_dim check probes them with batch norm\'s '
          'moving statistics, so it finds their other layers that mix examples, but not a wrong '
          'batch_dim that only batch norm\'s statistics see (a partition whose other layers all '
          'act on each position alone): check batch_dim=%d by hand for those', self._where,
          ', '.join(map(str, frozen)), self._batch_dim)
    if checks:
      with tf.device(self._devices[0]), tf.control_dependencies(checks):
        checks.append(flag[0].assign(True, read_value=False))
    return checks

  def _Origins(self, k, t, x_leaves, piece):
    """Where each input leaf of F(k, t) comes from (see `_Call`)."""
    sources: Dict[Any, Tuple[int, int]] = {}
    for i, x in enumerate(leaves.Present(piece)):
      sources.setdefault(x.ref(), (-1, i))
    for j in range(k):
      for i, y in enumerate(self._calls[schedule_lib.Action(schedule_lib.FORWARD, j, t)].ys):
        sources.setdefault(y.ref(), (j, i))
    origins = []
    for x in x_leaves:
      if x.ref() not in sources:
        raise AssertionError('%s: an input of partition %d is neither an input of the pipeline nor '
                             'an output of an earlier partition' % (self._where, k))
      origins.append(sources[x.ref()])
    return origins

  def _Entry(self, args):
    """Step (1): the micro-batches of `args` and a token; the gradient is step (6)'s join."""
    num_micro = self._num_micro

    @tf.custom_gradient
    def Entry(*xs):
      parts = micro_batching.Split(leaves.Fill(args, xs), num_micro, self._batch_dim, self._sizes)
      flat = [x for part in parts for x in leaves.Present(part)]

      def Grad(*unused_grads):
        if self._input_grads is None:
          raise AssertionError('%s: input gradients requested before the backward pass was built'
                               % self._where)
        return [self._JoinGradients(x, [dx[j] for dx in self._input_grads])
                for j, x in enumerate(xs)]

      return flat + [_Token()], Grad

    inputs = leaves.Present(args)
    results = Entry(*inputs)
    per = len(inputs)
    parts = [leaves.Fill(args, results[t * per:(t + 1) * per]) for t in range(num_micro)]
    return parts, results[-1]

  def _JoinGradients(self, x, grads):
    """The gradient of an input from its micro-batches' gradients."""
    if all(g is None for g in grads) or not x.dtype.is_floating:
      return None
    if micro_batching.IsBatched(x, self._batch_dim) and self._num_micro > 1:
      if any(g is None for g in grads):
        pieces = micro_batching.Split(tf.zeros_like(x), self._num_micro, self._batch_dim,
                                      self._sizes)
        grads = [p if g is None else g for g, p in zip(grads, pieces)]
      return tf.concat(grads, self._batch_dim)
    return tf.add_n([g for g in grads if g is not None])

  def _Anchor(self, k, theta_leaves):
    """Step (2): partition k's weights and a token; the gradient returns step (6)'s sums."""

    @tf.custom_gradient
    def Anchor(*theta):

      def Grad(*unused_grads):
        if self._weight_grads is None:
          raise AssertionError('%s: weight gradients requested before the backward pass was built'
                               % self._where)
        if not self._checks:
          return self._weight_grads[k]
        # The step's checks (the first step's batch_dim check, the early shapes of step (5)) run
        # before any weight gradient is returned.
        with tf.control_dependencies(self._checks):
          return [None if g is None else tf.identity(g) for g in self._weight_grads[k]]

      return list(theta) + [_Token()], Grad

    results = Anchor(*theta_leaves)
    return results[:-1], results[-1]

  def _Exit(self, last, tokens):
    """Step (4): the joined outputs; the gradient is step (5)."""
    flat = [leaves.Present(out) for out in last]
    per = len(flat[0])

    @tf.custom_gradient
    def Exit(*args):
      ys = [list(args[t * per:(t + 1) * per]) for t in range(self._num_micro)]
      joined = micro_batching.Concat([leaves.Fill(last[0], y) for y in ys],
                                     self._output_batch_dim, self._where)

      def Grad(*dys):
        self._BuildBackward(dys, ys)
        num_ys = per * self._num_micro
        return [None] * num_ys + [tf.zeros_like(token) for token in args[num_ys:]]

      return leaves.Present(joined), Grad

    joined = Exit(*[y for ys in flat for y in ys], *tokens)
    self._exit_outputs = list(joined)
    self._output_names = [name for name, x in zip(micro_batching.LeafNames(last[0], 'outputs'),
                                                  tf.nest.flatten(last[0])) if x is not None]
    return leaves.Fill(last[0], joined)

  def _EarlyShapes(self, out_grads, last_ys):
    """Step (5), in a schedule where forward actions wait for backward ones (IN_FLIGHT): the loss
    gradient's reads of the outputs' shapes are answered without waiting for every forward pass
    (see `early_shapes`), and a loss gradient that depends on their values is refused: the step
    could never finish."""
    # The forward actions that wait, directly or not, for a backward one: what the loss gradient
    # must not wait for.
    waiting = set()
    for action in self._sched.BuildOrder((schedule_lib.FORWARD,)):
      if any(e.before.kind != schedule_lib.FORWARD or e.before in waiting
             for e in self._sched.Waits(action)):
        waiting.add(action)
    forward = {op for action in waiting for op in self._ops[action]}
    total = sum(self._sizes[1:], self._sizes[0])

    def StandIn(first):  # Zeros shaped like the joined output whose first micro-batch is `first`.
      axis = micro_batching.OutputAxis(first, self._output_batch_dim)
      shape = tf.shape(first)
      shape = tf.concat([shape[:axis], [tf.cast(total, shape.dtype)], shape[axis + 1:]], 0)
      with tf.device(self._devices[-1]):
        return tf.zeros(shape, first.dtype, name='output_shape_stand_in')

    stand_ins: Dict[Any, Callable[[], Any]] = {
        out: functools.partial(StandIn, first) for out, first in zip(self._exit_outputs,
                                                                      last_ys[0])}
    grads = [g for g in out_grads if g is not None and hasattr(g, 'op')]
    self._checks.extend(early_shapes.Detach(grads, stand_ins, forward, self._where))
    late = early_shapes.Lateness(forward)
    outputs = {early_shapes.Unwrapped(out).ref(): name
               for out, name in zip(self._exit_outputs, self._output_names)}
    for op in early_shapes.Ancestors(grads, forward):
      if not late(op) or op.type in ('Identity', 'IdentityN'):
        continue
      read = [outputs[early_shapes.Unwrapped(x).ref()] for x in op.inputs
              if early_shapes.Unwrapped(x).ref() in outputs]
      if read or op in forward:
        raise ValueError(
            '%s: the %s schedule runs a micro-batch\'s backward pass before later forward passes, '
            'so the gradient reaching the pipeline\'s outputs may depend on their shapes but not '
            'on their values; it depends on the values of %s through op %r (%s), e.g. a loss '
            'computed from logits after the pipeline. Compute per-example losses inside the '
            'pipeline (in its last layer or a loss_layer) and take only their sum or mean after '
            "it, or use schedule='gpipe'" % (self._where, self._sched.name,
                                             ', '.join(read) or 'its outputs', op.name, op.type))

  def _BuildBackward(self, out_grads, last_ys):
    """Step (5): every backward action, in build order; fills the gradients step (6) returns."""
    num_micro, num_partitions = self._num_micro, self._num_partitions
    # tf.gradients hands outputs the loss does not use zeros_like(output): no gradient, and no
    # reason to wait for the output.
    out_grads = [None if g is not None and getattr(g, 'op', None) is not None and
                 g.op.type == 'ZerosLike' else g for g in out_grads]
    if self._late:
      self._EarlyShapes(out_grads, last_ys)
    # (k, t) -> the gradient of each output leaf of F(k, t), None where none yet
    dys: Dict[Tuple[int, int], List[Any]] = {}
    for t in range(num_micro):
      dys[(num_partitions - 1, t)] = [None] * len(last_ys[t])
    for j, grad in enumerate(out_grads):
      column = [ys[j] for ys in last_ys]
      if grad is None or not column[0].dtype.is_floating:
        continue
      if num_micro == 1:
        pieces = [tf.convert_to_tensor(grad)]
      else:
        pieces = micro_batching.SplitGradient(grad, column, self._output_batch_dim)
      for t in range(num_micro):
        dys[(num_partitions - 1, t)][j] = pieces[t]
    self._sums = [None] * num_partitions
    self._got = [None] * num_partitions
    input_grads = [[None] * self._num_inputs for _ in range(num_micro)]
    # Lingvo builds gradients with colocate_gradients_with_ops, which would pin every op built here
    # to Exit's device; each action is placed on its partition's device instead.
    with tf.compat.v1.colocate_with(None, ignore_existing=True):
      for action in self._sched.BuildOrder((schedule_lib.BACKWARD, schedule_lib.WEIGHT)):
        k, t = action.partition, action.micro_batch
        call = self._calls[self._Forward(k, t)]
        task = self._sched.Task(action)
        if task == schedule_lib.Task.WEIGHT_GRADIENT:
          if (k, t) not in self._kept:
            continue  # B(k, t) had no output gradient: nothing to add.
          grads, _, scope = self._kept[(k, t)]
        else:
          grads = dys.pop((k, t), []) or [None] * len(call.ys)
          if all(g is None for g in grads):
            continue
          scope = None
        # Backward tasks: rules LOSS_OF_EVERY_OUTPUT or PER_EXAMPLE_LOSS, BACKWARD_INPUT,
        # SUM_IN_REVERSE, SUM_IN_ORDER or INPUT_GRADIENT_ORDER, and AWAITING_WEIGHTS. Weight-
        # gradient tasks: WEIGHT_READS_KEPT, WEIGHT_SUM_ORDER and INPUT_GRADIENTS_FIRST. W(k, t)
        # is named in the scope of B(k, t).
        with tf.device(self._devices[k]), tf.name_scope(
            scope or 'partition%d_mb%d' % (k, t)) as scope, self._After(action):
          dx, ops = self._HANDLERS[task](self, call, grads, scope)
        self._Built(action, ops)
        # Each input gradient goes back to the output (or input piece) it came from.
        for g, (source, i) in zip(dx, call.origins):
          if g is None:
            continue
          if source < 0:
            input_grads[t][i] = _Add(input_grads[t][i], g)
          else:
            target = dys.setdefault(
                (source, t), [None] * len(self._calls[self._Forward(source, t)].ys))
            target[i] = _Add(target[i], g)
    self._weight_grads = []
    for k in range(num_partitions):
      call = self._calls[self._Forward(k, 0)]
      self._weight_grads.append([None] * len(call.theta) if self._sums[k] is None else
                                call.partition.WeightGradients(self._sums[k], self._got[k]))
    self._input_grads = input_grads

  # ------------------------------------------------------------------------------------------------
  # The handlers: one per task (schedule.Task), each building one action's call; `_HANDLERS` maps
  # tasks to them. A forward handler returns (outputs, batch-norm records, ops); a backward one
  # (input gradients per input leaf, none for a weight-gradient task; ops).

  def _RunForward(self, call, training):
    out, records, call.ys, call.kept = call.partition.Forward(
        call.step, call.offset, call.theta, call.x_leaves,
        differentiable=training and not self._sched.Recomputes(call.t))
    return out, records, [call.ys[0].op]

  def _Summed(self, k, result):
    """Takes a backward task's running sums for partition k; every task of a partition gives the
    same weights a gradient."""
    if self._got[k] is not None and self._got[k] != result.got:
      raise AssertionError('%s: partition %d: weights with gradients differ between backward tasks'
                           % (self._where, k))
    self._sums[k], self._got[k] = result.sums, result.got
    return result.ops

  def _RunBackward(self, call, grads, unused_scope):
    result = call.partition.Backward(call.step, call.offset, call.theta, call.x_leaves, grads,
                                     self._sums[call.k], call.kept)
    return result.dx, self._Summed(call.k, result)

  def _RunBackwardFromKept(self, call, grads, unused_scope):
    result = call.partition.BackwardFromKept(call.ys, call.theta, call.x_leaves, grads,
                                             self._sums[call.k])
    return result.dx, self._Summed(call.k, result)

  def _RunInputGradient(self, call, grads, scope):
    dx, kept, ops = call.partition.InputGradient(call.step, call.offset, call.theta,
                                                 call.x_leaves, grads)
    self._kept[(call.k, call.t)] = (grads, kept, scope)
    return dx, ops

  def _RunWeightGradient(self, call, grads, unused_scope):
    _, kept, _ = self._kept.pop((call.k, call.t))
    result = call.partition.WeightGradient(call.step, call.offset, call.theta, call.x_leaves,
                                           grads, kept, self._sums[call.k])
    return [], self._Summed(call.k, result)

  # Forward and backward handlers take different arguments; their callers pass the right ones.
  _HANDLERS: Dict[schedule_lib.Task, Callable[..., Any]] = {
      schedule_lib.Task.FORWARD: _RunForward,
      schedule_lib.Task.BACKWARD: _RunBackward,
      schedule_lib.Task.BACKWARD_FROM_KEPT: _RunBackwardFromKept,
      schedule_lib.Task.INPUT_GRADIENT: _RunInputGradient,
      schedule_lib.Task.WEIGHT_GRADIENT: _RunWeightGradient,
  }

  @staticmethod
  def _Forward(k, t):
    return schedule_lib.Action(schedule_lib.FORWARD, k, t)
