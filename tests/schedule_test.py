"""The schedule IR (no TensorFlow): actions, edges, rules, tasks, and a Schedule's checks."""

import functools
import subprocess
import sys
import unittest

from tensorpipe import schedule
from tensorpipe import schedule_builders

F, B, W = schedule.FORWARD, schedule.BACKWARD, schedule.WEIGHT


def _A(kind, k, t):
  return schedule.Action(kind, k, t)


def _OnePerDevice():
  """{name: its builder from (K, M, ...)} of each schedule with one partition per device."""
  return {name: functools.partial(schedule_builders.Build, name)
          for name in schedule_builders.SCHEDULES}


class ImportTest(unittest.TestCase):

  def testImportsWithoutTensorFlow(self):
    for module in ('tensorpipe.schedule', 'tensorpipe.schedule_builders'):
      code = ('import sys, %s; '
              'assert "tensorflow" not in sys.modules and "lingvo" not in sys.modules' % module)
      subprocess.run([sys.executable, '-c', code], check=True, timeout=120)


class CheckCountsTest(unittest.TestCase):

  def testNamesTheFirstCountThatIsNotAPositiveInteger(self):
    schedule.CheckCounts(num_devices=1, num_micro_batches=8)
    for value in (0, -1, 2.5, True, None):
      with self.assertRaisesRegex(
          ValueError, 'num_micro_batches must be a positive integer, got %r' % (value,)):
        schedule.CheckCounts(num_devices=2, num_micro_batches=value)
    with self.assertRaisesRegex(ValueError, 'num_partitions must be a positive integer, got 0'):
      schedule.CheckCounts(num_partitions=0, num_micro_batches=0)


class ScheduleCheckTest(unittest.TestCase):
  """A hand-made schedule is checked when it is made."""

  def _Lists(self):
    return [[_A(F, 0, 0), _A(B, 0, 0)], [_A(F, 1, 0), _A(B, 1, 0)]]

  def _Edges(self):
    return [schedule.Edge(_A(F, 0, 0), _A(F, 1, 0), 1), schedule.Edge(_A(B, 1, 0), _A(B, 0, 0), 4)]

  def testAValidOne(self):
    s = schedule.Schedule(2, 1, self._Lists(), self._Edges(), 'mine')
    self.assertEqual(s.DryRun(), {_A(F, 0, 0): 0, _A(F, 1, 0): 1, _A(B, 1, 0): 2, _A(B, 0, 0): 3})

  def testMissingRepeatedOrMisplacedActions(self):
    lists = self._Lists()
    lists[1].pop()
    with self.assertRaisesRegex(ValueError, 'mine: actions missing: B1,0'):
      schedule.Schedule(2, 1, lists, [], 'mine')
    lists = self._Lists()
    lists[0].append(_A(F, 0, 0))
    with self.assertRaisesRegex(ValueError, 'mine: F0,0 appears twice'):
      schedule.Schedule(2, 1, lists, [], 'mine')
    lists = self._Lists()
    lists[0][1], lists[1][1] = lists[1][1], lists[0][1]
    with self.assertRaisesRegex(ValueError, 'mine: B1,0 is in the list of device 0'):
      schedule.Schedule(2, 1, lists, [], 'mine')

  def testDeadlockAndUnknownActions(self):
    edges = self._Edges() + [schedule.Edge(_A(B, 0, 0), _A(F, 0, 0), 9)]
    with self.assertRaisesRegex(ValueError, 'mine: the schedule deadlocks; waiting: F0,0, F1,0'):
      schedule.Schedule(2, 1, self._Lists(), edges, 'mine')
    edges = [schedule.Edge(_A(F, 0, 5), _A(F, 1, 0), 1)]
    with self.assertRaisesRegex(ValueError, r'mine: edge F0,5 -> F1,0 names an unknown action'):
      schedule.Schedule(2, 1, self._Lists(), edges, 'mine')


