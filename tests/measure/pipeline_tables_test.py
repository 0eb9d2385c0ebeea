"""Smoke tests of tools/pipeline_tables.py: overhead shares, memory search, deep predictions."""

import contextlib
import io
import re

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.partition import balancing
from tensorpipe.partition import cost_model
from tensorpipe.measure import simulator
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

  def testThroughputTableNormalisesAndGivesBothErrors(self):
    ks, ms = (1, 2, 4), (1, 4)
    measured = {(k, m): 0.1 * (1 + k + m) for k in ks for m in ms}
    independent = {key: 1.5 * value for key, value in measured.items()}
    shared = dict(measured)
    shared[(4, 4)] = 1.9 * measured[(4, 4)]
    lines = tables.ThroughputTable(ks, ms, measured, independent, shared, cores=2).splitlines()
    self.assertIn('K=2, M=1', lines[0])
    self.assertEqual(lines[1].split(), ['M', 'K=1', 'K=2', 'K=4'])
    partitions = [re.findall(r'([\d.]+) / ([\d.]+) / ([\d.]+) \((\d+)/(\d+)/(\d+)\)', line)
             for line in lines[2:4]]
    self.assertEqual(partitions[0][1], ('1.00', '1.00', '1.00', '400', '600', '400'))  # K=2, M=1.
    self.assertEqual(partitions[1][2], ('0.44', '0.44', '0.23', '900', '1350', '1710'))  # K=4, M=4.
    self.assertIn('independent devices mean 50% (max 50%), shared cores mean 15% (max 90%)',
                  lines[4])
    self.assertIn('with K <= 2 only (4 configurations): independent devices mean 50%, shared '
                  'cores mean 0%', lines[5])
    scaled = tables.ThroughputTable(ks, ms, measured, independent, shared, 2,
                                    tracing={1: 0.7, 4: 0.9}).splitlines()[-1]
    # Scaled, independent is 5% off at M=1 and 35% at M=4; shared 30% at M=1, 10% and 71% at M=4.
    self.assertIn('M=1: 0.70, M=4: 0.90), K > 1 only (4 configurations): independent devices mean '
                  '20%, shared cores mean 35%', scaled)
    tasks = {key: 1.2 * value for key, value in measured.items()}
    with_tasks = tables.ThroughputTable(ks, ms, measured, independent, shared, 2,
                                        shared_tasks=tasks).splitlines()
    self.assertIn('shared cores fed per-task spans and parallelism: mean 20% (max 20%)',
                  with_tasks[-1])

  def testDeepPredictionsPrintATable(self):
    block = simulator.PartitionCost(1.0, 2.0, 1.0)
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

  def testLargestTransformerLGrowsWithTheNumberOfDevices(self):
    budget, bytes_per_param = 16 * 2**30, 8
    one = tables.LargestL(1, 32, 'always', budget, bytes_per_param, hi=64)
    eight = tables.LargestL(8, 32, 'always', budget, bytes_per_param, hi=256)
    self.assertGreater(one, 1)
    self.assertGreaterEqual(eight, 7 * one)
    for num_layers, fits in ((eight, True), (eight + 1, False)):
      mem = cost_model.MemoryCost(tables.TransformerLProfiles(num_layers), 32, 'always',
                                  bytes_per_param)
      self.assertEqual(max(mem.Partitions(balancing.OptimalSplit(mem, 8))) <= budget, fits)
    # Without re-computation the whole batch's activations of one layer do not fit.
    self.assertIsNone(tables.LargestL(1, 1, 'never', budget, bytes_per_param, hi=64))


if __name__ == '__main__':
  test_utils.main()
