"""Selective re-computation: a backward pass re-runs a partition's cheap ops, not its costly ones.

With recompute='selective' (Megatron-LM's selective activation recomputation, Korthikanti et al.
2022), a partition's forward function also outputs the output of every op of `KEPT_OP_TYPES`
(matmuls, einsums, convolutions) its layers make (`KeptOps`, `Kept`); the executor keeps them per
micro-batch until the backward pass, which re-runs the partition as 'always' does and then puts
each kept value in place of the re-run op's output (`Substitute`). Those ops' outputs hold a small
part of a layer's activations (the elementwise ops, norms, softmax and dropout masks after them
hold most), yet their FLOPs are nearly all of its forward pass: re-computation then costs little
while most of the memory saving stays.

Design, and why: the re-run is the same Python code as for 'always', so the layer-by-layer
differentiation (`layer_gradients`), the dropout masks, batch norm and every check stay as they
are; only the graph of the backward function changes after the re-run. Each kept op's output is
replaced, for every op that reads it, by an IdentityN of (the kept value, the op's inputs) whose
output is the kept value and whose gradient is the kept op's own gradient (TensorFlow's registered
one, its override included) with respect to those inputs. The values are exactly the forward
pass's, so the gradients are exactly those of 'always' (the same ops on the same values), and the
re-run op itself is read by nothing: TensorFlow prunes it from the function it instantiates, so it
never runs. This holds because the kept types' gradients read their inputs only, never their
outputs; `CheckUnread` makes sure after the differentiation. Ops inside a function a layer calls
(e.g. Lingvo's CallDefun) are re-run in full.

The alternatives cost more: re-running each layer with the kept outputs passed into its Python
code would need every layer to know of the mode, and differentiating from the kept tensors without
a re-run would need the forward pass's cheap activations too, which is 'never'.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from lingvo import compat as tf

from tensorpipe import layer_gradients
from tensorpipe import per_graph
from tensorpipe import tf_internals

# Op types whose outputs a selective forward pass keeps: the expensive ones (their FLOPs grow with
# a product of dimensions). Each one's gradient reads its inputs only.
KEPT_OP_TYPES = frozenset([
    'MatMul', 'BatchMatMul', 'BatchMatMulV2', 'BatchMatMulV3', 'Einsum', 'Conv2D', 'Conv3D',
    'DepthwiseConv2dNative'])

_GRADIENT_NAME = 'TensorPipeKeptOutput'
# Per function graph: {name of a substituting IdentityN: the re-run op whose output it replaces}.
_REPLACED: per_graph.PerGraph[Dict[str, Any]] = per_graph.PerGraph('selective_recompute', dict)

# Per layer, per kept op in creation order: (op type, output dtype name).
KeptTemplate = Tuple[Tuple[Tuple[str, str], ...], ...]


def KeptTypes(kept_ops: Optional[Sequence[str]], recompute: str) -> frozenset:
  """The op types a selective forward pass keeps, from TensorPipeLayer's selective_kept_ops
  (None: KEPT_OP_TYPES); raises ValueError naming a bad value and the fix."""
  if kept_ops is None:
    return KEPT_OP_TYPES
  if recompute != 'selective':
    raise ValueError("selective_kept_ops=%r applies to recompute='selective' only, got "
                     "recompute=%r: set recompute='selective' or selective_kept_ops=None" %
                     (kept_ops, recompute))
  if isinstance(kept_ops, str) or not kept_ops or any(
      t not in KEPT_OP_TYPES for t in kept_ops):
    raise ValueError('selective_kept_ops=%r must be a non-empty list of op types among %s (ops '
                     'whose gradients read only their inputs)' %
                     (kept_ops, sorted(KEPT_OP_TYPES)))
  return frozenset(kept_ops)


def IsKept(op: tf.Operation, types: frozenset = KEPT_OP_TYPES) -> bool:
  """Whether a selective forward pass keeps `op`'s output: one of `types` with one float
  output."""
  return (op.type in types and len(op.outputs) == 1 and
          layer_gradients.IsDifferentiable(op.outputs[0]))


def _Size(shape, dims=None):
  """The product of `shape`'s dimensions (those at `dims`), or None if one is unknown."""
  values = shape.as_list() if shape.rank is not None else None
  if values is None:
    return None
  values = values if dims is None else [values[d] for d in dims]
  return None if None in values else int(np.prod(values, dtype=np.int64))


def _EinsumContracted(op):
  """The product of the sizes of an Einsum's summed indices (in its inputs, not its output)."""
  inputs, _, output = op.get_attr('equation').decode().replace(' ', '').partition('->')
  sizes = {}
  for subscripts, x in zip(inputs.split(','), op.inputs):
    dims = x.shape.as_list() if x.shape.rank is not None else None
    if dims is None:
      return None
    before, _, after = subscripts.partition('...')
    letters = list(zip(before, dims[:len(before)])) + list(
        zip(after, dims[len(dims) - len(after):] if after else []))
    for letter, size in letters:
      if size is None:
        return None
      sizes[letter] = size
  summed = [size for letter, size in sizes.items() if letter not in output]
  return int(np.prod(summed, dtype=np.int64)) if summed else 1


