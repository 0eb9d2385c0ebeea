"""Capacity: the largest model that fits a per-device budget grows with pipelining and devices."""

import functools

import pytest
from lingvo.core import test_utils

from tensorpipe.measure import workloads
from tensorpipe.partitioner import balancing
from tensorpipe.partitioner import capacity
from tensorpipe.partitioner import cost_model
from tensorpipe.tasks.image import amoebanet


@functools.lru_cache(maxsize=None)
def _AmoebaProfiles(filters, num_cells=3, batch=8):
  layers = amoebanet.AmoebaNetLayers('D', num_cells, filters, image_size=32)
  return tuple(cost_model.Profiles(layers, [[batch, 32, 32, 3]]))


@functools.lru_cache(maxsize=None)
def _TransformerBlock():
  """Profiles of Transformer-L's embedding, one block and softmax (sequence 1024, batch 32)."""
  return cost_model.Profiles(workloads.TransformerStack(1, 2048, 8192, 32, 32000), [[1024, 32]])


def _TransformerL(num_layers):
  embedding, block, softmax = _TransformerBlock()
  return [embedding] + [block] * num_layers + [softmax]


class CapacityTest(test_utils.TestCase):

  @pytest.mark.slow
  def testLargestFittingAmoebaNetGrowsWithPipelining(self):
    """Filters F in steps of 64: each size tried profiles a new AmoebaNet (a graph built per layer,
    about a second each), so the coarse grid keeps both bisections and the checks below to three
    sizes (64, 128, 192), where naive (F = 64) and pipelined (F = 128) already differ."""
    budget, step = 64 * 2**20, 64
    naive = capacity.LargestModel(_AmoebaProfiles, 1, 1, 'never', budget, lo=64, hi=256, step=step)
    piped = capacity.LargestModel(_AmoebaProfiles, 2, 4, 'always', budget, lo=64, hi=256,
                                  step=step)
    self.assertIsNotNone(naive)
    self.assertEqual(naive % step, 0)
    self.assertGreater(piped, naive)
    self.assertLess(piped, 256)  # The search range does not cap the answer.
    peak, sizes = capacity.PeakOfBestSplit(_AmoebaProfiles(piped), 2, 4, 'always')
    self.assertLessEqual(peak, budget)
    self.assertEqual(len(sizes), 2)
    self.assertGreater(capacity.PeakOfBestSplit(_AmoebaProfiles(piped + step), 2, 4, 'always')[0],
                       budget)
    # The naive model one step larger does not fit either: the bisection found the largest.
    self.assertGreater(capacity.PeakOfBestSplit(_AmoebaProfiles(naive + step), 1, 1, 'never')[0],
                       budget)

  def testLargestTransformerLGrowsWithTheNumberOfDevices(self):
    budget, bytes_per_param = 16 * 2**30, 8
    one = capacity.LargestModel(_TransformerL, 1, 32, 'always', budget, lo=1, hi=64,
                                bytes_per_param=bytes_per_param)
    eight = capacity.LargestModel(_TransformerL, 8, 32, 'always', budget, lo=1, hi=256,
                                  bytes_per_param=bytes_per_param)
    self.assertGreater(one, 1)
    self.assertGreaterEqual(eight, 7 * one)
    for num_layers, fits in ((eight, True), (eight + 1, False)):
      mem = cost_model.MemoryCost(_TransformerL(num_layers), 32, 'always', bytes_per_param)
      self.assertEqual(max(mem.Partitions(balancing.OptimalSplit(mem, 8))) <= budget, fits)
    # Without re-computation the whole batch's activations of one layer do not fit.
    self.assertIsNone(capacity.LargestModel(_TransformerL, 1, 1, 'never', budget, lo=1, hi=64,
                                            bytes_per_param=bytes_per_param))

  def testFitsAndBisection(self):
    self.assertEqual(capacity.LargestFitting(lambda n: n <= 37, 1, 100), 37)
    self.assertEqual(capacity.LargestFitting(lambda n: True, 1, 100), 100)
    self.assertIsNone(capacity.LargestFitting(lambda n: False, 1, 100))
    with self.assertRaisesRegex(ValueError, r'empty range \[5, 4\]'):
      capacity.LargestFitting(lambda n: True, 5, 4)
    # Fewer layers than partitions cannot fill the devices: they count as fitting any budget.
    self.assertTrue(capacity.Fits(_TransformerL(1), 8, 32, 'always', budget=0))
    self.assertFalse(capacity.Fits(_TransformerL(6), 8, 32, 'always', budget=0))
    with self.assertRaisesRegex(ValueError, 'step=8, lo=4, hi=64'):
      capacity.LargestModel(_TransformerL, 1, 1, 'always', 1.0, lo=4, hi=64, step=8)


if __name__ == '__main__':
  test_utils.main()
