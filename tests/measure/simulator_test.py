"""Simulator: a schedule's timing from per-partition task times (plain data, no TensorFlow run)."""

import random
import re
import unittest

from tensorpipe.measure import simulator
from tensorpipe import schedule
from tensorpipe import schedule_builders


def _Equal(num_partitions, forward=1.0, backward=2.0, recompute=0.0):
  return [simulator.TaskTimes(forward, backward, recompute) for _ in range(num_partitions)]


def _Gpipe(costs, m, lag=1):
  return schedule_builders.FillDrainSchedule(len(costs), m, lag)


def _Sim(costs, m, transfer=0.0, cores=None, lag=1):
  return simulator.Simulate(costs, _Gpipe(costs, m, lag), transfer, cores)


class SimulateTest(unittest.TestCase):

  def testEqualPartitionsGiveTheTextbookBubble(self):
    for k in (1, 2, 4, 8, 128):
      for m in (1, 4, 32):
        result = _Sim(_Equal(k, 1.0, 2.0, 1.0), m)
        self.assertAlmostEqual(result.step_time, (m + k - 1) * (1.0 + 2.0 + 1.0))
        self.assertAlmostEqual(result.idle_fraction, (k - 1) / (m + k - 1))
        self.assertAlmostEqual(result.idle_fraction,
                               schedule_builders.FillDrainBubbleFraction(k, m))

  def testOneFOneBHasTheFillDrainBubble(self):
    for k in (2, 4, 8):
      for m in (4, 8, 32):
        costs = _Equal(k, 1.0, 2.0, 1.0)
        result = simulator.Simulate(costs, schedule_builders.OneFOneBSchedule(k, m))
        self.assertAlmostEqual(result.idle_fraction,
                               schedule_builders.FillDrainBubbleFraction(k, m), msg=(k, m))

  def testZeroBubbleIsAThirdOfOneFOneBWithEqualForwardInputAndWeightGradients(self):
    for k in (2, 4, 8):
      for m in (4, 8, 32):
        costs = [simulator.TaskTimes(forward=1.0, backward=1.0, weight=1.0)] * k
        one_f_one_b = simulator.Simulate(costs, schedule_builders.OneFOneBSchedule(k, m))
        zero_bubble = simulator.Simulate(costs, schedule_builders.ZeroBubbleSchedule(k, m))
        self.assertAlmostEqual(one_f_one_b.idle_fraction,
                               schedule_builders.FillDrainBubbleFraction(k, m))
        self.assertAlmostEqual(one_f_one_b.step_time, 3.0 * (m + k - 1))  # B holds the weights'.
        # ZB-H1's (K-1)(F + B - W) idle time per device, against 1F1B's (K-1)(F + B + W).
        if m >= k:
          self.assertAlmostEqual(zero_bubble.step_time, 3.0 * m + (k - 1), msg=(k, m))
        self.assertLess(zero_bubble.step_time, one_f_one_b.step_time)

  def testAWeightActionRecomputesThenAddsTheWeightGradients(self):
    costs = [simulator.TaskTimes(forward=1.0, backward=2.0, recompute=1.0, weight=3.0)]
    split = simulator.Simulate(costs, schedule_builders.ZeroBubbleSchedule(1, 1))
    self.assertEqual([(i.kind, i.start, i.end) for i in split.timeline], [
        (simulator.FORWARD_TASK, 0.0, 1.0), (simulator.RECOMPUTE_TASK, 1.0, 2.0),
        (simulator.BACKWARD_TASK, 2.0, 4.0), (simulator.RECOMPUTE_TASK, 4.0, 5.0),
        (simulator.WEIGHT_TASK, 5.0, 8.0)])
    joined = simulator.Simulate(costs, schedule_builders.OneFOneBSchedule(1, 1))
    self.assertEqual([i.kind for i in joined.timeline], [
        simulator.FORWARD_TASK, simulator.RECOMPUTE_TASK, simulator.BACKWARD_TASK,
        simulator.WEIGHT_TASK])
    self.assertAlmostEqual(joined.step_time, 7.0)

  def testDevicesFollowTheScheduleOrder(self):
    k, m = 3, 4
    result = _Sim(_Equal(k, 1.0, 1.0, 0.5), m)
    for partition in range(k):
      mine = sorted((i for i in result.timeline if i.partition == partition), key=lambda i: i.start)
      for a, b in zip(mine, mine[1:]):
        self.assertLessEqual(a.end, b.start + 1e-12)  # One task at a time.
      forward = [(i.kind, i.micro_batch) for i in mine if i.kind == simulator.FORWARD_TASK]
      backward = [(i.kind, i.micro_batch) for i in mine if i.kind == simulator.BACKWARD_TASK]
      order = schedule_builders.FillDrainSchedule(k, m).DeviceActions(partition)
      self.assertEqual([t.micro_batch for t in order if t.kind == schedule.FORWARD],
                       [t for _, t in forward])
      self.assertEqual([t.micro_batch for t in order if t.kind == schedule.BACKWARD],
                       [t for _, t in backward])
      # Each re-computation immediately precedes its backward pass on the device.
      kinds = [(i.kind, i.micro_batch) for i in mine if i.kind != simulator.FORWARD_TASK]
      self.assertEqual(kinds[::2], [(simulator.RECOMPUTE_TASK, t) for _, t in backward])

  def testTheSlowestPartitionPacesThePipeline(self):
    costs = [simulator.TaskTimes(1.0, 1.0), simulator.TaskTimes(3.0, 3.0)]
    result = _Sim(costs, 4)
    # Partition 1 runs 4 forwards back to back after partition 0's first (1 s), the loss, then 4
    # backwards; partition 0's last backward follows partition 1's.
    self.assertAlmostEqual(result.step_time, 1.0 + 4 * 3.0 + 4 * 3.0 + 1.0)
    self.assertEqual(result.busy, [8.0, 24.0])

  def testTransferDelaysEveryBoundaryCrossing(self):
    without = _Sim(_Equal(2), 1).step_time
    with_transfer = _Sim(_Equal(2), 1, transfer=0.5).step_time
    self.assertAlmostEqual(with_transfer - without, 2 * 0.5)

  def testSplitCostsScalesByMicroBatch(self):
    layers = [simulator.TaskTimes(4.0, 8.0, 4.0), simulator.TaskTimes(2.0, 4.0, 2.0),
              simulator.TaskTimes(6.0, 12.0, 0.0)]
    partitions = simulator.SplitCosts(layers, [2, 1], 2, overhead=0.1)
    self.assertEqual(partitions[0], simulator.TaskTimes(3.1, 6.1, 3.1))
    self.assertEqual(partitions[1], simulator.TaskTimes(3.1, 6.1, 0.0))
    with self.assertRaisesRegex(ValueError, r'partition sizes \[1, 1\] do not add up to 3 layers'):
      simulator.SplitCosts(layers, [1, 1], 2)

  def testBadInputIsNamed(self):
    with self.assertRaisesRegex(ValueError, 'partition 1 has backward time -1'):
      _Sim([simulator.TaskTimes(1, 1), simulator.TaskTimes(1, -1)], 2)
    with self.assertRaisesRegex(ValueError, 'no partitions'):
      simulator.Simulate([], schedule_builders.FillDrainSchedule(1, 2))
    with self.assertRaisesRegex(ValueError, '3 partition costs for a schedule of 2 partitions'):
      simulator.Simulate(_Equal(3), schedule_builders.FillDrainSchedule(2, 2))
    with self.assertRaisesRegex(ValueError, 'expected a schedule.Schedule, got 4'):
      simulator.Simulate(_Equal(2), 4)

  def testFillDrainIsTheLayersDefaultSchedule(self):
    costs = [simulator.TaskTimes(1.0, 2.0, 1.0), simulator.TaskTimes(2.0, 1.0, 0.5)]
    for cores in (None, 1):
      for overlap, lag in ((True, 2), (False, 1)):
        self.assertEqual(simulator.SimulateFillDrain(costs, 4, cores, forward_overlap=overlap),
                         _Sim(costs, 4, cores=cores, lag=lag))