def OpFlops(op: tf.Operation) -> int:
  """Multiply-adds x 2 of a kept op (IsKept) from its static shapes; 0 where one is unknown."""
  out = _Size(op.outputs[0].shape)
  x = op.inputs[0]
  if out is None or x.shape.rank is None:
    return 0
  if op.type == 'MatMul':
    inner = x.shape.as_list()[-2 if op.get_attr('transpose_a') else -1]
  elif op.type.startswith('BatchMatMul'):
    inner = x.shape.as_list()[-2 if op.get_attr('adj_x') else -1]
  elif op.type == 'Einsum':
    inner = _EinsumContracted(op)
  elif op.type == 'DepthwiseConv2dNative':
    inner = _Size(op.inputs[1].shape, [0, 1])
  else:  # Conv2D, Conv3D: the filter's window and input channels.
    rank = op.inputs[1].shape.rank
    inner = None if rank is None else _Size(op.inputs[1].shape, list(range(rank - 1)))
  return 0 if inner is None else 2 * out * int(inner)


def KeptOps(layer_ops: Sequence[Tuple[str, Sequence[tf.Operation]]],
            types: frozenset = KEPT_OP_TYPES) -> List[List[tf.Operation]]:
  """Per layer (layer_ops: each layer's name and ops, in creation order), its ops of `types`
  with one float output, in creation order."""
  return [[op for op in ops if IsKept(op, types)] for _, ops in layer_ops]


def Kept(layer_ops: Sequence[Tuple[str, Sequence[tf.Operation]]],
         types: frozenset = KEPT_OP_TYPES) -> Tuple[List[tf.Tensor], KeptTemplate]:
  """What a selective forward pass outputs besides its outputs: every kept op's output (ops of
  `types`), in layer and creation order, and the template a re-run's ops are matched against
  (`Substitute`)."""
  per_layer = KeptOps(layer_ops, types)
  template = tuple(tuple((op.type, op.outputs[0].dtype.name) for op in ops) for ops in per_layer)
  return [op.outputs[0] for ops in per_layer for op in ops], template


@tf.RegisterGradient(_GRADIENT_NAME)
def _Gradient(op, *grads):
  """The substituting IdentityN's gradient: none for the kept value, the replaced op's gradient
  for the replaced op's inputs."""
  replaced = _REPLACED.Of(op.graph)[op.name]
  if grads[0] is None:
    return [None] * len(op.inputs)
  return [None] + list(tf_internals.GradientFunction(replaced)(replaced, grads[0]))


def Substitute(layer_ops: Sequence[Tuple[str, Sequence[tf.Operation]]], types: frozenset,
               template: KeptTemplate, kept: Sequence[tf.Tensor], boundaries: List[Any],
               where: str) -> List[tf.Operation]:
  """In a re-run's graph, puts the kept values in place of the kept ops' outputs (see the module
  docstring); the boundaries (each layer's inputs, then the outputs) are updated in place.

  Args:
    layer_ops: the re-run's layers and their ops (partition_trace.PartitionBody.Run).
    types: the kept op types (as for Kept).
    template: Kept's template of the forward pass.
    kept: the forward pass's kept values, as the backward function's arguments.
    boundaries: the re-run's boundaries.
    where: names the partition in errors.

  Returns:
    The replaced ops, for `CheckUnread`.
  """
  per_layer = KeptOps(layer_ops, types)
  found = tuple(tuple((op.type, op.outputs[0].dtype.name) for op in ops) for ops in per_layer)
  if found != template or len(kept) != sum(len(ops) for ops in per_layer):
    raise AssertionError(
        '%s: the re-computation made other matmuls/convolutions than the forward pass (%s, '
        'then %s): a layer whose graph depends on more than its inputs and weights' %
        (where, template, found))
  graph = tf.get_default_graph()
  names = _REPLACED.Of(graph)
  replaced = {}
  ops = [op for layer in per_layer for op in layer]
  for op, value in zip(ops, kept):
    z = op.outputs[0]
    readers = list(z.consumers())
    with graph.name_scope(None), graph.name_scope(op.name + '_kept'), \
        graph.gradient_override_map({'IdentityN': _GRADIENT_NAME}):
      substitute = tf.identity_n([value] + list(op.inputs))[0]
    substitute.set_shape(z.shape)
    names[substitute.op.name] = op
    for reader in readers:
      for i, x in enumerate(reader.inputs):
        if x.op is op:
          tf_internals.UpdateInput(reader, i, substitute)
    replaced[z.ref()] = substitute
  for j, boundary in enumerate(boundaries):
    boundaries[j] = tf.nest.map_structure(
        lambda t: t if t is None else replaced.get(t.ref(), t), boundary)
  return ops


def CheckUnread(replaced: Sequence[tf.Operation], where: str) -> None:
  """Fails if anything reads a replaced op's output, which would make the op run again."""
  for op in replaced:
    if op.outputs[0].consumers():
      raise AssertionError(
          '%s: recompute=\'selective\' re-runs %s (%s): %s reads its output' %
          (where, op.name, op.type, op.outputs[0].consumers()[0].name))
