"""Gradient accumulation: weight gradients of M micro-batches summed as a running sum, on the cell's device.

Left alone, `tf.gradients` sums the M contributions to each weight with one AddN that waits for all of
them, so M partial weight gradients are alive at once. Instead micro-batch t + 1 reads the weights as
passed on by micro-batch t, so the gradient of theta_t is own_t + grad(theta_{t+1}): a chain of two-input
sums that runs as each micro-batch's backward pass finishes. A re-computed cell passes theta on itself
and adds with `Accumulate`; otherwise `PassOn` does it, whose gradient is an Identity. Both are marked
for grappler to keep, which stops its arithmetic optimiser from fusing the chain back into one M-input
AddN. Passing on after the previous micro-batch's forward pass also keeps each device on the fill-drain
order.
"""

from lingvo import compat as tf
from tensorflow.core.framework import attr_value_pb2

_DO_NOT_REMOVE = {'_grappler_do_not_remove': attr_value_pb2.AttrValue(b=True)}


def _KeptIdentity(g):
  """Identity of a gradient (dense or IndexedSlices) that grappler may not remove."""
  if g is None:
    return None
  with tf.get_default_graph()._attr_scope(_DO_NOT_REMOVE):  # pylint: disable=protected-access
    if isinstance(g, tf.IndexedSlices):
      return tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape)
    return tf.identity(g, name='accumulate')


def Accumulate(own, rest):
  """own + rest for weight gradients that may be None or IndexedSlices, kept out of AddN fusion."""
  if own is None:
    return rest
  if rest is None:
    return own
  if isinstance(own, tf.IndexedSlices) and isinstance(rest, tf.IndexedSlices):
    return tf.IndexedSlices(tf.concat([own.values, rest.values], 0),
                            tf.concat([own.indices, rest.indices], 0), own.dense_shape)
  with tf.get_default_graph()._attr_scope(_DO_NOT_REMOVE):  # pylint: disable=protected-access
    return tf.add(tf.convert_to_tensor(own), tf.convert_to_tensor(rest), name='accumulate')


def PassOn(theta, after, device, name='pass_on'):
  """Returns `theta` (a NestedMap) for the next micro-batch, read after the tensors in `after`.

  Args:
    theta: NestedMap of the cell's weights as used by the current micro-batch.
    after: tensors (the current micro-batch's outputs) that must exist before the next one starts.
    device: the cell's device; the pass-through and its gradient run there.
    name: name scope.
  """
  leaves = theta.Flatten()
  if not leaves:
    return theta

  @tf.custom_gradient
  def Op(*values):
    outs = [tf.identity(v) for v in values]

    def Grad(*grads):
      with tf.device(device):
        return [_KeptIdentity(g) for g in grads]

    return outs, Grad

  deps = [t for t in tf.nest.flatten(after) if isinstance(t, tf.Tensor)]
  with tf.device(device), tf.name_scope(name), tf.control_dependencies(deps):
    out = Op(*leaves)
  return theta.Pack(list(out) if isinstance(out, (list, tuple)) else [out])
