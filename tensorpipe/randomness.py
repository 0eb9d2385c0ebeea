"""Dropout and drop-path whose masks are the same in a cell's forward pass and in its re-computation.

Lingvo's dropout draws from stateful random ops seeded by name scopes, and GPipe's re-computation runs a
cell again under another name scope, so it would draw another mask and the gradient would belong to a
different network. Here every mask comes from a stateless random op whose seed is a pure function of
(global step, the layer's variable scope, the micro-batch index, a per-use salt). TensorPipeLayer sets
the micro-batch index (`MicroBatch`) around every run of a cell, the forward pass and the re-computation
alike, so both see the same mask; a new training step draws new masks. Outside a TensorPipeLayer the
micro-batch index is 0, so an unpipelined model draws the masks of a pipeline with one micro-batch.
"""

import contextlib
import threading
import zlib

from lingvo import compat as tf
from lingvo.core import py_utils

_STATE = threading.local()


def _Stack():
  if not hasattr(_STATE, 'micro_batches'):
    _STATE.micro_batches = []
  return _STATE.micro_batches


@contextlib.contextmanager
def MicroBatch(index):
  """Within this context, layers draw the random masks of micro-batch `index`."""
  if not isinstance(index, int) or index < 0:
    raise ValueError('micro-batch index must be a non-negative integer, got %r' % (index,))
  _Stack().append(index)
  try:
    yield
  finally:
    _Stack().pop()


def CurrentMicroBatch():
  """The index set by the innermost `MicroBatch` context, or 0 outside any."""
  stack = _Stack()
  return stack[-1] if stack else 0


def LayerKey(layer):
  """A stable string naming `layer`: its variable scope, the same whatever the pipeline's K is."""
  scope = getattr(layer, '_self_variable_scope', None)
  return scope.name if scope is not None else layer.path


def Seed(layer, salt=0):
  """A [2] int64 stateless-op seed from (global step, layer, current micro-batch, salt)."""
  key = '%s|%d|%d' % (LayerKey(layer), CurrentMicroBatch(), salt)
  local = zlib.crc32(key.encode('utf-8'))
  step = py_utils.GetGlobalStep()
  step = tf.constant(0, tf.int64) if step is None else tf.cast(tf.identity(step), tf.int64)
  return tf.stack([step, tf.constant(local, tf.int64)])


def _CheckKeepProb(keep_prob, where):
  if isinstance(keep_prob, (int, float)) and not 0.0 < keep_prob <= 1.0:
    raise ValueError('%s: keep_prob must be in (0, 1], got %r' % (where, keep_prob))


def Dropout(x, keep_prob, seed, noise_shape=None, where='Dropout'):
  """x * mask / keep_prob, mask ~ Bernoulli(keep_prob) drawn with a stateless op from `seed`.

  Args:
    x: float tensor.
    keep_prob: probability of keeping an element (a Python float in (0, 1] or a scalar tensor).
    seed: [2] int seed (see `Seed`).
    noise_shape: shape of the mask (broadcast against x); None: x's shape.
    where: names the caller in error messages.
  """
  _CheckKeepProb(keep_prob, where)
  if isinstance(keep_prob, (int, float)) and keep_prob >= 1.0:
    return x
  shape = tf.shape(x) if noise_shape is None else noise_shape
  uniform = tf.random.stateless_uniform(shape, seed=seed, dtype=tf.float32)
  keep_prob = tf.cast(keep_prob, tf.float32)
  mask = tf.cast(uniform < keep_prob, x.dtype) / tf.cast(keep_prob, x.dtype)
  return x * mask


def DropPath(x, keep_prob, seed, where='DropPath'):
  """Drops whole examples of x ([B, ...]) with probability 1 - keep_prob (NASNet's drop-path)."""
  noise_shape = tf.concat([tf.shape(x)[:1], tf.ones([tf.rank(x) - 1], tf.int32)], axis=0)
  return Dropout(x, keep_prob, seed, noise_shape=noise_shape, where=where)


def ScheduledKeepProb(keep_prob, cell_index, num_cells, total_steps):
  """NASNet's ScheduledDropPath keep probability for the cell at `cell_index` of `num_cells`.

  The drop probability 1 - keep_prob is scaled by the cell's depth ((cell_index + 1) / num_cells) and
  by training progress (min(1, global step / total_steps); no ramp when total_steps is 0).
  """
  if keep_prob >= 1.0:
    return 1.0
  drop = (1.0 - keep_prob) * (cell_index + 1) / float(num_cells)
  if not total_steps:
    return 1.0 - drop
  step = py_utils.GetGlobalStep()
  if step is None:
    return 1.0 - drop
  ratio = tf.minimum(1.0, tf.cast(tf.identity(step), tf.float32) / float(total_steps))
  return 1.0 - ratio * drop
