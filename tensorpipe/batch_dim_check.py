"""The first training step checks that each partition keeps examples apart along the batch dim.

Micro-batching is exact only if a partition computes each example's outputs from that example
alone: then splitting the mini-batch along `batch_dim` changes nothing. A wrong `batch_dim` breaks
that without any error: time-major inputs [T, B, ...] split along 0 cut the sequence, attention
then sees a part of it, and the loss changes with M. So on the first step (global step 0) each
partition's forward function runs once more on its first micro-batch with example 0 changed (floats
+1, integers and booleans taken from example 1), and the step fails if any other example's output
changed, with a message naming the partition, the inputs' shapes and the fix.

Partitions with batch-norm statistics are skipped (they mix examples on purpose, and their results
depend on M, not on K); so is a first micro-batch of one example. A graph without a global step
runs no check.
"""

from typing import Any, Optional, Sequence

from lingvo import compat as tf

from tensorpipe import micro_batching

_TOLERANCE = 1e-4  # Relative to the largest output magnitude among the other examples.


def _Axis(x, batch_dim):
  """The example axis of a partition's input or output leaf, or None if it has none."""
  if x is None or x.shape.rank is None or x.shape.rank <= batch_dim:
    return None
  return batch_dim


def _AlongAxis(vector, rank, axis):
  """`vector` [n] reshaped to broadcast along `axis` of a rank-`rank` tensor."""
  shape = [1] * rank
  shape[axis] = -1
  return tf.reshape(vector, shape)


def _Perturbed(x, axis):
  """`x` with its example 0 changed along `axis`."""
  size = tf.shape(x)[axis]
  first = _AlongAxis(tf.one_hot(0, size, dtype=tf.float32), x.shape.rank, axis)
  if x.dtype.is_floating:
    return x + tf.cast(first, x.dtype)
  return tf.where(tf.cast(first, tf.bool) & tf.ones_like(x, tf.bool),
                  tf.roll(x, shift=-1, axis=axis), x)


def _Change(y, y_probe, axis):
  """(largest change of the examples other than 0, their largest magnitude)."""
  size = tf.shape(y)[axis]
  others = _AlongAxis(1.0 - tf.one_hot(0, size, dtype=tf.float32), y.shape.rank, axis)
  y, y_probe = tf.cast(y, tf.float32), tf.cast(y_probe, tf.float32)
  return (tf.reduce_max(tf.abs(y_probe - y) * others), tf.reduce_max(tf.abs(y) * others))


def Check(partition: Any, k: int, step: Optional[tf.Tensor], offset: tf.Tensor,
          theta: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor], ys: Sequence[tf.Tensor],
          batch_dim: int, count: Optional[int], inputs: str,
          where: str) -> Optional[tf.Operation]:
  """The check of partition k on its first micro-batch; None where there is nothing to check.

  Args:
    partition: its partition_function.PartitionFunctions.
    k: the partition's index.
    step, offset, theta, x_leaves: what F(k, 0) got; ys: its output leaves.
    batch_dim: the pipeline's batch dimension.
    count: the first micro-batch's examples, if known when the graph is built.
    inputs: the pipeline's input leaves and shapes, for the message.
    where: names the pipeline.
  """
  if step is None or partition.has_batch_norm or (count is not None and count < 2):
    return None
  axes = [_Axis(x, batch_dim) for x in x_leaves]
  compared = [(y, _Axis(y, batch_dim)) for y in ys]
  compared = [(i, y, a) for i, (y, a) in enumerate(compared)
              if a is not None and y.dtype.is_floating]
  if all(a is None for a in axes) or not compared:
    return None

  def Probe():
    probe = [x if a is None else _Perturbed(x, a) for x, a in zip(x_leaves, axes)]
    _, _, probe_ys = partition.Forward(step, offset, theta, probe)
    changes = [_Change(y, probe_ys[i], a) for i, y, a in compared]
    change = tf.reduce_max(tf.stack([c for c, _ in changes]))
    scale = tf.reduce_max(tf.stack([s for _, s in changes]))
    message = (
        '%s: on its first micro-batch, changing example 0 of the input of partition %d changed '
        'the outputs of other examples along batch_dim=%d, so the layers mix examples along that '
        'axis and results would depend on the number of micro-batches. Pipeline inputs: %s. If '
        'they are time-major [T, B, ...] (the Lingvo convention), set batch_dim=1; if a layer '
        'mixes examples on purpose, set check_batch_dim=False. The largest change and the largest '
        'output of the other examples:' % (where.replace("'", ''), k, batch_dim, inputs))
    assert_op = tf.debugging.Assert(change <= _TOLERANCE * scale, [message, change, scale])
    with tf.control_dependencies([assert_op]):
      return tf.constant(True)

  return tf.cond(tf.equal(step, 0), Probe, lambda: tf.constant(True)).op


def DescribeInputs(args: Any) -> str:
  """'args[0].ids [20, 8], ...' for the pipeline's tensor inputs."""
  return ', '.join('%s %s' % (name, x.shape.as_list() if x.shape.rank is not None else '?')
                   for name, x in zip(micro_batching.LeafNames(args), tf.nest.flatten(args))
                   if x is not None)
