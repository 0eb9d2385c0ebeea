"""Re-computation is real: forward ops run twice with 'always', and peak memory drops."""

import re

import numpy as np
from lingvo import compat as tf
from lingvo.core import layers as lingvo_layers
from lingvo.core import test_utils

from tensorpipe import recomputation
from tests import helpers

K, M, L = 2, 4, 4


def _IsForwardMatMul(name):
  return 'MatMul_grad' not in name


class RecomputeCountTest(test_utils.TestCase):

  def _ForwardMatMuls(self, mode):
    with tf.Graph().as_default() as g, helpers.Cluster(K):
      net = helpers.Pipeline(helpers.DenseLayers(L), K, M, mode).Instantiate()
      out = net.FPropDefaultTheta(tf.ones([8, 8]))
      loss = tf.reduce_sum(out * out)
      grads = tf.gradients(loss, tf.trainable_variables(), colocate_gradients_with_ops=True)
      with helpers.Session(g, K) as sess:
        sess.run(tf.global_variables_initializer())
        _, nodes = helpers.TracedStep(sess, [loss, grads])
    return helpers.CountByType(nodes, helpers.MATMUL_TYPES, _IsForwardMatMul)

  def testForwardRunsTwiceWithAlwaysOnceWithNever(self):
    self.assertEqual(self._ForwardMatMuls('never'), L * M)
    self.assertEqual(self._ForwardMatMuls('always'), 2 * L * M)
    self.assertEqual(self._ForwardMatMuls('except_last'), 2 * L * M - L)


class NumericChecksTest(test_utils.TestCase):

  def testCheckNumericsRunsInTheForwardPassOnly(self):
    fcs = [lingvo_layers.FCLayer.Params().Set(name='fc%d' % i, input_dim=8, output_dim=8)
           for i in range(L)]
    with tf.Graph().as_default() as g, helpers.Cluster(K):
      out = helpers.Pipeline(fcs, K, M).Instantiate().FPropDefaultTheta(tf.ones([8, 8]))
      loss = tf.reduce_sum(out * out)
      grads = tf.gradients(loss, tf.trainable_variables(), colocate_gradients_with_ops=True)
      with helpers.Session(g, K) as sess:
        sess.run(tf.global_variables_initializer())
        _, nodes = helpers.TracedStep(sess, [loss, grads])
    checks = [name for _, name, op_type, _, _ in nodes if op_type == 'CheckNumerics']
    self.assertNotEmpty([c for c in checks if 'gradients' not in c])
    self.assertEmpty([c for c in checks if 'gradients' in c])


