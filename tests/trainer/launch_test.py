"""tensorpipe.trainer.launch: a killed worker stops the whole job; the same command resumes; its
flags, help and one-line flag errors."""

import glob
import io
import os
import random
import re
import signal
import subprocess
import sys
import time
from unittest import mock

import pytest
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import launch
from tests import helpers

_REPO = helpers.REPO


def _StopLauncher(proc, out_path, logdir, timeout_s):
  """Stops a launcher the test started (SIGINT: it stops its tasks; SIGKILL after `timeout_s`),
  then by pid every task it printed that still runs and belongs to the job in `logdir`. The output
  is read again here: a test that failed early may not have seen every pid."""
  if proc.poll() is None:
    proc.send_signal(signal.SIGINT)
    try:
      proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait(timeout=30)
  with open(out_path) as f:
    pids = [int(p) for p in re.findall(r'^\s+\w+ task \d+\s+pid (\d+)', f.read(), re.M)]
  for pid in pids:
    if LauncherTest._Alive(pid) and _Runs(pid, logdir):
      os.kill(pid, signal.SIGKILL)


def _Runs(pid, logdir):
  """Whether process `pid` is a task of the job in `logdir` (its command line names it), so that
  a pid the system has since given to another process is never killed."""
  try:
    with open('/proc/%d/cmdline' % pid, 'rb') as f:
      return logdir.encode() in f.read()
  except OSError:
    return False


