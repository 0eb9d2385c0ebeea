"""Broadcast matmuls' gradients as 2-D matmuls: TF's values, without per-leading-index products."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe import matmul_gradient
from tests import layer_helpers


def _GradientsAndOps(build, scoped):
  """(gradients of build()'s output w.r.t. its inputs, op types of the gradient graph)."""
  with tf.Graph().as_default() as g:
    inputs, out = build(matmul_gradient.Scope() if scoped else None)
    dy = tf.constant(np.random.RandomState(1).normal(size=out.shape.as_list()).astype(np.float32))
    grads = tf.gradients(out, inputs, grad_ys=dy)
    types = [op.type for op in g.get_operations() if op.name.startswith('gradients')]
    with tf.Session(graph=g) as sess:
      return sess.run(grads), types


def _MatMul(x_shape, w_shape, **kwargs):
  def Build(scope):
    rng = np.random.RandomState(0)
    x = tf.constant(rng.normal(size=x_shape).astype(np.float32))
    w = tf.constant(rng.normal(size=w_shape).astype(np.float32))
    if scope is None:
      return [x, w], tf.matmul(x, w, **kwargs)
    with scope:
      return [x, w], tf.matmul(x, w, **kwargs)
  return Build


class GradientTest(test_utils.TestCase):

  def testBroadcastProjectionsGetTfsValuesFromTwoDMatMuls(self):
    for x_shape in ([6, 4, 5], [3, 2, 4, 5]):
      build = _MatMul(x_shape, [5, 3])
      reference, ref_types = _GradientsAndOps(build, scoped=False)
      grads, types = _GradientsAndOps(build, scoped=True)
      for g, r in zip(grads, reference):
        self.assertAllClose(g, r, rtol=1e-5, atol=1e-5)
      self.assertIn('BatchMatMulV2', ref_types)
      self.assertNotIn('BatchMatMulV2', types)
      self.assertEqual(types.count('MatMul'), 2)

  def testOtherBatchMatMulsKeepTfsGradient(self):
    for build in (_MatMul([6, 4, 5], [6, 5, 3]), _MatMul([6, 5, 4], [5, 3], adjoint_a=True),
                  _MatMul([6, 4, 5], [3, 5], adjoint_b=True)):
      reference, _ = _GradientsAndOps(build, scoped=False)
      grads, types = _GradientsAndOps(build, scoped=True)
      for g, r in zip(grads, reference):
        self.assertAllClose(g, r, rtol=1e-5, atol=1e-5)
      self.assertIn('BatchMatMulV2', types)


class TensorPipeLayerTest(test_utils.TestCase):

  def testPartitionsUseItAndGradientsEqualThePlainModel(self):
    # layer_helpers.Dense on [B, T, D] inputs: a rank-3 activation projected with a rank-2 weight.
    layers = layer_helpers.DenseLayers(4)
    inputs = lambda: (tf.constant(
        np.random.RandomState(0).normal(size=[8, 5, 8]).astype(np.float32)),)
    reference, _ = layer_helpers.Gradients(layer_helpers.Plain(layers), inputs)
    for two_d in (True, False):
      params = layer_helpers.Pipeline(layers, 2, 4, two_d_weight_gradients=two_d)
      grads, _ = layer_helpers.Gradients(params, inputs)
      self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-5, two_d)
      with tf.Graph().as_default() as g, layer_helpers.Cluster(2):
        out = params.Instantiate().FPropDefaultTheta(*inputs())
        tf.gradients(tf.reduce_mean(out), tf.trainable_variables())
        # The partitions' backward functions hold the gradients (traced once, whatever M is).
        batched = [n.name for f in g.as_graph_def().library.function for n in f.node_def
                   if n.op == 'BatchMatMulV2' and 'MatMul_grad/' in n.name]
      if two_d:
        self.assertEmpty(batched)
      else:
        self.assertLen(batched, 2 * 4)  # dx and dw of 4 layers.


if __name__ == '__main__':
  test_utils.main()