class StageOrderTest(test_utils.TestCase):
  """Layer j's backward pass of micro-batch t starts after the weight gradients of layer j + 1 of t
  (ReplayOrder.STAGE_LAG) and of layer j of t + 1, with or without recompute_overlap."""

  def _Check(self, overlap):
    num_layers, per_cell, num_micro = 8, 4, 3
    with tf.Graph().as_default() as g, helpers.Cluster(K):
      net = helpers.Pipeline(helpers.DenseLayers(num_layers, dim=32), K, num_micro,
                             recompute_overlap=overlap).Instantiate()
      loss = tf.reduce_sum(tf.square(net.FPropDefaultTheta(tf.ones([24, 32]))))
      grads = tf.gradients(loss, tf.trainable_variables(), colocate_gradients_with_ops=True)
      with helpers.Session(g, K) as sess:
        sess.run(tf.global_variables_initializer())
        _, nodes = helpers.TracedStep(sess, [loss, grads])

    def WeightGradientEnd(t, j):
      mb = 'cell%d_mb%d/' % (j // per_cell, t)
      ends = [end for _, name, _, _, end in nodes
              if mb in name and name.endswith('/layer%d/MatMul_grad/MatMul_1' % j)]
      self.assertLen(ends, 1, (t, j))
      return ends[0]

    lag = recomputation.ReplayOrder.STAGE_LAG
    checked = 0
    for t in range(num_micro):
      for j in range(num_layers):
        mb = 'cell%d_mb%d/' % (j // per_cell, t)
        backward = [start for _, name, _, start, _ in nodes
                    if mb in name and re.search(r'/layer%d/\w+_grad/' % j, name)]
        self.assertNotEmpty(backward, (t, j))
        if j % per_cell + lag < per_cell:
          self.assertGreaterEqual(min(backward), WeightGradientEnd(t, j + lag), (t, j))
          checked += 1
        if t + 1 < num_micro:
          self.assertGreaterEqual(min(backward), WeightGradientEnd(t + 1, j), (t, j))
          checked += 1
    self.assertEqual(checked, num_micro * K * (per_cell - lag) + (num_micro - 1) * num_layers)

  def testWithOverlap(self):
    self._Check(True)

  def testWithoutOverlap(self):
    self._Check(False)


class InPlaceUpdateTest(test_utils.TestCase):
  """Once a weight's summed gradient exists nothing reads the weight, so the update copies nothing."""

  def testUpdatesCopyNoWeight(self):
    params = helpers.Pipeline(helpers.DenseLayers(8, dim=256), K, M)
    for step_stats in helpers.TracedSgdSteps(params, 1024, K):
      updates = [n for dev in step_stats.dev_stats for n in dev.node_stats
                 if re.fullmatch(r'AssignSubVariableOp(_\d+)?', n.node_name)]
      self.assertLen(updates, 8)
      copies = [n.node_name for n in updates
                if any(r.alloc_bytes > 0 for m in n.memory for r in m.allocation_records)]
      self.assertEmpty(copies)


def _Ancestors(op):
  """Every op `op` waits for, through data and control edges."""
  seen, todo = set(), [op]
  while todo:
    current = todo.pop()
    for before in [x.op for x in current.inputs] + list(current.control_inputs):
      if before not in seen:
        seen.add(before)
        todo.append(before)
  return seen


class ForwardOrderTest(test_utils.TestCase):
  """With recompute_overlap, F(k, t) waits for F(k, t - 2) but not for F(k, t - 1); without, for t - 1."""

  def _WaitsFor(self, overlap):
    num_micro = 4
    with tf.Graph().as_default() as g, helpers.Cluster(K):
      net = helpers.Pipeline(helpers.DenseLayers(L), K, num_micro,
                             recompute_overlap=overlap).Instantiate()
      loss = tf.reduce_sum(tf.square(net.FPropDefaultTheta(tf.ones([8, 8]))))
      tf.gradients(loss, tf.trainable_variables(), colocate_gradients_with_ops=True)
    matmuls = {op.name.split('/', 1)[1]: op for op in g.get_operations()
               if op.type == 'MatMul' and 'gradients' not in op.name}
    waits = {}
    for k in range(K):
      first, last = 'layer%d' % (k * L // K), 'layer%d' % ((k + 1) * L // K - 1)
      for t in range(1, num_micro):
        ancestors = _Ancestors(matmuls['cell%d_mb%d/%s/MatMul' % (k, t, first)])
        waits[(k, t)] = [u for u in range(t) if matmuls['cell%d_mb%d/%s/MatMul' % (k, u, last)]
                         in ancestors]
    return waits

  def testTwoMicroBatchesOfACellRunTheirForwardPassesAtOnce(self):
    for (k, t), waits in self._WaitsFor(True).items():
      self.assertEqual(waits, list(range(t - 1)), (k, t))
    for (k, t), waits in self._WaitsFor(False).items():
      self.assertEqual(waits, list(range(t)), (k, t))


class RecomputeMemoryTest(test_utils.TestCase):
  """On a deep, narrow model 'always' keeps only boundary activations: a much lower peak."""

  def _PeakBytes(self, mode):
    with tf.Graph().as_default() as g, helpers.Cluster(K):
      net = helpers.Pipeline(helpers.DenseLayers(32, dim=64), K, 8, mode).Instantiate()
      out = net.FPropDefaultTheta(tf.random.uniform([8192, 64]))
      grads = tf.gradients(tf.reduce_mean(out), tf.trainable_variables(),
                           colocate_gradients_with_ops=True)
      norm = tf.add_n([tf.reduce_sum(x * x) for x in grads])
      with helpers.Session(g, K) as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(norm)
        # Above what is allocated before the step: earlier tests in the process may hold memory.
        tf.config.experimental.reset_memory_stats('CPU:0')
        before = tf.config.experimental.get_memory_info('CPU:0')['current']
        sess.run(norm)
        return tf.config.experimental.get_memory_info('CPU:0')['peak'] - before

  def testAlwaysPeaksFarBelowNever(self):
    never = self._PeakBytes('never')
    always = self._PeakBytes('always')
    # 'never' keeps a 2 MiB activation per layer (measured ~68 MiB above resident); 'always' ~16 MiB.
    self.assertGreater(never, 32 * 2**20)
    self.assertLess(always, 0.5 * never, 'always %d vs never %d bytes' % (always, never))


if __name__ == '__main__':
  test_utils.main()
