"""The first step of every run checks that each partition keeps examples apart along batch_dim.

Micro-batching is exact only if a partition computes each example's outputs from that example
alone: then splitting the mini-batch along `batch_dim` changes nothing. A wrong `batch_dim` breaks
that without any error: time-major inputs [T, B, ...] split along 0 cut the sequence, attention
then sees a part of it, and the loss changes with M. So on the first step of every run (a run
resumed from a checkpoint included; `RunFlag`, a local variable, says whether this run has checked)
each partition runs twice more, on its first micro-batch as given and with example 0 changed (floats
+1, integers and booleans taken from example 1), through a function that returns every layer's
outputs (`PartitionFunctions.Probe`), and the step fails if any layer's output of another example
changed. The message names the first such layer (the one that mixes examples), the pipeline's
inputs and the fix; it is a `check_failure` line, so `check_failure.Run` raises it as the step's
error.

Batch norm mixes the examples of a micro-batch on purpose (through its statistics), so a partition
with batch norm is probed in evaluation mode, where batch norm normalises with its moving
statistics and keeps examples apart: the probe then finds every other layer that mixes examples.
What it cannot see is a wrong batch_dim that only batch norm's statistics would notice (a partition
whose other layers all act on each position alone); the executor says so at build time, naming the
partitions. A first micro-batch of one example is not checked (nothing to compare), nor is a graph
without a global step, nor a pipeline inside another pipeline's partition (the outer check probes
it as a layer).
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple

from lingvo import compat as tf

from tensorpipe import check_failure
from tensorpipe import micro_batching
from tensorpipe import trace_context

_TOLERANCE = 1e-4  # Relative to the largest output magnitude among the other examples.


def _Axis(x, batch_dim):
  """The batch dimension of a partition's input or output leaf, or None if it has none."""
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


def RunFlag(device: str) -> tf.Variable:
  """A local (not checkpointed) boolean variable on `device` that says whether this run has
  checked (see `Checked`); the executor sets it True after the checks.

  Lingvo's runners initialise local variables (to False) when their loop starts, and a variable of
  a new session or process starts uninitialised, which `Checked` reads as False: so every run
  checks its first step, a run resumed from a checkpoint at any global step included, and a
  session that runs no local-variable initialiser needs none.
  """
  with tf.init_scope(), tf.device(device):
    return tf.compat.v1.Variable(False, trainable=False, name='batch_dim_checked',
                                 collections=[tf.GraphKeys.LOCAL_VARIABLES], use_resource=True)


def Checked(flag: tf.Variable) -> tf.Tensor:
  """Whether this run has checked: `flag`'s value, False while it is uninitialised."""
  return tf.cond(tf.compat.v1.is_variable_initialized(flag), flag.read_value,
                 lambda: tf.constant(False), name='checked_this_run')


def _Compare(ys: List[tf.Tensor], probe_ys: List[tf.Tensor],
             batch_dim: int) -> Tuple[tf.Tensor, tf.Tensor]:
  """(a layer's output leaves on the micro-batch, on the probe) -> (the largest change of the
  examples other than 0, their largest magnitude)."""
  changes = [_Change(y, p, batch_dim) for y, p in zip(ys, probe_ys)
             if _Axis(y, batch_dim) is not None and y.dtype.is_floating]
  if not changes:
    return tf.constant(0.0), tf.constant(0.0)
  return (tf.reduce_max(tf.stack([c for c, _ in changes])),
          tf.reduce_max(tf.stack([m for _, m in changes])))


def _BatchDimFix(batch_dim):
  """The message's first way out: the batch_dim of the other layout."""
  if batch_dim == 1:
    return 'If they are batch-major [B, ...], set batch_dim=0 (the axis of the examples)'
  return ('If they are time-major [T, B, ...] (the Lingvo convention), set batch_dim=1 (the axis '
          'of the examples)')


def Check(partition: Any, step: Optional[tf.Tensor], offset: tf.Tensor,
          theta: Sequence[tf.Tensor], x_leaves: Sequence[tf.Tensor], inputs: str,
          done: Callable[[], tf.Tensor]) -> Optional[tf.Operation]:
  """The check of a partition on its first micro-batch, unless `done()`; None where there is
  nothing to check.

  Args:
    partition: its partition_function.PartitionFunctions for the first micro-batch: its `spec`
      gives the partition's index, the pipeline's name and batch_dim, and the first micro-batch's
      examples (if known when the graph is built).
    step, offset, theta, x_leaves: what F(k, 0) got.
    inputs: the pipeline's input leaves and shapes, for the message.
    done: makes (once) the boolean scalar that says whether this run has checked already
      (`Checked`), only if there is something to check.
  """
  spec = partition.spec
  k, batch_dim, count, where = spec.index, spec.batch_dim, spec.example_count, spec.where
  if step is None or (count is not None and count < 2):
    return None
  context = trace_context.Current()
  if context is not None and context.routing is not None:
    # A pipeline inside another pipeline's partition: the outer pipeline's check probes it as one
    # of its layers (a variable write here would be refused in the outer partition's function).
    return None
  axes = [_Axis(x, batch_dim) for x in x_leaves]
  if all(a is None for a in axes):
    return None
  names = partition.layer_names
  frozen = partition.has_batch_norm

  def Probe():
    probe = [x if a is None else _Perturbed(x, a) for x, a in zip(x_leaves, axes)]
    runs = [partition.Probe(step, offset, theta, x) for x in (x_leaves, probe)]
    pairs = [_Compare(ys, probe_ys, batch_dim) for ys, probe_ys in zip(*runs)]
    changes, scales = tf.stack([c for c, _ in pairs]), tf.stack([s for _, s in pairs])
    mixed = changes > _TOLERANCE * scales
    first = tf.argmax(tf.cast(mixed, tf.int32), output_type=tf.int32)
    name = tf.gather(tf.constant(names), first)
    layer = tf.strings.join(["'", name, "' (layer ", tf.strings.as_string(first),
                             ' of partition %d' % k])
    assert_op = check_failure.Assert(tf.logical_not(tf.reduce_any(mixed)), [
        '%s: the batch_dim check failed: layer ' % where, layer,
        ') mixes examples along batch_dim=%d%s: changing example 0 of the first micro-batch '
        "changed other examples' outputs by " % (
            batch_dim, ' (batch norm probed with its moving statistics)' if frozen else ''),
        tf.gather(changes, first), ' (their largest: ', tf.gather(scales, first),
        '), so results would depend on num_micro_batches. Pipeline inputs: %s. %s; if the layer '
        'should treat each example alone, make it reduce over axes other than batch_dim=%d; if it '
        'mixes examples on purpose, its results depend on num_micro_batches, which '
        'check_batch_dim=False accepts' % (inputs, _BatchDimFix(batch_dim), batch_dim)])
    with tf.control_dependencies([assert_op]):
      return tf.constant(True)

  return tf.cond(done(), lambda: tf.constant(True), Probe).op


def DescribeInputs(args: Any) -> str:
  """'args[0].ids [20, 8], ...' for the pipeline's tensor inputs."""
  return ', '.join('%s %s' % (name, x.shape.as_list() if x.shape.rank is not None else '?')
                   for name, x in zip(micro_batching.LeafNames(args), tf.nest.flatten(args))
                   if x is not None)
