"""TrainingStep: a TensorPipeLayer's SGD step in its own session, timed and traced."""

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.measure import training_step
from tests import layer_helpers
from tests import trace_helpers


class TrainingStepTest(test_utils.TestCase):

  def testTimesTracesAndTrains(self):
    layers = layer_helpers.DenseLayers(4, dim=64)
    step = training_step.TrainingStep('K=2', layers, [3, 1], lambda: (tf.ones([32, 64]),), 4,
                                      devices=2, warmup=1, learning_rate=0.1)
    try:
      first = step.Run()
      step.Time(3)
      self.assertLen(step.times, 3)
      self.assertGreater(step.Median(), 0.0)
      self.assertLess(step.Run(), first)  # The SGD updates lower the loss.
      trace = step.Trace()
    finally:
      step.Close()
    self.assertEqual(trace.devices, ['CPU:0', 'CPU:1'])
    self.assertLen(trace.PartitionTimes(), 2)
    self.assertEqual({op.micro_batch for op in trace.ops if op.partition == 1}, {0, 1, 2, 3})
    # The pipeline's own ops (splitting into micro-batches) are recognised by its scope.
    self.assertGreater(sum(by_cat.get('setup', 0.0) for by_cat in trace.BusyByCategory().values()),
                       0.0)
    # Partition 0 holds three of the four equal layers: its device ran three times the MatMuls.
    # (Counted, not timed: busy times are measured and belong in tools/.)
    matmuls = {device: len([op for op in trace.ops if op.device == device and not op.is_call
                            and op.op_type in trace_helpers.MATMUL_TYPES])
               for device in trace.devices}
    self.assertGreater(matmuls['CPU:1'], 0)
    self.assertEqual(matmuls['CPU:0'], 3 * matmuls['CPU:1'])
    self.assertTrue(all(t >= 0 for t in trace.Busy().values()))

  def testPerExampleLossRunsTheOneFOneBSchedule(self):
    layers = layer_helpers.DenseLayers(2, dim=8)
    with tf.Graph().as_default():
      loss = training_step.PerExampleSquare.Params().Set(name='l').Instantiate()
      y = tf.constant([[1.0, 3.0], [2.0, 2.0]])
      per_example = loss.FProp(loss.theta, y, 2 * y)
      with self.session():
        self.assertAllClose(self.evaluate(per_example), [5.0 + 20.0, 4.0 + 16.0])
    step = training_step.TrainingStep('1f1b', layers, [1, 1], lambda: (tf.random.uniform([8, 8], seed=1),), 4,
                                      devices=2,
                                      warmup=0, learning_rate=0.1, schedule='1f1b',
                                      per_example_loss=True)
    try:
      first = step.Run()
      self.assertLess(step.Run(), first)  # The SGD updates lower the loss.
      trace = step.Trace()
    finally:
      step.Close()
    # Partition 1 runs the loss layer on each micro-batch.
    self.assertEqual({op.micro_batch for op in trace.ops if op.partition == 1}, {0, 1, 2, 3})

  def testErrorsNameTheValues(self):
    with self.assertRaisesRegex(ValueError, r'TrainingStep s: partition sizes \[2, 1\] do not add '
                                'up to 4 layers'):
      training_step.TrainingStep('s', layer_helpers.DenseLayers(4), [2, 1],
                                 lambda: (tf.ones([2, 8]),), 1)


if __name__ == '__main__':
  test_utils.main()
