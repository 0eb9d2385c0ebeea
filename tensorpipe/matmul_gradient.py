"""Weight gradients of broadcast matmuls, x [..., n] @ w [n, m], as one 2-D matmul.

Layers that project the last dimension of rank-3 activations with `tf.matmul` (Lingvo's
projections and feed-forward layers on CPU/GPU, e.g. on [T, B, D]) create a broadcasting
BatchMatMulV2. TF's gradient for w multiplies per leading index, giving a [..., n, m] tensor, and
then sums it. That costs time and memory in proportion to the leading dimensions other than the
batch (e.g. T x n x m floats) whatever the batch size, so M micro-batches pay it M times. Here,
inside `Scope()`, such a matmul's gradients are dw = reshape(x, [-1, n])^T reshape(dy, [-1, m]) and
dx = dy w^T: the same values up to float rounding, at the cost of one matmul each. Other
BatchMatMul ops keep TF's gradient. TensorPipeLayer traces its partitions under `Scope()` when
`two_d_weight_gradients` is on.
"""

from typing import ContextManager

from lingvo import compat as tf

from tensorpipe import tf_internals

_GRADIENT_NAME = 'TensorPipeBroadcastMatMul'
_OP_TYPES = ('BatchMatMulV2', 'BatchMatMulV3')


def _IsBroadcastProjection(op):
  x, w = op.inputs[0], op.inputs[1]
  return (not op.get_attr('adj_x') and not op.get_attr('adj_y') and w.shape.rank == 2 and
          x.shape.rank is not None and x.shape.rank > 2 and x.dtype == w.dtype and
          op.outputs[0].dtype == x.dtype)


@tf.RegisterGradient(_GRADIENT_NAME)
def _Gradient(op, grad):
  if not _IsBroadcastProjection(op):
    return tf_internals.RegisteredGradient(op.type)(op, grad)
  x, w = op.inputs[0], op.inputs[1]
  n, m = tf.shape(w)[0], tf.shape(w)[1]
  dy2 = tf.reshape(grad, [-1, m])
  dx = tf.reshape(tf.matmul(dy2, w, transpose_b=True), tf.shape(x))
  dw = tf.matmul(tf.reshape(x, [-1, n]), dy2, transpose_a=True)
  return dx, dw


def Scope() -> ContextManager[None]:
  """Context in which new BatchMatMulV2/V3 ops get the gradient of this module."""
  return tf.get_default_graph().gradient_override_map({t: _GRADIENT_NAME for t in _OP_TYPES})
