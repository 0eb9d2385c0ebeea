"""tensorpipe.trainer.step_watchdog: a global step that stays put is named once its bound passed,
saves and restores not counted; the line says what to do. Every outcome is decided by a fake
clock."""

import threading
import unittest

from tensorpipe.trainer import step_watchdog

FACTOR = step_watchdog.FIRST_STEP_FACTOR


class _FakeClock:

  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


class _FakeStop:
  """A threading.Event stand-in whose wait moves the fake clock by the poll instead of sleeping;
  it is set after `rounds` waits."""

  def __init__(self, clock, rounds):
    self.clock = clock
    self.rounds = rounds

  def wait(self, seconds):
    if self.rounds == 0:
      return True
    self.rounds -= 1
    self.clock.now += seconds
    return False


class StepWatchdogTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.clock = _FakeClock()
    self.watchdog = step_watchdog.StepWatchdog(10, clock=self.clock)

  def _At(self, now):
    self.clock.now = now
    return self.watchdog.Check()

  def testNothingFiresBeforeTheFirstStepIsObserved(self):
    self.assertIsNone(self._At(10000))

  def testTheFirstStepOfARunGetsItsFactorTimesTheBound(self):
    self.watchdog.Observe(0)
    self.assertIsNone(self._At(10 * FACTOR))
    self.assertEqual(
        self._At(10 * FACTOR + 1),
        step_watchdog.Stall(global_step=0, bound_s=10 * FACTOR, timeout_s=10, first=True,
                            restarts=0))

  def testLaterStepsGetTheBoundFromTheLastMove(self):
    self.watchdog.Observe(41)  # Restored at step 41.
    self.clock.now = 10 * FACTOR - 1  # The first step, graph start-up included, nearly timed out.
    self.watchdog.Observe(42)
    self.assertIsNone(self._At(10 * FACTOR - 1 + 10))
    self.assertEqual(self._At(10 * FACTOR + 10),
                     step_watchdog.Stall(global_step=42, bound_s=10, timeout_s=10, first=False,
                                         restarts=0))

  def testSavesAndRestoresDoNotCount(self):
    self.watchdog.Observe(5)
    self.watchdog.Observe(6)  # Past the first step: the bound is 10 s.
    self.clock.now = 4
    with self.watchdog.NotCounting():
      with self.watchdog.NotCounting():  # A save inside a save (MaybeSave calls Save).
        self.assertIsNone(self._At(1000))
      self.assertIsNone(self._At(2000))  # Still inside the outer one.
    self.assertIsNone(self._At(2006))  # 4 + 6 s outside: 10 s counted.
    self.assertEqual(self._At(2007).global_step, 6)

  def testExcludedPassesArgumentsAndResultsThroughAndDoesNotCount(self):
    calls = []

    def Save(sess, gsteps, sync=True):
      """Lingvo's checkpointer's Save, as far as a caller sees it."""
      calls.append((sess, gsteps, sync))
      self.clock.now += 500  # A slow save.
      return 'train/ckpt-%08d' % gsteps

    save = self.watchdog.Excluded(Save)
    self.watchdog.Observe(3)
    self.watchdog.Observe(4)
    self.assertEqual(save('sess', 4, sync=False), 'train/ckpt-00000004')
    self.assertEqual(calls, [('sess', 4, False)])
    self.assertEqual(save.__doc__, Save.__doc__)
    self.assertIsNone(self._At(510))
    self.assertIsNotNone(self._At(511))

  def testAStepStartedAgainIsCountedAndDoesNotResetTheBound(self):
    self.watchdog.Observe(7)
    self.watchdog.Observe(8)
    self.clock.now = 6
    self.watchdog.Observe(8)  # Lingvo's loop restarted after an error: the same global step.
    self.watchdog.Observe(8)
    self.assertEqual(self._At(11), step_watchdog.Stall(global_step=8, bound_s=10, timeout_s=10,
                                                       first=False, restarts=2))

  def testStoppedItNeverFires(self):
    self.watchdog.Observe(0)
    self.watchdog.Stop()
    self.assertIsNone(self._At(10000))

  def testABoundOfZeroIsNoWatchdog(self):
    with self.assertRaisesRegex(ValueError, 'timeout_s must be positive, got 0'):
      step_watchdog.StepWatchdog(0)

  def testRunReportsAStallAndWatchesOnWhenTheHandlerDoesNotEndTheJob(self):
    stalls = []
    self.watchdog.Observe(0)
    self.watchdog.Observe(1)
    # The handler declines the first stall (the step finished meanwhile) and ends the job at the
    # second; polls every 4 s: t = 4, 8, 12 (stall), 16 (stall).
    self.watchdog.Run(lambda stall: stalls.append((self.clock.now, stall)) or len(stalls) == 2,
                      _FakeStop(self.clock, rounds=100), poll_s=4)
    self.assertEqual([now for now, _ in stalls], [12, 16])
    self.assertTrue(all(stall.global_step == 1 for _, stall in stalls))

  def testRunEndsWhenStopped(self):
    self.watchdog.Observe(0)
    self.watchdog.Run(self.fail, _FakeStop(self.clock, rounds=3), poll_s=1)
    self.assertEqual(self.clock.now, 3)


