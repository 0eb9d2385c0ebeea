"""consistency: the GPipe paper's test passes, a pipeline whose results depend on M against the
unpipelined reference fails, batch norm is compared across K at fixed M, and the Params of every
TensorPipeLayer nested in a task are re-partitioned.

The small task and input (`helpers.PipelineTask`, `helpers.ConstantInput`, `helpers.TimeMix`) are
also registered as a model by tests/tools/consistency_tool_test.py.
"""

import numpy as np
import pytest
from lingvo.core import hyperparams
from lingvo.core import test_utils

from tensorpipe import batch_norm
from tensorpipe import layer as layer_lib
from tensorpipe.measure import consistency
from tests import helpers

TIME, BATCH, DIM = helpers.TIME_MAJOR_SHAPE
ConstantInput = helpers.ConstantInput
PipelineTask = helpers.PipelineTask
TimeMajorTask = helpers.TimeMajorTask


def BatchNormTask():
  """A task on x [B, D] with two tensorpipe.batch_norm.BatchNorm layers."""
  dense = helpers.DenseLayers(2, DIM)
  layers = [dense[0], batch_norm.BatchNorm.Params().Set(name='bn0', dim=DIM), dense[1],
            batch_norm.BatchNorm.Params().Set(name='bn1', dim=DIM)]
  task = PipelineTask.Params().Set(pipeline=layer_lib.TensorPipeLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=2, num_micro_batches=2))
  task.input = ConstantInput.Params().Set(shape=[BATCH, DIM])
  return task


class WithPipelinesTest(test_utils.TestCase):

  def testOverridesEveryNestedPipelineAndKeepsTheRest(self):
    outer = hyperparams.Params()
    outer.Define('encoder', layer_lib.TensorPipeLayer.Params().Set(
        name='enc', partitions=[helpers.DenseLayers(2), helpers.DenseLayers(3)[2:]],
        num_micro_batches=4, memory_budget=10**6, schedule='1f1b'), '')
    outer.Define('towers', [hyperparams.Params()], '')
    outer.towers[0].Define('decoder', helpers.Pipeline(helpers.DenseLayers(4), 4, 1,
                                                       micro_batch_size=2, name='dec'), '')
    outer.Define('plain', helpers.Plain(helpers.DenseLayers(2)), '')
    paths = [path for path, _ in layer_lib.Pipelines(outer)]
    self.assertEqual(paths, ['encoder', 'towers[0].decoder'])
    self.assertEqual([consistency.NumLayers(p) for _, p in layer_lib.Pipelines(outer)], [3, 4])

    new = consistency.WithPipelines(outer, 2, 3)
    enc, dec = new.encoder, new.towers[0].decoder
    self.assertIsNone(enc.partitions)
    self.assertEqual([l.name for l in enc.layers], ['layer0', 'layer1', 'layer2'])
    for p in (enc, dec):
      self.assertEqual((p.num_partitions, p.num_micro_batches, p.micro_batch_size,
                        p.memory_budget, p.unpipelined), (2, 3, None, None, False))
    self.assertEqual(enc.schedule, '1f1b')  # Kept: all schedules give the same gradients.
    self.assertTrue(consistency.WithPipelines(outer, 1, 1, unpipelined=True).encoder.unpipelined)
    # The original is untouched.
    self.assertLen(outer.encoder.partitions, 2)
    self.assertEqual(outer.towers[0].decoder.micro_batch_size, 2)

  def testKAboveTheLayersIsSkippedWithANote(self):
    task = TimeMajorTask(batch_dim=1)
    case = consistency.TaskCase(task, partitions=(1, 3, 4), micro_batches=(1,),
                                input_params=ConstantInput.Params())
    self.assertEqual([v.name for v in case.variants], ['K=1 M=1', 'K=3 M=1'])
    self.assertIn('K=4 skipped: TensorPipeLayer task.pipeline has only 3 layers', case.notes)
    self.assertIn('batch: x [4, 8, 4] float32 (one batch of the training input, fed to every '
                  'variant)', case.notes)

  def testErrorsAreOneLineNamingTheValue(self):
    with self.assertRaisesRegex(ValueError, r"^task 'tiny' has no TensorPipeLayer"):
      consistency.TaskCase(PipelineTask.Params().Set(pipeline=helpers.Plain([])),
                           input_params=ConstantInput.Params())
    with self.assertRaisesRegex(ValueError, r"^task 'tiny' has no input Params"):
      consistency.TaskCase(TimeMajorTask(1))
    with self.assertRaisesRegex(ValueError, r'^partitions must be a non-empty list of positive '
                                r'integers, got \[1, 0\]$'):
      consistency.TaskCase(TimeMajorTask(1), partitions=(1, 0), input_params=ConstantInput.Params())
    with self.assertRaisesRegex(ValueError, r'^tolerance must be positive, got 0'):
      consistency.Compare(consistency.PaperExample(), tolerance=0)