class LauncherTest(test_utils.TestCase):
  """tensorpipe.trainer.launch with K = 4 partitions in 2 worker processes: a killed worker stops
  the job with a message naming it, every process is stopped, and the same command resumes from the
  checkpoint."""

  def _Launch(self, logdir, max_steps, stall_timeout_s, save_interval_s=2):
    args = [sys.executable, '-m', 'tensorpipe.trainer.launch', '--model=digits.TinyConvPipeline',
            '--logdir=%s' % logdir, '--worker_tasks=2', '--cpu_devices=2',
            '--stall_timeout_s=%d' % stall_timeout_s, '--startup_timeout_s=60',
            '--model_params_override=train.max_steps: %d; train.save_interval_seconds: %d' %
            (max_steps, save_interval_s)]
    # In a network namespace of its own: the ports the launcher picks cannot be taken by anyone
    # else before its tasks bind them.
    args = helpers.InPrivateNetwork(args)
    if args is None:
      self.skipTest('needs root with unshare and ip, to run the job in its own network namespace')
    out = open(os.path.join(logdir, 'launcher.%d.out' % len(self._outs)), 'w')
    self._outs.append(out.name)
    proc = subprocess.Popen(args, cwd=_REPO, stdout=out, stderr=subprocess.STDOUT,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    self.addCleanup(self._Stop, proc, out, logdir)
    return proc, out.name

  def _Stop(self, proc, out, logdir):
    out.close()
    _StopLauncher(proc, out.name, logdir, timeout_s=120)

  def setUp(self):
    super().setUp()
    self._outs = []

  @staticmethod
  def _Read(path):
    with open(path) as f:
      return f.read()

  def _Pids(self, path, num_tasks, timeout_s=60):
    """{task name: pid} from the launcher's 'worker task 1   pid 123   log ...' lines."""
    deadline = time.time() + timeout_s
    while True:
      pids = {m.group(1): int(m.group(2)) for m in re.finditer(
          r'^\s+(\w+ task \d+)\s+pid (\d+)', self._Read(path), re.M)}
      if len(pids) == num_tasks or time.time() > deadline:
        return pids
      time.sleep(0.5)

  @staticmethod
  def _Alive(pid):
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return False
    with open('/proc/%d/stat' % pid) as f:  # A zombie has exited (it waits for its parent).
      return f.read().split(')')[-1].split()[0] != 'Z'

  def _TrainerSteps(self, trainer_log):
    """The steps the trainer client logged in its latest run (after its last 'model' line)."""
    log = self._Read(trainer_log).split('TensorPipe: model')[-1]
    return [int(s) for s in re.findall(r'step: *(\d+),', log)]

  def _AssertAllEnded(self, pids):
    for name, pid in pids.items():
      self.assertFalse(self._Alive(pid), '%s (pid %d) still runs' % (name, pid))

  @pytest.mark.slow
  def testSigtermSavesTheStepAKilledWorkerStopsTheJobAndTheSameCommandResumes(self):
    logdir = self.create_tempdir().full_path
    trainer_log = os.path.join(logdir, 'launch', 'trainer_client.log')
    # 1. SIGTERM to the launcher while it trains (no periodic checkpoints: the one the trainer
    # client saves is the only one after step 0).
    proc, path = self._Launch(logdir, max_steps=100000, stall_timeout_s=90, save_interval_s=3600)
    pids = self._Pids(path, 4)
    self.assertEqual(sorted(pids), ['controller task 0', 'trainer_client task 0', 'worker task 0',
                                    'worker task 1'], self._Read(path))
    deadline = time.time() + 240  # Bounds on the test's run time, not timing properties.
    while len(self._TrainerSteps(trainer_log)) < 3:
      self.assertIsNone(proc.poll(), self._Read(path)[-3000:])
      self.assertLess(time.time(), deadline, 'no 3 training steps within 240 s')
      time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60 + 15 + 30)  # --sigterm_grace_s, the launcher's margin, and slack.
    out = self._Read(path)
    self.assertEqual(proc.returncode, 128 + signal.SIGTERM, out[-3000:])
    self._AssertAllEnded(pids)
    match = re.search(r'^tensorpipe\.trainer\.launch: error: stopped by SIGTERM: the trainer '
                      r'client saved a checkpoint of step (\d+): (\S+)\. Run the same command '
                      r'again to resume at step (\d+)\.$', out.strip().splitlines()[-1])
    self.assertIsNotNone(match, out[-3000:])
    saved, path_saved, resume = int(match.group(1)), match.group(2), int(match.group(3))
    self.assertEqual(resume, saved + 1)
    self.assertEqual(max(self._TrainerSteps(trainer_log)), saved)  # The step last run.
    self.assertEqual(tf.train.load_checkpoint(path_saved).get_tensor('global_step'), saved)
    # 2. The same command resumes at that step + 1; a killed worker then stops the whole job.
    proc, path = self._Launch(logdir, max_steps=100000, stall_timeout_s=90)
    pids = self._Pids(path, 4)
    deadline = time.time() + 240
    while not [f for f in glob.glob(os.path.join(logdir, 'train', 'ckpt-*.index'))
               if int(re.search(r'ckpt-(\d+)', f).group(1)) > saved]:
      self.assertIsNone(proc.poll(), self._Read(path)[-3000:])
      self.assertLess(time.time(), deadline, 'no checkpoint after step %d within 240 s' % saved)
      time.sleep(1)
    self.assertEqual(self._TrainerSteps(trainer_log)[0], saved + 1)
    os.kill(pids['worker task 1'], signal.SIGKILL)
    # A bound on the test's run time, not a timing property: that the launcher notices an exited
    # task at its next poll is SuperviseTest's, on a fake clock.
    proc.wait(timeout=120)
    out = self._Read(path)
    self.assertEqual(proc.returncode, 1, out[-3000:])
    self.assertRegex(out.strip().splitlines()[-1],
                     r'^tensorpipe\.trainer\.launch: error: worker task 1 \(pid %d\) exited '
                     r'with status -9; its log: .*worker\.1\.log\. '
                     r'Run the same command again to resume' % pids['worker task 1'])
    self._AssertAllEnded(pids)
    # The launcher's SIGTERM reached the trainer client, which could not save its step.
    self.assertRegex(self._Read(trainer_log),
                     r'tensorpipe\.trainer\.train: error: SIGTERM: the current step cannot be '
                     r'saved: task worker:1 at 127\.0\.0\.1:\d+ \(.*\) does not answer; training '
                     r'resumes from the last checkpoint in ')
    # The latest checkpoint holds the step it is named after (the trainer client saves between
    # steps).
    latest = tf.train.latest_checkpoint(os.path.join(logdir, 'train'))
    held = int(tf.train.load_checkpoint(latest).get_tensor('global_step'))
    self.assertEqual(latest, os.path.join(logdir, 'train', 'ckpt-%08d' % held))
    self.assertGreater(held, saved)
    # 3. The same command (fewer steps to go) resumes from that checkpoint and ends.
    proc, path = self._Launch(logdir, max_steps=held + 5, stall_timeout_s=90)
    proc.wait(timeout=300)
    out = self._Read(path)
    self.assertEqual(proc.returncode, 0, out[-3000:])
    self.assertIn('training done (last step %d)' % (held + 5), out)
    self.assertEqual(self._TrainerSteps(trainer_log)[0], held + 1)


