"""Partition report: per-partition rows and predictions (the tool: tests/tools/)."""

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.partitioner import partition_report
from tensorpipe.partitioner import partitioning
from tests import layer_helpers


class ReportTest(test_utils.TestCase):

  def testRowsAndPredictions(self):
    layers = [layer_helpers.Dense.Params().Set(name='d%d' % i, dim=8) for i in range(4)]
    plan = partitioning.MakePlan(layers, 2, [[4, 8]], num_micro_batches=4)
    report = partition_report.Build(plan, 'pipe')
    self.assertEqual([(r.first, r.last, r.num_layers) for r in report.rows],
                     [('d0', 'd1', 2), ('d2', 'd3', 2)])
    self.assertEqual([r.cost for r in report.rows], [2 * 2 * 4 * 8 * 8] * 2)
    self.assertAlmostEqual(sum(r.share for r in report.rows), 1.0)
    self.assertEqual([r.params for r in report.rows], [2 * 64, 2 * 64])
    self.assertEqual(report.rows[1].param_bytes, 2 * 64 * 12)
    # d2's [4, 8] input stashed; 2 of 4 micro-batches of d2's and d3's tanh outputs (which their
    # gradients read) held while re-computing.
    self.assertEqual(report.rows[1].activation_bytes, 4 * 8 * 4 + 0.5 * 2 * (4 * 8) * 4)
    self.assertEqual(report.imbalance, 1.0)
    self.assertAlmostEqual(report.bubble, 1 / 5)
    self.assertAlmostEqual(report.efficiency, 4 / 5)
    text = str(report)
    self.assertIn("pipe: 2 partitions, cost 'flops', algorithm 'optimal', M = 4, recompute 'always'",
                  text)
    self.assertIn('d0 .. d1', text)
    self.assertIn('imbalance (max/mean cost) 1.000; fill-drain bubble 20.0%; predicted efficiency '
                  '80.0%', text)
    self.assertEqual([r.device for r in report.rows], [0, 1])
    self.assertIsNone(report.device_bytes)
    self.assertNotIn('memory per device', text)

  def testSelectiveKeepsTheMatmulOutputsOfEveryStashedMicroBatch(self):
    layers = [layer_helpers.Dense.Params().Set(name='d%d' % i, dim=8) for i in range(4)]
    always, selective = [partition_report.Build(partitioning.MakePlan(
        layers, 2, [[4, 8]], num_micro_batches=4, recompute=mode), 'pipe')
                         for mode in ('always', 'selective')]
    # Each of d2's and d3's [4, 8] matmul outputs, for the 4 micro-batches stashed (fill-drain).
    self.assertEqual(selective.rows[1].activation_bytes,
                     always.rows[1].activation_bytes + 2 * 4 * 8 * 4)
    self.assertIn("M = 4, recompute 'selective'", str(selective))

  def testVirtualStagesNameDevicesAndSumTheirMemory(self):
    layers = [layer_helpers.Dense.Params().Set(name='d%d' % i, dim=8) for i in range(4)]
    plan = partitioning.MakePlan(layers, 4, [[4, 8]], num_micro_batches=4,
                                 partition_devices=[0, 1, 1, 0])
    report = partition_report.Build(plan, 'pipe')
    self.assertEqual([r.device for r in report.rows], [0, 1, 1, 0])
    memory = [r.param_bytes + r.activation_bytes for r in report.rows]
    self.assertEqual(report.device_bytes, [memory[0] + memory[3], memory[1] + memory[2]])
    self.assertRegex(str(report), r'memory per device \(its partitions together\): 0: .*, 1: ')

  def testTensorPipeLayerLogsItsReport(self):
    layers = [layer_helpers.Dense.Params().Set(name='d%d' % i, dim=8) for i in range(4)]
    with tf.Graph().as_default(), layer_helpers.Cluster(2):
      with self.assertLogs(level='INFO') as logs:
        net = layer_helpers.Pipeline(layers, 2, 4, cost_input_shapes=[[4, 8]],
                               log_partition_report=True).Instantiate()
      self.assertTrue(any('predicted efficiency 80.0%' in line for line in logs.output),
                      logs.output)
      self.assertEqual(str(net.PartitionReport()), str(partition_report.Build(
          net.partition_plan, "TensorPipeLayer 'pipe'")))
      with self.assertRaisesRegex(ValueError, 'log_partition_report needs cost_input_shapes'):
        layer_helpers.Pipeline(layers, 2, 4, log_partition_report=True, name='q').Instantiate()


if __name__ == '__main__':
  test_utils.main()