class CheckTest(test_utils.TestCase):

  # The paper's example (16 convolutions, K = 1, 2, 4): tests/tools/consistency_tool_test.py runs it
  # as a user does and checks the global norms.

  def testRightBatchDimPasses(self):
    report = consistency.Check(TimeMajorTask(batch_dim=1), partitions=(1, 2), micro_batches=(1, 2),
                               input_params=ConstantInput.Params())
    self.assertTrue(report.ok, report.Format())
    self.assertEqual(sorted(report.differences), ['K=1 M=1', 'K=1 M=2', 'K=2 M=1', 'K=2 M=2'])
    self.assertLess(report.LargestDifference()[0], 1e-6)

  def testWrongBatchDimFailsAtEveryKWithMoreThanOneMicroBatch(self):
    report = consistency.Check(TimeMajorTask(batch_dim=0), partitions=(1, 2), micro_batches=(1, 2),
                               input_params=ConstantInput.Params())
    self.assertFalse(report.ok)
    self.assertEqual(sorted({variant for variant, _, _ in report.mismatches}),
                     ['K=1 M=2', 'K=2 M=2'])
    # Cutting the time axis changes the gradients by far more than rounding.
    self.assertGreater(report.differences['K=2 M=2']['tiny/pipe/layer0/w'], 1e-3)
    self.assertLess(report.differences['K=2 M=1']['tiny/pipe/layer0/w'], 1e-6)
    self.assertEqual(report.fixed_m, {})  # Nothing legitimately depends on M here.
    last = report.Format().splitlines()[-1]
    self.assertRegex(last, r'^FAIL: 2 of 4 variant\(s\) \(K=1 M=2, K=2 M=2\) differ by more than '
                     r'1\.0e-04; largest: K=\d M=2, .* differs by \d\.\de-\d\d$')

  @pytest.mark.slow  # Five builds with grappler: about 7 s.
  def testBatchNormIsComparedAcrossKAtFixedM(self):
    report = consistency.Check(BatchNormTask(), partitions=(1, 2), micro_batches=(1, 2))
    text = report.Format()
    self.assertTrue(report.ok, text)
    self.assertEqual(list(report.fixed_m), [2])
    self.assertIn('batch norm tiny/pipe/bn0 normalises each micro-batch with its own statistics',
                  report.fixed_m[2])
    self.assertIs(report.baselines['K=2 M=2'], report.fixed_m_bases[2])
    self.assertEqual(report.fixed_m_bases[2].name, 'K=1 M=2')
    self.assertIs(report.baselines['K=2 M=1'], report.reference)  # M = 1: batch norm is exact.
    self.assertIn('M=2: results depend on M, so each K at M=2 is compared with K=1 M=2 (across K '
                  'at fixed M), not with the unpipelined reference', text)
    self.assertIn('  - batch norm tiny/pipe/bn1 normalises each micro-batch with its own '
                  'statistics', text)
    # Against the unpipelined reference M = 2 would fail: micro-batch statistics differ.
    m2, reference = report.fixed_m_bases[2], report.reference
    largest = max(np.linalg.norm(m2.grads[name] - g) for name, g in reference.grads.items())
    self.assertGreater(largest / reference.max_norm, 10 * consistency.DEFAULT_TOLERANCE)


if __name__ == '__main__':
  test_utils.main()
