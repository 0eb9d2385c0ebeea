"""Dropout and drop-path whose masks do not depend on re-computation, K or M.

Lingvo's dropout draws from stateful random ops, and GPipe's re-computation runs a partition again,
so it would draw another mask and the gradient would belong to a different network. Here each
element's keep/drop decision is a 32-bit integer hash of

  (global step, site, example, position)

where `site` names the dropout use (a layer's variable scope plus a per-use name, see `Site`),
`example` is the element's example index in the whole mini-batch and `position` is its flat index
among the other axes. TensorPipeLayer traces a partition (for the forward pass and its
re-computation alike) with micro-batch t's example offset, t * micro-batch size (see
`trace_context`; `ExampleOffset` sets one by hand), so a layer's local example b is example offset
+ b of the mini-batch; outside a pipeline the offset is 0. The mask of an example is therefore the
same in the forward pass, in its re-computation, and whatever K and M are, so a pipelined model with
dropout gets exactly the plain model's gradients; a new training step draws new masks. See
docs/design.md, "Why training does not depend on K or M".
"""

import contextlib
import numbers
import zlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils

from tensorpipe import body_cache
from tensorpipe import per_graph
from tensorpipe import tf_internals
from tensorpipe import trace_context

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B1

# A shape: Python ints, or a 1-D integer tensor.
_Shape = Union[Sequence[int], tf.Tensor]


@contextlib.contextmanager
def ExampleOffset(offset: Union[int, tf.Tensor]) -> Iterator[None]:
  """Within this context, example b of a layer's batch is example `offset` + b of the mini-batch.

  Offsets of nested contexts add up (a pipeline inside a pipeline's partition).

  Args:
    offset: a non-negative Python int or a scalar integer tensor.
  """
  with trace_context.Offset(offset):
    yield


def CurrentExampleOffset() -> Union[int, tf.Tensor]:
  """The example offset of the current trace context (summed over nested `ExampleOffset`s and
  partitions, see `trace_context`), or 0 outside any."""
  context = trace_context.Current()
  return context.offset if context is not None else 0


def LayerKey(layer: base_layer.BaseLayer) -> str:
  """A stable string naming `layer`: its variable scope, the same whatever the pipeline's K is."""
  scope = tf_internals.LayerVariableScope(layer)
  return scope.name if scope is not None else layer.path


def Site(layer: base_layer.BaseLayer, use: str = '') -> int:
  """A Python int naming one dropout use in `layer` (distinct `use` strings for distinct uses)."""
  return NamedSite('%s|%s' % (LayerKey(layer), use))


def NamedSite(name: str) -> int:
  """A Python int naming one dropout use by a string that is the same whatever K and M are."""
  return zlib.crc32(name.encode('utf-8'))


def _Mix32Int(h):
  """_Mix32 on a Python int (for the parts of a key known when the graph is built)."""
  h ^= h >> 16
  h = (h * 0x85EBCA6B) & _MASK32
  h ^= h >> 13
  h = (h * 0xC2B2AE35) & _MASK32
  return h ^ (h >> 16)


def _XorShift16Int(h):
  """The first (and last) step of _Mix32 on a Python int: h ^ (h >> 16)."""
  return h ^ (h >> 16)


class _Constants:
  """The constants the hash uses, made once per graph (and function body)."""

  def __init__(self):
    values = dict(mask=_MASK32, golden=_GOLDEN, m1=0x85EBCA6B, m2=0xC2B2AE35, s8=8, s13=13,
                  s16=16, s32=32)
    for name, value in values.items():
      setattr(self, name, tf.constant(value, tf.int64, name='hash_' + name))
    self.unit = tf.constant(1.0 / (1 << 24), tf.float32, name='hash_unit')  # 2^-24, exact.


def _NewGraphState() -> Dict[Any, Any]:
  """A graph's state: {'constants': _Constants, ('step', id): step key}; the constants built
  outside any control context."""
  with tf.control_dependencies(None), tf.name_scope('example_hash/'):
    return {'constants': _Constants()}


_PER_GRAPH = per_graph.PerGraph('randomness', _NewGraphState)


def _GraphState():
  """Per-graph tensors shared by every mask of the graph (see `_NewGraphState`)."""
  return _PER_GRAPH.Of(tf.get_default_graph())


