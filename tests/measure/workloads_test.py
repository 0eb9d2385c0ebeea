"""Workloads: the synthetic layers run, and their FPropMeta gives their shapes and costs."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.measure import workloads
from tensorpipe.partitioner import cost_model


class WorkloadsTest(test_utils.TestCase):

  def testTransformerStackRunsAndItsMetaFollowsTheShapes(self):
    t, b, vocab, dim = 5, 3, 50, 16
    stack = workloads.TransformerStack(2, dim, 32, 2, vocab)
    self.assertEqual([p.name for p in stack], ['embedding', 'block0', 'block1', 'softmax'])
    self.assertEqual([p.cls for p in stack], [workloads.TokenEmbedding, workloads.TransformerBlock,
                                              workloads.TransformerBlock, workloads.SoftmaxLogits])
    metas, out_shapes = cost_model.ChainMeta(stack, [[t, b]])
    self.assertEqual([s.ToTensorShape().as_list() for s in metas[1][1]], [[t, b, dim], [t, b]])
    self.assertEqual(out_shapes[0].ToTensorShape().as_list(), [t, b, vocab])
    flops = [f for f, _ in metas]
    self.assertEqual(flops[0], t * b * dim)
    self.assertEqual(flops[1], 2 * t * b * (4 * dim * dim + 2 * dim * 32) + 4 * t * t * b * dim)
    self.assertEqual(flops[3], 2 * t * b * dim * vocab + 3 * t * b * vocab)
    with self.session(graph=tf.Graph()) as sess:
      layers = [p.Instantiate() for p in stack]
      ids = tf.constant(np.random.RandomState(0).randint(0, vocab, size=[t, b]), tf.int32)
      out = (ids,)
      for layer in layers:
        out = layer.FPropDefaultTheta(*out)
        out = out if isinstance(out, tuple) else (out,)
      sess.run(tf.global_variables_initializer())
      log_probs = sess.run(out[0])
    self.assertEqual(log_probs.shape, (t, b, vocab))
    self.assertAllClose(np.exp(log_probs).sum(-1), np.ones([t, b]), atol=1e-5)
    with self.assertRaisesRegex(ValueError, 'num_layers must be >= 0, got -1'):
      workloads.TransformerStack(-1, dim, 32, 2, vocab)

  def testRepeatedDenseCostsItsRepeats(self):
    p = workloads.RepeatedDense.Params().Set(name='r', dim=4, repeats=3)
    self.assertEqual(cost_model.Flops([p], [[2, 4]]), [2 * 2 * 4 * 4 * 3])
    with self.session(graph=tf.Graph()) as sess:
      layer = p.Instantiate()
      x = tf.constant(np.random.RandomState(1).uniform(size=[2, 4]).astype(np.float32))
      out = layer.FPropDefaultTheta(x)
      sess.run(tf.global_variables_initializer())
      w, x_value, y = sess.run([layer.vars.w, x, out])
    expected = x_value
    for _ in range(3):
      expected = np.tanh(expected @ w)
    self.assertAllClose(y, expected, atol=1e-5)


if __name__ == '__main__':
  test_utils.main()