class RuleTest(unittest.TestCase):

  def testRulesAreNumberedOneToSixteenEachWithOneLine(self):
    self.assertEqual([int(rule) for rule in schedule.Rule], list(range(1, 17)))
    for rule in schedule.Rule:
      self.assertIs(schedule.Rule(int(rule)), rule)
      self.assertIsInstance(rule.text, str)
      self.assertTrue(rule.text.strip(), rule)
      self.assertNotIn('\n', rule.text, rule)
      self.assertLessEqual(len(rule.text), 100, rule)
    self.assertEqual(len({rule.text for rule in schedule.Rule}), 16)
    self.assertEqual(schedule.Rule.IN_FLIGHT, 8)
    self.assertTrue(schedule.Rule.IN_FLIGHT.text.startswith('F(k, t + K - k) after B(k, t)'))

  def testEdgesCarryRuleMembers(self):
    for name, build in _OnePerDevice().items():
      for edge in build(3, 5).edges:
        self.assertIsInstance(edge.rule, schedule.Rule, (name, edge))
    in_flight = [e for e in schedule_builders.OneFOneBSchedule(3, 5).edges
                 if e.rule is schedule.Rule.IN_FLIGHT]
    self.assertEqual(len(in_flight), sum(max(5 - (3 - k), 0) for k in range(3)))
    for edge in in_flight:
      self.assertEqual((edge.before.kind, edge.after.kind), (B, F))
      self.assertEqual(edge.after.micro_batch, edge.before.micro_batch + 3 - edge.before.partition)
    self.assertEqual({e.rule for e in schedule_builders.FillDrainSchedule(2, 3).edges},
                     {schedule.Rule.FORWARD_INPUT, schedule.Rule.LOSS_OF_EVERY_OUTPUT,
                      schedule.Rule.BACKWARD_INPUT, schedule.Rule.SUM_IN_REVERSE,
                      schedule.Rule.FORWARD_ORDER})


class TaskTest(unittest.TestCase):
  """Each action's task: what it computes, from its kind and the re-computation mode."""

  def testJoinedBackwardPassesFollowTheRecomputeMode(self):
    k_partitions, m = 3, 4
    for build in (schedule_builders.FillDrainSchedule, schedule_builders.OneFOneBSchedule):
      for mode in schedule.RECOMPUTE_MODES:
        sched = build(k_partitions, m, recompute=mode)
        self.assertEqual(sched.recompute, mode)
        for actions in sched.device_actions:
          for a in actions:
            if a.kind == F:
              expected = schedule.Task.FORWARD
            elif mode in ('always', 'selective') or (mode == 'except_last' and
                                                     a.micro_batch < m - 1):
              expected = schedule.Task.BACKWARD
            else:
              expected = schedule.Task.BACKWARD_FROM_KEPT
            self.assertIs(sched.Task(a), expected, (sched.name, mode, str(a)))
        self.assertEqual([sched.Recomputes(t) for t in range(m)],
                         {'always': [True] * m, 'never': [False] * m, 'selective': [True] * m,
                          'except_last': [True] * (m - 1) + [False]}[mode])

  def testTheDefaultRecomputesAlways(self):
    for name, build in _OnePerDevice().items():
      sched = build(2, 3)
      self.assertEqual(sched.recompute, 'always', name)
      self.assertTrue(all(sched.Recomputes(t) for t in range(3)), name)

  def testOneMicroBatchExceptLastRecomputesNothing(self):
    sched = schedule_builders.OneFOneBSchedule(2, 1, recompute='except_last')
    self.assertIs(sched.Task(_A(B, 0, 0)), schedule.Task.BACKWARD_FROM_KEPT)
    self.assertIs(sched.Task(_A(B, 1, 0)), schedule.Task.BACKWARD_FROM_KEPT)

  def testZeroBubbleSplitsBackwardPasses(self):
    sched = schedule_builders.ZeroBubbleSchedule(3, 4, recompute='always')
    tasks = {schedule.FORWARD: schedule.Task.FORWARD, schedule.BACKWARD:
             schedule.Task.INPUT_GRADIENT, schedule.WEIGHT: schedule.Task.WEIGHT_GRADIENT}
    count = 0
    for actions in sched.device_actions:
      for a in actions:
        self.assertIs(sched.Task(a), tasks[a.kind], str(a))
        count += 1
    self.assertEqual(count, 3 * 3 * 4)

  def testZeroBubbleRefusesKeptActivations(self):
    for mode in ('never', 'except_last', 'selective'):
      with self.assertRaisesRegex(
          ValueError, r"zero-bubble K=2, M=3 schedule needs recompute='always', got "
          r"recompute='%s'" % mode):
        schedule_builders.ZeroBubbleSchedule(2, 3, recompute=mode)
      with self.assertRaisesRegex(ValueError, r"mine needs recompute='always'"):
        schedule.CheckRecompute('mine', mode, splits_backward=True)
      schedule.CheckRecompute('mine', mode, splits_backward=False)  # Joined backward: fine.

  def testUnknownRecomputeModeIsRefused(self):
    for name, build in _OnePerDevice().items():
      with self.assertRaisesRegex(
          ValueError, r"recompute='sometimes' is not one of "
          r"\('always', 'except_last', 'never', 'selective'\)"):
        build(2, 3, recompute='sometimes')
      with self.assertRaisesRegex(ValueError, r"recompute=True is not one of", msg=name):
        build(2, 3, recompute=True)
    lists = [[_A(F, 0, 0), _A(B, 0, 0)]]
    with self.assertRaisesRegex(ValueError, r"recompute='Always' is not one of"):
      schedule.Schedule(1, 1, lists, [], 'mine', recompute='Always')


if __name__ == '__main__':
  unittest.main()
