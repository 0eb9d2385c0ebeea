"""Balancing: the optimal split equals brute force, beats the paper's heuristic, keeps budgets."""

import itertools
import random
import unittest
from unittest import mock

from tensorpipe.partitioner import balancing


def _Splits(num_layers, num_partitions):
  for inner in itertools.combinations(range(1, num_layers), num_partitions - 1):
    cuts = (0,) + inner + (num_layers,)
    yield [cuts[k + 1] - cuts[k] for k in range(num_partitions)]


def _BruteForce(cost, num_partitions, mem=None, budget=None, key=max):
  """The least key(partition costs) over every split that fits the budget (None if none fits)."""
  best = None
  for sizes in _Splits(len(cost), num_partitions):
    if mem is not None and max(mem.Partitions(sizes)) > budget:
      continue
    value = key(cost.Partitions(sizes))
    if best is None or value < best:
      best = value
  return best


def _SumSquares(partitions):
  return sum(c * c for c in partitions)


class OptimalSplitTest(unittest.TestCase):

  def testEqualsBruteForceOnRandomInstances(self):
    rng = random.Random(0)
    for _ in range(300):
      num_layers = rng.randint(1, 10)
      num_partitions = rng.randint(1, num_layers)
      costs = [rng.choice([0, 0, 1, 2, 3, 5, 8, 13, 100]) for _ in range(num_layers)]
      cost = balancing.LayerCosts(costs)
      sizes = balancing.OptimalSplit(cost, num_partitions)
      self.assertEqual(sum(sizes), num_layers)
      self.assertEqual(len(sizes), num_partitions)
      self.assertTrue(all(s >= 1 for s in sizes), sizes)
      self.assertEqual(max(cost.Partitions(sizes)), _BruteForce(cost, num_partitions), costs)

  def testEqualsBruteForceWithFloatCostsAndStartCosts(self):
    rng = random.Random(1)
    for _ in range(200):
      num_layers = rng.randint(2, 9)
      num_partitions = rng.randint(1, num_layers)
      cost = balancing.LayerCosts([rng.uniform(0, 10) for _ in range(num_layers)],
                                [rng.uniform(0, 5) for _ in range(num_layers)])
      sizes = balancing.OptimalSplit(cost, num_partitions)
      self.assertAlmostEqual(max(cost.Partitions(sizes)), _BruteForce(cost, num_partitions),
                             places=9)

  def testNeverWorseThanMinVariance(self):
    rng = random.Random(2)
    strictly_better = 0
    for _ in range(300):
      num_layers = rng.randint(2, 12)
      num_partitions = rng.randint(2, min(num_layers, 5))
      cost = balancing.LayerCosts([rng.randint(1, 20) for _ in range(num_layers)])
      optimal = max(cost.Partitions(balancing.OptimalSplit(cost, num_partitions)))
      heuristic = max(cost.Partitions(balancing.MinVarianceSplit(cost, num_partitions)))
      self.assertLessEqual(optimal, heuristic)
      strictly_better += optimal < heuristic
    self.assertGreater(strictly_better, 0)

  def testMinVarianceMinimisesTheSumOfSquares(self):
    rng = random.Random(3)
    for _ in range(100):
      num_layers = rng.randint(1, 9)
      num_partitions = rng.randint(1, num_layers)
      cost = balancing.LayerCosts([rng.randint(0, 20) for _ in range(num_layers)])
      sizes = balancing.MinVarianceSplit(cost, num_partitions)
      self.assertEqual(_SumSquares(cost.Partitions(sizes)),
                       _BruteForce(cost, num_partitions, key=_SumSquares))

  def testBalancedAmongOptimalSplits(self):
    self.assertEqual(balancing.OptimalSplit([1] * 16, 4), [4, 4, 4, 4])
    self.assertEqual(balancing.OptimalSplit([1] * 7, 3), [2, 3, 2])
    self.assertEqual(balancing.OptimalSplit([8, 1, 1, 1, 1, 1, 1, 1, 1], 2), [1, 8])
    self.assertEqual(balancing.OptimalSplit([2, 2, 2, 6], 2), [3, 1])

  def testDegenerateInputs(self):
    self.assertEqual(balancing.OptimalSplit([100, 0, 0, 0], 4), [1, 1, 1, 1])
    self.assertEqual(balancing.OptimalSplit([0, 0, 0, 100], 3), [1, 1, 2])
    self.assertEqual(balancing.OptimalSplit([0, 0, 0], 2), [1, 2])
    self.assertEqual(balancing.OptimalSplit([5], 1), [1])
    # One huge layer: it gets a partition of its own, the rest share the others.
    self.assertEqual(balancing.OptimalSplit([1, 1, 1000, 1, 1, 1], 3), [2, 1, 3])

  def testMemoryBudgetIsRespectedAndOptimalAndFitsSaysWhetherOneExists(self):
    rng = random.Random(4)
    checked = 0
    for _ in range(300):
      num_layers = rng.randint(2, 9)
      num_partitions = rng.randint(1, num_layers)
      cost = balancing.LayerCosts([rng.randint(1, 10) for _ in range(num_layers)])
      mem = balancing.LayerCosts([rng.randint(1, 10) for _ in range(num_layers)],
                               [rng.randint(0, 6) for _ in range(num_layers)])
      budget = rng.randint(5, 30)
      best = _BruteForce(cost, num_partitions, mem, budget)
      self.assertEqual(balancing.Fits(mem, num_partitions, budget), best is not None)
      if best is None:
        with self.assertRaisesRegex(ValueError, 'no split of %d layers into %d partitions fits a '
                                    'memory budget of %d B' % (num_layers, num_partitions, budget)):
          balancing.OptimalSplit(cost, num_partitions, mem, budget)
        continue
      sizes = balancing.OptimalSplit(cost, num_partitions, mem, budget)
      self.assertLessEqual(max(mem.Partitions(sizes)), budget)
      self.assertEqual(max(cost.Partitions(sizes)), best)
      checked += 1
    self.assertGreater(checked, 100)

  def testBudgetErrorGivesTheSmallestBudgetThatFits(self):
    mem = balancing.LayerCosts([3 * 2**30, 2**30, 2**30, 2**30])
    with self.assertRaisesRegex(ValueError, r'budget of 2.00 GiB per device; the best split needs '
                                r'3.00 GiB on its fullest device \(partition sizes \[1, 3\]\)'):
      balancing.OptimalSplit([1, 1, 1, 1], 2, mem, 2 * 2**30)
    self.assertEqual(balancing.OptimalSplit([1, 1, 1, 1], 2, mem, 3 * 2**30), [1, 3])

  def testBadInputNamesTheValue(self):
    with self.assertRaisesRegex(ValueError, '3 layers cannot fill 4 partitions'):
      balancing.OptimalSplit([1, 1, 1], 4)
    with self.assertRaisesRegex(ValueError, 'num_partitions must be a positive integer, got 0'):
      balancing.OptimalSplit([1], 0)
    with self.assertRaisesRegex(ValueError, 'layer 1 has cost -1'):
      balancing.OptimalSplit([1, -1], 2)
    with self.assertRaisesRegex(ValueError, 'layer 0 has cost nan'):
      balancing.MinVarianceSplit([float('nan'), 1], 2)
    with self.assertRaisesRegex(ValueError, 'no layers to partition'):
      balancing.OptimalSplit([], 1)
    with self.assertRaisesRegex(ValueError, 'memory_budget=10 needs per-layer memory'):
      balancing.OptimalSplit([1, 1], 2, memory_budget=10)
    with self.assertRaisesRegex(ValueError, "algorithm 'greedy' is not one of"):
      balancing.Split([1, 1], 2, 'greedy')
    with self.assertRaisesRegex(ValueError, "memory_budget needs partition_algorithm='optimal'"):
      balancing.Split([1, 1], 2, 'min_variance', [1, 1], 10)

  def testFastForThousandsOfLayers(self):
    rng = random.Random(5)
    costs = [rng.uniform(0.5, 2.0) for _ in range(5000)]
    mem = [rng.uniform(1, 3) for _ in range(5000)]
    # Fast by construction, not by a clock: each feasibility probe is one vectorised O(K L) pass,
    # and bisection over float64 bounds needs at most ~64 probes + log2(upper / lower).
    reach = balancing._Reach  # pylint: disable=protected-access
    with mock.patch.object(reach, 'Forward', autospec=True, side_effect=reach.Forward) as probes:
      sizes = balancing.OptimalSplit(costs, 64, mem, 400.0)
    cost = balancing.LayerCosts(costs)
    self.assertLess(balancing.Imbalance(cost.Partitions(sizes)), 1.01)
    self.assertLessEqual(max(balancing.LayerCosts(mem).Partitions(sizes)), 400.0)
    self.assertGreaterEqual(probes.call_count, 2)
    self.assertLessEqual(probes.call_count, 64 + 16, 'feasibility probes')


class MeasuresTest(unittest.TestCase):

  def testImbalanceAndEfficiency(self):
    self.assertEqual(balancing.Imbalance([1, 1, 1, 1]), 1.0)
    self.assertEqual(balancing.Imbalance([2, 1, 1, 0]), 2.0)
    self.assertEqual(balancing.Imbalance([0, 0]), 1.0)
    # K = 4, M = 4: 4 of 7 slots busy, perfectly balanced.
    self.assertAlmostEqual(balancing.Efficiency([3, 3, 3, 3], 4), 4 / 7)
    self.assertAlmostEqual(balancing.Efficiency([4, 2], 1), 0.5 * 0.75)


if __name__ == '__main__':
  unittest.main()
