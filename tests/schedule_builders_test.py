"""The named schedules' builders: action lists, edges, grids, bubbles, and Build by name."""

import functools
import itertools
import random
import unittest

from tensorpipe import schedule
from tensorpipe import schedule_builders

F, B, W = schedule.FORWARD, schedule.BACKWARD, schedule.WEIGHT


def _A(kind, k, t):
  return schedule.Action(kind, k, t)


class FillDrainScheduleTest(unittest.TestCase):

  def testEveryActionOnceOnItsDevice(self):
    for k, m, lag in itertools.product(range(1, 6), range(1, 9), (1, 2)):
      s = schedule_builders.FillDrainSchedule(k, m, lag)
      for partition, actions in enumerate(s.device_actions):
        self.assertEqual(actions, [_A(F, partition, t) for t in range(m)] +
                         [_A(B, partition, t) for t in reversed(range(m))])
      ticks = s.Ticks()
      self.assertEqual(len(ticks), 2 * (m + k - 1))
      for tick in ticks:
        partitions = [a.partition for a in tick]
        self.assertEqual(len(partitions), len(set(partitions)))

  def testEdgesFollowTheRules(self):
    s = schedule_builders.FillDrainSchedule(3, 4, forward_lag=2)
    waits = lambda a: sorted((e.before, e.rule) for e in s.Waits(a))
    self.assertEqual(waits(_A(F, 0, 0)), [])
    self.assertEqual(waits(_A(F, 1, 3)), [(_A(F, 0, 3), 1), (_A(F, 1, 1), 2)])
    self.assertEqual(waits(_A(B, 2, 3)), [(_A(F, 2, t), 3) for t in range(4)])
    self.assertEqual(waits(_A(B, 2, 1)), [(_A(B, 2, 2), 5)])
    self.assertEqual(waits(_A(B, 0, 1)), [(_A(B, 0, 2), 5), (_A(B, 1, 1), 4)])
    self.assertEqual(sorted({e.rule for e in s.edges}), [1, 2, 3, 4, 5])  # 6-8 are 1F1B's.
    self.assertTrue(all(e.crosses_devices == (e.rule in (1, 4)) for e in s.edges))

  def testDryRunRespectsEveryEdgeAndIsTheTextbookGrid(self):
    for k, m in itertools.product(range(1, 5), range(1, 7)):
      s = schedule_builders.FillDrainSchedule(k, m)
      tick = s.DryRun()
      for e in s.edges:
        self.assertLess(tick[e.before], tick[e.after], (k, m, e))
      for c, t in itertools.product(range(k), range(m)):
        self.assertEqual(tick[_A(F, c, t)], c + t)
        self.assertEqual(tick[_A(B, c, t)], (m + k - 1) + (k - 1 - c) + (m - 1 - t))
      order = s.BuildOrder()
      position = {a: i for i, a in enumerate(order)}
      for e in s.edges:
        self.assertLess(position[e.before], position[e.after])
      self.assertEqual(s.BuildOrder(F), [a for a in order if a.kind == F])

  def testRender(self):
    self.assertEqual(schedule_builders.FillDrainSchedule(2, 3).Render().split('\n'),
                     ['partition 0 | F0,0 F0,1 F0,2 .    .    B0,2 B0,1 B0,0',
                      'partition 1 | .    F1,0 F1,1 F1,2 B1,2 B1,1 B1,0 .   '])

  def testBubble(self):
    self.assertEqual(schedule_builders.FillDrainBubbleFraction(1, 1), 0.0)
    self.assertAlmostEqual(schedule_builders.FillDrainBubbleFraction(4, 8), 3 / 11)
    self.assertAlmostEqual(schedule_builders.FillDrainBubbleFraction(8, 32), 7 / 39)
    for k, m in itertools.product(range(1, 6), range(1, 9)):
      self.assertAlmostEqual(schedule_builders.FillDrainSchedule(k, m).BubbleFraction(),
                             schedule_builders.FillDrainBubbleFraction(k, m))
    # Negligible once M >= 4K.
    self.assertLess(schedule_builders.FillDrainBubbleFraction(4, 16), 0.16)

  def testBadSizes(self):
    with self.assertRaisesRegex(ValueError, 'num_partitions must be a positive integer, got 0'):
      schedule_builders.FillDrainSchedule(0, 4)
    with self.assertRaisesRegex(ValueError,
                                'num_micro_batches must be a positive integer, got 2.5'):
      schedule_builders.FillDrainSchedule(2, 2.5)
    with self.assertRaisesRegex(ValueError, 'forward_lag must be 1 or 2, got 3'):
      schedule_builders.FillDrainSchedule(2, 2, 3)
    with self.assertRaisesRegex(ValueError, r'partition 3 is not in \[0, 2\)'):
      schedule_builders.FillDrainSchedule(2, 2).DeviceActions(3)


