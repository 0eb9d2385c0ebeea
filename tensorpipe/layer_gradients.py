"""A partition's gradients taken layer by layer, last layer first, inside a backward function.

A backward function re-computes its partition and keeps each layer's inputs (its boundaries); it
differentiates one layer at a time from its output gradients to its inputs and weights
(`LayerGradients`), so only one layer's gradient ops are alive at a time, and adds each layer's
weight gradients into the running sums as soon as they exist (see `accumulation`).

A split backward pass runs no layer twice where it need not. The input-gradient pass
(`InputGradients`) also takes the gradients at the outputs of the ops that read weights
(`WeightReads`: a MatMul, a convolution, a bias add, batch norm's Mul and Sub), which lie on the
path to the input gradients anyway, and keeps them with what those ops' weight gradients need of
their other inputs (`Keep`). The weight-gradient pass (`WeightGradients`) re-creates only those ops
and differentiates them with respect to the weights given the kept gradients: the forward ops
themselves are pruned, and a weight's gradient is the sum over the ops that read it (the chain
rule). A layer whose weights go through control flow, a function call, a stateful op or an op
without a gradient is re-run from its kept inputs instead.

Each layer's pass waits until the weight gradients of the layer after it have been added to their
sums. Left alone, the executor may run the chain of input gradients far ahead of the cheap
weight-gradient ops beside it (a bias gradient's reduction, the additions), and every layer's
output gradient and weight gradient would stay alive until they run.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from lingvo import compat as tf

from tensorpipe import accumulation
from tensorpipe import tf_internals

# One entry per leaf (or per weight), None where it has none.
PerLeaf = List[Optional[tf.Tensor]]


def IsDifferentiable(t: tf.Tensor) -> bool:
  return t.dtype.is_floating or t.dtype.is_complex


def AddWeightGradients(total: PerLeaf, grads: Sequence[Any], theta_leaves: Sequence[tf.Tensor]
                       ) -> List[tf.Tensor]:
  """Adds `grads` (one per differentiable weight, None allowed) into the running sums `total` in
  place; returns the sums added to."""
  own = iter(grads)
  added = []
  for i, t in enumerate(theta_leaves):
    g = accumulation.Dense(next(own)) if IsDifferentiable(t) else None
    if g is None:
      continue
    if total[i] is None:
      raise AssertionError('no running sum for weight %d (%s)' % (i, t.name))
    total[i] = accumulation.AddInPlace(total[i], g)
    added.append(total[i])
  return added


def LayerGradients(boundaries: Sequence[Any], out_grads: Sequence[Optional[tf.Tensor]],
                   theta_leaves: Sequence[tf.Tensor], sums: Optional[PerLeaf] = None
                   ) -> Tuple[List[PerLeaf], Optional[PerLeaf]]:
  """Gradients of a partition, differentiated layer by layer, last layer first.

  Args:
    boundaries: every layer's inputs, then the partition's outputs (structures).
    out_grads: the gradient of each leaf of the partition's outputs (flattened), None where none.
    theta_leaves: the partition's weights.
    sums: running sums per weight (None where a weight has no gradient), added to in place; None:
      input gradients only (a weight-gradient pass adds the weights' later, `WeightGradients`).

  Returns:
    (per boundary, the gradient of each of its leaves (flattened) or None; the sums or None).
  """
  grads, total, _ = _Gradients(boundaries, out_grads, theta_leaves, sums, None)
  return grads, total


def InputGradients(boundaries: Sequence[Any], out_grads: Sequence[Optional[tf.Tensor]],
                   at: Sequence[Sequence[tf.Tensor]]
                   ) -> Tuple[List[PerLeaf], List[PerLeaf]]:
  """LayerGradients without sums (input gradients only), and the gradients at tensors `at[j]`
  inside each layer j, taken in the same differentiation as its input gradients (tensors between
  its inputs and outputs cost nothing more). Returns (per boundary, per layer `at`)."""
  grads, _, at_grads = _Gradients(boundaries, out_grads, [], None, at)
  return grads, at_grads


def _Gradients(boundaries, out_grads, theta_leaves, sums, at):
  """LayerGradients, and per layer the gradients at the tensors `at[j]` (None: none)."""
  num_layers = len(boundaries) - 1
  targets = [t for t in theta_leaves if IsDifferentiable(t)] if sums is not None else []
  total = None if sums is None else list(sums)
  done: List[Any] = []
  grads: List[Any] = [None] * num_layers + [list(out_grads)]  # Per boundary, once reached.
  at_grads = [[None] * len(at[j]) if at else [] for j in range(num_layers)]
  for j in reversed(range(num_layers)):
    ins = tf.nest.flatten(boundaries[j])
    grads[j] = [None] * len(ins)
    pairs = [(y, d) for y, d in zip(tf.nest.flatten(boundaries[j + 1]), grads[j + 1])
             if y is not None and d is not None and IsDifferentiable(y)]
    if not pairs:
      continue
    with tf.control_dependencies(done):
      grad_ys = [tf.identity(d) for _, d in pairs]
    diff = [i for i, x in enumerate(ins) if x is not None and IsDifferentiable(x)]
    inside = list(at[j]) if at else []
    results = tf.gradients([y for y, _ in pairs], [ins[i] for i in diff] + inside + targets,
                           grad_ys=grad_ys, stop_gradients=[ins[i] for i in diff])
    for i, g in zip(diff, results):
      grads[j][i] = accumulation.Dense(g)
    at_grads[j] = [accumulation.Dense(g) for g in results[len(diff):len(diff) + len(inside)]]
    if total is not None:
      done = AddWeightGradients(total, results[len(diff) + len(inside):], theta_leaves) or done
  return grads, total, at_grads


# Op types whose outputs are not a function of their inputs and attributes alone, or that TensorFlow
# gives control-flow meaning (TF1 control flow): never re-created.
_NOT_RECREATED = frozenset([
    'Placeholder', 'PlaceholderWithDefault', 'Enter', 'RefEnter', 'Exit', 'RefExit', 'Switch',
    'RefSwitch', 'Merge', 'RefMerge', 'NextIteration', 'RefNextIteration', 'LoopCond',
    'ControlTrigger'])
# Ops that read only their input's shape.
_SHAPE_READERS = frozenset(['Shape', 'ShapeN', 'Size', 'Rank'])
_OPAQUE_DTYPES = (tf.resource, tf.variant, tf.string)
# What a reading op's weight gradient needs of each of its inputs, in increasing order: nothing (a
# stand-in of its shape), its shape, its value. Its weight inputs are re-created from the weights.
_NOTHING, _SHAPE, _VALUE, _WEIGHTS = 'nothing', 'shape', 'value', 'weights'
_ORDER = {_NOTHING: 0, _SHAPE: 1, _VALUE: 2}
# (op type, attributes, input dtypes and shapes, weight inputs) -> needs, see `_Needs`.
_NEEDS_CACHE: Dict[Any, Any] = {}


def _Recreate(op: tf.Operation, inputs: Sequence[tf.Tensor]) -> tf.Operation:
  """An op of `op`'s type and attributes (its gradient override too) on `inputs`, named as `op`,
  in the default graph."""
  graph = tf.get_default_graph()
  with graph.name_scope(None):
    return graph.create_op(op.type, list(inputs), [y.dtype for y in op.outputs], name=op.name,
                           attrs=tf_internals.AttributesButColocation(op))


def _CanRecreate(op: tf.Operation) -> bool:
  """Whether `op` can be made again elsewhere with the same outputs for the same inputs."""
  return (op.type not in _NOT_RECREATED and (op.inputs or op.type == 'Const') and
          not tf_internals.IsStateful(op) and
          not any(v.HasField('func') or v.list.func for v in op.node_def.attr.values()) and
          not any(t.dtype.base_dtype in _OPAQUE_DTYPES for t in list(op.inputs) + op.outputs))


def _Needs(op: tf.Operation, weighted: Tuple[int, ...]) -> Optional[Tuple[str, ...]]:
  """Per input of `op`, what the gradient with respect to its inputs `weighted` needs of it (the
  weighted ones: _WEIGHTS), found by building that gradient on placeholders in a graph of its own;
  None if `op` has no registered gradient."""
  shapes = tuple((x.dtype, None if x.shape.rank is None else tuple(x.shape.as_list()))
                 for x in op.inputs)
  key = (op.type, tuple(sorted((k, v.SerializeToString()) for k, v in
                               tf_internals.AttributesButColocation(op).items())),
         shapes, weighted)
  if key not in _NEEDS_CACHE:
    with tf.Graph().as_default():
      ins = [tf.placeholder(x.dtype, x.shape) for x in op.inputs]
      copy = _Recreate(op, ins)
      ys = [y for y in copy.outputs if IsDifferentiable(y)]
      try:
        grads = tf.gradients(ys, [ins[i] for i in weighted],
                             grad_ys=[tf.placeholder(y.dtype, y.shape) for y in ys])
      except LookupError:
        _NEEDS_CACHE[key] = None
        return None
    needs = [_WEIGHTS if i in weighted else _NOTHING for i in range(len(ins))]
    index = {x.op: i for i, x in enumerate(ins)}
    todo = [t.op for t in tf.nest.flatten(grads, expand_composites=True) if t is not None]
    seen = set()
    while todo:
      top = todo.pop()
      if top in seen:
        continue
      seen.add(top)
      if top is copy:  # The gradient reads the op's outputs: the op itself runs.
        needs = [n if n == _WEIGHTS else _VALUE for n in needs]
        continue
      for x in top.inputs:
        i = index.get(x.op)
        if i is None:
          todo.append(x.op)
        elif needs[i] != _WEIGHTS:
          need = _SHAPE if top.type in _SHAPE_READERS else _VALUE
          needs[i] = max(needs[i], need, key=lambda n: _ORDER[n])
      todo.extend(top.control_inputs)
    _NEEDS_CACHE[key] = tuple(needs)
  return _NEEDS_CACHE[key]


@dataclasses.dataclass(frozen=True)
class LayerReads:
  """How layer j reads the weights. `ops`: the ops that combine tensors made from the weights
  alone with other tensors; the layer's weight gradient is the sum of theirs given the gradients
  at their outputs, and `needs` says, per op and input, what that needs (_WEIGHTS: re-created from
  the weights). `ops` None: the layer must be re-run (`why` says why)."""
  j: int
  ops: Optional[Tuple[tf.Operation, ...]]
  needs: Optional[Tuple[Tuple[str, ...], ...]]
  why: str = ''


def WeightReads(boundaries: Sequence[Any], layer_ops: Sequence[Tuple[str, Sequence[tf.Operation]]],
                theta_leaves: Sequence[tf.Tensor]) -> List[LayerReads]:
  """Per layer that reads weights (in order), how (see `LayerReads`).

  Within layer j's ops (in creation order, so inputs first), an op is re-creatable from the
  weights if it is deterministic and stateless, calls no function, is no control flow, and reads
  only weights and re-creatable ops' outputs. The other ops that read a weight-derived float
  tensor are the layer's reading ops: every path from a weight to the layer's outputs leaves the
  re-creatable ops through one of them. The layer is re-run instead if a reading op cannot be
  re-created, has no gradient, or if a weight-derived tensor leaves the layer.
  """
  theta = {t.ref() for t in theta_leaves}
  weights = {t.ref() for t in theta_leaves if IsDifferentiable(t)}
  out = []
  for j, (_, ops) in enumerate(layer_ops):
    if not any(x.ref() in theta for op in ops for x in op.inputs):
      continue  # No weights, nothing for a weight-gradient pass to do.
    mine = set(ops)
    recreated = set()  # Re-creatable ops.
    derived = set(weights)  # Refs of weight-derived tensors (weights included).
    readers, why = [], ''
    for op in ops:
      reads = [x.ref() in derived for x in op.inputs]
      if _CanRecreate(op) and all(x.ref() in theta or x.op in recreated for x in op.inputs):
        recreated.add(op)
        if any(reads):
          derived.update(y.ref() for y in op.outputs)
      elif any(reads):
        readers.append(op)
    outputs = {y.ref() for y in tf.nest.flatten(boundaries[j + 1]) if y is not None}
    for op in readers:
      if not _CanRecreate(op):
        why = 'op %s (%s) reads weights and cannot be re-created' % (op.name, op.type)
        break
    for op in recreated:
      for y in op.outputs:
        if y.ref() in derived and (y.ref() in outputs or
                                   any(c not in mine for c in y.consumers())):
          why = why or 'weight-derived tensor %s leaves the layer' % y.name
    if any(y in weights for y in outputs):
      why = why or 'a weight is an output of the layer'
    needs = []
    for op in readers if not why else []:
      weighted = tuple(i for i, x in enumerate(op.inputs)
                       if x.ref() in theta or x.op in recreated)
      need = _Needs(op, weighted)
      if need is None:
        why = 'op %s (%s) has no gradient' % (op.name, op.type)
        break
      needs.append(need)
    if why:
      out.append(LayerReads(j, None, None, why))
    else:
      out.append(LayerReads(j, tuple(readers), tuple(needs)))
  return out


def ReadOutputs(reads: Sequence[LayerReads], num_layers: int) -> List[List[tf.Tensor]]:
  """Per layer, the float outputs of its reading ops, whose gradients the weight-gradient pass
  needs (for `InputGradients`)."""
  at: List[List[tf.Tensor]] = [[] for _ in range(num_layers)]
  for r in reads:
    for op in r.ops or ():
      at[r.j].extend(y for y in op.outputs if IsDifferentiable(y))
  return at


# Where the weight-gradient pass finds a tensor of the input-gradient pass: ('shared', i): the
# i-th tensor both passes get as arguments; ('kept', i): the i-th kept tensor; ('weights', t): t
# re-created from the weights; ('stand_in', shape, dtype, source of its run-time shape or None): a
# tensor of that shape whose values are not read.
Source = tuple


@dataclasses.dataclass(frozen=True)
class RerunLayer:
  """A layer the weight-gradient pass re-runs: its index, its inputs structure (None leaves), the
  Source of each input leaf (None where absent), the positions of its output leaves that have
  gradients and their Sources."""
  j: int
  template: Any
  inputs: Tuple[Optional[Source], ...]
  grad_index: Tuple[int, ...]
  grads: Tuple[Source, ...]


@dataclasses.dataclass(frozen=True)
class RereadLayer:
  """A layer whose weight gradient the weight-gradient pass takes from its reading ops alone:
  per op, (the op, the Source of each input, the Source of the gradient at each output or None)."""
  j: int
  ops: Tuple[Tuple[tf.Operation, Tuple[Source, ...], Tuple[Optional[Source], ...]], ...]


@dataclasses.dataclass(frozen=True)
class KeptLayout:
  """Where the weight-gradient pass finds what it needs: per layer that reads weights (in order),
  a RerunLayer or a RereadLayer; and the shared tensors of the input-gradient pass (see `Keep`)."""
  layers: tuple
  shared: tuple


class _Keeper:
  """Sources of tensors: shared ones by position, the others kept once each."""

  def __init__(self, shared):
    self.kept = []
    self._index = {t.ref(): ('shared', i) for i, t in enumerate(shared)}

  def Source(self, t):
    if t.ref() not in self._index:
      self._index[t.ref()] = ('kept', len(self.kept))
      self.kept.append(t)
    return self._index[t.ref()]


def Keep(boundaries: Sequence[Any], grads: Sequence[PerLeaf], reads: Sequence[LayerReads],
         read_grads: Sequence[PerLeaf], shared: Sequence[tf.Tensor]
         ) -> Tuple[List[tf.Tensor], KeptLayout]:
  """What a weight-gradient pass needs of an input-gradient pass, each tensor once: per layer
  that reads weights, the gradients at its reading ops' outputs and what their weight gradients
  need of their other inputs, or, where the layer must be re-run, its inputs and output gradients.

  Args:
    boundaries, grads: InputGradients' arguments and per-boundary results.
    reads: WeightReads' result.
    read_grads: InputGradients' gradients at ReadOutputs(reads).
    shared: tensors the weight-gradient pass gets as arguments too (the partition's weights,
      inputs and output gradients), by position: never kept.

  Returns:
    (the kept tensors, where the weight-gradient pass finds each tensor it needs).
  """
  keeper = _Keeper(shared)
  layers: List[Union[RerunLayer, RereadLayer]] = []
  for r in reads:
    if r.ops is None:
      xs = tf.nest.flatten(boundaries[r.j])
      grad_index = tuple(i for i, g in enumerate(grads[r.j + 1]) if g is not None)
      layers.append(RerunLayer(
          r.j, tf.nest.map_structure(lambda _: None, boundaries[r.j]),
          tuple(None if x is None else keeper.Source(x) for x in xs), grad_index,
          tuple(keeper.Source(grads[r.j + 1][i]) for i in grad_index)))
      continue
    assert r.needs is not None  # Set with r.ops (LayerReads).
    at = iter(read_grads[r.j])
    ops: List[Tuple[tf.Operation, Tuple[Source, ...], Tuple[Optional[Source], ...]]] = []
    for op, needs in zip(r.ops, r.needs):
      dys = [next(at) if IsDifferentiable(y) else None for y in op.outputs]
      dzs = tuple(None if d is None else keeper.Source(d) for d in dys)
      if not any(dzs):
        continue  # No gradient reaches the op's outputs.
      ins: List[Source] = []
      for x, need in zip(op.inputs, needs):
        if need == _WEIGHTS:
          ins.append(('weights', x))
        elif need == _VALUE:
          ins.append(keeper.Source(x))
        else:
          shape = None if x.shape.is_fully_defined() else keeper.Source(tf.shape(x))
          ins.append(('stand_in', x.shape, x.dtype, shape))
      ops.append((op, tuple(ins), dzs))
    layers.append(RereadLayer(r.j, tuple(ops)))
  return keeper.kept, KeptLayout(tuple(layers), tuple(shared))


def WeightGradients(layout: KeptLayout, kept: Sequence[tf.Tensor], shared: Sequence[tf.Tensor],
                    run_layer: Callable[[int, Any], Any], theta_leaves: Sequence[tf.Tensor],
                    sums: PerLeaf) -> PerLeaf:
  """The weight-gradient pass: `sums` plus every layer's weight gradients, last layer first.

  A RereadLayer's reading ops are re-created on their kept inputs and on their weight inputs,
  re-created from `theta_leaves`, and differentiated with respect to the weights given the kept
  gradients at their outputs: no forward op runs unless an op's gradient reads its outputs. A
  RerunLayer is re-run from its kept inputs and differentiated given its output gradients.

  Args:
    layout, kept: Keep's results (the kept tensors as this pass's arguments).
    shared: the tensors at the positions of Keep's `shared`, as this pass's arguments. They must
      not depend on the weights (each layer is differentiated with respect to every weight).
    run_layer: (j, inputs structure) -> layer j's outputs structure, re-run in the caller's trace
      context.
    theta_leaves: the partition's weights.
    sums: the running sums, added to in place.
  """
  total = list(sums)
  targets = [t for t in theta_leaves if IsDifferentiable(t)]
  done: List[Any] = []
  for layer in reversed(layout.layers):  # One layer's tensors at a time.
    tensors = _LayerTensors(layout, kept, shared, done)
    if isinstance(layer, RerunLayer):
      xs = [None if s is None else tensors.Get(s) for s in layer.inputs]
      outs = tf.nest.flatten(run_layer(layer.j, tf.nest.pack_sequence_as(layer.template, xs)))
      pairs = [(outs[i], tensors.Get(s)) for i, s in zip(layer.grad_index, layer.grads)
               if IsDifferentiable(outs[i])]
    else:
      pairs = []
      for op, ins, dzs in layer.ops:
        copy = _Recreate(op, [tensors.Input(s) for s in ins])
        pairs += [(y, tensors.Get(d)) for y, d in zip(copy.outputs, dzs) if d is not None]
    if not pairs:
      continue
    results = tf.gradients([y for y, _ in pairs], targets, grad_ys=[g for _, g in pairs])
    done = AddWeightGradients(total, results, theta_leaves) or done
  return total


class _LayerTensors:
  """The tensors of one layer's weight-gradient pass: shared and kept ones, each read once after
  the ops `done` (the previous layer's additions), and tensors re-created from the weights."""

  def __init__(self, layout, kept, shared, done):
    self._kept, self._shared, self._done = kept, shared, done
    self._positions = {t.ref(): i for i, t in enumerate(layout.shared)}
    self._read = {}
    self._copies = {}

  def Get(self, source: Source) -> tf.Tensor:
    """The tensor of a 'shared' or 'kept' Source."""
    if source not in self._read:
      with tf.control_dependencies(self._done):
        self._read[source] = tf.identity(
            (self._shared if source[0] == 'shared' else self._kept)[source[1]])
    return self._read[source]

  def Rebuilt(self, t: tf.Tensor) -> tf.Tensor:
    """`t` of the input-gradient pass made again from the weights (shared)."""
    if t.ref() in self._positions:
      return self._shared[self._positions[t.ref()]]
    if t.op not in self._copies:
      self._copies[t.op] = _Recreate(t.op, [self.Rebuilt(x) for x in t.op.inputs])
    return self._copies[t.op].outputs[t.value_index]

  def Input(self, source: Source) -> tf.Tensor:
    """The tensor of any Source, for a re-created op's input."""
    if source[0] == 'weights':
      return self.Rebuilt(source[1])
    if source[0] == 'stand_in':
      _, shape, dtype, dynamic = source
      if dynamic is None:
        return tf.zeros(shape, dtype)
      stand_in = tf.zeros(self.Get(dynamic), dtype)
      stand_in.set_shape(shape)
      return stand_in
    return self.Get(source)
