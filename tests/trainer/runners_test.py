"""The trainer's runners (tensorpipe.trainer.runners): WatchedSteps on a fake Lingvo trainer and
clock, the Evaler's processed checkpoints, and RunnerManager's line for a port taken at start."""

import functools
import socket
import threading
import types
from unittest import mock

from absl.testing import flagsaver
from lingvo import compat as tf
from lingvo import runners as lingvo_runners
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe.trainer import ending
from tensorpipe.trainer import liveness
from tensorpipe.trainer import runners
from tensorpipe.trainer import startup
from tensorpipe.trainer import step_watchdog

MODEL = 'digits.TinyConvPipeline'


class _FakeCheckpointer:
  """Lingvo's checkpointer as the trainer calls it; a save or restore takes 1000 s of `clock` (a
  fake one: its `now` is the time)."""

  def __init__(self, clock):
    self.clock = clock
    self.calls = []

  def Save(self, sess=None, gsteps=None, sync=True):
    self.calls.append(('Save', sess, gsteps, sync))
    self.clock.now += 1000
    return 'train/ckpt-%08d' % gsteps

  def Restore(self, sess=None, force_reinitialize=False):
    self.calls.append(('Restore', sess, force_reinitialize))
    self.clock.now += 1000


class _FakeLingvoTrainer:
  """What WatchedSteps uses of Lingvo's Trainer: `_checkpointer`, and a `_Loop` that restores, then
  calls `_ShouldStop(sess, global_step)` before every step and saves every second step. A step
  takes `step_s` of the clock; after each, `checks` records the watchdog's Check."""

  def __init__(self, clock, step_s, max_steps):
    self._checkpointer = _FakeCheckpointer(clock)
    self.clock, self.step_s, self.max_steps = clock, step_s, max_steps
    self.checks = []

  def _Loop(self):
    self._checkpointer.Restore('sess', force_reinitialize=True)
    step = 0
    while not self._ShouldStop('sess', step):
      self.clock.now += self.step_s
      step += 1
      self.checks.append(self._loop_watch.watchdog.Check())  # pylint: disable=no-member
      if step % 2 == 0:
        self.checks.append(self._checkpointer.Save('sess', step))

  def _ShouldStop(self, sess=None, step=None, check_early_stop=True):
    del sess, check_early_stop
    return step >= self.max_steps


class _WatchedTrainer(runners.WatchedSteps, _FakeLingvoTrainer):
  pass