def _Mix32(h, c, first=True, last=True):
  """murmur3's 32-bit finaliser (a bijection) on int64 tensors holding values in [0, 2^32).

  Its first and last steps are the same xor-shift, h ^ (h >> 16), which on 32-bit values undoes
  itself and distributes over xor. So _Mix32(_Mix32(h)) == _Mix32(_Mix32(h, last=False),
  first=False), and _Mix32(a ^ b) == _Mix32(_XorShift16(a) ^ _XorShift16(b), first=False): the
  same values with fewer ops.
  """
  if first:
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, c.s16))
  h = tf.bitwise.bitwise_and(h * c.m1, c.mask)
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, c.s13))
  h = tf.bitwise.bitwise_and(h * c.m2, c.mask)
  if last:
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, c.s16))
  return h


def _ShiftedStepKey(state):
  """_XorShift16 of a 32-bit hash of the global step (0 without one), shared by every mask of the
  graph: the step key as `Uniform` xors it with a site's key before _Mix32 without its first
  step."""
  c = state['constants']
  step = py_utils.GetGlobalStep()
  key = ('step', None if step is None else step.ref())
  if key not in state:
    with tf.control_dependencies(None), tf.name_scope('example_hash/'):
      if step is None:
        state[key] = tf.constant(_XorShift16Int(_Mix32Int(_Mix32Int(0))), tf.int64)
      else:
        step = tf.cast(tf.identity(step), tf.int64)
        low = _Mix32(tf.bitwise.bitwise_and(step, c.mask), c)
        state[key] = _Mix32(tf.bitwise.bitwise_xor(low, tf.bitwise.right_shift(step, c.s32)), c,
                            last=False)
  return state[key]


def _Static(value):
  """`value` as a Python int if it is one or a constant known when the graph is built, else None."""
  if isinstance(value, int):
    return value
  return tf.get_static_value(value)


def _ExampleTerms(batch, offset, c):
  """(offset + range(batch)) * golden ratio (int64), one per example."""
  with tf.name_scope('example_hash/'):
    examples = tf.range(batch, dtype=tf.int64) + tf.cast(offset, tf.int64)
    return examples * c.golden


def _StaticExampleTerms(batch, c):
  """_ExampleTerms for a static `batch` at the current example offset, shared per function body."""
  offset = CurrentExampleOffset()
  return body_cache.Shared(
      ('example terms', batch, offset.ref() if isinstance(offset, tf.Tensor) else offset),
      lambda: _ExampleTerms(batch, offset, c))


def _SiteKey(site):
  """The site's part of a mask's key, folded in Python: _XorShift16(_Mix32(site ^ a constant)) (the
  key is _Mix32(step key ^ _Mix32(site ^ constant)); see _Mix32)."""
  return _XorShift16Int(_Mix32Int((site ^ 0x7F4A7C15) & _MASK32))


def _Keys(state, site_keys):
  """_Mix32(step key ^ site key) for the int64 tensor `site_keys` of _SiteKey values."""
  return _Mix32(tf.bitwise.bitwise_xor(_ShiftedStepKey(state), site_keys), state['constants'],
                first=False)


def _PerExampleHashes(keys, terms, c):
  """The hash of each (key, example) at position 0: _Mix32(_Mix32((key + term) & mask))."""
  example_keys = tf.bitwise.bitwise_and(keys + terms, c.mask)
  return _Mix32(_Mix32(example_keys, c, last=False), c, first=False)  # See _Mix32.


def _ToUniform(h, c):
  """32-bit hashes to float32 values in [0, 1): their top 24 bits times 2^-24 (exact)."""
  return tf.cast(tf.bitwise.right_shift(h, c.s8), tf.float32) * c.unit


