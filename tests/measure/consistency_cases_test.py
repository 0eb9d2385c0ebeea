"""consistency_cases: a pipeline whose results depend on M against the unpipelined reference fails,
batch norm is compared with the micro-batch reference (so a wrong batch_dim fails even with batch
norm), a variant that fails to run is reported with its cause and not as a difference, and the
Params of every TensorPipeLayer nested in a task are re-partitioned.

The small task and input (`task_helpers.PipelineTask`, `task_helpers.ConstantInput`, `task_helpers.TimeMix`) are
also registered as a model by tests/tools/consistency_tool_test.py.
"""

import numpy as np
import pytest
from lingvo.core import hyperparams
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import batch_norm
from tensorpipe import layer as layer_lib
from tensorpipe.measure import consistency
from tensorpipe.measure import consistency_cases
from tests import layer_helpers
from tests import task_helpers

TIME, BATCH, DIM = task_helpers.TIME_MAJOR_SHAPE
ConstantInput = task_helpers.ConstantInput
PipelineTask = task_helpers.PipelineTask
TimeMajorTask = task_helpers.TimeMajorTask
TimeMajorBatchNormTask = task_helpers.TimeMajorBatchNormTask


def BatchNormTask():
  """A task on x [B, D] with two tensorpipe.batch_norm.BatchNorm layers."""
  dense = layer_helpers.DenseLayers(2, DIM)
  layers = [dense[0], batch_norm.BatchNorm.Params().Set(name='bn0', dim=DIM), dense[1],
            batch_norm.BatchNorm.Params().Set(name='bn1', dim=DIM)]
  task = PipelineTask.Params().Set(pipeline=layer_lib.TensorPipeLayer.Params().Set(
      name='pipe', layers=layers, num_devices=2, num_micro_batches=2))
  task.input = ConstantInput.Params().Set(shape=[BATCH, DIM])
  return task


class WithPipelinesTest(test_utils.TestCase):

  def testOverridesEveryNestedPipelineAndKeepsTheRest(self):
    outer = hyperparams.Params()
    outer.Define('encoder', layer_lib.TensorPipeLayer.Params().Set(
        name='enc', partitions=[layer_helpers.DenseLayers(2), layer_helpers.DenseLayers(3)[2:]],
        num_micro_batches=4, memory_budget=10**6, schedule='1f1b'), '')
    outer.Define('towers', [hyperparams.Params()], '')
    outer.towers[0].Define('decoder', layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 4, 1,
                                                       micro_batch_size=2, name='dec'), '')
    outer.Define('plain', layer_helpers.Plain(layer_helpers.DenseLayers(2)), '')
    paths = [path for path, _ in layer_lib.Pipelines(outer)]
    self.assertEqual(paths, ['encoder', 'towers[0].decoder'])
    self.assertEqual([consistency_cases.NumLayers(p) for _, p in layer_lib.Pipelines(outer)],
                     [3, 4])

    new = consistency_cases.WithPipelines(outer, 2, 3)
    enc, dec = new.encoder, new.towers[0].decoder
    self.assertIsNone(enc.partitions)
    self.assertEqual([l.name for l in enc.layers], ['layer0', 'layer1', 'layer2'])
    for p in (enc, dec):
      self.assertEqual((p.num_devices, p.num_micro_batches, p.micro_batch_size,
                        p.memory_budget, p.unpipelined), (2, 3, None, None, False))
    self.assertEqual(enc.schedule, '1f1b')  # Kept: all schedules give the same gradients.
    unpipelined = consistency_cases.WithPipelines(outer, 1, 1, unpipelined=True)
    self.assertTrue(unpipelined.encoder.unpipelined)
    # The original is untouched.
    self.assertLen(outer.encoder.partitions, 2)
    self.assertEqual(outer.towers[0].decoder.micro_batch_size, 2)

  def testKAboveTheLayersIsSkippedWithANote(self):
    task = TimeMajorTask(batch_dim=1)
    case = consistency_cases.TaskCase(task, devices=(1, 3, 4), micro_batches=(1,),
                                      input_params=ConstantInput.Params())
    self.assertEqual([v.name for v in case.variants], ['K=1 M=1', 'K=3 M=1'])
    self.assertIn('K=4 skipped: TensorPipeLayer task.pipeline has only 3 layers', case.notes)
    self.assertIn('batch: x [4, 8, 4] float32 (one batch of the training input, fed to every '
                  'variant)', case.notes)
    # ConstantInput's batch_size is 8: the examples are on axis 1 of the time-major x.
    self.assertIn('examples: x axis 1 (the axes a batch-norm model\'s micro-batch reference '
                  'splits)', case.notes)

  def testErrorsAreOneLineNamingTheValue(self):
    with self.assertRaisesRegex(ValueError, r"^task 'tiny' has no TensorPipeLayer"):
      consistency_cases.TaskCase(PipelineTask.Params().Set(pipeline=layer_helpers.Plain([])),
                                 input_params=ConstantInput.Params())
    with self.assertRaisesRegex(ValueError, r"^task 'tiny' has no input Params"):
      consistency_cases.TaskCase(TimeMajorTask(1))
    with self.assertRaisesRegex(ValueError, r'^devices must be a non-empty list of positive '
                                r'integers, got \[1, 0\]$'):
      consistency_cases.TaskCase(TimeMajorTask(1), devices=(1, 0),
                                 input_params=ConstantInput.Params())


