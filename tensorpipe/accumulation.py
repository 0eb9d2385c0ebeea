"""Gradient accumulation: a partition's weight gradients summed over micro-batches, one buffer each.

Each backward (or weight-gradient) action adds its weight gradients to the running sum that the
device's previous such action hands it (schedule rules SUM_IN_REVERSE, SUM_IN_ORDER and
WEIGHT_SUM_ORDER), and hands the sum on. Summing inside the backward function frees each layer's
weight gradient as soon as it is added, so a device holds one sum per weight plus one layer's
gradient, instead of every micro-batch's partial gradients (what one M-input AddN over separate
calls would hold). The add writes into the running sum's own buffer (`AddInPlace`): a graph function
cannot hand its input buffers on to its outputs, so an ordinary add would allocate a second copy of
every sum while the call runs. That is safe because the sum an action receives has no other reader:
it comes from the previous action, or for the first one from `Zeros`, and goes only to this one. See
docs/design.md, "Inside a partition's functions". """

from typing import ContextManager, Optional, Union

from lingvo import compat as tf

from tensorpipe import body_cache
from tensorpipe import tf_internals


def Kept() -> ContextManager[None]:
  """Scope in which new ops carry the attribute that stops grappler removing or fusing them."""
  return tf_internals.KeptByGrappler(tf.get_default_graph())


def Dense(grad: Union[None, tf.Tensor, tf.IndexedSlices]) -> Optional[tf.Tensor]:
  """A gradient as a dense tensor (IndexedSlices summed into place), or None."""
  if grad is None or isinstance(grad, tf.Tensor):
    return grad
  return tf.convert_to_tensor(grad)


def Zeros(shape: tf.TensorShape, dtype: tf.DType) -> tf.Tensor:
  """A new zero-filled buffer of `shape` each time the op runs: a running sum to add into.

  `Empty` is a stateful op, so grappler never folds it into a constant (whose one buffer every
  step would then add into).
  """
  return tf.raw_ops.Empty(shape=body_cache.Constant(shape.as_list(), tf.int32), dtype=dtype,
                          init=True)


def AddInPlace(total: tf.Tensor, grad: Optional[tf.Tensor]) -> tf.Tensor:
  """total + grad, written into `total`'s buffer; `total` must have no other reader.

  Element for element the same value as total + grad (one float addition). Both are added as one
  row, [1, -1]; the shapes (static where known) and row index are constants shared in a function
  body (see `body_cache`).
  """
  if grad is None:
    return total
  if total is None:
    raise ValueError('AddInPlace: no running sum to add to')
  shape = (body_cache.Constant(total.shape.as_list(), tf.int32)
           if total.shape.is_fully_defined() else tf.shape(total))
  row = body_cache.Constant([1, -1], tf.int32)
  summed = tf.raw_ops.InplaceAdd(x=tf.reshape(total, row), i=body_cache.Constant([0], tf.int32),
                                 v=tf.reshape(tf.cast(grad, total.dtype), row))
  return tf.reshape(summed, shape)
