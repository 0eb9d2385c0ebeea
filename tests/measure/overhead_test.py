"""Overhead shares of a traced step: they add up, and each is where it belongs."""

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.measure import overhead
from tensorpipe.measure import training_step
from tensorpipe import schedule_builders
from tests import layer_helpers


class OverheadTest(test_utils.TestCase):

  def testOverheadSharesOfATracedStepAddUp(self):
    layers = layer_helpers.DenseLayers(4, dim=64)
    step = training_step.TrainingStep('K=2', layers, [2, 2], lambda: (tf.ones([32, 64]),), 4,
                                      devices=2, warmup=1)
    trace = step.Trace()
    step.Close()
    shares = overhead.OverheadShares(trace, 4)
    self.assertEqual(sorted(shares), sorted(overhead.SHARES))
    self.assertAlmostEqual(sum(shares.values()), 1.0, places=6)
    for name, value in shares.items():
      self.assertGreaterEqual(value, 0.0, name)
    self.assertGreater(shares['recompute'], 0.0)
    self.assertGreater(shares['work'], 0.0)
    # The bubble is the fill-drain idle share of equal partitions, (K - 1) / (M + K - 1), unless
    # the devices idled less than that; the rest of the idle time is imbalance.
    idle = shares['bubble'] + shares['imbalance']
    self.assertAlmostEqual(shares['bubble'],
                           min(schedule_builders.FillDrainBubbleFraction(2, 4), idle))


if __name__ == '__main__':
  test_utils.main()