class CheckTest(test_utils.TestCase):

  # The paper's example (16 convolutions, K = 1, 2, 4): tests/tools/consistency_tool_test.py runs it
  # as a user does and checks the global norms.

  def testRightBatchDimPasses(self):
    report = consistency_cases.Check(TimeMajorTask(batch_dim=1), devices=(1, 2),
                                     micro_batches=(1, 2), input_params=ConstantInput.Params())
    self.assertTrue(report.ok, report.Format())
    self.assertEqual(sorted(report.differences), ['K=1 M=1', 'K=1 M=2', 'K=2 M=1', 'K=2 M=2'])
    self.assertLess(report.LargestDifference()[0], 1e-6)

  def testWrongBatchDimFailsAtEveryKWithMoreThanOneMicroBatch(self):
    report = consistency_cases.Check(TimeMajorTask(batch_dim=0), devices=(1, 2),
                                     micro_batches=(1, 2), input_params=ConstantInput.Params())
    self.assertFalse(report.ok)
    self.assertEqual(sorted({variant for variant, _, _ in report.mismatches}),
                     ['K=1 M=2', 'K=2 M=2'])
    # Cutting the time axis changes the gradients by far more than rounding.
    self.assertGreater(report.differences['K=2 M=2']['tiny/pipe/layer0/w'], 1e-3)
    self.assertLess(report.differences['K=2 M=1']['tiny/pipe/layer0/w'], 1e-6)
    self.assertEqual(report.fixed_m, {})  # Nothing legitimately depends on M here.
    last = report.Format().splitlines()[-1]
    self.assertRegex(last, r'^FAIL: 2 of 4 variant\(s\) \(K=1 M=2, K=2 M=2\) differ by more than '
                     r'1\.0e-05; largest: K=\d M=2, .* differs by \d\.\de-\d\d; only M > 1 '
                     r'differs, so the micro-batches likely split an axis other than the '
                     r'examples\': TensorPipeLayer task.pipeline has batch_dim=0; .*\(set '
                     r'batch_dim=1 for time-major inputs \[T, B, \.\.\.\]\)$')

  @pytest.mark.slow  # Six builds with grappler: 2-8 s.
  def testBatchNormIsComparedWithTheMicroBatchReference(self):
    report = consistency_cases.Check(BatchNormTask(), devices=(1, 2), micro_batches=(1, 2))
    text = report.Format()
    self.assertTrue(report.ok, text)
    self.assertEqual(list(report.fixed_m), [2])
    self.assertIn('batch norm tiny/pipe/bn0 normalises each micro-batch with its own statistics',
                  report.fixed_m[2])
    micro = report.micro_references[2]
    self.assertEqual(micro.name, 'unpipelined M=2')
    self.assertIs(report.baselines['K=1 M=2'], micro)
    self.assertIs(report.baselines['K=2 M=2'], micro)
    self.assertIs(report.baselines['K=2 M=1'], report.reference)  # M = 1: batch norm is exact.
    self.assertIn('M=2: results depend on M, so each K at M=2 is compared with unpipelined M=2: '
                  'the same layers unpipelined, run on each of the 2 micro-batches of examples in '
                  'turn', text)
    self.assertIn('  - batch norm tiny/pipe/bn1 normalises each micro-batch with its own '
                  'statistics', text)
    self.assertLess(report.LargestDifference()[0], 1e-6)
    # Against the unpipelined reference M = 2 would fail: micro-batch statistics differ.
    reference = report.reference
    largest = max(np.linalg.norm(micro.grads[name] - g) for name, g in reference.grads.items())
    self.assertGreater(largest / reference.max_norm, 10 * consistency.DEFAULT_TOLERANCE)

  def testTimeMajorBatchNormWithTheRightBatchDimPasses(self):
    report = consistency_cases.Check(TimeMajorBatchNormTask(batch_dim=1), devices=(2,),
                                     micro_batches=(2,), input_params=ConstantInput.Params())
    self.assertTrue(report.ok, report.Format())
    self.assertIs(report.baselines['K=2 M=2'], report.micro_references[2])
    self.assertLess(report.LargestDifference()[0], 1e-6)

  def testTimeMajorBatchNormWithBatchDimZeroFailsNamingBatchDim(self):
    # Compared across K at fixed M, as before, this passed: a wrong split never depends on K.
    report = consistency_cases.Check(TimeMajorBatchNormTask(batch_dim=0), devices=(2,),
                                     micro_batches=(1, 2), input_params=ConstantInput.Params())
    text = report.Format()
    self.assertFalse(report.ok, text)
    self.assertEqual(report.Differing(), ['K=2 M=2'])
    self.assertEqual(report.Failed(), [])
    self.assertGreater(report.differences['K=2 M=2']['tiny/pipe/layer0/w'],
                       10 * consistency.DEFAULT_TOLERANCE)
    self.assertLess(report.differences['K=2 M=1']['tiny/pipe/layer0/w'], 1e-6)
    self.assertRegex(text.splitlines()[-1],
                     r'^FAIL: 1 of 2 variant\(s\) \(K=2 M=2\) differ by more than 1\.0e-05; '
                     r'.*TensorPipeLayer task.pipeline has batch_dim=0; .*set batch_dim=1 for '
                     r'time-major inputs')

  def testAVariantThatFailsToRunIsReportedWithItsCauseNotAsADifference(self):
    task = TimeMajorTask(batch_dim=0)
    task.pipeline.check_batch_dim = True  # Its check fails the first step: the layers mix along T.
    report = consistency_cases.Check(task, devices=(2,), micro_batches=(2,),
                                     input_params=ConstantInput.Params())
    text = report.Format()
    self.assertFalse(report.ok)
    self.assertEqual([r.name for r in report.Failed()], ['K=2 M=2'])
    self.assertEqual(report.Differing(), [])
    lines = text.splitlines()
    failed = [l for l in lines if l.startswith('K=2 M=2 failed to run: ')]
    self.assertLen(failed, 1, text)
    # The first line of the cause is TensorPipe's message, not TensorFlow's header.
    self.assertRegex(failed[0], r"^K=2 M=2 failed to run: TensorPipeLayer 'pipe': the batch_dim "
                     r'check failed: .*batch_dim=0')
    self.assertNotIn('Graph execution error', text)
    self.assertRegex(lines[-1], r'^FAIL: 1 of 1 variant\(s\) failed to run \(K=2 M=2\); first '
                     r"cause: TensorPipeLayer 'pipe': the batch_dim check failed: .*batch_dim=0")
    self.assertNotIn('differ', lines[-1])