class _Checkpointer:
  """Lingvo's checkpointer, as far as LoopWatch sees it."""

  def __init__(self, clock):
    self.clock = clock

  def Save(self, sess, gsteps, sync=True):
    self.clock.now += 500
    return (sess, gsteps, sync)


class LoopWatchTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.clock = _FakeClock()
    self.spawned = []
    self.stalls = []
    self.watch = step_watchdog.LoopWatch(10, self.stalls.append, clock=self.clock,
                                         spawn=self.spawned.append)

  def testOnlyTheLoopsThreadIsObservedAndTheWatchStartsOnce(self):
    self.assertFalse(self.watch.Observe(0))  # No loop started in this thread.
    self.watch.LoopStarts()
    self.assertTrue(self.watch.Observe(0))
    self.assertTrue(self.watch.Observe(1))
    other = []
    thread = threading.Thread(target=lambda: other.append(self.watch.Observe(99)))
    thread.start()
    thread.join(timeout=60)  # Hang guard.
    self.assertEqual(other, [False])
    self.assertEqual(len(self.spawned), 1)
    self.clock.now = 11
    self.assertEqual(self.watch.watchdog.Check().global_step, 1)  # Not 99.

  def testAStoppedWatchReportsNothingAndStartsNoThread(self):
    self.watch.LoopStarts()
    self.watch.Observe(0)
    self.clock.now = 31  # Past the first step's bound ...
    self.watch.Stop()  # ... but training ended.
    self.spawned[0]()  # The watching thread's body returns at once.
    self.assertEqual(self.stalls, [])
    self.assertIsNone(self.watch.watchdog.Check())
    self.watch.Observe(1)
    self.assertEqual(len(self.spawned), 1)

  def testExcludedMethodsRunUnchangedAndDoNotCount(self):
    checkpointer = _Checkpointer(self.clock)
    self.watch.ExcludeFrom(checkpointer, ['Save', 'Restore'])  # It has no Restore: left alone.
    self.assertFalse(hasattr(checkpointer, 'Restore'))
    self.watch.LoopStarts()
    self.watch.Observe(0)
    self.watch.Observe(1)
    self.assertEqual(checkpointer.Save('sess', 1, sync=False), ('sess', 1, False))
    self.clock.now = 510
    self.assertIsNone(self.watch.watchdog.Check())


def _Stall(first=False, restarts=0):
  return step_watchdog.Stall(global_step=57, bound_s=1800 if first else 600, timeout_s=600,
                             first=first, restarts=restarts)


class StallLineTest(unittest.TestCase):

  def testOneProcess(self):
    self.assertEqual(
        step_watchdog.StallLine(_Stall(), None, 5),
        'training step 58 did not finish within --step_timeout_s=600 s (the global step stayed '
        'at 57, checkpoint saves and restores not counted): the step is stuck inside TensorFlow in '
        'this process (e.g. a deadlocked op or an input that never yields); look at the log for '
        'the cause, or raise --step_timeout_s if steps of this model really take that long (0 '
        'turns the bound off)')

  def testEveryTaskAnswers(self):
    self.assertEqual(
        step_watchdog.StallLine(_Stall(first=True), [], 5),
        'the first step of this run, step 58, did not finish within 3 x --step_timeout_s=600 = '
        '1800 s (a run\'s first step also starts the graph; the global step stayed at 57, '
        'checkpoint saves and restores not counted): every task of the job answers a '
        'status request within 5 s, so the step itself is stuck inside TensorFlow (e.g. a '
        'deadlocked op, an input that never yields, or a task that waits for another); look at '
        'the tasks\' logs for the cause, or raise --step_timeout_s if steps of this model really '
        'take that long (0 turns the bound off)')

  def testSilentTasksAreNamed(self):
    self.assertEqual(
        step_watchdog.StallLine(_Stall(restarts=1),
                                ['worker:1 at 10.0.0.4:7000 (no answer within 5 s)'], 5),
        'training step 58 did not finish within --step_timeout_s=600 s (the global step stayed '
        'at 57, checkpoint saves and restores not counted; the trainer started the step again 1 '
        'time after errors: see this task\'s log): task worker:1 at 10.0.0.4:7000 (no answer '
        'within 5 s) does not answer a status request, and the step waits for it; look at its log '
        'and its host, then start every task of the job again with the same commands to resume '
        'from the last checkpoint')
    line = step_watchdog.StallLine(_Stall(restarts=2), ['worker:1 at A (x)', 'worker:2 at B (y)'],
                                   5)
    self.assertIn('started the step again 2 times', line)
    self.assertIn('tasks worker:1 at A (x), worker:2 at B (y) do not answer a status request, and '
                  'the step waits for them; look at their logs and hosts', line)


if __name__ == '__main__':
  unittest.main()