class _FakeClock:
  """Time that passes only when the code under test sleeps; each sleep may also run `on_sleep`."""

  def __init__(self, on_sleep=None):
    self.now = 0.0
    self.on_sleep = on_sleep

  def Now(self):
    return self.now

  def Sleep(self, seconds):
    self.now += seconds
    if self.on_sleep:
      self.on_sleep(self.now)


class _FakeProc:
  """A started process as Supervise and Stop see it: a pid, an exit status (None while it runs),
  the signals sent to it, and what a SIGTERM does (`on_sigterm(proc)`; default: nothing)."""

  def __init__(self, pid, on_sigterm=None):
    self.pid = pid
    self.status = None
    self.sent = []
    self.on_sigterm = on_sigterm

  def poll(self):
    return self.status

  def send_signal(self, signum):
    self.sent.append(signum)
    if signum == signal.SIGTERM and self.on_sigterm:
      self.on_sigterm(self)

  def kill(self):
    self.sent.append(signal.SIGKILL)
    self.status = -signal.SIGKILL

  def wait(self):
    return self.status


def _FakeTasks(logdir):
  """Two workers, a controller and a trainer client, each with a fake process and a log."""
  tasks = []
  for i, job in enumerate(('worker', 'worker', 'controller', 'trainer_client')):
    task = launch.Task(job, i % 2 if job == 'worker' else 0, [],
                       os.path.join(logdir, '%s.%d.log' % (job, i)))
    task.proc = _FakeProc(100 + i)
    tasks.append(task)
  return tasks


def _LogStep(task, step):
  with open(task.log, 'a') as f:
    f.write('I1125 runners.py] step: %6d, steps/sec: 1.0, loss:0.5\n' % step)