class SpansTest(unittest.TestCase):

  def testMergeSpansJoinsOverlappingAndTouchingSpans(self):
    self.assertEqual(simulator.MergeSpans([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (3.0, 4.0),
                                           (7.0, 7.5)]),
                     [(0.0, 4.0), (5.0, 6.0), (7.0, 7.5)])
    self.assertEqual(simulator.MergeSpans([]), [])
    self.assertEqual(simulator.MergeSpans([(0.0, 10.0), (2.0, 3.0)]), [(0.0, 10.0)])

  def testUnionLengthCountsOverlapsOnce(self):
    self.assertAlmostEqual(simulator.UnionLength([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]), 4.0)
    self.assertEqual(simulator.UnionLength([]), 0.0)


def _Random(rng, num_partitions, recompute=True, parallel=False):
  """Unequal partitions; with `parallel`, tasks that can keep 1 to 3 cores busy."""
  def P():
    return rng.uniform(1.0, 3.0) if parallel else 1.0
  return [simulator.TaskTimes(rng.uniform(0.1, 3.0), rng.uniform(0.1, 3.0),
                              rng.uniform(0.1, 3.0) if recompute else 0.0, P(), P(), P())
          for _ in range(num_partitions)]


class SharedCoresTest(unittest.TestCase):

  def testWithACorePerDeviceAndSerialDevicesItIsTheIndependentModel(self):
    # With forward lag 1 the schedule's edges keep each device on one action at a time, so with a
    # core per device nothing is shared.
    rng = random.Random(0)
    for k, m, transfer in ((1, 1, 0.0), (1, 5, 0.0), (2, 4, 0.3), (3, 7, 0.0), (5, 3, 0.1)):
      for recompute in (False, True):
        costs = _Random(rng, k, recompute)
        independent = _Sim(costs, m, transfer)
        for cores in (k, k + 1.5, 100):
          shared = _Sim(costs, m, transfer, cores=cores)
          self.assertAlmostEqual(shared.step_time, independent.step_time, places=9)
          for a, b in zip(shared.busy, independent.busy):
            self.assertAlmostEqual(a, b, places=9)

  def testOneCoreRunsTheTotalWork(self):
    rng = random.Random(1)
    for k, m in ((1, 1), (1, 4), (2, 4), (4, 8)):
      costs = _Random(rng, k, parallel=True)
      work = m * sum(c.Work(kind) for c in costs for kind in simulator.TASK_KINDS)
      self.assertAlmostEqual(_Sim(costs, m, cores=1).step_time, work, places=9)
      self.assertGreater(work, _Sim(costs, m).step_time)

  def testABackwardActionRecomputesThenBackPropagates(self):
    costs = [simulator.TaskTimes(forward=1.0, backward=2.0, recompute=1.0,
                                 backward_parallelism=2.0)]
    for cores in (None, 2, 1):
      result = _Sim(costs, 2, cores=cores)
      spans = {(i.kind, i.micro_batch): (i.start, i.end) for i in result.timeline}
      for t in range(2):
        self.assertAlmostEqual(spans[(simulator.RECOMPUTE_TASK, t)][1],
                               spans[(simulator.BACKWARD_TASK, t)][0])
      self.assertLessEqual(spans[(simulator.BACKWARD_TASK, 1)][1],
                           spans[(simulator.RECOMPUTE_TASK, 0)][0])
    # On one core the backward phase's work (2 s x 2) takes 4 s.
    self.assertAlmostEqual(_Sim(costs, 2, cores=1).step_time, 2 * (1.0 + 1.0 + 4.0))

  def testForwardLagTwoRunsTwoForwardPassesOfADeviceAtOnce(self):
    costs = [simulator.TaskTimes(forward=1.0, backward=0.0)]
    self.assertAlmostEqual(_Sim(costs, 6, cores=2).step_time, 6.0)
    self.assertAlmostEqual(_Sim(costs, 6, cores=2, lag=2).step_time, 3.0)
    self.assertAlmostEqual(_Sim(costs, 6, cores=1, lag=2).step_time, 6.0)
    for lag in (1, 2):
      result = _Sim(_Random(random.Random(2), 3), 5, cores=8, lag=lag)
      spans = {(i.kind, i.partition, i.micro_batch): (i.start, i.end) for i in result.timeline}
      for k in range(3):
        for t in range(5 - lag):
          self.assertGreaterEqual(spans[(simulator.FORWARD_TASK, k, t + lag)][0],
                                  spans[(simulator.FORWARD_TASK, k, t)][1] - 1e-12)
      if lag == 2:
        self.assertTrue(any(spans[(simulator.FORWARD_TASK, k, t + 1)][0] <
                            spans[(simulator.FORWARD_TASK, k, t)][1]
                            for k in range(3) for t in range(4)))

  def testEveryEdgeOfTheScheduleHolds(self):
    rng = random.Random(4)
    for cores in (None, 1, 2, 8):
      for lag in (1, 2):
        costs = _Random(rng, 3, parallel=True)
        sched = _Gpipe(costs, 4, lag)
        result = simulator.Simulate(costs, sched, 0.1, cores)
        start, end = {}, {}
        for i in result.timeline:
          kind = schedule.FORWARD if i.kind == simulator.FORWARD_TASK else schedule.BACKWARD
          action = schedule.Action(kind, i.partition, i.micro_batch)
          start[action] = min(start.get(action, i.start), i.start)
          end[action] = max(end.get(action, i.end), i.end)
        for e in sched.edges:
          gap = 0.1 if e.crosses_devices else 0.0
          self.assertGreaterEqual(start[e.after], end[e.before] + gap - 1e-9, (cores, lag, e))

  def testATaskUsesTheCoresItsParallelismAllows(self):
    partition = simulator.TaskTimes(forward=2.0, backward=3.0, forward_parallelism=2.0,
                                    backward_parallelism=1.5)
    # Alone a task takes its span if the cores allow, else its work over the cores.
    self.assertAlmostEqual(_Sim([partition], 1, cores=2).step_time, 2.0 + 3.0)
    self.assertAlmostEqual(_Sim([partition], 1, cores=1).step_time, 4.0 + 4.5)
    self.assertAlmostEqual(_Sim([partition], 1, cores=1.5).step_time, 4.0 / 1.5 + 3.0)

  def testMoreCoresNeverMakeTheStepSlower(self):
    rng = random.Random(3)
    for _ in range(40):
      k, m = rng.randint(1, 5), rng.randint(1, 6)
      costs = _Random(rng, k, recompute=rng.random() < 0.7, parallel=True)
      transfer = rng.choice([0.0, 0.2])
      lag = rng.choice([1, 2])
      steps = [_Sim(costs, m, transfer, cores=c, lag=lag).step_time
               for c in (0.5, 1, 1.5, 2, 3, 4, 8, 64)]
      for fewer, more in zip(steps, steps[1:]):
        self.assertLessEqual(more, fewer * (1 + 1e-9))
      # Unlimited cores: never slower than devices that run one task at a time.
      self.assertLessEqual(steps[-1], _Sim(costs, m, transfer, lag=lag).step_time + 1e-9)

  def testSplitCostsCarriesWorkAndParallelism(self):
    layers = [simulator.TaskTimes(4.0, 8.0, 0.0, 2.0, 1.5),
              simulator.TaskTimes(2.0, 4.0, 0.0, 1.0, 1.0)]
    partition, = simulator.SplitCosts(layers, [2], 2)
    self.assertAlmostEqual(partition.forward, 3.0)
    self.assertAlmostEqual(partition.Work(simulator.FORWARD_TASK), (8.0 + 2.0) / 2)
    self.assertAlmostEqual(partition.forward_parallelism, 10.0 / 6.0)
    self.assertAlmostEqual(partition.backward_parallelism, 16.0 / 12.0)
    self.assertEqual(partition.recompute, 0.0)
    self.assertEqual(partition.recompute_parallelism, 1.0)

  def testBadCoresAndParallelismAreNamed(self):
    for cores in (0, -2, 'two', float('nan'), True):
      with self.assertRaisesRegex(ValueError, 'cores must be a positive number.*got %s' %
                                  re.escape(repr(cores))):
        _Sim(_Equal(2), 2, cores=cores)
    for value in (0.5, -1.0, None, float('inf')):
      with self.assertRaisesRegex(ValueError, 'partition 1 has recompute_parallelism %s; it must '
                                  'be a number >= 1' % re.escape(repr(value))):
        _Sim([simulator.TaskTimes(1, 1), simulator.TaskTimes(1, 1, 1, 1, 1, value)], 2,
             cores=2)