class OneFOneBScheduleTest(unittest.TestCase):

  def testEveryActionOnceAndTheDocstringGrid(self):
    for k, m, lag in itertools.product(range(1, 6), range(1, 9), (1, 2)):
      sched = schedule_builders.OneFOneBSchedule(k, m, lag)  # Checked (and dry-run) when made.
      self.assertEqual(sum(len(a) for a in sched.device_actions), 2 * k * m)
    self.assertEqual(schedule_builders.OneFOneBSchedule(2, 3).Render().splitlines(), [
        'partition 0 | F0,0 F0,1 .    B0,0 F0,2 B0,1 .    B0,2',
        'partition 1 | .    F1,0 B1,0 F1,1 B1,1 F1,2 B1,2 .   '])

  def testAtMostKMinusKMicroBatchesInFlightOnDeviceK(self):
    for k_partitions, m in itertools.product(range(1, 6), range(1, 9)):
      sched = schedule_builders.OneFOneBSchedule(k_partitions, m)
      for k, actions in enumerate(sched.device_actions):
        in_flight = peak = 0
        for action in actions:
          in_flight += 1 if action.kind == F else -1
          peak = max(peak, in_flight)
        self.assertEqual(peak, min(k_partitions - k, m), (k_partitions, m, k))
      # Backward passes in micro-batch order (rule 7's running sums).
      for actions in sched.device_actions:
        self.assertEqual([a.micro_batch for a in actions if a.kind == B], list(range(m)))

  def testEdgesFollowTheRulesAndTheBubbleIsFillDrains(self):
    sched = schedule_builders.OneFOneBSchedule(3, 5)
    ticks = sched.DryRun()
    for edge in sched.edges:
      self.assertIn(edge.rule, (1, 2, 4, 6, 7, 8))
      self.assertGreater(ticks[edge.after], ticks[edge.before])
    self.assertEqual({(e.before, e.after) for e in sched.edges if e.rule == 8},
                     {(_A(B, k, t), _A(F, k, t + 3 - k)) for k in range(3) for t in range(5)
                      if t + 3 - k < 5})
    for k, m in itertools.product((2, 4, 8), (4, 8, 32)):
      self.assertAlmostEqual(schedule_builders.OneFOneBSchedule(k, m).BubbleFraction(),
                             schedule_builders.FillDrainBubbleFraction(k, m))
    built, made = schedule_builders.Build('1f1b', 3, 5), schedule_builders.OneFOneBSchedule(3, 5)
    self.assertEqual((built.name, built.device_actions, built.edges),
                     (made.name, made.device_actions, made.edges))


class ZeroBubbleScheduleTest(unittest.TestCase):

  def testEveryActionOnceAndTheDocstringGrid(self):
    for k, m, lag in itertools.product(range(1, 6), range(1, 9), (1, 2)):
      sched = schedule_builders.ZeroBubbleSchedule(k, m, lag)  # Checked (and dry-run) when made.
      self.assertEqual(sum(len(a) for a in sched.device_actions), 3 * k * m)
      self.assertTrue(sched.splits_backward)
    self.assertFalse(schedule_builders.OneFOneBSchedule(2, 3).splits_backward)
    self.assertEqual(schedule_builders.ZeroBubbleSchedule(2, 3).Render().splitlines(), [
        'partition 0 | F0,0 F0,1 .    B0,0 F0,2 W0,0 B0,1 W0,1 B0,2 W0,2',
        'partition 1 | .    F1,0 B1,0 F1,1 B1,1 F1,2 W1,0 B1,2 W1,1 W1,2'])

  def testInFlightAsOneFOneBAndWeightGradientsKMicroBatchesLate(self):
    for k_partitions, m in itertools.product(range(1, 6), range(1, 9)):
      sched = schedule_builders.ZeroBubbleSchedule(k_partitions, m)
      for k, actions in enumerate(sched.device_actions):
        waiting_for_b = waiting_for_w = peak = peak_w = 0
        for action in actions:
          waiting_for_b += {F: 1, B: -1, W: 0}[action.kind]
          waiting_for_w += {F: 0, B: 1, W: -1}[action.kind]
          peak, peak_w = max(peak, waiting_for_b), max(peak_w, waiting_for_w)
        self.assertEqual(peak, min(k_partitions - k, m), (k_partitions, m, k))
        self.assertLessEqual(peak_w, k + 1, (k_partitions, m, k))  # Rule 13.
        for kind in (B, W):  # Rules 9 and 11: micro-batch order.
          self.assertEqual([a.micro_batch for a in actions if a.kind == kind], list(range(m)))
        position = {a: i for i, a in enumerate(actions)}
        for t in range(m - k):  # W(k, t) comes right after B(k, t + k) (and its F).
          self.assertLess(position[_A(B, k, t + k)], position[_A(W, k, t)])
          self.assertLessEqual(position[_A(W, k, t)], position[_A(B, k, t + k)] + 2)

  def testEdgesFollowTheRulesAndTheBubbleIsAThirdOfOneFOneBs(self):
    sched = schedule_builders.ZeroBubbleSchedule(3, 5)
    ticks = sched.DryRun()
    for edge in sched.edges:
      self.assertIn(edge.rule, (1, 2, 4, 6, 8, 9, 10, 11, 12, 13))
      self.assertGreater(ticks[edge.after], ticks[edge.before])
    self.assertEqual({(e.before, e.after) for e in sched.edges if e.rule == 12},
                     {(_A(B, k, t + k), _A(W, k, t)) for k in range(1, 3) for t in range(5 - k)})
    # With F, B and W one tick each, ZB-H1's bubble is (K-1) / (3M + K-1) for M >= K: a third of
    # 1F1B's (K-1) / (M + K-1) with B and W in one task of two ticks.
    for k, m in itertools.product((2, 4, 8), (8, 32)):
      self.assertAlmostEqual(schedule_builders.ZeroBubbleSchedule(k, m).BubbleFraction(),
                             schedule_builders.ZeroBubbleFraction(k, m), msg=(k, m))
    self.assertAlmostEqual(schedule_builders.ZeroBubbleFraction(4, 8), 3 / 27)
    self.assertEqual(schedule_builders.ZeroBubbleFraction(1, 1), 0.0)
    with self.assertRaisesRegex(ValueError, 'needs M >= K, got M=2, K=4'):
      schedule_builders.ZeroBubbleFraction(4, 2)
    built, made = (schedule_builders.Build('zero_bubble', 3, 5),
                   schedule_builders.ZeroBubbleSchedule(3, 5))
    self.assertEqual((built.name, built.device_actions, built.edges),
                     (made.name, made.device_actions, made.edges))


