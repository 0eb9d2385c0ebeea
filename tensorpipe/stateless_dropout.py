"""Dropout whose mask is a pure function of (example seed, site, position): the same on every re-run.

GPipe re-computes each cell in backprop, so a dropout mask drawn from a stateful random op would differ
between the forward pass and its re-computation (the gradient would then belong to another network).
Here every example carries an integer seed (a [B] tensor that travels through the pipeline with the
activations, so micro-batching splits it like any other batched input), every dropout site has a
constant integer `site`, and each element's keep/drop decision is a 32-bit integer hash of
(seed, site, element position). The mask therefore depends on nothing else: it is identical in the
forward pass and its re-computation, and also whatever K and M are, so a pipelined model with dropout
gets exactly the gradients of the plain one.
"""

from lingvo import compat as tf

_MASK32 = 0xFFFFFFFF


def _Mix32(h):
  """murmur3's 32-bit finaliser on int64 tensors holding values in [0, 2^32)."""
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 16))
  h = tf.bitwise.bitwise_and(h * 0x85EBCA6B, _MASK32)
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 13))
  h = tf.bitwise.bitwise_and(h * 0xC2B2AE35, _MASK32)
  return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 16))


def ExampleSeeds(batch_size, step):
  """[batch_size] int64 seeds, distinct per example and per training step: step * 2^20 + index."""
  step = tf.cast(step, tf.int64)
  return step * (1 << 20) + tf.range(batch_size, dtype=tf.int64)


def Uniform(x, seeds, site):
  """Float32 like x ([B, ...]) in [0, 1): element (b, i) is a hash of (seeds[b], site, flat position i)."""
  seeds = tf.cast(seeds, tf.int64)
  shape = tf.shape(x)
  pos = tf.reshape(tf.range(tf.reduce_prod(shape[1:]), dtype=tf.int64), [1, -1])
  salt = _Mix32(tf.constant((site * 0x9E3779B1 + 0x7F4A7C15) & _MASK32, tf.int64))
  seed = _Mix32(tf.bitwise.bitwise_xor(tf.bitwise.bitwise_and(seeds, _MASK32), salt))
  h = _Mix32(tf.bitwise.bitwise_and(seed[:, None] + pos * 0x9E3779B1, _MASK32))
  return tf.reshape(tf.cast(h, tf.float32) * (1.0 / 4294967296.0), shape)


def Dropout(x, keep_prob, seeds, site):
  """x * mask / keep_prob with mask[b, ...] = Uniform(...) < keep_prob; identity if keep_prob >= 1.

  Args:
    x: [B, ...] float tensor.
    keep_prob: probability of keeping an element, in (0, 1].
    seeds: [B] integer example seeds (see ExampleSeeds).
    site: a Python int naming the dropout site (distinct per layer and per use in a layer).
  """
  if not 0.0 < keep_prob <= 1.0:
    raise ValueError('keep_prob must be in (0, 1], got %r' % (keep_prob,))
  if keep_prob >= 1.0:
    return x
  keep = tf.cast(Uniform(x, seeds, site) < keep_prob, x.dtype, name='dropout_mask')
  return x * keep * (1.0 / keep_prob)