class RecomputeModeTest(unittest.TestCase):
  """A backward action re-computes its partition only where the schedule's mode says it does."""

  def _Kinds(self, result):
    """{(partition, micro-batch): the kinds of its intervals, in time order}."""
    kinds = {}
    for i in sorted(result.timeline, key=lambda i: (i.start, i.end)):
      kinds.setdefault((i.partition, i.micro_batch), []).append(i.kind)
    return kinds

  def testOneFOneBRecomputesOnlyWhereTheModeSays(self):
    k, m = 2, 3
    costs = [simulator.TaskTimes(forward=1.0, backward=2.0, recompute=0.5, weight=0.25)] * k
    with_recompute = [simulator.FORWARD_TASK, simulator.RECOMPUTE_TASK, simulator.BACKWARD_TASK,
                      simulator.WEIGHT_TASK]
    without = [simulator.FORWARD_TASK, simulator.BACKWARD_TASK, simulator.WEIGHT_TASK]
    for cores in (None, 2):
      steps = {}
      for mode in schedule.RECOMPUTE_MODES:
        result = simulator.Simulate(costs, schedule_builders.OneFOneBSchedule(k, m, recompute=mode),
                                    cores=cores)
        steps[mode] = result.step_time
        kinds = self._Kinds(result)
        self.assertEqual(sorted(kinds), [(p, t) for p in range(k) for t in range(m)])
        for (p, t), got in kinds.items():
          recomputes = mode in ('always', 'selective') or (mode == 'except_last' and t < m - 1)
          self.assertEqual(got, with_recompute if recomputes else without, (cores, mode, p, t))
        for i in result.timeline:
          if i.kind == simulator.RECOMPUTE_TASK:
            self.assertAlmostEqual(i.end - i.start, 0.5)
      # One partition's re-computations are on the critical path: 0.5 s per micro-batch each.
      self.assertLess(steps['never'], steps['except_last'])
      self.assertLess(steps['except_last'], steps['always'])
    one = simulator.Simulate(costs[:1], schedule_builders.OneFOneBSchedule(1, 1, recompute='never'))
    self.assertAlmostEqual(one.step_time, 1.0 + 2.0 + 0.25)
    one = simulator.Simulate(costs[:1],
                             schedule_builders.OneFOneBSchedule(1, 1, recompute='always'))
    self.assertAlmostEqual(one.step_time, 1.0 + 0.5 + 2.0 + 0.25)

  def testFillDrainWithoutRecomputationIsItsBackwardPassesShorter(self):
    k, m = 3, 4
    costs = _Equal(k, 1.0, 2.0, 1.0)
    never = simulator.Simulate(costs, schedule_builders.FillDrainSchedule(k, m, recompute='never'))
    self.assertNotIn(simulator.RECOMPUTE_TASK, {i.kind for i in never.timeline})
    self.assertAlmostEqual(never.step_time, (m + k - 1) * (1.0 + 2.0))
    always = _Sim(costs, m)
    self.assertAlmostEqual(always.step_time, (m + k - 1) * (1.0 + 2.0 + 1.0))


