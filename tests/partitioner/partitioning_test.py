"""Partitioning: explicit partitions are checked; plans split by the chosen cost and algorithm."""

import itertools
from unittest import mock

from lingvo import compat as tf
from lingvo.core import layers as lingvo_layers
from lingvo.core import test_utils

from tensorpipe import layer as layer_lib
from tensorpipe.measure import workloads
from tensorpipe.partitioner import cost_model
from tensorpipe.partitioner import partitioning
from tests import layer_helpers
from tests import trace_helpers


def _Widths(widths):
  return [layer_helpers.Dense.Params().Set(name='d%d' % i, dim=w) for i, w in enumerate(widths)]


class CheckPartitionsTest(test_utils.TestCase):

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, 'partition 0 of 2 is empty'):
      partitioning.CheckPartitions([[], [1]])
    with self.assertRaisesRegex(ValueError, 'partition 1 must be a list of layer Params, got int'):
      partitioning.CheckPartitions([[1], 2])
    with self.assertRaisesRegex(ValueError, 'partitions must be a non-empty list'):
      partitioning.CheckPartitions([])


class LayerNamesAndSkipsTest(test_utils.TestCase):

  def testLayerNames(self):
    with self.assertRaisesRegex(ValueError, "^pipe: layer name 'layer0' appears twice"):
      partitioning.CheckNames(layer_helpers.DenseLayers(2) + layer_helpers.DenseLayers(1), 'pipe')
    with self.assertRaisesRegex(ValueError, r'^pipe: layer 1 \(Dense\) has no name'):
      partitioning.CheckNames(layer_helpers.DenseLayers(1) + [layer_helpers.Dense.Params()], 'pipe')
    partitioning.CheckNames(layer_helpers.DenseLayers(3), 'pipe')

  def testSkipIndicesLeaveTheBadOnesToTheCheck(self):
    layers = [layer_helpers.Dense.Params().Set(name='l%d' % i) for i in range(6)]
    skips = [('l0', 'l3'), ('l2', 'l3'), ('l1', 'l5'), ('l3', 'l1'), ('l0', 'nope'), 'l0']
    self.assertEqual(partitioning.SkipIndices(layers, skips), [(0, 3), (2, 3), (1, 5)])
    self.assertEqual(partitioning.SkipIndices(layers, None), [])


