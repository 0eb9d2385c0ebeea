"""Profiling: a traced TensorPipe step's ops are labelled by partition, micro-batch and purpose."""

import collections

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.measure import profiling
from tests import layer_helpers
from tests import trace_helpers


def _TracedStep(recompute, num_micro_batches=2, num_layers=4, dim=64, batch=16,
                first_partition=None, schedule='gpipe'):
  """The profiling.Trace of one traced training step of a 2-partition Dense pipeline."""
  layers = layer_helpers.DenseLayers(num_layers, dim=dim)
  # One forward pass per partition at a time, so each op inside a call is that micro-batch's.
  p = layer_helpers.Pipeline(layers, 2, num_micro_batches, recompute=recompute,
                             forward_overlap=False,
                       schedule=schedule)
  if first_partition is not None:
    p.Set(layers=None, num_devices=None,
          partitions=[layers[:first_partition], layers[first_partition:]])
  x = np.random.RandomState(0).uniform(size=[batch, dim]).astype(np.float32)
  return trace_helpers.TracedPipelineStep(p, x)


class TraceTest(test_utils.TestCase):

  def testOpsAreLabelledAndPlaced(self):
    trace = _TracedStep('always')
    matmuls = collections.Counter()
    for op in trace.ops:
      if op.partition is not None:
        self.assertEqual(op.device, 'CPU:%d' % op.partition, op.name)
      if op.op_type in trace_helpers.MATMUL_TYPES:
        matmuls[(op.category, op.partition, op.micro_batch)] += 1
    for k in range(2):
      for t in range(2):
        self.assertEqual(matmuls[('forward', k, t)], 2)  # Two Dense layers per partition.
        self.assertEqual(matmuls[('recompute', k, t)], 2)  # Re-run once in the backward pass.
        self.assertGreaterEqual(matmuls[('backward', k, t)], 3)  # dW for both, dx for at least one.
    categories = {op.category for op in trace.ops}
    self.assertIn('setup', categories)  # Micro-batch split and concat.
    self.assertIn('update', categories)
    calls = collections.Counter((op.category, op.partition, op.micro_batch) for op in trace.ops
                                if op.is_call)
    for k in range(2):
      for t in range(2):
        self.assertEqual(calls[('forward', k, t)], 1)
        # The backward call, and for the step's first backward pass the call that zeroes the sums.
        self.assertEqual(calls[('backward', k, t)], 2 if t == 1 else 1)
    for op in trace.compute_ops:
      if op.category in ('forward', 'recompute',
                         'backward') and op.op_type in trace_helpers.MATMUL_TYPES:
        self.assertRegex(op.layer, r'^layer\d$', op.name)

  def testWithoutRecomputationNothingIsRecomputed(self):
    trace = _TracedStep('never')
    self.assertFalse([op.name for op in trace.ops if op.category == 'recompute'])
    self.assertTrue([op for op in trace.ops if op.category == 'backward' and op.partition == 1])

  def testPartitionTimesTasksAndSummary(self):
    trace = _TracedStep('always', num_micro_batches=4)
    partitions = trace.PartitionTimes()
    self.assertEqual(len(partitions), 2)
    for c in partitions:
      self.assertGreater(c.forward, 0)
      self.assertGreater(c.backward, 0)
      self.assertGreater(c.recompute, 0)
    tasks = {(k, kind, t): (start, end) for k, kind, t, start, end in trace.Tasks()}
    for t in range(4):
      # Data dependencies: F(1, t) after F(0, t); B(0, t) after B(1, t) has begun.
      self.assertGreaterEqual(tasks[(1, 'forward', t)][0], tasks[(0, 'forward', t)][1] - 1e-6)
      self.assertGreater(tasks[(0, 'backward', t)][1], tasks[(1, 'backward', t)][0])
    busy = trace.Busy()
    self.assertLessEqual(max(busy.values()), trace.step_time + 1e-9)
    text = profiling.Summary(trace)
    self.assertIn('CPU:0', text)
    self.assertIn('recompute', text)

  def testWeightGradientTasksOfAZeroBubbleStep(self):
    trace = _TracedStep('always', num_micro_batches=4, schedule='zero_bubble')
    tasks = {(k, kind, t): (start, end) for k, kind, t, start, end in trace.Tasks()}
    for k in range(2):
      for t in range(4):
        # W(k, t) re-runs the layers and adds weight gradients after B(k, t) is done.
        self.assertGreaterEqual(tasks[(k, 'weight', t)][0], tasks[(k, 'backward', t)][1] - 1e-6)
    weight_task_layers = {op.layer for op in trace.compute_ops if op.task == 'weight'}
    self.assertTrue({'layer0', 'layer1', 'layer2', 'layer3'} <= weight_task_layers,
                    weight_task_layers)  # Each layer's re-run is named after the layer.
    for c in trace.PartitionTimes():
      for kind in ('forward', 'backward', 'recompute', 'weight'):
        self.assertGreater(getattr(c, kind), 0, kind)
    self.assertIn('weight', profiling.PartitionSummary(trace.PartitionTimes()))

  def testPeakMemoryFromAllocationRecords(self):
    # Records with known times: the peaks follow from them alone.
    meta = tf.compat.v1.RunMetadata()
    for device, ops in (('CPU:0', [('a', 0, [(1, 100), (5, -100)]),  # 100 B live over 1-5 us.
                                   ('b', 2, [(3, 50), (3, -20)])]),  # Frees first at equal times.
                        ('CPU:1', [('c', 0, [(2, 200), (4, -200)]),
                                   ('pipe/layer0/w/AssignSub', 6, [(6, 30)])])):
      dev = meta.step_stats.dev_stats.add(device='/job:localhost/replica:0/task:0/device:' + device)
      for name, start, records in ops:
        op_type = 'AssignSubVariableOp' if 'Assign' in name else 'MatMul'
        n = dev.node_stats.add(node_name=name, all_start_micros=start, all_end_rel_micros=1,
                               timeline_label='%s = %s(x)' % (name, op_type))
        memory = n.memory.add()
        for micros, size in records:
          memory.allocation_records.add(alloc_micros=micros, alloc_bytes=size)
    trace = profiling.Trace(meta, pipeline_scope='pipe')
    # CPU:0: 100 from 1 us, -20 then +50 at 3 us (peak 130), -100 at 5 us. CPU:1: 200 over 2-4 us;
    # the update's new buffer (30 B) replaces an old one freed as the op ends, so it adds nothing.
    self.assertEqual(trace.PeakMemory(), {'CPU:0': 130, 'CPU:1': 200})
    self.assertEqual(trace.PeakMemory(['CPU:0', 'CPU:1']), 100 + 200 - 20 + 50)
    self.assertTrue(trace.HasMemory())
    # The same replay over time, one point per instant (its last value), from (0, 0); the update's
    # buffer counts until the op ends at 7 us.
    self.assertEqual(trace.MemoryOverTime(), {
        'CPU:0': [(0.0, 0)] + [(micros / 1e6, size) for micros, size in
                               ((1, 100), (3, 130), (5, 30))],
        'CPU:1': [(0.0, 0)] + [(micros / 1e6, size) for micros, size in
                               ((2, 200), (4, 0), (6, 30), (7, 0))]})

  def testPeakMemoryOfARealStep(self):
    # 'never' keeps every activation of a partition until its backward pass: partition 1 (five
    # 512-wide layers) holds five 256 x 512 float activations (0.5 MiB each) at once, whatever the
    # timing: the backward pass that frees them starts after the last forward op. (The trace's peak
    # against the allocator's own is a measurement: tools.pipeline_tables prints it.)
    trace = _TracedStep('never', num_micro_batches=1, num_layers=6, dim=512, batch=256,
                        first_partition=1)
    mib = 2.0**20
    per_device = trace.PeakMemory()
    self.assertEqual(sorted(per_device), ['CPU:0', 'CPU:1'])
    self.assertGreaterEqual(per_device['CPU:1'], 4 * 0.5 * mib)
    together = trace.PeakMemory(trace.devices)
    self.assertGreaterEqual(together, 4 * 0.5 * mib)
    self.assertLessEqual(together, sum(per_device.values()))
    self.assertIn('MiB', profiling.Summary(trace))
    self.assertIn('recompute', profiling.PartitionSummary(trace.PartitionTimes()))

  def testClassifyNames(self):
    self.assertEqual(profiling.Classify('pipe_1/partition0_mb3/forward', 'PartitionedCall'),
                     ('forward', 0, 3))
    self.assertEqual(profiling.Classify('gradients/pipe_1/IdentityN_1_grad/partition1_mb2/backward',
                                        'PartitionedCall'), ('backward', 1, 2))
    self.assertEqual(profiling.Classify('gradients/pipe_1/IdentityN_1_grad/partition1_mb2/zeros',
                                        'StatefulPartitionedCall'), ('backward', 1, 2))
    self.assertEqual(profiling.Classify('pipe_1/split', 'Split', 'pipe'), ('setup', None, None))
    self.assertEqual(profiling.Classify('pipe/layer0/w/AssignSub', 'AssignSubVariableOp'),
                     ('update', None, None))
    self.assertEqual(profiling.Classify(
        'GroupCrossDeviceControlEdges_0/pipe_1/partition1_mb0/forward', 'NoOp'),
                     ('transfer', None, None))
    # A tensor from another process (step stats name the receive RecvTensor).
    self.assertEqual(profiling.Classify('RecvTensor', '[0.1MB] [396Mb/s] edge_91_pipe_1/y'),
                     ('transfer', None, None))

  def testShortDeviceNamesOtherProcesses(self):
    self.assertEqual(profiling.ShortDevice('/job:localhost/replica:0/task:0/device:CPU:1'), 'CPU:1')
    self.assertEqual(profiling.ShortDevice('/job:worker/replica:0/task:2/device:CPU:0'),
                     'worker:2/CPU:0')

  def testOpsInsideCallsTakeTheCallsLabels(self):
    trace = profiling.Trace(trace_helpers.OpsMetadata([
        ('net/partition0_mb0/forward', 'PartitionedCall', 1000, 1020),
        ('fc0/MatMul', 'MatMul', 1002, 1010),
        ('net/partition0_mb1/forward', 'PartitionedCall', 1005, 1030),
        ('fc0/MatMul', 'MatMul', 1012, 1019),  # Inside both: the call that started last.
        ('gradients/net/IdentityN_grad/partition0_mb1/backward', 'PartitionedCall', 1040, 1070),
        ('recompute/fc0/MatMul', 'MatMul', 1041, 1045),
        ('gradients_1/recompute/fc0/MatMul_grad/MatMul', 'MatMul', 1046, 1050),
        ('InplaceAdd', 'InplaceAdd', 1051, 1052),
        ('w_0', '_Arg', 1040, 1041),
        ('loss/Mean', 'Mean', 1035, 1037)]), pipeline_scope='net')
    labels = [(op.category, op.partition, op.micro_batch, op.layer) for op in trace.ops]
    self.assertEqual(labels, [
        ('forward', 0, 0, None), ('forward', 0, 0, 'fc0'), ('forward', 0, 1, None),
        ('forward', 0, 1, 'fc0'), ('backward', 0, 1, None), ('recompute', 0, 1, 'fc0'),
        ('backward', 0, 1, 'fc0'), ('backward', 0, 1, None), ('backward', 0, 1, None),
        ('other', None, None, None)])
    self.assertEqual([op.is_call for op in trace.ops], [True, False, True] + [False] * 1 +
                     [True] + [False] * 5)
    us = 1e-6
    # Busy time counts the ops inside the calls, not the calls' own spans.
    self.assertAlmostEqual(trace.Busy()['CPU:0'], (8 + 7 + 4 + 4 + 1 + 1 + 2) * us, places=12)
    tasks = {(k, kind, t): (start, end) for k, kind, t, start, end in trace.Tasks()}
    self.assertEqual(sorted(tasks), [(0, 'backward', 1), (0, 'forward', 0), (0, 'forward', 1),
                                     (0, 'recompute', 1)])

  def testPipelinesApartAndOpsNamedAfterATaskCountInIt(self):
    # An encoder's and a decoder's partition 0 on one device; the decoder's forward task has a
    # variable read outside its call, named after the task.
    trace = profiling.Trace(trace_helpers.OpsMetadata([
        ('m/encoder/partition0_mb0/forward', 'PartitionedCall', 1000, 1010),
        ('fc0/MatMul', 'MatMul', 1001, 1009),
        ('m/decoder/partition0_mb0/ReadVariableOp', 'ReadVariableOp', 1018, 1019),
        ('m/decoder/partition0_mb0/forward', 'PartitionedCall', 1020, 1040),
        ('fc0/MatMul', 'MatMul', 1021, 1039),
        ('gradients/m/decoder/IdentityN_1_grad/partition0_mb0/backward', 'PartitionedCall',
         1050, 1070),
        ('recompute/fc0/MatMul', 'MatMul', 1051, 1059),
        ('gradients/recompute/fc0/MatMul_grad/MatMul', 'MatMul', 1060, 1069),
        ('m/decoder/split', 'Split', 1011, 1012)]), pipeline_scope=['encoder', 'decoder'])
    us = 1e-6
    self.assertEqual(trace.pipelines, ['encoder', 'decoder'])
    self.assertEqual([op.pipeline for op in trace.ops], ['encoder'] * 2 + ['decoder'] * 7)
    self.assertEqual(trace.ops[-1].category, 'setup')
    encoder, = trace.PartitionTimes('encoder')
    self.assertAlmostEqual(encoder.forward, 8 * us, places=12)
    self.assertEqual((encoder.backward, encoder.recompute), (0.0, 0.0))
    decoder, = trace.PartitionTimes('decoder')
    # The read counts in F(0, 0) (one task per micro-batch, not two): 1 + 18 us.
    self.assertAlmostEqual(decoder.forward, 19 * us, places=12)
    self.assertAlmostEqual(decoder.recompute, 8 * us, places=12)
    self.assertAlmostEqual(decoder.backward, 9 * us, places=12)
    both, = trace.PartitionTimes()  # Partitions 0 of both pipelines together.
    self.assertAlmostEqual(both.forward, (8 + 19) * us, places=12)
    self.assertEqual([t[:3] for t in trace.Tasks('encoder')], [(0, 'forward', 0)])
    self.assertEqual(len(trace.Tasks()), 3)  # F, R, B of partition 0 and micro-batch 0.
    self.assertEqual(len(trace.Tasks('decoder')), 3)
    with self.assertRaisesRegex(ValueError, "pipeline 'nosuch'"):
      trace.PartitionTimes('nosuch')

  def testTimesCarryWorkAndParallelism(self):
    # fc0's forward on micro-batch 0 runs two ops at once; the weight argument is bookkeeping.
    trace = profiling.Trace(trace_helpers.OpsMetadata([
        ('net/partition0_mb0/forward', 'PartitionedCall', 995, 1015),
        ('fc0/MatMul', 'MatMul', 1000, 1010),
        ('fc0/MatMul_1', 'MatMul', 1000, 1010),
        ('w_0', '_Arg', 996, 997),
        ('fc1/Relu', 'Relu', 1010, 1014),
        ('net/partition0_mb1/forward', 'PartitionedCall', 1018, 1032),
        ('fc0/MatMul', 'MatMul', 1020, 1030),
        ('gradients/net/IdentityN_grad/partition0_mb0/backward', 'PartitionedCall', 1038, 1048),
        ('gradients/recompute/fc0/MatMul_grad/MatMul', 'MatMul', 1040, 1046),
        ('loss/Mean', 'Mean', 1035, 1037)]), pipeline_scope='net')
    us = 1e-6
    fc0, fc1 = trace.LayerTimes(['fc0', 'fc1'])
    self.assertAlmostEqual(fc0.forward, 20 * us, places=12)
    self.assertAlmostEqual(fc0.forward_parallelism, 30 / 20)
    self.assertAlmostEqual(fc0.Work('forward'), 30 * us, places=12)
    self.assertAlmostEqual(fc0.backward, 6 * us, places=12)
    self.assertEqual(fc0.backward_parallelism, 1.0)
    self.assertEqual((fc0.recompute, fc0.recompute_parallelism), (0.0, 1.0))
    self.assertAlmostEqual(fc1.forward, 4 * us, places=12)
    self.assertEqual(fc1.forward_parallelism, 1.0)
    partition, = trace.PartitionTimes()
    # Per micro-batch (the argument counts here): spans 1 + 10 + 4 and 10; work 25 and 10.
    self.assertAlmostEqual(partition.forward, (15 + 10) / 2 * us, places=12)
    self.assertAlmostEqual(partition.forward_parallelism, 35 / 25)
    work = trace.WorkByCategory()['CPU:0']
    self.assertAlmostEqual(work['forward'], 35 * us, places=12)  # With the 1 us argument.
    self.assertAlmostEqual(work['backward'], 6 * us, places=12)
    self.assertAlmostEqual(work['other'], 2 * us, places=12)

  def testGroupTimesCountOverlapBetweenLayersOnce(self):
    # On micro-batch 0, fc1's backward starts before fc0's weight gradient ends.
    trace = profiling.Trace(trace_helpers.OpsMetadata([
        ('net/partition0_mb0/forward', 'PartitionedCall', 995, 1015),
        ('fc0/MatMul', 'MatMul', 1000, 1010),
        ('fc1/MatMul', 'MatMul', 1010, 1014),
        ('net/partition0_mb1/forward', 'PartitionedCall', 1018, 1032),
        ('fc0/MatMul', 'MatMul', 1020, 1030),
        ('gradients/net/IdentityN_grad/partition0_mb0/backward', 'PartitionedCall', 1038, 1052),
        ('gradients/recompute/fc1/MatMul_grad/MatMul', 'MatMul', 1040, 1046),
        ('gradients_1/recompute/fc0/MatMul_grad/MatMul_1', 'MatMul', 1044, 1050)]),
                            pipeline_scope='net')
    us = 1e-6
    both, = trace.GroupTimes([['fc0', 'fc1']])
    self.assertAlmostEqual(both.forward, (14 + 10) / 2 * us, places=12)
    self.assertAlmostEqual(both.backward, 10 * us, places=12)  # The union 1040-1050.
    self.assertAlmostEqual(both.backward_parallelism, 12 / 10)
    fc0, fc1 = trace.GroupTimes([['fc0'], ['fc1']])
    self.assertAlmostEqual(fc0.forward, 10 * us, places=12)
    self.assertAlmostEqual(fc1.forward, 4 * us, places=12)  # Only micro-batch 0 ran fc1 here.
    self.assertAlmostEqual(fc1.backward + fc0.backward, 12 * us, places=12)

  def testBusyByCategorySplitsOverlapsAndAddsUpToBusy(self):
    # A forward op overlaps a backward op for 4 us; two backward ops overlap each other.
    trace = profiling.Trace(trace_helpers.OpsMetadata([
        ('net/partition0_mb1/forward', 'PartitionedCall', 999, 1011),
        ('fc0/MatMul', 'MatMul', 1000, 1010),
        ('gradients/net/IdentityN_grad/partition0_mb0/backward', 'PartitionedCall', 1005, 1017),
        ('gradients/recompute/fc0/MatMul_grad/MatMul', 'MatMul', 1006, 1016),
        ('gradients/recompute/fc0/MatMul_grad/MatMul_1', 'MatMul', 1008, 1012),
        ('loss/Mean', 'Mean', 1020, 1022)]), pipeline_scope='net')
    us = 1e-6
    cats = trace.BusyByCategory()['CPU:0']
    self.assertAlmostEqual(cats['forward'], (6 + 4 / 2) * us, places=12)
    self.assertAlmostEqual(cats['backward'], (4 / 2 + 6) * us, places=12)
    self.assertAlmostEqual(cats['other'], 2 * us, places=12)
    self.assertAlmostEqual(sum(cats.values()), trace.Busy()['CPU:0'], places=12)
    self.assertAlmostEqual(trace.Busy()['CPU:0'], 18 * us, places=12)

  def testUntracedMetadataIsRejected(self):
    with self.assertRaisesRegex(ValueError, 'FULL_TRACE'):
      profiling.Trace(tf.compat.v1.RunMetadata())


class TracedRunTest(test_utils.TestCase):

  def testFeedsAndTracesOneRun(self):
    with tf.Graph().as_default() as graph:
      x = tf.compat.v1.placeholder(tf.float32, [2])
      y = tf.reduce_sum(tf.square(x), name='total')
      with tf.compat.v1.Session(graph=graph) as sess:
        value, meta = profiling.TracedRun(sess, y, feed_dict={x: [1.0, 2.0]})
        self.assertEqual(value, 5.0)
        self.assertIn('total', {n.node_name for d in meta.step_stats.dev_stats
                                for n in d.node_stats})
        self.assertTrue(profiling.Trace(meta).HasMemory())
        with self.assertRaisesRegex(ValueError, 'TracedRun sets run_metadata itself; got '
                                    'run_metadata=None'):
          profiling.TracedRun(sess, y, feed_dict={x: [1.0, 2.0]}, run_metadata=None)


if __name__ == '__main__':
  test_utils.main()
