"""The loss gradient's reads of the pipeline outputs' shapes, answered before forward passes end.

In 1F1B and zero-bubble, micro-batch t's backward pass starts before later forward passes, so the
gradient reaching the pipeline's outputs must not wait for them. With a batch (or sequence) size
known only when the graph runs, TensorFlow's gradient of a sum or mean, of a broadcasting product
and of a division by `tf.shape(x)[0]` reads the run-time shape of the joined outputs (a Shape op),
and a Shape op waits for its input to be computed: for every forward pass.

`Detach` rewires those reads. Each shape-only op in the loss gradient (Shape, Size, ZerosLike, ...)
that reads a tensor computed from the pipeline's outputs reads instead a stand-in of the same shape:
the same ops re-run on zeros shaped like the outputs, whose shape is known once the first
micro-batch's forward pass is done (its non-batch dimensions) and from the batch size. Values never
flow through a stand-in, only shapes, and a check that runs with the weight gradients compares
every stand-in's shape with the real one, so a shape that depends on values fails loudly instead of
silently. Ops whose output shape depends on values (Where, Unique, ...) or that are stateful are
refused with a message naming them.
"""

import collections
from typing import AbstractSet, Any, Callable, Dict, List, Sequence

from lingvo import compat as tf

from tensorpipe import check_failure
from tensorpipe import tf_internals

# Ops that read only their input's shape (and dtype), never its values.
SHAPE_READS = frozenset(['Shape', 'ShapeN', 'Size', 'Rank', 'ZerosLike', 'OnesLike'])
# Ops whose output shape depends on their input's values: zeros would give another shape.
_VALUE_SHAPED = frozenset(['Where', 'Unique', 'UniqueV2', 'UniqueWithCounts',
                           'UniqueWithCountsV2', 'DynamicPartition', 'ListDiff',
                           'NonMaxSuppression', 'NonMaxSuppressionV2', 'NonMaxSuppressionV3',
                           'NonMaxSuppressionV4', 'NonMaxSuppressionV5', 'StringSplit',
                           'StringSplitV2', 'RaggedRange', 'Bincount', 'DenseBincount'])
_IDENTITIES = frozenset(['Identity', 'IdentityN', 'StopGradient', 'PreventGradient'])


class Lateness:
  """Whether an op depends (through data or control inputs) on any of `forward_ops`."""

  def __init__(self, forward_ops):
    self._late = {op: True for op in forward_ops}

  def __call__(self, op: tf.Operation) -> bool:
    if op in self._late:
      return self._late[op]
    stack = [op]
    while stack:  # Iterative post-order: loss graphs can be deep.
      top = stack[-1]
      if top in self._late:
        stack.pop()
        continue
      pending = [x for x in _Inputs(top) if x not in self._late]
      if pending:
        stack.extend(pending)
        continue
      self._late[top] = any(self._late[x] for x in _Inputs(top))
      stack.pop()
    return self._late[op]


def _Inputs(op):
  return [t.op for t in op.inputs] + list(op.control_inputs)


def Ancestors(tensors: Sequence[tf.Tensor],
              stop: AbstractSet[tf.Operation] = frozenset()) -> List[tf.Operation]:
  """The ops `tensors` are computed from (data and control inputs), nearest first, not looking
  past the ops in `stop` (e.g. the forward passes, whose ancestors are the whole model)."""
  seen, order = set(), []
  todo = collections.deque(t.op for t in tensors if t is not None and hasattr(t, 'op'))
  while todo:
    op = todo.popleft()
    if op in seen:
      continue
    seen.add(op)
    order.append(op)
    if op not in stop:
      todo.extend(_Inputs(op))
  return order


def Unwrapped(tensor: tf.Tensor) -> tf.Tensor:
  """`tensor` without the identities around it (e.g. the pipeline output behind FProp's)."""
  while tensor.op.type in _IDENTITIES:
    tensor = tensor.op.inputs[tensor.value_index if tensor.op.type == 'IdentityN' else 0]
  return tensor