class WatchedStepsTest(test_utils.TestCase):
  """--step_timeout_s: a step that does not finish within it ends the job with one line,
  checkpoint saves and restores not counted."""

  def _Trainer(self, step_s, max_steps, **flags):
    """A _WatchedTrainer on a fake clock whose watching thread is not started but kept in
    `self.spawned`; returns it and the clock."""
    clock = types.SimpleNamespace(now=0.0)
    self.spawned = []
    watch = functools.partial(step_watchdog.LoopWatch, clock=lambda: clock.now,
                              spawn=self.spawned.append)
    with flagsaver.flagsaver(**dict(dict(step_timeout_s=10), **flags)), \
         mock.patch.object(step_watchdog, 'LoopWatch', watch):
      trainer = _WatchedTrainer(clock, step_s, max_steps)
    return trainer, clock

  @staticmethod
  def _Watchdog(trainer):
    return trainer._loop_watch.watchdog  # pylint: disable=protected-access

  def testSavesAndRestoresRunUnchangedAndDoNotCount(self):
    trainer, clock = self._Trainer(step_s=9, max_steps=4)  # Steps of 9 s, saves of 1000 s.
    trainer._Loop()  # pylint: disable=protected-access
    self.assertEqual(trainer.checks, [None, None, 'train/ckpt-00000002', None, None,
                                      'train/ckpt-00000004'])
    self.assertEqual(trainer._checkpointer.calls, [  # pylint: disable=protected-access
        ('Restore', 'sess', True), ('Save', 'sess', 2, True), ('Save', 'sess', 4, True)])
    self.assertLen(self.spawned, 1)  # The watching thread, started at the first step.
    clock.now += 10000
    self.assertIsNone(self._Watchdog(trainer).Check())  # Training ended: no stall any more.

  def testAStepLongerThanTheBoundIsAStall(self):
    trainer, _ = self._Trainer(step_s=11, max_steps=3)
    trainer._Loop()  # pylint: disable=protected-access
    # The first step has 3 x 10 s; the second's 11 s pass the bound.
    self.assertEqual(trainer.checks[:2], [None, step_watchdog.Stall(
        global_step=1, bound_s=10, timeout_s=10, first=False, restarts=0)])

  def testZeroTurnsTheWatchOff(self):
    trainer, _ = self._Trainer(step_s=9, max_steps=2, step_timeout_s=0)
    self.assertIsNone(trainer._loop_watch)  # pylint: disable=protected-access
    self.assertEqual(trainer._checkpointer.Save.__func__,  # pylint: disable=protected-access
                     _FakeCheckpointer.Save)

  def testOnlyTheTrainingLoopsThreadIsWatched(self):
    # Lingvo's enqueue loops call _ShouldStop from threads of their own, with other steps.
    trainer, clock = self._Trainer(step_s=1, max_steps=100)
    trainer._loop_watch.LoopStarts()  # pylint: disable=protected-access  # This thread's loop.
    should_stop = trainer._ShouldStop  # pylint: disable=protected-access
    other = threading.Thread(target=should_stop, args=('sess', 5))
    other.start()
    other.join(timeout=60)  # Hang guard.
    clock.now = 10000
    self.assertIsNone(self._Watchdog(trainer).Check())  # Not armed: nothing observed.
    self.assertEqual(self.spawned, [])

  def _Stall(self, trainer, clock):
    """Puts `trainer` 11 s into step 8 (bound 10 s) and returns the stall."""
    trainer._loop_watch.LoopStarts()  # pylint: disable=protected-access
    trainer._ShouldStop('sess', 6)  # pylint: disable=protected-access
    trainer._ShouldStop('sess', 7)  # pylint: disable=protected-access
    clock.now += 11
    stall = self._Watchdog(trainer).Check()
    self.assertIsNotNone(stall)
    return stall

  def testAStallInOneProcessEndsItWithTheLine(self):
    trainer, clock = self._Trainer(step_s=1, max_steps=100)
    stall = self._Stall(trainer, clock)
    with flagsaver.flagsaver(cluster_spec='', run_locally='cpu'), \
         mock.patch.object(ending, 'EndJob') as end:
      trainer._OnStall(stall)  # pylint: disable=protected-access
    end.assert_called_once_with(
        'training step 8 did not finish within --step_timeout_s=10 s (the global step stayed at '
        '7, checkpoint saves and restores not counted): the step is stuck inside TensorFlow in '
        'this process (e.g. a deadlocked op or an input that never yields); look at the log for '
        'the cause, or raise --step_timeout_s if steps of this model really take that long (0 '
        'turns the bound off)', record=True)

  def testAStallInAClusterJobNamesTheTasksThatDoNotAnswer(self):
    trainer, clock = self._Trainer(step_s=1, max_steps=100)
    stall = self._Stall(trainer, clock)
    spec = 'controller=10.0.0.2:7000@trainer_client=10.0.0.2:7001@worker=10.0.0.3:7000'
    silent = ['worker:0 at 10.0.0.3:7000 (no answer within 5 s)']
    with flagsaver.flagsaver(cluster_spec=spec, job='trainer_client', task=0, run_locally='',
                             tf_master=''), \
         mock.patch.object(liveness, 'Silent', return_value=silent) as ask, \
         mock.patch.object(ending, 'EndJob') as end:
      trainer._OnStall(stall)  # pylint: disable=protected-access
    ask.assert_called_once_with([('controller', 0, '10.0.0.2:7000'),
                                 ('worker', 0, '10.0.0.3:7000')], liveness.STATUS_TIMEOUT_S)
    line = end.call_args.args[0]
    self.assertIn(': task worker:0 at 10.0.0.3:7000 (no answer within 5 s) does not answer a '
                  'status request, and the step waits for it;', line)

  def testAStepThatFinishesWhileTheTasksAreAskedEndsNothing(self):
    trainer, clock = self._Trainer(step_s=1, max_steps=100)
    stall = self._Stall(trainer, clock)

    def Silent(unused_peers, unused_timeout_s):
      trainer._ShouldStop('sess', 8)  # pylint: disable=protected-access  # The step finished.
      return []

    spec = 'trainer_client=10.0.0.2:7001@worker=10.0.0.3:7000'
    with flagsaver.flagsaver(cluster_spec=spec, job='trainer_client', task=0, run_locally='',
                             tf_master=''), \
         mock.patch.object(liveness, 'Silent', side_effect=Silent), \
         mock.patch.object(ending, 'EndJob') as end:
      self.assertFalse(trainer._OnStall(stall))  # pylint: disable=protected-access
    end.assert_not_called()