class SplitExamplesTest(test_utils.TestCase):

  def testExampleAxesPreferAxisZeroThenTheAxisOfTheBatchSize(self):
    batch = py_utils.NestedMap(ids=np.zeros([8, 5]), tm=np.zeros([5, 8, 3]), vocab=np.zeros([7]),
                               scalar=np.float32(1))
    self.assertEqual(consistency_cases.ExampleAxes(batch, 8),
                     {'ids': 0, 'tm': 1, 'vocab': None, 'scalar': None})
    # No batch size, or one no input has: Lingvo's convention, axis 0.
    self.assertEqual(consistency_cases.ExampleAxes(batch, None),
                     {'ids': 0, 'tm': 0, 'vocab': 0, 'scalar': None})

  def testSplitsLikeThePipelineWithOffsets(self):
    batch = py_utils.NestedMap(x=np.arange(2 * 5).reshape([2, 5]), vocab=np.arange(3))
    parts = consistency_cases.SplitExamples(batch, {'x': 1, 'vocab': None}, 2)
    self.assertEqual([offset for offset, _ in parts], [0, 3])  # 5 = 3 + 2, as micro_batching.
    self.assertAllEqual(parts[0][1].x, [[0, 1, 2], [5, 6, 7]])
    self.assertAllEqual(parts[1][1].x, [[3, 4], [8, 9]])
    self.assertAllEqual(parts[1][1].vocab, [0, 1, 2])
    with self.assertRaisesRegex(ValueError, r'^the inputs disagree on their number of examples: '
                                r'x 5, vocab 3$'):
      consistency_cases.SplitExamples(batch, {'x': 1, 'vocab': 0}, 2)


if __name__ == '__main__':
  test_utils.main()