def _Virtual(k_devices, m, v=2):
  """(builder name, schedule) of each virtual schedule for K devices and M micro-batches."""
  return [('interleaved_1f1b', schedule_builders.InterleavedOneFOneBSchedule(k_devices, m, v)),
          ('zbv', schedule_builders.ZeroBubbleVSchedule(k_devices, m))]


def _CheckPerDevice(test, sched, msg, in_order=True):
  """Asserts (with `test`): every action once, in its partition's device's list; one action per
  device per tick; every edge respected by the dry run and crossing devices exactly where its
  partitions' devices differ; with `in_order`, each partition's forward passes (and B, W) in
  micro-batch order."""
  k_devices, m = sched.num_devices, sched.num_micro_batches
  kinds = (F, B, W) if sched.splits_backward else (F, B)
  test.assertEqual(len(sched.device_actions), k_devices, msg)
  for d, actions in enumerate(sched.device_actions):
    test.assertEqual(sorted(actions), sorted(_A(kind, c, t) for c in sched.DevicePartitions(d)
                                             for kind in kinds for t in range(m)), msg)
  ticks = sched.DryRun()
  for tick in sched.Ticks():
    devices = [sched.DeviceOf(a.partition) for a in tick]
    test.assertEqual(len(devices), len(set(devices)), msg)
  for edge in sched.edges:
    test.assertLess(ticks[edge.before], ticks[edge.after], (msg, edge))
    test.assertEqual(edge.crosses_devices, sched.DeviceOf(edge.before.partition) !=
                     sched.DeviceOf(edge.after.partition), (msg, edge))
  for c in range(sched.num_partitions if in_order else 0):
    mine = sched.DeviceActions(c)
    for kind in kinds:
      test.assertEqual([a.micro_batch for a in mine if a.kind == kind], list(range(m)), msg)