class RunnerManagerTest(test_utils.TestCase):
  """The runners RunnerManager builds, and its start of this task's TensorFlow server."""

  def testRunnersStartPromptly(self):
    manager = runners.RunnerManager(MODEL)
    for runner in (manager.Controller, manager.Trainer):
      self.assertTrue(issubclass(runner, startup.PromptStart), runner)
      self.assertIs(runner._WaitUntilInit, startup.PromptStart._WaitUntilInit)  # pylint: disable=protected-access
    self.assertTrue(issubclass(manager.Controller, lingvo_runners.Controller))
    self.assertTrue(issubclass(manager.Trainer, lingvo_runners.Trainer))

  def testPortTakenAfterTheCheckIsNamed(self):
    # The port is taken between the check and the server's start: TensorFlow's 'Could not start
    # gRPC server' becomes the line naming the address.
    with socket.socket() as held:
      held.bind(('127.0.0.1', 0))
      held.listen()
      address = '127.0.0.1:%d' % held.getsockname()[1]
      with flagsaver.flagsaver(cluster_spec='worker=%s' % address, job='worker', task=0,
                               mode='sync', run_locally='', tf_master=''), \
           mock.patch.object(ending, 'Exit', side_effect=SystemExit) as end, \
           mock.patch.object(ending.sys, 'stderr') as stderr, \
           self.assertRaises(SystemExit):
        runners.RunnerManager(MODEL).MaybeLaunchTensorFlow()
    end.assert_called_once_with(ending.ERROR_EXIT_CODE)
    self.assertEqual(
        ''.join(c.args[0] for c in stderr.write.call_args_list),
        'tensorpipe.trainer.train: error: task worker:0 cannot listen on %s: another process, '
        'e.g. a task of an earlier run, holds %s; stop it or pick another port in '
        '--cluster_spec\n' % (address, address))


class TensorPipeEvalerTest(test_utils.TestCase):
  """What TensorPipeEvaler adds to Lingvo 0.14.0's Evaler."""

  def testEvalerRecordsAFixedCheckpointAsProcessed(self):
    # Lingvo 0.14.0's Evaler calls a method it lacks after evaluating
    # task.eval.load_checkpoint_from; TensorPipe's records the checkpoint as the Decoder does.
    eval_dir = self.create_tempdir().full_path
    runners.TensorPipeEvaler._UpdateProcessedCheckpoints(  # pylint: disable=protected-access
        None, eval_dir, '/logs/train/ckpt-00000005')
    self.assertEqual(py_utils.GetProcessedCheckpoints(eval_dir), ['/logs/train/ckpt-00000005'])


if __name__ == '__main__':
  tf.test.main()