class MakePlanTest(test_utils.TestCase):

  def testCountAndFlops(self):
    small = [layer_helpers.Dense.Params().Set(name='s%d' % i, dim=8) for i in range(4)]
    big = layer_helpers.Dense.Params().Set(name='big', dim=64)
    by_count = partitioning.SplitLayers(small + [big], 2)
    self.assertEqual([len(c) for c in by_count], [2, 3])
    by_cost = partitioning.SplitLayers(small + [big], 2, input_shapes=[[10, 8]])
    self.assertEqual([[p.name for p in c] for c in by_cost], [['s0', 's1', 's2', 's3'], ['big']])
    plan = partitioning.MakePlan(small + [big], 2, [[10, 8]])
    self.assertEqual(plan.cost_source, 'flops')
    self.assertEqual(plan.PartitionCosts(), [4 * 2 * 10 * 8 * 8, 2 * 10 * 8 * 64])

  def testOptimalBeatsMinVarianceOnAnUnevenStack(self):
    layers = _Widths([1, 8, 3, 3, 1])
    shapes = [[1, 1]]  # Flops = 2 x dim: costs 2, 16, 6, 6, 2.
    optimal = partitioning.MakePlan(layers, 3, shapes, algorithm='optimal')
    heuristic = partitioning.MakePlan(layers, 3, shapes, algorithm='min_variance')
    self.assertEqual(optimal.PartitionCosts(), [2, 16, 14])
    # Less variance (sum of squares 424 against 456) but a slower slowest partition.
    self.assertEqual(heuristic.PartitionCosts(), [18, 6, 8])
    self.assertLess(optimal.Imbalance(), heuristic.Imbalance())

  def testMemoryCostAndBudget(self):
    widths = [(8, 256), (256, 8), (8, 8), (8, 8)]
    layers = [lingvo_layers.FCLayer.Params().Set(name='f%d' % i, input_dim=a, output_dim=b)
              for i, (a, b) in enumerate(widths)]
    plan = partitioning.MakePlan(layers, 2, [[16, 8]], cost='memory', num_micro_batches=4)
    mem = plan.Memory()
    best = min(max(mem.Partitions([s, 4 - s])) for s in range(1, 4))
    self.assertEqual(max(mem.Partitions(plan.sizes)), best)
    # Partition 0 = f0: its weights x 12 bytes, its [16, 8] input stashed, and 2 of 4 micro-batches
    # of its forward activations held while re-computing, 4 bytes an element.
    f0 = plan.Profiles()[0]
    self.assertEqual(f0.params, 8 * 256 + 256)
    self.assertGreaterEqual(f0.activation_elements, 16 * 256)  # At least the relu output.
    self.assertEqual(mem.Of(0, 1), f0.params * 12 + 16 * 8 * 4 + 0.5 * f0.activation_elements * 4)
    budget = best
    flops = partitioning.MakePlan(layers, 2, [[16, 8]], memory_budget=budget, num_micro_batches=4)
    self.assertLessEqual(max(flops.Memory().Partitions(flops.sizes)), budget)
    with self.assertRaisesRegex(ValueError, 'no split of 4 layers into 2 partitions fits a memory '
                                'budget of 1.00 KiB per device; the best split needs'):
      partitioning.MakePlan(layers, 2, [[16, 8]], memory_budget=1024)
    # Explicit partitions are checked against the budget, not cut.
    over = max(mem.Partitions([1, 3]))
    explicit = partitioning.MakePlan(layers, 2, [[16, 8]], memory_budget=over, num_micro_batches=4,
                                     sizes=[1, 3])
    self.assertEqual(explicit.sizes, [1, 3])
    with self.assertRaisesRegex(ValueError, r'partition \d needs an estimated .*, more than '
                                r'memory_budget=.*; move layers out of it'):
      partitioning.MakePlan(layers, 2, [[16, 8]], memory_budget=over - 1, num_micro_batches=4,
                            sizes=[1, 3])

  def testBudgetBoundsEachDeviceSumOfPartitions(self):
    dims = [8, 64, 8, 8, 64, 8, 8, 32, 8]
    layers = [lingvo_layers.FCLayer.Params().Set(name='f%d' % i, input_dim=dims[i],
                                                 output_dim=dims[i + 1]) for i in range(8)]
    shapes, v_devices = [[16, 8]], [0, 1, 1, 0]  # Two devices in a V.
    free = partitioning.MakePlan(layers, 4, shapes, num_micro_batches=4,
                                 partition_devices=v_devices)
    parts = free.Memory().Partitions(free.sizes)
    self.assertAllClose(free.DeviceMemory(), [parts[0] + parts[3], parts[1] + parts[2]])
    # The least any split's fullest device needs, by trying every split: a budget that fits.
    splits = [list(s) + [8 - sum(s)] for s in itertools.product(range(1, 6), repeat=3)
              if sum(s) < 8]
    least = min(max(free.DeviceMemory(sizes)) for sizes in splits)
    self.assertLess(least, max(free.DeviceMemory()))  # The balanced split does not fit it.
    plan = partitioning.MakePlan(layers, 4, shapes, memory_budget=least, num_micro_batches=4,
                                 partition_devices=v_devices)
    self.assertLessEqual(max(plan.DeviceMemory()), least)
    # The least max partition cost of the splits that fit.
    fitting = [sizes for sizes in splits if max(free.DeviceMemory(sizes)) <= least]
    self.assertEqual(max(plan.PartitionCosts()),
                     min(max(free.cost.Partitions(sizes)) for sizes in fitting))
    with self.assertRaisesRegex(ValueError, r'device 0 holds partitions 0, 3, which need together '
                                r'an estimated .*, more than memory_budget='):
      partitioning.MakePlan(layers, 4, shapes, memory_budget=parts[0] + parts[3] - 1,
                            num_micro_batches=4, sizes=free.sizes, partition_devices=v_devices)
    with self.assertRaisesRegex(ValueError, r'found no split of 8 layers into 4 partitions \(2 on '
                                r'a device\) that keeps every device within memory_budget=1.00 '
                                r'KiB \(a device holds the sum of its partitions\)'):
      partitioning.MakePlan(layers, 4, shapes, memory_budget=1024, num_micro_batches=4,
                            partition_devices=v_devices)

  def testMeasuredCostsFollowTheWork(self):
    # The cost of each layer's step is injected (MatMuls executed, not seconds): the split must
    # follow the measured work, and machine load must not decide it.
    layers = [workloads.RepeatedDense.Params().Set(name='r%d' % i, dim=64, repeats=n)
              for i, n in enumerate([1, 1, 40, 1])]
    with mock.patch.object(cost_model, 'StepSeconds', trace_helpers.MatMulsRun):
      plan = partitioning.MakePlan(layers, 2, [[256, 64]], cost='measured')
    costs = plan.cost.per_layer
    self.assertEqual(plan.cost_source, 'measured')
    # Forward + backward of a layer applying its weight n times: n + 2n MatMuls.
    self.assertEqual(list(costs), [3, 3, 120, 3])
    self.assertEqual(plan.sizes, [2, 2])

  def testErrorsNameTheValues(self):
    layers = layer_helpers.DenseLayers(3)
    with self.assertRaisesRegex(ValueError, '`layers` is empty'):
      partitioning.MakePlan([], 1)
    with self.assertRaisesRegex(ValueError, '3 layers cannot fill 4 partitions'):
      partitioning.MakePlan(layers, 4, [[2, 8]])
    with self.assertRaisesRegex(ValueError, "partition_cost='time' is not one of"):
      partitioning.MakePlan(layers, 2, cost='time')
    with self.assertRaisesRegex(ValueError, "partition_algorithm='dp' is not one of"):
      partitioning.MakePlan(layers, 2, algorithm='dp')
    with self.assertRaisesRegex(ValueError, "partition_cost='memory' needs cost_input_shapes"):
      partitioning.MakePlan(layers, 2, cost='memory')
    with self.assertRaisesRegex(ValueError, 'memory_budget needs cost_input_shapes'):
      partitioning.MakePlan(layers, 2, memory_budget=100)
    from lingvo.core import base_layer  # pylint: disable=g-import-not-at-top
    opaque = base_layer.BaseLayer.Params().Set(name='opaque')
    with self.assertRaisesRegex(ValueError, "Layer 'opaque' .* has no FPropMeta"):
      partitioning.MakePlan([opaque, opaque.Copy().Set(name='o2')], 2, [[2, 2]])