class VirtualStagesTest(unittest.TestCase):
  """Several partitions per device: placement, per-device lists, edges between devices."""

  def testTodaysSchedulesPlaceEachPartitionOnItsOwnDevice(self):
    for build in (functools.partial(schedule_builders.Build, name)
                  for name in schedule_builders.SCHEDULES):
      sched = build(3, 4)
      self.assertEqual((sched.num_devices, sched.partition_devices), (3, [0, 1, 2]))
      self.assertEqual([sched.DeviceOf(k) for k in range(3)], [0, 1, 2])
      self.assertEqual([sched.DevicePartitions(d) for d in range(3)], [[0], [1], [2]])
      self.assertTrue(all(e.crosses_devices == (e.before.partition != e.after.partition)
                          for e in sched.edges))
      _CheckPerDevice(self, sched, sched.name, in_order=sched.name.startswith(('1F1B', 'zero')))

  def testAHandMadePlacement(self):
    # Two partitions on one device: the edges between them cross no device.
    lists = [[_A(F, 0, 0), _A(F, 1, 0), _A(B, 1, 0), _A(B, 0, 0)]]
    edges = [schedule.Edge(_A(F, 0, 0), _A(F, 1, 0), schedule.Rule.FORWARD_INPUT),
             schedule.Edge(_A(B, 1, 0), _A(B, 0, 0), schedule.Rule.BACKWARD_INPUT)]
    sched = schedule.Schedule(2, 1, lists, edges, 'mine', partition_devices=[0, 0])
    self.assertEqual((sched.num_partitions, sched.num_devices), (2, 1))
    self.assertFalse(any(e.crosses_devices for e in sched.edges))
    self.assertTrue(all(e.crosses_devices for e in edges))  # Edges alone: a device each.
    self.assertEqual(sched.Render(), 'device 0 | F0,0 F1,0 B1,0 B0,0')
    self.assertEqual(sched.BubbleFraction(), 0.0)
    self.assertEqual(sched.InFlight(), [2])
    with self.assertRaisesRegex(ValueError, r'mine: partition_devices \[0, 2\] leaves device\(s\) '
                                r'\[1\] without a partition'):
      schedule.Schedule(2, 1, lists, edges, 'mine', partition_devices=[0, 2])
    with self.assertRaisesRegex(ValueError, 'mine: partition_devices must give a device index >= 0 '
                                r'for each of the 2 partitions, got \[0\]'):
      schedule.Schedule(2, 1, lists, edges, 'mine', partition_devices=[0])
    with self.assertRaisesRegex(ValueError, 'mine: 1 device lists for 2 devices'):
      schedule.Schedule(2, 1, lists, edges, 'mine', partition_devices=[0, 1])

  def testPlacements(self):
    self.assertEqual(schedule_builders.InterleavedPartitionDevices(3, 2), [0, 1, 2, 0, 1, 2])
    self.assertEqual(schedule_builders.VPartitionDevices(3), [0, 1, 2, 2, 1, 0])
    for k_devices in (1, 2, 4):
      for name, sched in _Virtual(k_devices, 2 * k_devices, 3):
        self.assertEqual(sched.partition_devices, {
            'interleaved_1f1b': schedule_builders.InterleavedPartitionDevices(k_devices, 3),
            'zbv': schedule_builders.VPartitionDevices(k_devices)}[name])
        self.assertEqual(sched.num_devices, k_devices)
    self.assertEqual(sorted(schedule_builders.VIRTUAL_SCHEDULES), ['interleaved_1f1b', 'zbv'])
    self.assertFalse(set(schedule_builders.VIRTUAL_SCHEDULES) & set(schedule_builders.SCHEDULES))

  def testBuildByNameChecksThePartitionsPerDevice(self):
    self.assertEqual(schedule_builders.NAMES,
                     ('gpipe', '1f1b', 'zero_bubble', 'interleaved_1f1b', 'zbv'))
    self.assertEqual([schedule_builders.LeastVirtualStages(n) for n in schedule_builders.NAMES],
                     [1, 1, 1, 2, 2])
    self.assertEqual([schedule_builders.SplitsBackward(n, schedule_builders.LeastVirtualStages(n))
                      for n in schedule_builders.NAMES], [False, False, True, False, True])
    for name in schedule_builders.NAMES:
      v = schedule_builders.LeastVirtualStages(name)
      sched = schedule_builders.Build(name, 2, 4, v, 2)
      self.assertEqual((sched.num_devices, sched.num_partitions), (2, 2 * v), name)
      self.assertEqual(sched.partition_devices, schedule_builders.PartitionDevices(name, 2, v),
                       name)
    self.assertEqual(schedule_builders.PartitionDevices('gpipe', 3), [0, 1, 2])
    self.assertEqual(schedule_builders.Build('interleaved_1f1b', 2, 4, 3).num_partitions, 6)
    for name, v, message in (
        ('gpipe', 2, "schedule='gpipe' runs one partition per device, but virtual_stages=2: use "
         "schedule='interleaved_1f1b'"),
        ('interleaved_1f1b', 1, "needs virtual_stages >= 2"),
        ('zbv', 4, "set virtual_stages=2, got 4"),
        ('zbv', 0, 'virtual_stages must be a positive integer'),
        ('v_shape', 2, r"schedule='v_shape' is not one of \('gpipe'")):
      with self.assertRaisesRegex(ValueError, message):
        schedule_builders.Build(name, 2, 4, v)
    with self.assertRaisesRegex(ValueError, r"schedule='v_shape' is not one of"):
      schedule_builders.LeastVirtualStages('v_shape')

  def testCheckRefusesWhatBuildRefusesWithoutBuilding(self):
    for name in schedule_builders.NAMES:
      for k, m, v, mode in itertools.product((1, 2, 3), (1, 2, 4, 6), (1, 2, 3),
                                             schedule.RECOMPUTE_MODES + ('sometimes',)):
        try:
          schedule_builders.Build(name, k, m, v, recompute=mode)
          refused = None
        except ValueError as e:
          refused = str(e)
        if refused is None:
          schedule_builders.Check(name, k, m, v, mode)
        else:
          with self.assertRaises(ValueError, msg=(name, k, m, v, mode, refused)):
            schedule_builders.Check(name, k, m, v, mode)
    with self.assertRaisesRegex(ValueError, 'needs num_micro_batches M a multiple of num_devices K, '
                                'got M=3, K=2: use M=2 or M=4'):
      schedule_builders.Check('interleaved_1f1b', 2, 3, 2)
    with self.assertRaisesRegex(ValueError, "the 'zbv' schedule needs recompute='always'"):
      schedule_builders.Check('zbv', 2, 3, 2, 'never')

  def testEqualCostBubblesAreTheTextbookOnes(self):
    for k in (2, 4, 8):
      for m in (k, 2 * k, 4 * k):
        for v in (2, 3):
          interleaved = schedule_builders.InterleavedOneFOneBSchedule(k, m, v)
          self.assertAlmostEqual(interleaved.BubbleFraction(),
                                 schedule_builders.InterleavedBubbleFraction(k, m, v),
                                 msg=(k, m, v))
        if m >= 2 * k - 1:
          self.assertAlmostEqual(schedule_builders.ZeroBubbleVSchedule(k, m).BubbleFraction(),
                                 schedule_builders.ZeroBubbleVFraction(k, m), msg=(k, m))
    with self.assertRaisesRegex(ValueError, 'needs M >= 2K - 1, got M=4, K=4'):
      schedule_builders.ZeroBubbleVFraction(4, 4)

  def testWeightedInFlightSumsEachPairsPartition(self):
    for name, sched in _Virtual(2, 4):
      weights = [10.0 ** c for c in range(sched.num_partitions)]
      # One weight of 1 per partition gives the count; a device's pairs weigh what their
      # partition does, and the largest weighted sum is at most the count times its heaviest.
      self.assertEqual(sched.InFlight([1] * sched.num_partitions), sched.InFlight(), name)
      for d, (weighted, count) in enumerate(zip(sched.InFlight(weights), sched.InFlight())):
        heaviest = max(weights[c] for c in sched.DevicePartitions(d))
        self.assertLessEqual(weighted, count * heaviest, name)
        self.assertGreaterEqual(weighted, heaviest, name)
    with self.assertRaisesRegex(ValueError, '2 weights for 4 partitions'):
      schedule_builders.Build('zbv', 2, 4, 2).InFlight([1, 2])

  def testWeightedCountsAreTheSumsOfTheSpansInOrder(self):
    # The counts as the dry run defines them, summed one span after another (the floats a
    # fast implementation must give exactly: the planner compares them with budgets).
    def Reference(sched, first_kind, last_kind, weights):
      ticks = sched.DryRun()
      out = []
      for d in range(sched.num_devices):
        spans = [(ticks[schedule.Action(first_kind, k, t)],
                  ticks[schedule.Action(last_kind, k, t)], weights[k])
                 for k in sched.DevicePartitions(d) for t in range(sched.num_micro_batches)
                 if schedule.Action(last_kind, k, t) in ticks]
        most = 0
        for c in {a for a, _, _ in spans}:
          total = 0
          for a, b, w in spans:
            if a <= c <= b:
              total += w
          most = max(most, total)
        out.append(most)
      return out

    rng = random.Random(3)
    for name in schedule_builders.NAMES:
      for k, m in ((1, 3), (2, 4), (3, 7), (4, 8)):
        v = schedule_builders.LeastVirtualStages(name) if name != 'interleaved_1f1b' else 2
        if name == 'interleaved_1f1b' and m % k:
          continue
        sched = schedule_builders.Build(name, k, m, v)
        weights = [rng.uniform(0.1, 1e6) / 3 for _ in range(sched.num_partitions)]
        self.assertEqual(sched.InFlight(weights), Reference(sched, schedule.FORWARD,
                                                            schedule.BACKWARD, weights))
        self.assertEqual(sched.InFlight(), Reference(sched, schedule.FORWARD, schedule.BACKWARD,
                                                     [1] * sched.num_partitions))
        if sched.splits_backward:
          self.assertEqual(sched.AwaitingWeights(weights), Reference(
              sched, schedule.BACKWARD, schedule.WEIGHT, weights))
        self.assertTrue(all(isinstance(n, int) for n in sched.InFlight()))

  def testEdgesCarryRuleMembersAndTheirRules(self):
    allowed = {'interleaved_1f1b': {1, 2, 4, 6, 7, 14}, 'zbv': {1, 2, 4, 6, 9, 10, 11, 14, 15, 16}}
    for name, sched in _Virtual(3, 6):
      self.assertTrue(all(isinstance(e.rule, schedule.Rule) for e in sched.edges), name)
      self.assertEqual({int(e.rule) for e in sched.edges}, allowed[name])
      # Only the data rules join partitions; a device's own bounds stay on it.
      for edge in sched.edges:
        if edge.rule in (schedule.Rule.FORWARD_INPUT, schedule.Rule.BACKWARD_INPUT):
          self.assertEqual(abs(edge.before.partition - edge.after.partition), 1)
        else:
          self.assertFalse(edge.crosses_devices, (name, edge))
    # In the V, partitions K - 1 and K share the last device: their edges are no transfer.
    zbv = schedule_builders.ZeroBubbleVSchedule(3, 6)
    self.assertEqual(sorted((e.before.partition, e.after.partition) for e in zbv.edges
                            if e.rule in (1, 4) and not e.crosses_devices),
                     sorted([(2, 3)] * 6 + [(3, 2)] * 6))