class VirtualStagesTest(unittest.TestCase):
  """Several partitions per device: a device runs one action of any of its partitions at a time,
  and only edges between devices cost a transfer."""

  def testInterleavingCutsOneFOneBsBubbleByV(self):
    # The same model: 1F1B's partition costs F = 1, B = 1 + W = 1; each of the v partitions of a
    # device a v-th of that. Narayanan et al.: the bubble (K - 1)(F + B) becomes (K - 1)(F + B) / v.
    for k, m, v in ((2, 4, 2), (4, 8, 2), (4, 8, 3), (8, 16, 2), (8, 32, 3)):
      one_f_one_b = simulator.Simulate([simulator.TaskTimes(1.0, 1.0, weight=1.0)] * k,
                                       schedule_builders.OneFOneBSchedule(k, m))
      chunk = simulator.TaskTimes(1.0 / v, 1.0 / v, weight=1.0 / v)
      interleaved = simulator.Simulate([chunk] * (k * v),
                                       schedule_builders.InterleavedOneFOneBSchedule(k, m, v))
      self.assertAlmostEqual(one_f_one_b.step_time, 3.0 * m + 3.0 * (k - 1), msg=(k, m, v))
      self.assertAlmostEqual(interleaved.step_time, 3.0 * m + 3.0 * (k - 1) / v, msg=(k, m, v))
      self.assertEqual(len(interleaved.busy), k)
      for busy in interleaved.busy:
        self.assertAlmostEqual(busy, 3.0 * m)

  def testZeroBubbleVIdlesOnlyTheRampForMAtLeast2KMinus1(self):
    # F, B and W of equal cost: each device runs from its first action to its last without a gap;
    # the step is the 6M tasks of a device plus the ramp, one forward pass per device before it.
    # ZB-H1 on the same model (a partition twice a V partition) idles twice that ramp.
    for k, m in ((1, 4), (2, 3), (2, 4), (4, 8), (4, 32), (8, 16)):
      sched = schedule_builders.ZeroBubbleVSchedule(k, m)
      result = simulator.Simulate([simulator.TaskTimes(0.5, 0.5, weight=0.5)] * (2 * k), sched)
      self.assertAlmostEqual(result.step_time, 3.0 * m + 0.5 * (k - 1), msg=(k, m))
      for d in range(k):
        spans = [(i.start, i.end) for i in result.timeline if sched.DeviceOf(i.partition) == d]
        self.assertEqual(len(simulator.MergeSpans(spans)), 1, (k, m, d))  # No gap.
        self.assertAlmostEqual(result.busy[d], 3.0 * m)
      zb_h1 = simulator.Simulate([simulator.TaskTimes(1.0, 1.0, weight=1.0)] * k,
                                 schedule_builders.ZeroBubbleSchedule(k, m))
      self.assertAlmostEqual(zb_h1.step_time, 3.0 * m + (k - 1), msg=(k, m))

  def testTransferOnlyBetweenDevices(self):
    costs = [simulator.TaskTimes(1.0, 1.0, weight=1.0)] * 2
    # One device holding both partitions of the V: no transfer anywhere.
    sched = schedule_builders.ZeroBubbleVSchedule(1, 3)
    self.assertEqual(simulator.Simulate(costs, sched, transfer=5.0),
                     simulator.Simulate(costs, sched))
    # Two devices: every edge between devices waits for the transfer, no other edge does.
    rng = random.Random(5)
    for sched in (schedule_builders.InterleavedOneFOneBSchedule(2, 4, 2),
                  schedule_builders.ZeroBubbleVSchedule(2, 4)):
      for cores in (None, 1, 4):
        costs = _Random(rng, sched.num_partitions, parallel=True)
        result = simulator.Simulate(costs, sched, 0.25, cores)
        self.assertEqual(len(result.busy), 2)
        # Forward actions are one interval each: check the edges between them (rules 1 and 2).
        spans = {schedule.Action(schedule.FORWARD, i.partition, i.micro_batch): (i.start, i.end)
                 for i in result.timeline if i.kind == simulator.FORWARD_TASK}
        for e in sched.edges:
          if e.before in spans and e.after in spans:
            gap = 0.25 if e.crosses_devices else 0.0
            self.assertGreaterEqual(spans[e.after][0], spans[e.before][1] + gap - 1e-9, (cores, e))
        if cores is None:  # A device runs one task at a time.
          for d in range(2):
            mine = sorted((i.start, i.end) for i in result.timeline
                          if sched.DeviceOf(i.partition) == d)
            for a, b in zip(mine, mine[1:]):
              self.assertLessEqual(a[1], b[0] + 1e-12)


