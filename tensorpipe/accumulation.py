"""Gradient accumulation: weight gradients of M micro-batches summed as a running sum, on the cell's device.

Left alone, `tf.gradients` sums the M contributions to each weight with one AddN that waits for all of
them, so M partial weight gradients are alive at once. Instead micro-batch t + 1 reads the weights as
passed on by micro-batch t, so the gradient of theta_t is own_t + grad(theta_{t+1}): a chain of two-input
sums that runs as each micro-batch's backward pass finishes. A re-computed cell passes theta on itself
and adds with `Accumulate`; otherwise `PassOn` does it, whose gradient is an Identity. Both are marked
for grappler to keep, which stops its arithmetic optimiser from fusing the chain back into one M-input
AddN. Passing on after the previous micro-batch's forward pass also keeps each device on the fill-drain
order (a re-computed cell with recompute_overlap relaxes it to two micro-batches at once; see
recomputation.Recomputed), and so does the order in which backward passes are released (see PassOn
and recomputation.ReplayOrder).
"""

from lingvo import compat as tf
from tensorflow.core.framework import attr_value_pb2

_DO_NOT_REMOVE = {'_grappler_do_not_remove': attr_value_pb2.AttrValue(b=True)}


def Kept():
  """Scope in which new ops carry the attribute that stops grappler removing or fusing them."""
  return tf.get_default_graph()._attr_scope(_DO_NOT_REMOVE)  # pylint: disable=protected-access


def _KeptIdentity(g):
  """Identity of a gradient (dense or IndexedSlices) that grappler may not remove."""
  if g is None:
    return None
  with Kept():
    if isinstance(g, tf.IndexedSlices):
      return tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape)
    return tf.identity(g, name='accumulate')


def Accumulate(own, rest):
  """own + rest for weight gradients that may be None or IndexedSlices, kept out of AddN fusion.

  Dense sums are computed as rest - (-own), bit for bit own + rest: TF writes a sum into the buffer
  of its first input when nothing else holds it, and grappler orders the inputs of a commutative op
  by name, which puts own first. The running sum would then move to a new buffer with every
  micro-batch, and the allocator often serves the new one from a larger free block (1.5-2 MiB
  blocks for 1 MiB gradients, measured). Subtraction keeps rest first, so each sum stays in one buffer.
  """
  if own is None:
    return rest
  if rest is None:
    return own
  if isinstance(own, tf.IndexedSlices) and isinstance(rest, tf.IndexedSlices):
    return tf.IndexedSlices(tf.concat([own.values, rest.values], 0),
                            tf.concat([own.indices, rest.indices], 0), own.dense_shape)
  with Kept():
    return tf.subtract(tf.convert_to_tensor(rest), tf.negative(tf.convert_to_tensor(own)),
                       name='accumulate')


def PassOn(theta, outputs, device, name='pass_on'):
  """Passes `theta` on to the next micro-batch, and gates this micro-batch's `outputs`.

  Forward, both are identities, and the next micro-batch's theta exists only after `outputs` do.
  Backward, the gradient reaching theta (the sum over later micro-batches) is kept out of AddN fusion,
  and the gradients of `outputs` are released only once that sum exists. So a cell without
  re-computation also runs its backward passes in reverse micro-batch order and holds about two partial
  weight gradients instead of M.

  Args:
    theta: NestedMap of the cell's weights as used by the current micro-batch.
    outputs: the current micro-batch's outputs (any structure; None allowed).
    device: the cell's device; the pass-on and its gradient run there.
    name: name scope.

  Returns:
    (gated outputs, theta for the next micro-batch).
  """
  theta_leaves = theta.Flatten()
  out_leaves = tf.nest.flatten(outputs)
  gated = [i for i, y in enumerate(out_leaves) if isinstance(y, tf.Tensor) and y.dtype.is_floating]
  if not theta_leaves or not gated:
    return outputs, theta
  num_y = len(gated)

  @tf.custom_gradient
  def Op(*values):
    ys, thetas = values[:num_y], values[num_y:]
    with tf.control_dependencies(list(ys)):
      passed = [tf.identity(t) for t in thetas]

    def Grad(*grads):
      dys, rest = grads[:num_y], grads[num_y:]
      with tf.device(device):
        with tf.control_dependencies([r for r in rest if r is not None]):
          released = [None if d is None else tf.identity(d) for d in dys]
        return released + [_KeptIdentity(r) for r in rest]

    return [tf.identity(y) for y in ys] + passed, Grad

  with tf.device(device), tf.name_scope(name):
    results = Op(*([out_leaves[i] for i in gated] + theta_leaves))
  results = list(results) if isinstance(results, (list, tuple)) else [results]
  for i, y in zip(gated, results[:num_y]):
    out_leaves[i] = y
  return tf.nest.pack_sequence_as(outputs, out_leaves), theta.Pack(results[num_y:])