class _Copier:
  """Re-creates the ops between the pipeline's outputs and a late tensor on stand-in inputs."""

  def __init__(self, stand_ins: Dict[tf.Tensor, Callable[[], tf.Tensor]], late: Lateness,
               where: str):
    self._stand_in_fns = {t.ref(): fn for t, fn in stand_ins.items()}
    self._copies: Dict[Any, tf.Tensor] = {}  # tensor ref -> its stand-in
    self._late = late
    self._where = where

  def StandIn(self, tensor: tf.Tensor) -> tf.Tensor:
    """`tensor` re-computed on the stand-ins: a given stand-in, or a copy of its op (made once)."""
    key = tensor.ref()
    if key in self._copies:
      return self._copies[key]
    if key in self._stand_in_fns:
      self._copies[key] = self._stand_in_fns[key]()
      return self._copies[key]
    op = tensor.op
    if op.type in _IDENTITIES:
      copy = self.StandIn(op.inputs[tensor.value_index if op.type == 'IdentityN' else 0])
    else:
      self._Check(op, tensor)
      inputs = [self.StandIn(x) if self._late(x.op) else x for x in op.inputs]
      attrs = {name: op.node_def.attr[name] for name in op.node_def.attr}
      with tf.device(op.device), tf.control_dependencies(
          [c for c in op.control_inputs if not self._late(c)]):
        new = tf.get_default_graph().create_op(
            op.type, inputs, [t.dtype for t in op.outputs], attrs=attrs,
            name=op.name.split('/')[-1] + '_shape_stand_in')
      for out, copy_out in zip(op.outputs, new.outputs):
        self._copies[out.ref()] = copy_out
      copy = new.outputs[tensor.value_index]
    self._copies[key] = copy
    return copy

  def _Check(self, op, tensor):
    reason = None
    if op.type in _VALUE_SHAPED:
      reason = 'its output shape depends on the values'
    elif tf_internals.IsStateful(op):
      reason = 'it is stateful'
    elif any(op.node_def.attr[a].HasField('func') for a in op.node_def.attr):
      reason = 'it calls a function'
    elif op.type in ('Switch', 'Merge', 'Enter', 'Exit', 'NextIteration', 'LoopCond'):
      reason = 'it is control flow'
    if reason:
      raise ValueError(
          '%s: the loss gradient reads the run-time shape of %r, which is computed from the '
          "pipeline's outputs through op %r (%s), so the shape is only known once every forward "
          'pass is done, and a 1F1B-style schedule cannot start its backward passes early. '
          "Compute that shape from the pipeline's inputs instead (e.g. divide by the number of "
          "examples or non-padded tokens of the input batch), or use schedule='gpipe'" %
          (self._where, tensor.name, op.name, reason))


def Detach(grads: Sequence[tf.Tensor], stand_ins: Dict[tf.Tensor, Callable[[], tf.Tensor]],
           forward_ops: AbstractSet[tf.Operation], where: str) -> List[tf.Operation]:
  """Rewires every shape read in the ancestry of `grads` whose input is late to a stand-in.

  Args:
    grads: the gradients that reach the pipeline's outputs.
    stand_ins: {joined output tensor: () -> zeros of its shape, computed without waiting for the
      forward passes}.
    forward_ops: the ops of the forward passes.
    where: names the pipeline in errors.

  Returns:
    Checks (assert ops) that every stand-in has the shape it stands for; they wait for the forward
    passes, so run them with something that does (e.g. the weight gradients).
  """
  late = Lateness(forward_ops)
  copier = _Copier(stand_ins, late, where)
  checks = []
  for op in Ancestors(grads, forward_ops):
    if op.type not in SHAPE_READS or not late(op):
      continue
    for index, x in enumerate(list(op.inputs)):
      if not late(x.op):
        continue
      stand_in = copier.StandIn(x)
      tf_internals.UpdateInput(op, index, stand_in)
      with tf.device(x.device):
        checks.append(check_failure.Assert(
            tf.reduce_all(tf.equal(tf.shape(x), tf.shape(stand_in))),
            ['%s: a shape the loss gradient read early differs from that of %s: ' %
             (where, x.name), tf.shape(stand_in), ' read, ', tf.shape(x),
             " computed; compute per-example losses inside the pipeline or use "
             "schedule='gpipe'"]))
  return checks
