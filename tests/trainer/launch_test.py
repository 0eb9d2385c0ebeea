"""tensorpipe.trainer.launch: a killed worker stops the whole job; the same command resumes."""

import glob
import io
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import launch
from tests import helpers

_REPO = helpers.REPO


class LauncherTest(test_utils.TestCase):
  """tensorpipe.trainer.launch with K = 4 partitions in 2 worker processes: a killed worker stops
  the job with a message naming it, every process is stopped, and the same command resumes from the
  checkpoint."""

  def _Launch(self, logdir, max_steps, stall_timeout_s):
    args = [sys.executable, '-m', 'tensorpipe.trainer.launch', '--model=digits.TinyConvPipeline',
            '--logdir=%s' % logdir, '--worker_tasks=2', '--cpu_devices=2',
            '--stall_timeout_s=%d' % stall_timeout_s, '--startup_timeout_s=60',
            '--model_params_override=train.max_steps: %d; train.save_interval_seconds: 2' %
            max_steps]
    # In a network namespace of its own: the ports the launcher picks cannot be taken by anyone
    # else before its tasks bind them.
    args = helpers.InPrivateNetwork(args)
    if args is None:
      self.skipTest('needs root with unshare and ip, to run the job in its own network namespace')
    out = open(os.path.join(logdir, 'launcher.%d.out' % max_steps), 'w')
    proc = subprocess.Popen(args, cwd=_REPO, stdout=out, stderr=subprocess.STDOUT,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    self.addCleanup(self._Stop, proc, out)
    return proc, out.name

  def _Stop(self, proc, out):
    """Stops the launcher (SIGINT: it then stops its tasks), and then by pid every task it
    reported that still runs."""
    if proc.poll() is None:
      proc.send_signal(signal.SIGINT)
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
    out.close()
    for pid in self._task_pids:
      if self._Alive(pid):
        os.kill(pid, signal.SIGKILL)

  def setUp(self):
    super().setUp()
    self._task_pids = []

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
        self._task_pids.extend(pids.values())
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

  @pytest.mark.slow
  def testKilledWorkerStopsTheJobAndTheSameCommandResumes(self):
    logdir = self.create_tempdir().full_path
    trainer_log = os.path.join(logdir, 'launch', 'trainer_client.log')
    proc, path = self._Launch(logdir, max_steps=100000, stall_timeout_s=90)
    pids = self._Pids(path, 4)
    self.assertEqual(sorted(pids), ['controller task 0', 'trainer_client task 0', 'worker task 0',
                                    'worker task 1'], self._Read(path))
    deadline = time.time() + 240
    while not glob.glob(os.path.join(logdir, 'train', 'ckpt-*[1-9]*.index')):
      self.assertIsNone(proc.poll(), self._Read(path)[-3000:])
      self.assertLess(time.time(), deadline, 'no checkpoint after a training step within 240 s')
      time.sleep(1)
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
    for name, pid in pids.items():
      self.assertFalse(self._Alive(pid), '%s (pid %d) still runs' % (name, pid))
    # The launcher's SIGTERM reached the trainer client, which could not save its step.
    self.assertRegex(self._Read(trainer_log),
                     r'tensorpipe\.trainer\.train: error: SIGTERM: the current step cannot be '
                     r'saved: task worker:1 at 127\.0\.0\.1:\d+ \(.*\) does not answer; training '
                     r'resumes from the last checkpoint in ')
    saved = max(int(re.search(r'ckpt-(\d+)', f).group(1))
                for f in glob.glob(os.path.join(logdir, 'train', 'ckpt-*.index')))
    self.assertGreater(saved, 0)
    # The same command (fewer steps to go) resumes from that checkpoint.
    proc, path = self._Launch(logdir, max_steps=saved + 5, stall_timeout_s=90)
    proc.wait(timeout=300)
    out = self._Read(path)
    self.assertEqual(proc.returncode, 0, out[-3000:])
    self.assertIn('training done (last step %d)' % (saved + 5), out)
    with open(trainer_log) as f:
      log = f.read().split('TensorPipe: model')[-1]
    resumed = [int(s) for s in re.findall(r'step: *(\d+),', log)]
    # Training resumed from the checkpoint, not from an earlier step. (A step logged with the
    # checkpoint's own number was seen once, on a loaded 2-core machine: Lingvo's trainer client
    # reads the step it logs separately from the step it runs, so only earlier numbers are errors.)
    self.assertGreaterEqual(min(resumed), saved, re.findall(r'.*step: *\d+.*', log)[:5])


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
  """A started process as Supervise sees it: a pid and an exit status (None while it runs)."""

  def __init__(self, pid):
    self.pid = pid
    self.status = None

  def poll(self):
    return self.status


class SuperviseTest(test_utils.TestCase):
  """The launcher's supervision on fake processes and a fake clock: stalls, progress, failures."""

  def _Tasks(self):
    logdir = self.create_tempdir().full_path
    tasks = []
    for i, job in enumerate(('worker', 'worker', 'controller', 'trainer_client')):
      task = launch.Task(job, i % 2 if job == 'worker' else 0, [],
                         os.path.join(logdir, '%s.%d.log' % (job, i)))
      task.proc = _FakeProc(100 + i)
      tasks.append(task)
    return tasks

  @staticmethod
  def _LogStep(task, step):
    with open(task.log, 'a') as f:
      f.write('I1125 runners.py] step: %6d, steps/sec: 1.0, loss:0.5\n' % step)

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


class FreePortsTest(test_utils.TestCase):

  def testDistinctPortsBelowTheEphemeralRange(self):
    with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
      ephemeral_low = int(f.read().split()[0])
    ports = launch.FreePorts(5, rng=random.Random(3))
    self.assertLen(set(ports), 5)
    self.assertTrue(all(10000 <= p < ephemeral_low for p in ports), ports)


if __name__ == '__main__':
  tf.test.main()
