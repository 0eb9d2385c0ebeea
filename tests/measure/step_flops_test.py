"""Step FLOPs: model and hardware FLOPs of a training step from its forward FLOPs and schedule."""

import unittest

from lingvo.core import layers

from tensorpipe.measure import step_flops
from tensorpipe.partitioner import cost_model
from tensorpipe import schedule_builders


class StepFlopsTest(unittest.TestCase):

  def testMatmulFlopsAreTwoPerMultiplyAdd(self):
    self.assertEqual(step_flops.MatmulFlops(1024, 1024, 1024), 2.0 * 1024**3)
    self.assertEqual(step_flops.MatmulFlops(256, 512, 128), 2.0 * 256 * 512 * 128)
    with self.assertRaisesRegex(ValueError, 'inner must be >= 1, got 0'):
      step_flops.MatmulFlops(4, 0, 4)

  def testRecomputedForwardsFollowTheRecomputeMode(self):
    sizes = [2, 2, 2, 2]
    fill_drain = lambda mode: schedule_builders.FillDrainSchedule(2, 4, recompute=mode)
    self.assertEqual(step_flops.RecomputedForwards(fill_drain('never'), sizes), 0.0)
    self.assertEqual(step_flops.RecomputedForwards(fill_drain('always'), sizes), 1.0)
    self.assertEqual(step_flops.RecomputedForwards(fill_drain('except_last'), sizes), 0.75)
    # 'selective' re-runs every micro-batch's share of the FLOPs outside its matmuls.
    self.assertEqual(step_flops.RecomputedForwards(fill_drain('selective'), sizes), 1.0)
    self.assertEqual(step_flops.RecomputedForwards(fill_drain('selective'), sizes, 0.25), 0.25)
    self.assertEqual(step_flops.RecomputedForwards(fill_drain('always'), sizes, 0.25), 1.0)
    # Uneven micro-batches: the last one (not re-computed) holds 2 of 11 examples.
    self.assertAlmostEqual(
        step_flops.RecomputedForwards(fill_drain('except_last'), [3, 3, 3, 2]), 9 / 11.0)
    self.assertEqual(step_flops.RecomputedForwards(
        schedule_builders.OneFOneBSchedule(2, 4, recompute='always'), sizes), 1.0)
    # Zero bubble: the input-gradient task re-computes; the weight-gradient task re-runs nothing.
    zero_bubble = schedule_builders.ZeroBubbleSchedule(2, 4)
    self.assertEqual(step_flops.RecomputedForwards(zero_bubble, sizes), 1.0)

  def testRecomputedForwardsRefuseSizesNotOnePerMicroBatch(self):
    with self.assertRaisesRegex(ValueError, r'needs 4 micro-batch sizes .*got \[2, 2\]'):
      step_flops.RecomputedForwards(schedule_builders.FillDrainSchedule(2, 4), [2, 2])
    with self.assertRaisesRegex(ValueError, r'adding up to >= 1, got \[0\]'):
      step_flops.RecomputedForwards(schedule_builders.FillDrainSchedule(1, 1), [0])

  def testDenseStackCountsItsMatmulsThreeOrFourTimes(self):
    batch, width, depth = 64, 32, 3
    stack = [layers.FCLayer.Params().Set(name='fc%d' % i, input_dim=width, output_dim=width)
             for i in range(depth)]
    forward, _ = cost_model.ChainFlops(stack, [[batch, width]])
    matmuls = depth * step_flops.MatmulFlops(batch, width, width)
    # FCLayer's FPropMeta adds its ReLU (one per output) and bias (one per unit) to the matmul.
    self.assertEqual(forward, matmuls + depth * (batch * width + width))
    self.assertEqual(step_flops.ModelFlops(forward), 3 * forward)
    recompute = step_flops.RecomputedForwards(schedule_builders.FillDrainSchedule(3, 4), [16] * 4)
    self.assertEqual(step_flops.HardwareFlops(forward, recompute), 4 * forward)
    self.assertEqual(step_flops.HardwareFlops(forward, 0.0), step_flops.ModelFlops(forward))


if __name__ == '__main__':
  unittest.main()