class LowerBoundTest(unittest.TestCase):

  def testNoSimulatedStepIsBelowItsBound(self):
    rng = random.Random(7)
    schedules = [schedule_builders.FillDrainSchedule(3, 5, 2),
                 schedule_builders.OneFOneBSchedule(4, 6),
                 schedule_builders.ZeroBubbleSchedule(3, 4),
                 schedule_builders.InterleavedOneFOneBSchedule(2, 4, 2),
                 schedule_builders.ZeroBubbleVSchedule(2, 3),
                 schedule_builders.FillDrainSchedule(1, 3)]
    for sched in schedules:
      for cores in (None, 0.5, 1, 2, 8):
        for _ in range(5):
          costs = _Random(rng, sched.num_partitions, recompute=True, parallel=True)
          for c in costs:
            c.weight = rng.uniform(0.0, 2.0)
          bound = simulator.LowerBound(costs, sched, cores)
          for transfer in (0.0, 0.7):
            step = simulator.Simulate(costs, sched, transfer, cores).step_time
            self.assertLessEqual(bound, step * (1 + 1e-12), (sched.name, cores))
          self.assertGreater(bound, 0.0)

  def testItIsTheStepWhereNothingOverlaps(self):
    # One device runs every action one after another: the step is the device's busy time.
    costs = _Random(random.Random(3), 1, recompute=True)
    sched = schedule_builders.OneFOneBSchedule(1, 4)
    self.assertAlmostEqual(simulator.LowerBound(costs, sched),
                           simulator.Simulate(costs, sched).step_time, places=12)
    # One core: the step is the total work (testOneCoreRunsTheTotalWork).
    costs = _Random(random.Random(4), 3, parallel=True)
    sched = _Gpipe(costs, 4)
    self.assertAlmostEqual(simulator.LowerBound(costs, sched, cores=1),
                           simulator.Simulate(costs, sched, cores=1).step_time, places=9)


if __name__ == '__main__':
  unittest.main()
