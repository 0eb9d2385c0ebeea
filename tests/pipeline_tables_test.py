"""Smoke tests of tools/pipeline_tables.py: overhead shares, memory search, deep predictions."""

import contextlib
import io

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe import simulator
from tests import helpers
from tools import benchmark_partitioning as bp
from tools import pipeline_tables as tables


class PipelineTablesTest(test_utils.TestCase):

  def testOverheadSharesOfATracedStepAddUp(self):
    layers = helpers.DenseLayers(4, dim=64)
    step = bp.Step('K=2', layers, [2, 2], lambda: (tf.ones([32, 64]),), 4, devices=2,
                   warmup=1)
    trace = step.Trace()
    step.Close()
    shares = tables.OverheadShares(trace, 4)
    self.assertAlmostEqual(sum(shares.values()), 1.0, places=6)
    for name, value in shares.items():
      self.assertGreaterEqual(value, 0.0, name)
    self.assertGreater(shares['recompute'], 0.0)
    self.assertGreater(shares['work'], 0.0)

  def testLargestFittingAmoebaNetGrowsWithPipelining(self):
    shapes = [[8, 32, 32, 3]]
    budget = 64 * 2**20
    naive = tables.LargestFilters(3, shapes, 1, 1, 'never', budget, lo=8, hi=256, step=8)
    piped = tables.LargestFilters(3, shapes, 2, 4, 'always', budget, lo=8, hi=256, step=8)
    self.assertIsNotNone(naive)
    self.assertGreaterEqual(piped, naive)
    peak, sizes = tables.PeakOfBestSplit(tables.AmoebaProfiles(3, piped, shapes), 2, 4, 'always')
    self.assertLessEqual(peak, budget)
    self.assertEqual(len(sizes), 2)
    bigger = tables.AmoebaProfiles(3, piped + 8, shapes)
    self.assertGreater(tables.PeakOfBestSplit(bigger, 2, 4, 'always')[0], budget)

  def testDeepPredictionsPrintATable(self):
    block = simulator.CellCost(1.0, 2.0, 1.0)
    costs = [block] * 10
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      tables.PredictDeep({1: costs, 4: costs}, 'Transformer-8 (tiny)')
    lines = out.getvalue().strip().splitlines()
    self.assertIn('K=128', lines[1])
    k2_m1 = float(lines[2].split()[1])
    self.assertEqual(k2_m1, 1.0)  # Normalised to K=2, M=1.
    k128_m4 = float(lines[3].split()[-1])
    self.assertGreater(k128_m4, 1.0)


if __name__ == '__main__':
  test_utils.main()