class SuperviseTest(test_utils.TestCase):
  """The launcher's supervision on fake processes and a fake clock: stalls, progress, failures."""

  def _Tasks(self):
    return _FakeTasks(self.create_tempdir().full_path)

  _LogStep = staticmethod(_LogStep)

  def testNoNewStepForTheStallTimeoutStopsTheJob(self):
    tasks = self._Tasks()
    self._LogStep(tasks[3], 7)
    clock = _FakeClock()
    status, message = launch.Supervise(tasks, stall_timeout_s=30, poll_s=1.0, out=io.StringIO(),
                                       clock=clock.Now, sleep=clock.Sleep)
    self.assertEqual(status, launch.EXIT_FAILED)
    self.assertRegex(message, r'^no training step for 30 s \(last: 7\); stopping every task')
    self.assertBetween(clock.now, 30, 32)

  def testStepsKeepTheJobAliveUntilItEnds(self):
    tasks = self._Tasks()

    def Progress(now):  # A new step every 20 s (under the 30 s stall timeout) up to step 10.
      if now % 20 == 0:
        self._LogStep(tasks[3], int(now // 20))
      if now >= 200:
        for t in tasks[2:]:
          t.proc.status = 0
    clock = _FakeClock(Progress)
    status, message = launch.Supervise(tasks, stall_timeout_s=30, poll_s=1.0, out=io.StringIO(),
                                       clock=clock.Now, sleep=clock.Sleep)
    self.assertEqual((status, clock.now), (0, 200))
    self.assertRegex(message, r'^training done \(last step 10\)')

  def testALongStretchWithoutStepsAfterAStepKeepsTheStep(self):
    # A step, then more than the first read's 64 KiB of other output (Lingvo's retries under load):
    # the launcher reported steps every 30 s and crashed on None here.
    tasks = self._Tasks()
    out = io.StringIO()

    def Progress(now):
      if now == 1:
        self._LogStep(tasks[3], 7)
      if now == 40:
        with open(tasks[3].log, 'a') as f:
          f.write('W1125 base_runner.py] Retrying as expected\n' * 4000)  # 172 KB
        self._LogStep(tasks[3], 8)
        with open(tasks[3].log, 'a') as f:
          f.write('W1125 base_runner.py] Retrying as expected\n' * 4000)
      if now == 80:
        for t in tasks[2:]:
          t.proc.status = 0
    clock = _FakeClock(Progress)
    status, message = launch.Supervise(tasks, stall_timeout_s=60, poll_s=1.0, out=out,
                                       clock=clock.Now, sleep=clock.Sleep)
    self.assertEqual(status, 0, message)
    self.assertRegex(message, r'^training done \(last step 8\)')
    self.assertIn('  step 8\n', out.getvalue())

  def testALogThatShrinksIsReadAgainFromItsStart(self):
    tasks = self._Tasks()
    steps = launch.StepLog(tasks[3].log)
    self.assertIsNone(steps.Read())  # No log yet.
    self._LogStep(tasks[3], 12)
    self.assertEqual(steps.Read(), 12)
    with open(tasks[3].log, 'w') as f:  # Rotated: a new, shorter log.
      f.write('I1125 runners.py] step: ')  # A line not yet ended is not read as a step.
    self.assertEqual(steps.Read(), 12)
    with open(tasks[3].log, 'a') as f:
      f.write('     3, steps/sec: 1.0\n')
    self.assertEqual(steps.Read(), 3)  # A restarted trainer client: taken as it is.

  def testAWorkerThatExitsStopsTheJob(self):
    tasks = self._Tasks()

    def Crash(now):
      if now == 5:
        tasks[1].proc.status = -9
    clock = _FakeClock(Crash)
    status, message = launch.Supervise(tasks, stall_timeout_s=30, out=io.StringIO(),
                                       clock=clock.Now, sleep=clock.Sleep)
    self.assertEqual((status, clock.now), (launch.EXIT_FAILED, 5))
    self.assertRegex(message, r'^worker task 1 \(pid 101\) exited with status -9; its log: ')

  def testAWorkerEndsWithStatus0OnlyAfterTraining(self):
    tasks = self._Tasks()

    def End(now):  # Worker 0 ends as it does when it saw the job's training done.
      if now == 5:
        tasks[0].proc.status = 0
    clock = _FakeClock(End)
    status, message = launch.Supervise(tasks, stall_timeout_s=30, out=io.StringIO(),
                                       clock=clock.Now, sleep=clock.Sleep)
    self.assertEqual((status, clock.now), (launch.EXIT_FAILED, 5))  # Too early: a fault.
    self.assertRegex(message, r'^worker task 0 \(pid 100\) exited with status 0; its log: ')
    for t in tasks[2:]:
      t.proc.status = 0
    status, message = launch.Supervise(tasks, stall_timeout_s=30, out=io.StringIO(),
                                       clock=clock.Now, sleep=clock.Sleep)
    self.assertEqual(status, 0, message)

  def testASignalEndsTheSupervision(self):
    tasks = self._Tasks()
    signals = launch.Signals()

    def Signal(now):
      if now == 7:
        signals.received.append(signal.SIGHUP)
    clock = _FakeClock(Signal)
    result = launch.Supervise(tasks, stall_timeout_s=30, out=io.StringIO(), clock=clock.Now,
                              sleep=clock.Sleep, signals=signals)
    self.assertEqual((result, clock.now), ((None, 'SIGHUP'), 7))


class StopTest(test_utils.TestCase):
  """Stop on fake processes and a fake clock: the trainer client is signalled first, the others are
  waited for up to the grace, then killed; a further signal kills at once."""

  def _Tasks(self, on_sigterm):
    tasks = _FakeTasks(self.create_tempdir().full_path)
    for t in tasks:
      t.proc.on_sigterm = on_sigterm.get(t.job)
    return tasks

  def testTasksThatEndOnSigtermAreNotKilled(self):
    order = []

    def End(proc):
      order.append(proc.pid)
      proc.status = 0
    tasks = self._Tasks({'trainer_client': End, 'controller': End, 'worker': End})
    clock = _FakeClock()
    killed = launch.Stop(tasks, grace_s=60, clock=clock.Now, sleep=clock.Sleep)
    self.assertEqual(killed, '')
    self.assertEqual(order, [103, 102, 100, 101])  # Trainer client, controller, then the workers.
    self.assertEqual(clock.now, 0)
    for t in tasks:
      self.assertEqual(t.proc.sent, [signal.SIGTERM], t.name)

  def testWhatDoesNotEndWithinTheGraceIsKilled(self):
    tasks = self._Tasks({})  # Nothing ends on SIGTERM.

    def TrainerEndsAt30(now):
      if now >= 30:
        tasks[3].proc.status = 0
    clock = _FakeClock(TrainerEndsAt30)
    killed = launch.Stop(tasks, grace_s=75, clock=clock.Now, sleep=clock.Sleep, poll_s=1.0)
    self.assertEqual(clock.now, 75)
    self.assertEqual(killed, 'controller task 0, worker task 0, worker task 1')
    self.assertEqual(tasks[3].proc.sent, [signal.SIGTERM])
    for t in tasks[:3]:
      self.assertEqual(t.proc.sent, [signal.SIGTERM, signal.SIGKILL], t.name)

  def testASecondSignalKillsAtOnce(self):
    tasks = self._Tasks({})
    signals = launch.Signals()
    signals.received.append(signal.SIGINT)  # The signal that began the stop.

    def SecondCtrlC(now):
      if now == 3:
        signals.received.append(signal.SIGINT)
    clock = _FakeClock(SecondCtrlC)
    killed = launch.Stop(tasks, grace_s=75, kill_now=lambda: len(signals.received) > 1,
                         clock=clock.Now, sleep=clock.Sleep, poll_s=1.0)
    self.assertEqual(clock.now, 3)
    self.assertEqual(killed, 'trainer_client task 0, controller task 0, worker task 0, '
                     'worker task 1')


class SignalledOutcomeTest(test_utils.TestCase):

  def testASavedStepIsNamedWithTheStepToResumeAt(self):
    self.assertEqual(
        launch.SignalledOutcome('SIGTERM', ('/l/train/ckpt-00000040', 40),
                                ('/l/train/ckpt-00000057', 57), ''),
        'stopped by SIGTERM: the trainer client saved a checkpoint of step 57: '
        '/l/train/ckpt-00000057. Run the same command again to resume at step 58.')

  def testNothingSaved(self):
    self.assertEqual(
        launch.SignalledOutcome('SIGHUP', ('/l/train/ckpt-00000040', 40),
                                ('/l/train/ckpt-00000040', 40), 'trainer_client task 0'),
        'stopped by SIGHUP: the current step was not saved (killed: trainer_client task 0). Run '
        'the same command again to resume from the last checkpoint, /l/train/ckpt-00000040, at '
        'step 41.')
    self.assertEqual(
        launch.SignalledOutcome('SIGINT', None, None, ''),
        'stopped by SIGINT: the current step was not saved. Run the same command again to resume '
        'from step 1 (no checkpoint yet).')

  def testLatestCheckpointReadsTheSaversStateFile(self):
    train_dir = self.create_tempdir().full_path
    self.assertIsNone(launch.LatestCheckpoint(train_dir))
    with open(os.path.join(train_dir, 'checkpoint'), 'w') as f:
      f.write('model_checkpoint_path: "ckpt-00000057"\n'
              'all_model_checkpoint_paths: "ckpt-00000040"\n'
              'all_model_checkpoint_paths: "ckpt-00000057"\n')
    self.assertEqual(launch.LatestCheckpoint(train_dir),
                     (os.path.join(train_dir, 'ckpt-00000057'), 57))


# A task of a fake job for the launcher (see LauncherSignalsTest): logs a step every 50 ms; on
# SIGTERM the trainer client records its current step as the latest checkpoint, as the real one
# saves it, and every task ends with status 0. argv: job, train dir, 'stubborn' (ignore SIGTERM).
_FAKE_TASK = r'''
import os, signal, sys, time
job, train_dir, mode = sys.argv[1:4]
step = 0
def OnSigterm(signum, frame):
  if mode == 'stubborn':
    return
  if job == 'trainer_client':
    os.makedirs(train_dir, exist_ok=True)
    with open(os.path.join(train_dir, 'checkpoint'), 'w') as f:
      f.write('model_checkpoint_path: "ckpt-%08d"\n' % step)
  sys.exit(0)
signal.signal(signal.SIGTERM, OnSigterm)
print('ready', flush=True)
while True:
  step += 1
  if job == 'trainer_client':
    print('step:%6d, steps/sec: 20.0' % step, flush=True)
  time.sleep(0.05)
'''

# Runs the launcher's main() with its tasks replaced by _FAKE_TASK processes.
_FAKE_LAUNCHER = r'''
import sys
from tensorpipe.trainer import launch
fake_task, mode = sys.argv[1:3]
def Tasks(args, extra):
  import os
  logs = os.path.join(args.logdir, 'launch')
  train = os.path.join(args.logdir, 'train')
  jobs = [('worker', i) for i in range(args.worker_tasks)] + [('controller', 0), ('trainer_client', 0)]
  return [launch.Task(job, i, [sys.executable, '-c', fake_task, job, train, mode],
                      os.path.join(logs, '%s.%d.log' % (job, i))) for job, i in jobs]
launch.Tasks = Tasks
launch.Run(sys.argv[:1] + sys.argv[3:])
'''


class LauncherSignalsTest(test_utils.TestCase):
  """The launcher process itself receives SIGTERM, SIGHUP or SIGINT (tasks are small stand-ins
  that behave as the trainer's tasks do on SIGTERM): every task ends, the last line names the
  saved step and the step to resume at, and the status is 128 + the signal's number."""

  def _Start(self, mode, grace_s):
    logdir = self.create_tempdir().full_path
    out = open(os.path.join(logdir, 'launcher.out'), 'w')
    self.addCleanup(out.close)
    proc = subprocess.Popen(
        [sys.executable, '-c', _FAKE_LAUNCHER, _FAKE_TASK, mode, '--model=fake',
         '--logdir=%s' % logdir, '--sigterm_grace_s=%d' % grace_s],
        cwd=_REPO, stdout=out, stderr=subprocess.STDOUT)
    pids = []

    self.addCleanup(_StopLauncher, proc, out.name, logdir, 60)
    trainer_log = os.path.join(logdir, 'launch', 'trainer_client.0.log')
    deadline = time.time() + 60  # A bound on the test's run time.
    while True:
      pids[:] = [int(p) for p in re.findall(r'^\s+\w+ task \d+\s+pid (\d+)',
                                            LauncherTest._Read(out.name), re.M)]
      if (len(pids) == 4 and os.path.exists(trainer_log) and
          'step:' in LauncherTest._Read(trainer_log)):
        return proc, out.name, pids
      self.assertIsNone(proc.poll(), LauncherTest._Read(out.name))
      self.assertLess(time.time(), deadline, 'no step logged within 60 s')
      time.sleep(0.1)

  def _AssertStopped(self, proc, path, pids, signum):
    proc.wait(timeout=60)  # A bound on the test's run time.
    out = LauncherTest._Read(path)
    self.assertEqual(proc.returncode, 128 + signum, out)
    for pid in pids:
      self.assertFalse(LauncherTest._Alive(pid), 'task pid %d still runs' % pid)
    return out.strip().splitlines()[-1]

  def testEachSignalSavesTheStepAndStopsEveryTask(self):
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
      proc, path, pids = self._Start('', grace_s=600)
      proc.send_signal(signum)
      last = self._AssertStopped(proc, path, pids, signum)
      match = re.match(r'^tensorpipe\.trainer\.launch: error: stopped by %s: the trainer client '
                       r'saved a checkpoint of step (\d+): .*ckpt-0*(\d+)\. Run the same '
                       r'command again to resume at step (\d+)\.$' % signum.name, last)
      self.assertIsNotNone(match, last)
      step, named, resume = (int(g) for g in match.groups())
      self.assertEqual((named, resume), (step, step + 1), last)

  def testASecondSignalKillsEveryTaskAtOnce(self):
    proc, path, pids = self._Start('stubborn', grace_s=600)  # Tasks that ignore SIGTERM.
    proc.send_signal(signal.SIGTERM)
    deadline = time.time() + 60
    while 'a second signal kills every task now' not in LauncherTest._Read(path):
      self.assertLess(time.time(), deadline)
      time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    # Without the second signal the launcher would wait the 600 s grace (+ margin).
    last = self._AssertStopped(proc, path, pids, signal.SIGTERM)
    self.assertRegex(last, r'^tensorpipe\.trainer\.launch: error: stopped by SIGTERM: the current '
                     r'step was not saved \(killed: trainer_client task 0, controller task 0, '
                     r'worker task 0, worker task 1\)\. Run the same command again to resume from '
                     r'step 1 \(no checkpoint yet\)\.$')


# The tensorpipe-launch console script: its entry point, called as the installed script calls it.
_CONSOLE_LAUNCH = ('import sys; from tensorpipe.trainer import console; '
                   'sys.argv[0] = "tensorpipe-launch"; sys.exit(console.Launch())')

_LAUNCHER_FLAGS = ('model', 'logdir', 'worker_tasks', 'tasks_per_replica', 'cpu_devices',
                   'stall_timeout_s', 'startup_timeout_s', 'sigterm_grace_s')


def _RunLauncher(*args, console=False):
  """(exit status, stdout, stderr) of `python -m tensorpipe.trainer.launch ARGS`, or of the
  tensorpipe-launch console script's entry point with ARGS."""
  if console:
    command = [sys.executable, '-c', _CONSOLE_LAUNCH]
  else:
    command = [sys.executable, '-m', 'tensorpipe.trainer.launch']
  proc = subprocess.run(command + list(args), capture_output=True, text=True, timeout=120,
                        cwd=_REPO, check=False, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
  return proc.returncode, proc.stdout, proc.stderr


class FlagsTest(test_utils.TestCase):
  """The launcher's absl flags: --help and --helpfull (the same from the console script), one-line
  errors for its own flags, and every other flag passed on to the tasks."""

  def testHelpListsTheLaunchersFlagsAsTheConsoleScriptDoes(self):
    code, out, err = _RunLauncher('--help')
    self.assertEqual(code, 0, err)
    self.assertTrue(out.startswith(launch.__doc__.split('\n', maxsplit=1)[0]), out)
    self.assertIn('`tensorpipe-launch FLAGS` is the same command', out)
    for name in _LAUNCHER_FLAGS:
      self.assertRegex(out, r'\n  --%s: ' % name)
    self.assertNotIn('--logtostderr', out)  # absl's own flags: only with --helpfull.
    self.assertIn('Try --helpfull to get a list of all flags.', out)
    self.assertEqual(_RunLauncher('--help', console=True), (code, out, err))

  def testHelpfullAlsoListsAbslsFlags(self):
    code, out, err = _RunLauncher('--helpfull')
    self.assertEqual(code, 0, err)
    for name in _LAUNCHER_FLAGS + ('helpfull', 'logtostderr', 'verbosity', 'only_check_args'):
      self.assertRegex(out, r'\n  (-\S,)?--(\[no\])?%s: ' % name)
    self.assertEqual(_RunLauncher('--helpfull', console=True), (code, out, err))

  def testABadOrMissingLauncherFlagIsOneLine(self):
    logdir = '--logdir=%s' % self.create_tempdir().full_path
    for args, error in [
        (['--model=m'], r'flag --logdir=None: Flag --logdir must have a value other than None\.'),
        (['--model=m', logdir, '--worker_tasks=0'],
         r'flag --worker_tasks=0: 0 is not a positive integer'),
        (['--model=m', logdir, '--sigterm_grace_s=soon'],
         r"flag --sigterm_grace_s=soon: invalid literal for int\(\) with base 10: 'soon'"),
        (['--model=m', logdir, '--worker_tasks=4', '--tasks_per_replica=3'],
         r'flags worker_tasks=4, tasks_per_replica=3: --tasks_per_replica must divide '
         r'--worker_tasks')]:
      code, out, err = _RunLauncher(*args)
      self.assertEqual((code, out), (2, ''), err)
      self.assertRegex(err, r'\Atensorpipe\.trainer\.launch: error: %s \(see --helpfull\)\n\Z' %
                       error)
    self.assertEqual(os.listdir(logdir.split('=', 1)[1]), [])  # Nothing was started.
    blocker = os.path.join(logdir.split('=', 1)[1], 'file')
    open(blocker, 'w').close()
    code, out, err = _RunLauncher('--model=m', '--logdir=%s/run' % blocker)
    self.assertEqual((code, out), (2, ''), err)
    self.assertEqual(err, "tensorpipe.trainer.launch: error: flag --logdir=%s/run: '%s/run' cannot "
                     'hold the outputs (Not a directory); give a directory you can write (see '
                     '--helpfull)\n' % (blocker, blocker))

  def testOtherFlagsAndAbslLoggingFlagsGoToEveryTask(self):
    script = ('import sys; from tensorpipe.trainer import launch; launch.DefineFlags(); '
              'print(launch.ParseFlags(sys.argv)[1:]); print(launch.Args.FromFlags())')
    proc = subprocess.run(
        [sys.executable, '-c', script, '--model=digits.X', '--logdir=rel', '--worker_tasks', '4',
         '--model_params_override=train.max_steps: 5', '--v=1', '--cpu_devices=2',
         '--noenable_asserts'], capture_output=True, text=True, timeout=120, cwd=_REPO,
        check=False)
    self.assertEqual(proc.returncode, 0, proc.stderr)
    extra, args = proc.stdout.splitlines()
    self.assertEqual(extra, str(['--model_params_override=train.max_steps: 5',
                                 '--noenable_asserts', '--verbosity=1']))
    self.assertEqual(args, str(launch.Args(
        model='digits.X', logdir=os.path.join(_REPO, 'rel'), worker_tasks=4, tasks_per_replica=4,
        cpu_devices=2, stall_timeout_s=300, startup_timeout_s=120, sigterm_grace_s=60)))


class FreePortsTest(test_utils.TestCase):

  def testDistinctPortsOutsideTheEphemeralRange(self):
    with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
      low, high = (int(v) for v in f.read().split()[:2])
    ports = launch.FreePorts(5, rng=random.Random(3))
    self.assertLen(set(ports), 5)
    self.assertTrue(all(10000 <= p < low or p > high for p in ports), ports)

  def testAnEphemeralRangeThatStartsLowLeavesThePortsAboveIt(self):
    # Some machines hand out ports from 1024 up: the launcher then picks from above the range.
    path = os.path.join(self.create_tempdir().full_path, 'ip_local_port_range')
    with open(path, 'w') as f:
      f.write('1024\t50000\n')
    self.enter_context(mock.patch.object(launch, '_EPHEMERAL_RANGE', path))
    ports = launch.FreePorts(3, rng=random.Random(5))
    self.assertTrue(all(50000 < p < 65536 for p in ports), ports)
    with open(path, 'w') as f:
      f.write('1024\t65535\n')
    with self.assertRaisesRegex(RuntimeError, r'no port from 10000 up lies outside the ephemeral '
                                r'range in .*ip_local_port_range; narrow that range'):
      launch.FreePorts(1)


if __name__ == '__main__':
  tf.test.main()