class InterleavedOneFOneBScheduleTest(unittest.TestCase):

  def testEveryActionOnceOnItsDeviceAndDeadlockFree(self):
    for k_devices, v in itertools.product((1, 2, 4, 8), (2, 3)):
      for m in range(k_devices, 33, k_devices):
        sched = schedule_builders.InterleavedOneFOneBSchedule(k_devices, m, v)  # Dry-run when made.
        self.assertEqual((sched.num_partitions, sched.num_devices), (k_devices * v, k_devices))
        _CheckPerDevice(self, sched, sched.name)
    for lag in (1, 2):
      sched = schedule_builders.InterleavedOneFOneBSchedule(4, 8, 2, forward_lag=lag)
      _CheckPerDevice(self, sched, sched.name)

  def testTheBubbleIsOneVthOfOneFOneBs(self):
    # Narayanan et al.: the bubble is (K - 1) / (v M) of the busy time. With every action one tick
    # a device is busy 2 v M ticks, so the step is 2 v M + 2 (K - 1) ticks.
    for k_devices, v in itertools.product((1, 2, 4, 8), (2, 3)):
      for m in range(k_devices, 33, k_devices):
        sched = schedule_builders.InterleavedOneFOneBSchedule(k_devices, m, v)
        self.assertEqual(len(sched.Ticks()), 2 * v * m + 2 * (k_devices - 1), sched.name)
        bubble = sched.BubbleFraction()
        self.assertAlmostEqual(bubble / (1 - bubble), (k_devices - 1) / (v * m), msg=sched.name)
        if k_devices > 1:
          self.assertLess(bubble, schedule_builders.OneFOneBSchedule(k_devices, m).BubbleFraction())

  def testMegatronsOrderAndInFlight(self):
    k_devices, m, v = 2, 4, 2
    sched = schedule_builders.InterleavedOneFOneBSchedule(k_devices, m, v)
    self.assertEqual([str(a) for a in sched.device_actions[1]], [
        'F1,0', 'F1,1', 'F3,0', 'B3,0', 'F3,1', 'B3,1', 'F1,2', 'B1,0', 'F1,3', 'B1,1', 'F3,2',
        'B3,2', 'F3,3', 'B3,3', 'B1,2', 'B1,3'])
    for k_devices, v, m in itertools.product((1, 2, 4, 8), (2, 3), (8, 16)):
      if m % k_devices:
        continue
      sched = schedule_builders.InterleavedOneFOneBSchedule(k_devices, m, v)
      # A warm-up of 2 (K - 1 - k) + (v - 1) K forward passes, then one forward before each
      # backward: one more in flight. Each is a partition of 1/v of the device's layers.
      self.assertEqual(sched.InFlight(), [min(2 * (k_devices - 1 - k) + (v - 1) * k_devices + 1,
                                              v * m) for k in range(k_devices)], sched.name)
      self.assertEqual(sched.AwaitingWeights(), [0] * k_devices)

  def testRender(self):
    # The module docstring's grid, and K = 2, v = 2, M = 4.
    self.assertEqual(schedule_builders.InterleavedOneFOneBSchedule(2, 2, 2).Render().splitlines(), [
        'device 0 | F0,0 F0,1 F2,0 F2,1 .    B2,0 .    B2,1 B0,0 B0,1',
        'device 1 | .    F1,0 F1,1 F3,0 B3,0 F3,1 B3,1 B1,0 B1,1 .   '])
    self.assertEqual(schedule_builders.InterleavedOneFOneBSchedule(2, 4, 2).Render().splitlines(), [
        'device 0 | F0,0 F0,1 F2,0 F2,1 F0,2 B2,0 F0,3 B2,1 F2,2 B0,0 F2,3 B0,1 .    B2,2 .    '
        'B2,3 B0,2 B0,3',
        'device 1 | .    F1,0 F1,1 F3,0 B3,0 F3,1 B3,1 F1,2 B1,0 F1,3 B1,1 F3,2 B3,2 F3,3 B3,3 '
        'B1,2 B1,3 .   '])

  def testBadInput(self):
    with self.assertRaisesRegex(ValueError, 'needs num_micro_batches M a multiple of num_devices '
                                'K, got M=6, K=4: use M=4 or M=8'):
      schedule_builders.InterleavedOneFOneBSchedule(4, 6, 2)
    with self.assertRaisesRegex(ValueError, 'got M=3, K=4: use M=4 or M=8'):
      schedule_builders.InterleavedOneFOneBSchedule(4, 3, 2)
    for v in (1, 0, 2.0, True):
      with self.assertRaisesRegex(ValueError, r"needs virtual_stages >= 2 \(partitions per "
                                  r"device\), got %r; for one partition per device use "
                                  r"schedule='1f1b'" % (v,)):
        schedule_builders.InterleavedOneFOneBSchedule(2, 4, v)
    with self.assertRaisesRegex(ValueError, 'num_devices must be a positive integer, got 0'):
      schedule_builders.InterleavedOneFOneBSchedule(0, 4, 2)
    with self.assertRaisesRegex(ValueError, 'forward_lag must be 1 or 2, got 3'):
      schedule_builders.InterleavedOneFOneBSchedule(2, 4, 2, forward_lag=3)
    with self.assertRaisesRegex(ValueError, "recompute='sometimes' is not one of"):
      schedule_builders.InterleavedOneFOneBSchedule(2, 4, 2, recompute='sometimes')
    for mode in schedule.RECOMPUTE_MODES:  # Joined backward passes: any mode.
      interleaved = schedule_builders.InterleavedOneFOneBSchedule(2, 4, 2, recompute=mode)
      self.assertEqual(interleaved.recompute, mode)


