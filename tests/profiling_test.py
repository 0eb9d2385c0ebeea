"""Profiling: a traced TensorPipe step's ops are labelled by cell, micro-batch and purpose."""

import collections

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe import profiling
from tests import helpers


def _TracedStep(recompute, num_micro_batches=2):
  graph = tf.Graph()
  with graph.as_default(), helpers.Cluster(2):
    net = helpers.Pipeline(helpers.DenseLayers(4, dim=64), 2, num_micro_batches,
                           recompute=recompute).Instantiate()
    x = tf.constant(np.random.RandomState(0).uniform(size=[16, 64]).astype(np.float32))
    loss = tf.reduce_mean(net.FPropDefaultTheta(x))
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    train_op = tf.group(*[v.assign_sub(0.1 * g) for v, g in zip(variables, grads)])
    with helpers.Session(graph, 2) as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(train_op)
      _, meta = profiling.TracedRun(sess, [train_op, loss])
  return profiling.Trace(meta, pipeline_scope='pipe')


class TraceTest(test_utils.TestCase):

  def testOpsAreLabelledAndPlaced(self):
    trace = _TracedStep('always')
    matmuls = collections.Counter()
    for op in trace.ops:
      if op.cell is not None:
        self.assertEqual(op.device, 'CPU:%d' % op.cell, op.name)
      if op.op_type in helpers.MATMUL_TYPES:
        matmuls[(op.category, op.cell, op.micro_batch)] += 1
    for k in range(2):
      for t in range(2):
        self.assertEqual(matmuls[('forward', k, t)], 2)  # Two Dense layers per cell.
        self.assertEqual(matmuls[('recompute', k, t)], 2)  # Re-run once in the backward pass.
        self.assertGreaterEqual(matmuls[('backward', k, t)], 3)  # dW for both, dx for at least one.
    categories = {op.category for op in trace.ops}
    self.assertIn('setup', categories)  # Micro-batch split and concat.
    self.assertIn('update', categories)

  def testWithoutRecomputationNothingIsRecomputed(self):
    trace = _TracedStep('never')
    self.assertFalse([op.name for op in trace.ops if op.category == 'recompute'])
    self.assertTrue([op for op in trace.ops if op.category == 'backward' and op.cell == 1])

  def testCellTimesTasksAndSummary(self):
    trace = _TracedStep('always', num_micro_batches=4)
    cells = trace.CellTimes()
    self.assertEqual(len(cells), 2)
    for c in cells:
      self.assertGreater(c.forward, 0)
      self.assertGreater(c.backward, 0)
      self.assertGreater(c.recompute, 0)
    tasks = {(k, kind, t): (start, end) for k, kind, t, start, end in trace.Tasks()}
    for t in range(4):
      # Data dependencies: F(1, t) after F(0, t); B(0, t) after B(1, t) has begun.
      self.assertGreaterEqual(tasks[(1, 'forward', t)][0], tasks[(0, 'forward', t)][1] - 1e-6)
      self.assertGreater(tasks[(0, 'backward', t)][1], tasks[(1, 'backward', t)][0])
    busy = trace.Busy()
    self.assertLessEqual(max(busy.values()), trace.step_time + 1e-9)
    text = profiling.Summary(trace)
    self.assertIn('CPU:0', text)
    self.assertIn('recompute', text)

  def testClassifyNames(self):
    self.assertEqual(profiling.Classify('pipe_1/cell0_mb3/layer0/MatMul', 'MatMul'),
                     ('forward', 0, 3))
    self.assertEqual(profiling.Classify(
        'gradients/pipe_1/cell1_mb2/IdentityN_grad/cell1_mb2/layer2/MatMul', 'MatMul'),
                     ('recompute', 1, 2))
    self.assertEqual(profiling.Classify(
        'gradients/pipe_1/cell1_mb2/IdentityN_grad/cell1_mb2/gradients/gradients/pipe_1/cell1_mb2/'
        'IdentityN_grad/cell1_mb2/layer2/MatMul_grad/MatMul', 'MatMul'), ('backward', 1, 2))
    self.assertEqual(profiling.Classify('gradients/pipe_1/cell0_mb0/layer0/MatMul_grad/MatMul_1',
                                        'MatMul'), ('backward', 0, 0))
    self.assertEqual(profiling.Classify('pipe_1/split', 'Split', 'pipe'), ('setup', None, None))
    self.assertEqual(profiling.Classify('pipe/layer0/w/AssignSub', 'AssignSubVariableOp'),
                     ('update', None, None))

  def testUntracedMetadataIsRejected(self):
    with self.assertRaisesRegex(ValueError, 'FULL_TRACE'):
      profiling.Trace(tf.compat.v1.RunMetadata())


if __name__ == '__main__':
  test_utils.main()