def Uniform(shape: _Shape, site: int, batch_dim: Optional[int] = 0) -> tf.Tensor:
  """Float32 values in [0, 1) of `shape`, each a hash of (global step, site, example, position).

  Args:
    shape: the output shape (list of ints or a 1-D integer tensor); axis `batch_dim` is the batch.
    site: a Python int naming the use (see `Site`).
    batch_dim: the axis of `shape` that indexes examples, or None if none does: the whole tensor
      then counts as one example, CurrentExampleOffset() (values then depend on how the mini-batch
      is split, but not on re-computation).

  The example of an element is CurrentExampleOffset() + its index along `batch_dim`; its position
  is its flat index over the other axes (in row-major order). With a static shape, what depends
  only on the shape and the example offset is made once per function body (see `body_cache`).
  """
  if not isinstance(site, int):
    raise ValueError('site must be a Python int (see randomness.Site), got %r' % (site,))
  if batch_dim is None:
    if isinstance(shape, (list, tuple)) and all(isinstance(d, int) for d in shape):
      flat_shape = [1, int(np.prod(shape, dtype=np.int64))]
    else:
      flat_shape = tf.stack([tf.constant(1, tf.int64),
                             tf.reduce_prod(tf.cast(tf.convert_to_tensor(shape), tf.int64))])
    return tf.reshape(Uniform(flat_shape, site, 0), shape)
  static = [int(d) for d in shape] if isinstance(shape, (list, tuple)) and all(
      isinstance(d, int) for d in shape) else None
  if static is None:
    shape = tf.cast(tf.convert_to_tensor(shape), tf.int64)
    rank = tf.compat.dimension_value(shape.shape[0])
  else:
    rank = len(static)
  if not isinstance(batch_dim, int) or batch_dim < 0 or (rank is not None and batch_dim >= rank):
    raise ValueError('batch_dim must be an axis of a rank-%s shape, got %r' % (rank, batch_dim))
  state = _GraphState()
  c = state['constants']
  key = _Keys(state, tf.constant(_SiteKey(site), tf.int64))
  if static is not None:
    batch = static[batch_dim]
    inner = int(np.prod(static[batch_dim + 1:], dtype=np.int64))
    total = int(np.prod(static, dtype=np.int64))
    terms = _StaticExampleTerms(batch, c)
  else:
    batch = shape[batch_dim]
    inner = tf.reduce_prod(shape[batch_dim + 1:])
    total = tf.reduce_prod(shape)
    terms = _ExampleTerms(batch, CurrentExampleOffset(), c)
  if static is not None and total == batch:  # One value per example (e.g. drop-path): position 0.
    h = _PerExampleHashes(key, terms, c)
  else:
    flat = tf.range(total, dtype=tf.int64)
    example = (flat // inner) % batch
    position = (flat // (inner * batch)) * inner + flat % inner
    seed = tf.gather(_Mix32(tf.bitwise.bitwise_and(key + terms, c.mask), c), example)
    h = _Mix32(tf.bitwise.bitwise_and(seed + position * c.golden, c.mask), c)
  return tf.reshape(_ToUniform(h, c), shape if static is None else
                    body_cache.Constant(static, tf.int32))


def _CheckKeepProb(keep_prob, where):
  if isinstance(keep_prob, numbers.Real) and not 0.0 < float(keep_prob) <= 1.0:
    raise ValueError('%s: keep_prob must be in (0, 1], got %r' % (where, keep_prob))


def Dropout(x: tf.Tensor, keep_prob: Union[float, tf.Tensor], site: int,
            batch_dim: Optional[int] = 0, noise_shape: Optional[_Shape] = None,
            where: str = 'Dropout') -> tf.Tensor:
  """x * mask / keep_prob, mask = Uniform(...) < keep_prob; x itself when keep_prob is 1.

  Args:
    x: float tensor whose axis `batch_dim` indexes examples.
    keep_prob: probability of keeping an element: a Python number in (0, 1] or a scalar tensor.
    site: a Python int naming this use (see `Site`); distinct per layer and per use in a layer.
    batch_dim: the batch axis of x (and of noise_shape), or None (see `Uniform`).
    noise_shape: shape of the mask, broadcast against x; None: x's shape.
    where: names the caller in error messages.
  """
  _CheckKeepProb(keep_prob, where)
  if isinstance(keep_prob, numbers.Real) and float(keep_prob) >= 1.0:
    return x
  shape = py_utils.GetShape(x) if noise_shape is None else noise_shape
  keep_prob = tf.cast(keep_prob, tf.float32)
  mask = tf.cast(Uniform(shape, site, batch_dim) < keep_prob, x.dtype, name='dropout_mask')
  return x * mask / tf.cast(keep_prob, x.dtype)


def DropPath(x: tf.Tensor, keep_prob: Union[float, tf.Tensor], site: int, batch_dim: int = 0,
             where: str = 'DropPath') -> tf.Tensor:
  """Keeps or drops whole examples of x with probability keep_prob (NASNet's drop-path), scaled."""
  rank = x.shape.rank
  if rank is None or not isinstance(batch_dim, int) or not 0 <= batch_dim < rank:
    raise ValueError('%s: batch_dim must be an axis of x (rank %s), got %r' %
                     (where, rank, batch_dim))
  noise_shape = [py_utils.GetShape(x)[batch_dim] if i == batch_dim else 1 for i in range(rank)]
  return Dropout(x, keep_prob, site, batch_dim, noise_shape=noise_shape, where=where)


def DropPathMasks(batch: int, rank: int, dtype: tf.DType, keep_prob: Union[float, tf.Tensor],
                  sites: Sequence[int], batch_dim: int = 0,
                  where: str = 'DropPath') -> List[Optional[tf.Tensor]]:
  """DropPath's masks at several sites of one layer, drawn together.

  Masked(x, masks[i], keep_prob) is DropPath(x, keep_prob, sites[i], batch_dim) bit for bit, for
  any x of rank `rank`, type `dtype` and `batch` examples along `batch_dim`; one op sequence hashes
  every site's examples instead of one per site (e.g. for the drop-path uses of an AmoebaNet cell).

  Returns:
    Per site, a mask (0 or 1 in `dtype`, `batch` along `batch_dim` and 1 along the other axes), or
    None when keep_prob is 1 (DropPath returns x).
  """
  _CheckKeepProb(keep_prob, where)
  if not isinstance(batch, int) or not isinstance(rank, int) or not 0 <= batch_dim < rank:
    raise ValueError('%s: batch must be a static size and batch_dim an axis of a rank-%r x, got '
                     '%r and %r' % (where, rank, batch, batch_dim))
  for site in sites:
    if not isinstance(site, int):
      raise ValueError('site must be a Python int (see randomness.Site), got %r' % (site,))
  if isinstance(keep_prob, numbers.Real) and float(keep_prob) >= 1.0:
    return [None] * len(sites)
  if not sites:
    return []
  state = _GraphState()
  c = state['constants']
  keys = _Keys(state, tf.constant([[_SiteKey(site)] for site in sites], tf.int64))  # [sites, 1]
  uniform = _ToUniform(_PerExampleHashes(keys, _StaticExampleTerms(batch, c), c), c)
  masks = tf.cast(uniform < tf.cast(keep_prob, tf.float32), dtype, name='dropout_mask')
  shape = [len(sites)] + [batch if i == batch_dim else 1 for i in range(rank)]
  return tf.unstack(tf.reshape(masks, body_cache.Constant(shape, tf.int32)))


def Masked(x: tf.Tensor, mask: Optional[tf.Tensor], keep_prob: Union[float, tf.Tensor]
           ) -> tf.Tensor:
  """x * mask / keep_prob, as Dropout computes it (x itself for a None mask, see DropPathMasks)."""
  if mask is None:
    return x
  return x * mask / tf.cast(tf.cast(keep_prob, tf.float32), x.dtype)


def ScheduledKeepProb(keep_prob: float, layer_index: int, num_layers: int,
                      total_steps: int) -> Union[float, tf.Tensor]:
  """NASNet's ScheduledDropPath keep probability for the layer at `layer_index` of `num_layers`.

  The drop probability 1 - keep_prob is scaled by the layer's depth ((layer_index + 1) / num_layers)
  and by training progress (min(1, global step / total_steps); no ramp when total_steps is 0).
  """
  _CheckKeepProb(keep_prob, 'ScheduledKeepProb')
  if not 0 <= layer_index < num_layers:
    raise ValueError('ScheduledKeepProb: layer_index must be in [0, num_layers=%r), got %r' %
                     (num_layers, layer_index))
  if keep_prob >= 1.0:
    return 1.0
  drop = (1.0 - keep_prob) * (layer_index + 1) / float(num_layers)
  if not total_steps:
    return 1.0 - drop
  step = py_utils.GetGlobalStep()
  if step is None:
    return 1.0 - drop
  ratio = tf.minimum(1.0, tf.cast(tf.identity(step), tf.float32) / float(total_steps))
  return 1.0 - ratio * drop