class ZeroBubbleVScheduleTest(unittest.TestCase):

  def testEveryActionOnceOnItsDeviceAndDeadlockFree(self):
    for k_devices in (1, 2, 4, 8):
      for m in sorted(set(range(k_devices, 33, k_devices)) | {1, 3, 2 * k_devices - 1}):
        sched = schedule_builders.ZeroBubbleVSchedule(k_devices, m)  # Dry-run when made.
        self.assertEqual((sched.num_partitions, sched.num_devices), (2 * k_devices, k_devices))
        self.assertTrue(sched.splits_backward)
        _CheckPerDevice(self, sched, sched.name)
    _CheckPerDevice(self, schedule_builders.ZeroBubbleVSchedule(4, 8, forward_lag=2), 'lag 2')

  def testEveryDeviceBusyFromItsFirstActionOnForMAtLeast2KMinus1(self):
    # With F, B and W one tick each and M >= 2K - 1, device k runs its 6M actions at ticks k .. k +
    # 6M - 1 without a gap, so the step is 6M + K - 1 ticks: device k cannot start before F(k-1, 0)
    # ends, and nothing else idles. The bubble is the ramp, (K - 1) / (6M + K - 1).
    for k_devices in (1, 2, 4, 8):
      for m in sorted(set(range(2 * k_devices, 33, k_devices)) | {2 * k_devices - 1}):
        sched = schedule_builders.ZeroBubbleVSchedule(k_devices, m)
        ticks = sched.DryRun()
        for d, actions in enumerate(sched.device_actions):
          self.assertEqual(sorted(ticks[a] for a in actions), list(range(d, d + 6 * m)),
                           (sched.name, d))
        self.assertEqual(len(sched.Ticks()), 6 * m + k_devices - 1)
        self.assertAlmostEqual(sched.BubbleFraction(), (k_devices - 1) / (6 * m + k_devices - 1))
        # In flight: 2K micro-batches of a half-size partition on every device, 1F1B's K on
        # device 0. Awaiting weight gradients: 2k + 1 on device k (the cool-down's B first).
        self.assertEqual(sched.InFlight(), [2 * k_devices] * k_devices, sched.name)
        self.assertEqual(sched.AwaitingWeights(), [2 * k + 1 for k in range(k_devices)])
    for k_devices, m in ((2, 2), (4, 4), (8, 8)):  # Fewer: gaps, never more in flight.
      sched = schedule_builders.ZeroBubbleVSchedule(k_devices, m)
      self.assertTrue(all(n <= 2 * k_devices for n in sched.InFlight()))
      self.assertGreater(len(sched.Ticks()), 6 * m + k_devices - 1)

  def testTheVOrder(self):
    sched = schedule_builders.ZeroBubbleVSchedule(2, 4)
    self.assertEqual([str(a) for a in sched.device_actions[1]], [
        'F1,0', 'F2,0', 'F1,1', 'F2,1', 'B2,0', 'W2,0', 'F1,2', 'B1,0', 'W1,0', 'F2,2', 'B2,1',
        'W2,1', 'F1,3', 'B1,1', 'W1,1', 'F2,3', 'B2,2', 'W2,2', 'B1,2', 'B2,3', 'B1,3', 'W1,2',
        'W2,3', 'W1,3'])

  def testRender(self):
    # The module docstring's grid, and K = 2, M = 4.
    self.assertEqual(schedule_builders.ZeroBubbleVSchedule(2, 2).Render().splitlines(), [
        'device 0 | F0,0 F0,1 .    F3,0 B3,0 W3,0 F3,1 B3,1 W3,1 B0,0 W0,0 .    B0,1 W0,1',
        'device 1 | .    F1,0 F2,0 F1,1 F2,1 B2,0 W2,0 B1,0 W1,0 B2,1 W2,1 B1,1 W1,1 .   '])
    self.assertEqual(schedule_builders.ZeroBubbleVSchedule(2, 4).Render().splitlines(), [
        'device 0 | F0,0 F0,1 F0,2 F3,0 B3,0 W3,0 F3,1 B3,1 W3,1 F0,3 B0,0 W0,0 F3,2 B3,2 W3,2 '
        'B0,1 W0,1 F3,3 B3,3 W3,3 B0,2 W0,2 B0,3 W0,3 .   ',
        'device 1 | .    F1,0 F2,0 F1,1 F2,1 B2,0 W2,0 F1,2 B1,0 W1,0 F2,2 B2,1 W2,1 F1,3 B1,1 '
        'W1,1 F2,3 B2,2 W2,2 B1,2 B2,3 B1,3 W1,2 W2,3 W1,3'])

  def testTasksAndBadInput(self):
    sched = schedule_builders.ZeroBubbleVSchedule(2, 4)
    tasks = {F: schedule.Task.FORWARD, B: schedule.Task.INPUT_GRADIENT,
             W: schedule.Task.WEIGHT_GRADIENT}
    for actions in sched.device_actions:
      for a in actions:
        self.assertIs(sched.Task(a), tasks[a.kind], str(a))
    for mode in ('never', 'except_last'):
      with self.assertRaisesRegex(ValueError, r"the 'zbv' schedule needs recompute='always', got "
                                  r"recompute='%s'" % mode):
        schedule_builders.ZeroBubbleVSchedule(2, 4, recompute=mode)
    with self.assertRaisesRegex(ValueError, 'num_micro_batches must be a positive integer, got 0'):
      schedule_builders.ZeroBubbleVSchedule(2, 0)
    with self.assertRaisesRegex(ValueError, 'forward_lag must be 1 or 2, got 0'):
      schedule_builders.ZeroBubbleVSchedule(2, 4, forward_lag=0)


