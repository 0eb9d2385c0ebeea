"""Micro-batching: split a mini-batch of N examples into M micro-batches and join the outputs.

Inputs may be a tensor, a tuple/list, or a NestedMap whose fields may be None. Every tensor whose
rank is larger than `batch_dim` is batched: all of them must agree on the batch size N, and each is
split into M slices along `batch_dim`. Tensors of lower rank (e.g. a scalar) and None are given
unchanged to every micro-batch. M need not divide N: the first N mod M micro-batches get one
example more than the others (`Sizes`), so sizes differ by at most one, and the joined outputs and
summed gradients are still those of the whole mini-batch. Outputs are joined along their own batch
axis (`OutputAxis`): `batch_dim`, or another axis the pipeline names, and axis 0 of a rank-1 output.
`Plan` makes a mini-batch's whole plan (N, M, sizes, offsets) in one call, every value checked.
The executor splits in step (1), joins in step (4) and cuts the output gradient in step (5)
(docs/design.md, "One training step").
"""

import dataclasses
from typing import Any, Callable, List, Optional, Sequence, Union

from lingvo import compat as tf

from tensorpipe import accumulation
from tensorpipe import check_failure


def NumMicroBatches(batch_size: Optional[int], num_micro_batches: Optional[int] = None,
                    micro_batch_size: Optional[int] = None, where: str = 'TensorPipeLayer') -> int:
  """Returns M for a mini-batch of `batch_size` examples, checking every value it is given.

  Exactly one of `num_micro_batches` and `micro_batch_size` decides M; `batch_size` may be None when
  it is only known when the graph runs (then M must come from `num_micro_batches`). M need not
  divide the batch (see `Sizes`); `micro_batch_size` gives the fewest micro-batches of at most that
  many examples.
  """
  if micro_batch_size is not None:
    if not isinstance(micro_batch_size, int) or micro_batch_size < 1:
      raise ValueError('%s: micro_batch_size must be a positive integer, got %r' %
                       (where, micro_batch_size))
    if batch_size is None:
      raise ValueError('%s: micro_batch_size=%d needs a static batch size, but the batch dimension '
                       'is unknown when the graph is built; set num_micro_batches instead' %
                       (where, micro_batch_size))
    m = -(-batch_size // micro_batch_size)
    if num_micro_batches is not None and num_micro_batches != m:
      raise ValueError('%s: num_micro_batches=%r and micro_batch_size=%d disagree for batch %d '
                       '(that micro-batch size gives %d micro-batches); set only one of them' %
                       (where, num_micro_batches, micro_batch_size, batch_size, m))
    return m
  if num_micro_batches is None:
    raise ValueError('%s: set num_micro_batches or micro_batch_size' % where)
  if not isinstance(num_micro_batches, int) or num_micro_batches < 1:
    raise ValueError('%s: num_micro_batches must be an integer >= 1, got %r' %
                     (where, num_micro_batches))
  if batch_size is not None and num_micro_batches > batch_size:
    raise ValueError('%s: num_micro_batches %d is larger than the batch %d; every micro-batch '
                     'needs an example' % (where, num_micro_batches, batch_size))
  return num_micro_batches


def Sizes(batch_size: Union[int, tf.Tensor], num_micro_batches: int) -> List[Union[int, tf.Tensor]]:
  """Examples in each of M micro-batches of a batch of `batch_size` (an int, or a run-time tensor).

  The first N mod M micro-batches get one example more than the others, as numpy.array_split does.
  Returns ints for an int batch size, else int32 scalar tensors.
  """
  m = num_micro_batches
  if isinstance(batch_size, int):
    q, r = divmod(batch_size, m)
    return [q + (1 if t < r else 0) for t in range(m)]
  n = tf.cast(batch_size, tf.int32)
  q, r = n // m, n % m
  return [q + tf.cast(t < r, tf.int32) for t in range(m)]


def Offsets(sizes: Sequence[Union[int, tf.Tensor]]) -> List[Union[int, tf.Tensor]]:
  """Each micro-batch's first example's index in the mini-batch, from the micro-batch sizes."""
  offsets, total = [], 0
  for size in sizes:
    offsets.append(total)
    total = total + size
  return offsets


def IsEven(sizes: Sequence[Union[int, tf.Tensor]]) -> bool:
  """Whether `sizes` are known to be equal when the graph is built."""
  return all(isinstance(s, int) for s in sizes) and len(set(sizes)) == 1


def IsBatched(x: Any, batch_dim: int) -> bool:
  """Whether `x` is a tensor of known rank with a `batch_dim` axis (so it is split and joined)."""
  return isinstance(x, tf.Tensor) and x.shape.rank is not None and x.shape.rank > batch_dim


def LeafNames(structure: Any, prefix: str = 'args') -> List[str]:
  """Readable paths of the leaves of `structure` (e.g. 'args[0].vec'), in tf.nest.flatten order."""
  if isinstance(structure, dict):
    return [n for k in sorted(structure) for n in LeafNames(structure[k], '%s.%s' % (prefix, k))]
  if isinstance(structure, (list, tuple)):
    return [n for i, v in enumerate(structure) for n in LeafNames(v, '%s[%d]' % (prefix, i))]
  return [prefix]


def BatchSize(structure: Any, batch_dim: int, where: str = 'TensorPipeLayer') -> Optional[int]:
  """The batch size N shared by all batched tensors of `structure` (None if only known at run time).

  Raises ValueError naming the disagreeing inputs when batch sizes differ, and when nothing is
  batched; TypeError for a leaf that is not a tensor.
  """
  leaves = tf.nest.flatten(structure)
  names = LeafNames(structure)
  sizes = []
  for name, x in zip(names, leaves):
    if x is not None and not isinstance(x, tf.Tensor):
      raise TypeError('%s: input %s is of type %s; inputs must be tensors, tuples or NestedMaps '
                      'of tensors (None allowed)' % (where, name, type(x).__name__))
    if x is not None and IsBatched(x, batch_dim):
      sizes.append((name, tf.compat.dimension_value(x.shape[batch_dim])))
  if not sizes:
    raise ValueError('%s: no input has a batch dimension %d to split into micro-batches' %
                     (where, batch_dim))
  known = {size for _, size in sizes if size is not None}
  if len(known) > 1:
    raise ValueError('%s: inputs disagree on the batch size along batch_dim %d: %s' %
                     (where, batch_dim, ', '.join('%s=%s' % s for s in sizes)))
  return known.pop() if known else None


def RunTimeBatchSize(structure: Any, batch_dim: int) -> tf.Tensor:
  """The batch size of `structure` when the graph runs (int32 scalar), from its first batched
  tensor."""
  first = [x for x in tf.nest.flatten(structure) if IsBatched(x, batch_dim)][0]
  return tf.shape(first)[batch_dim]


def _AssertEnoughExamples(structure, batch_dim, num_micro_batches, where):
  """`structure` after a run-time check for a batch size unknown when the graph is built: every
  micro-batch needs an example."""
  batch = RunTimeBatchSize(structure, batch_dim)
  check = check_failure.Assert(
      tf.greater_equal(batch, num_micro_batches),
      ['%s: this batch has ' % where, batch, ' examples along batch_dim=%d, fewer than its '
       'num_micro_batches=%d (each micro-batch needs one): feed batches of at least %d examples '
       'or lower num_micro_batches' % (batch_dim, num_micro_batches, num_micro_batches)])
  with tf.control_dependencies([check]):
    return tf.nest.map_structure(lambda x: None if x is None else tf.identity(x), structure)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
  """How one mini-batch is cut into micro-batches (see `Plan`)."""
  args: Any  # The inputs; where N is unknown at graph building, checked at run time (see `Plan`).
  batch_size: Optional[int]  # N, or None if it is only known when the graph runs.
  sizes: List[Union[int, tf.Tensor]]  # Examples per micro-batch (see `Sizes`).
  offsets: List[Union[int, tf.Tensor]]  # Each micro-batch's first example's index (`Offsets`).
  even: bool  # Whether the sizes are known to be equal when the graph is built (`IsEven`).

  @property
  def num_micro_batches(self) -> int:
    """M."""
    return len(self.sizes)


def Plan(args: Any, batch_dim: int, num_micro_batches: Callable[[Optional[int]], int],
         where: str = 'TensorPipeLayer') -> BatchPlan:
  """The micro-batches of the mini-batch `args`, every value checked.

  Args:
    args: the inputs (see `BatchSize`, which checks them).
    batch_dim: their batch dimension.
    num_micro_batches: M for a batch of a given size (None where it is only known at run time),
      checked (e.g. by `NumMicroBatches`).
    where: names the pipeline in messages.

  Where N is only known when the graph runs and M > 1, the plan's `args` carry a run-time check
  that fails the step, naming N and M, if N < M (every micro-batch needs an example); its sizes
  are then int32 scalars computed from the inputs' shapes. Ops are made in the current device and
  name scope.
  """
  batch = BatchSize(args, batch_dim, where)
  num_micro = num_micro_batches(batch)
  if batch is None:
    if num_micro > 1:
      args = _AssertEnoughExamples(args, batch_dim, num_micro, where)
    sizes = Sizes(RunTimeBatchSize(args, batch_dim), num_micro)
  else:
    sizes = Sizes(batch, num_micro)
  return BatchPlan(args, batch, sizes, Offsets(sizes), IsEven(sizes))


def Split(structure: Any, num_micro_batches: int, batch_dim: int,
          sizes: Optional[Sequence[Union[int, tf.Tensor]]] = None) -> List[Any]:
  """Returns a list of M structures like `structure`, each holding one micro-batch.

  `sizes` (see `Sizes`) gives each micro-batch's examples; None: M equal slices.
  """
  leaves = tf.nest.flatten(structure)
  if sizes is not None and IsEven(sizes):
    sizes = None
  if sizes is not None and not all(isinstance(s, int) for s in sizes):
    sizes = tf.stack([tf.cast(s, tf.int32) for s in sizes])
  per_leaf = []
  for x in leaves:
    if IsBatched(x, batch_dim) and num_micro_batches > 1:
      per_leaf.append(tf.split(x, num_micro_batches if sizes is None else sizes,
                               num=num_micro_batches, axis=batch_dim))
    else:
      per_leaf.append([x] * num_micro_batches)
  return [tf.nest.pack_sequence_as(structure, [parts[t] for parts in per_leaf])
          for t in range(num_micro_batches)]


def OutputAxis(x: tf.Tensor, batch_dim: int, name: str = 'output',
               where: str = 'TensorPipeLayer') -> int:
  """The axis along which the micro-batches of output `x` are joined: `batch_dim`, or 0 for a rank-1
  output (e.g. per-example losses [B] of a time-major pipeline).

  Raises ValueError for an output without such an axis (e.g. a scalar), since silently picking one
  micro-batch's value would be wrong.
  """
  rank = x.shape.rank
  if rank is None or rank > batch_dim:
    return batch_dim
  if rank == 1:
    return 0
  raise ValueError('%s: %s has rank %s, so it has no batch dimension %d to join micro-batches '
                   'along; return per-example values (or set output_batch_dim to the axis that '
                   'holds the examples)' % (where, name, rank, batch_dim))


def Concat(structures: Sequence[Any], batch_dim: int, where: str = 'TensorPipeLayer') -> Any:
  """Joins M per-micro-batch output structures into one, along each output's `OutputAxis`."""
  first = structures[0]
  if len(structures) == 1:
    return first
  names = LeafNames(first, 'outputs')
  columns = zip(*[tf.nest.flatten(s) for s in structures])
  joined = []
  for name, column in zip(names, columns):
    joined.append(None if column[0] is None else
                  tf.concat(list(column), axis=OutputAxis(column[0], batch_dim, name, where)))
  return tf.nest.pack_sequence_as(first, joined)


def SplitGradient(grad: Union[tf.Tensor, tf.IndexedSlices], parts: Sequence[tf.Tensor],
                  batch_dim: int) -> List[tf.Tensor]:
  """The gradient of a joined output cut back into its micro-batches' pieces, each a copy.

  Slices along the first dimension would alias `grad`, so the whole mini-batch's gradient would stay
  alive until the last micro-batch's backward pass (the first micro-batch's, in fill-drain order) is
  done. Copies let it go at once, and each piece goes when its micro-batch is done.

  Args:
    grad: the gradient of the joined tensor (may be IndexedSlices).
    parts: the M micro-batch tensors that were joined.
    batch_dim: the outputs' batch dimension (see `OutputAxis`).
  """
  axis = OutputAxis(parts[0], batch_dim)
  grad = tf.convert_to_tensor(grad)
  sizes = [tf.compat.dimension_value(x.shape[axis]) for x in parts]
  if all(size is not None for size in sizes):
    pieces = tf.split(grad, sizes, axis=axis)
  else:
    # Piece t reads the run-time sizes of parts 0 .. t only: a schedule may start micro-batch t's
    # backward pass before the later parts exist.
    pieces, start = [], tf.constant(0, tf.int32)
    for x in parts:
      size = tf.shape(x, out_type=tf.int32)[axis]
      begin = tf.tensor_scatter_nd_update(tf.zeros([grad.shape.rank], tf.int32), [[axis]], [start])
      extent = tf.tensor_scatter_nd_update(-tf.ones([grad.shape.rank], tf.int32), [[axis]], [size])
      pieces.append(tf.slice(grad, begin, extent))
      start += size
  if axis == 0:
    with accumulation.Kept():  # Else grappler hoists the copies above the split.
      pieces = [tf.raw_ops.DeepCopy(x=piece) for piece in pieces]
  return [tf.ensure_shape(piece, x.shape) for piece, x in zip(pieces, parts)]