class LayerParamsTest(test_utils.TestCase):

  def testTensorPipeLayerUsesTheChosenAlgorithm(self):
    layers = _Widths([1, 8, 3, 3, 1])
    with tf.Graph().as_default(), layer_helpers.Cluster(3):
      for algorithm, sizes in (('optimal', [1, 1, 3]), ('min_variance', [2, 1, 2])):
        net = layer_helpers.Pipeline(layers, 3, 1, cost_input_shapes=[[1, 1]],
                               partition_algorithm=algorithm, name=algorithm).Instantiate()
        self.assertEqual([len(c) for c in net.partition_layer_names], sizes)
        self.assertEqual(net.partition_plan.algorithm, algorithm)

  def testMeasuredAndMemoryCostsInsideTheLayer(self):
    layers = [workloads.RepeatedDense.Params().Set(name='r%d' % i, dim=64, repeats=n)
              for i, n in enumerate([1, 1, 40, 1])]
    with tf.Graph().as_default(), layer_helpers.Cluster(2):
      with mock.patch.object(cost_model, 'StepSeconds', trace_helpers.MatMulsRun):
        net = layer_helpers.Pipeline(layers, 2, 1, cost_input_shapes=[[256, 64]],
                               partition_cost='measured').Instantiate()
      self.assertEqual([len(c) for c in net.partition_layer_names], [2, 2])
      self.assertEqual(list(net.partition_plan.cost.per_layer), [3, 3, 120, 3])
      net = layer_helpers.Pipeline(layers, 2, 1, cost_input_shapes=[[256, 64]], partition_cost='memory',
                             name='m').Instantiate()
      self.assertEqual(net.partition_plan.cost_source, 'memory')

  def testBadParamsAreNamed(self):
    with tf.Graph().as_default(), layer_helpers.Cluster(2):
      with self.assertRaisesRegex(ValueError, "partition_cost='flop' is not one of"):
        layer_helpers.Pipeline(layer_helpers.DenseLayers(2), 2, 1, partition_cost='flop').Instantiate()
      with self.assertRaisesRegex(ValueError, 'layer 1 .* has no name'):
        layer_lib.TensorPipeLayer.Params().Set(
            name='p', layers=[layer_helpers.Dense.Params().Set(name='a'), layer_helpers.Dense.Params()],
            num_devices=2).Instantiate()


if __name__ == '__main__':
  test_utils.main()
