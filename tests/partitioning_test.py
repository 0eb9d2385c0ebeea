"""Partitioning: explicit cells are checked; layers are split into balanced, non-empty cells."""

from lingvo.core import test_utils

from tensorpipe import partitioning
from tests import helpers


class BalancedSplitTest(test_utils.TestCase):

  def testEqualCosts(self):
    self.assertEqual(partitioning.BalancedSplit([1] * 16, 4), [4, 4, 4, 4])
    self.assertEqual(partitioning.BalancedSplit([1] * 7, 3), [2, 3, 2])
    self.assertEqual(partitioning.BalancedSplit([1] * 3, 3), [1, 1, 1])

  def testUnequalCosts(self):
    self.assertEqual(partitioning.BalancedSplit([8, 1, 1, 1, 1, 1, 1, 1, 1], 2), [1, 8])
    self.assertEqual(partitioning.BalancedSplit([2, 2, 2, 6], 2), [3, 1])

  def testEveryCellKeepsALayer(self):
    self.assertEqual(partitioning.BalancedSplit([100, 0, 0, 0], 4), [1, 1, 1, 1])
    self.assertEqual(partitioning.BalancedSplit([0, 0, 0, 100], 3), [1, 1, 2])
    self.assertEqual(partitioning.BalancedSplit([0, 0, 0], 2), [1, 2])

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, '3 layers cannot fill 4 partitions'):
      partitioning.BalancedSplit([1, 1, 1], 4)
    with self.assertRaisesRegex(ValueError, 'num_partitions must be a positive integer, got 0'):
      partitioning.BalancedSplit([1], 0)
    with self.assertRaisesRegex(ValueError, 'costs must be non-negative'):
      partitioning.BalancedSplit([1, -1], 2)
    with self.assertRaisesRegex(ValueError, '`layers` is empty'):
      partitioning.SplitLayers([], 1)
    with self.assertRaisesRegex(ValueError, 'partition 0 of 2 is empty'):
      partitioning.CheckPartitions([[], [1]])
    with self.assertRaisesRegex(ValueError, 'partition 1 must be a list of layer Params, got int'):
      partitioning.CheckPartitions([[1], 2])


class CostTest(test_utils.TestCase):

  def testLayerCostsChainFPropMetaShapes(self):
    layers = helpers.DenseLayers(3, dim=4)
    self.assertEqual(partitioning.LayerCosts(layers, [[10, 4]]), [320.0, 320.0, 320.0])
    self.assertEqual(partitioning.CellCosts([layers[:1], layers[1:]], [[10, 4]]), [320.0, 640.0])

  def testSplitLayersByCost(self):
    big = helpers.Dense.Params().Set(name='big', dim=64)
    small = [helpers.Dense.Params().Set(name='s%d' % i, dim=8) for i in range(4)]
    by_count = partitioning.SplitLayers(small + [big], 2)
    self.assertEqual([len(c) for c in by_count], [2, 3])
    by_cost = partitioning.SplitLayers(small + [big], 2, input_shapes=[[10, 8]])
    self.assertEqual([[p.name for p in c] for c in by_cost], [['s0', 's1', 's2', 's3'], ['big']])

  def testLayerWithoutFPropMetaIsNamed(self):
    from lingvo.core import base_layer  # pylint: disable=g-import-not-at-top
    params = base_layer.BaseLayer.Params().Set(name='opaque')
    with self.assertRaisesRegex(ValueError, "Layer 'opaque' .* has no FPropMeta"):
      partitioning.LayerCosts([params], [[2, 2]])


if __name__ == '__main__':
  test_utils.main()