class DecodeScheduleTest(unittest.TestCase):

  def testForwardActionsOnlyWithRulesOneAndTwoAndTheDocstringGrid(self):
    for k, m, lag in itertools.product(range(1, 5), range(1, 6), (1, 2)):
      s = schedule_builders.DecodeSchedule(k, m, lag)
      self.assertTrue(s.forward_only)
      self.assertEqual(s.device_actions, [[_A(F, p, t) for t in range(m)] for p in range(k)])
      self.assertEqual({e.rule for e in s.edges} - {schedule.Rule.FORWARD_INPUT,
                                                    schedule.Rule.FORWARD_ORDER}, set())
      ticks = s.DryRun()
      for e in s.edges:
        self.assertLess(ticks[e.before], ticks[e.after])
      # Partition p runs micro-batch t at tick p + t: while p + 1 runs t - 1.
      self.assertEqual(ticks, {_A(F, p, t): p + t for p in range(k) for t in range(m)})
      self.assertIs(s.Task(_A(F, 0, 0)), schedule.Task.FORWARD)
    self.assertEqual(schedule_builders.DecodeSchedule(2, 3).Render().splitlines(), [
        'partition 0 | F0,0 F0,1 F0,2 .   ', 'partition 1 | .    F1,0 F1,1 F1,2'])

  def testSeveralPartitionsPerDeviceGoDownTheWave(self):
    s = schedule_builders.DecodeSchedule(4, 2, 1, schedule_builders.VPartitionDevices(2))
    self.assertEqual(s.Render().splitlines(), [
        'device 0 | F0,0 F0,1 .    .    F3,0 F3,1', 'device 1 | .    F1,0 F1,1 F2,0 F2,1 .   '])
    s = schedule_builders.DecodeSchedule(4, 3, 2,
                                         schedule_builders.InterleavedPartitionDevices(2, 2))
    self.assertEqual([s.DeviceOf(p) for p in range(4)], [0, 1, 0, 1])
    self.assertEqual(len(s.DryRun()), 12)

  def testAForwardOnlyScheduleHasNoOtherActions(self):
    lists = [[_A(F, 0, 0), _A(B, 0, 0)]]
    with self.assertRaisesRegex(ValueError, 'mine: a forward-only schedule has other actions: B0,0'):
      schedule.Schedule(1, 1, lists, [], 'mine', forward_only=True)
    with self.assertRaisesRegex(ValueError, 'partition_devices must give a device for each of the '
                                '3 partitions'):
      schedule_builders.DecodeSchedule(3, 2, 1, [0, 1])


if __name__ == '__main__':
  unittest.main()
