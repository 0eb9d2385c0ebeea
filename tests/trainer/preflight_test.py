"""Checks before any job starts: the model's pipelines, its data directories, the worker tasks,
and the several-hosts flags (--cluster_spec, --job, --task, a writable logdir, a free port), also
through the real `python -m tensorpipe.trainer.train` (ClusterFlagsCommandLineTest)."""

import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import pytest
from lingvo.core import base_model
from lingvo.core import test_utils

from tensorpipe.trainer import preflight
from tensorpipe.trainer import registry
from tests import helpers

MODEL = 'digits.TinyConvPipeline'
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class PreflightTest(test_utils.TestCase):

  def testPipelineDevices(self):
    cfg = registry.ModelRegistry.GetParams(MODEL, 'Train')
    self.assertEqual(preflight.PipelineDevices(cfg), [('task.pipeline', 'pipeline', 4)])

  def testMissingDataDirIsNamed(self):
    cfg = registry.ModelParams(MODEL, 'Train')
    cfg.input.data_dir = os.path.join(self.get_temp_dir(), 'no-such-dir')
    with self.assertRaisesRegex(
        registry.UsageError, r"data directory '.*no-such-dir' of dataset Train \(input.data_dir\)"):
      preflight.CheckDataDirs(cfg, 'Train')

  def testOverrideKeys(self):
    self.assertEqual(preflight.OverrideKeys('task.train.max_steps: 750; train.max_steps:5\n'
                                            '# a comment: no key\ninput.data_dir : /x:y'),
                     ['task.train.max_steps', 'train.max_steps', 'input.data_dir'])
    self.assertEqual(preflight.OverrideKeys(''), [])

  def _Unused(self, override):
    # As Lingvo applies --model_params_override, after building the params.
    cfg = registry.ModelParams(MODEL, 'Train').FromText(override.replace(';', '\n'))
    return preflight.UnusedTaskTrainOverrides(cfg, override)

  def testTaskTrainOverrideTheTrainerDoesNotReadIsNamedWithTheFix(self):
    messages = self._Unused('task.train.max_steps: 750; task.train.save_interval_steps: 10')
    self.assertLen(messages, 2)
    self.assertIn('sets task.train.max_steps: 750, which the trainer does not read', messages[0])
    self.assertIn('train.max_steps (still 800)', messages[0])
    self.assertIn('--model_params_override="train.max_steps: 750"', messages[0])
    self.assertIn('--model_params_override="train.save_interval_steps: 10"', messages[1])

  def testOverridesTheTrainerReadsAreNotNamed(self):
    self.assertEqual(self._Unused('train.max_steps: 750'), [])
    self.assertEqual(self._Unused('train.max_steps: 750; task.train.max_steps: 750'), [])
    # The learning rate is the task's own: its learner reads task.train.
    self.assertEqual(self._Unused('task.train.learning_rate: 0.5'), [])

  def testModelLevelTrainKeysAreTheOnesLingvoCopiesFromTheTask(self):
    task = base_model.BaseTask.Params().Set(name='task')
    model = base_model.SingleTaskModel.Params(task.Copy())
    shared = [k for k, _ in model.train.IterParams() if k in task.train]
    markers = {k: object() for k in shared}
    task.train.Set(**markers)
    base_model.SingleTaskModel.CopyTaskParams(task, model)
    copied = sorted(k for k in shared if model.train.Get(k) is markers[k])
    self.assertEqual(copied, sorted(preflight.MODEL_LEVEL_TRAIN_KEYS))

  def testClusterSpec(self):
    self.assertEqual(preflight.ParseClusterSpec('worker=127.0.0.1:1,127.0.0.1:2@ps=127.0.0.1:3'),
                     {'worker': ['127.0.0.1:1', '127.0.0.1:2'], 'ps': ['127.0.0.1:3']})
    with self.assertRaisesRegex(registry.UsageError, "--cluster_spec part 'worker' is not JOB="):
      preflight.ParseClusterSpec('worker')

  def testUnreachableWorkerIsNamed(self):
    # Held bound, never listening: connections are refused and no other process can take the port.
    with socket.socket() as held:
      held.bind(('127.0.0.1', 0))
      port = held.getsockname()[1]
      clock = _FakeClock()
      with self.assertRaisesRegex(registry.UsageError,
                                  r'task worker:0 at 127.0.0.1:%d is not reachable after 5 s' % port):
        preflight.WaitForWorkers({'worker': ['127.0.0.1:%d' % port]}, timeout_s=5, poll_s=0.5,
                                 clock=clock.Now, sleep=clock.Sleep)
      self.assertGreater(clock.now, 5)  # It tried until the deadline, not once.
      self.assertLessEqual(clock.now, 5.5)

  def testAWorkerThatStartsLateIsNamedOnceWhenTheWaitBeginsAndOnceWhenItAnswers(self):
    with socket.socket() as worker:
      worker.bind(('127.0.0.1', 0))  # Bound, not listening yet: connections are refused.
      address = '127.0.0.1:%d' % worker.getsockname()[1]
      clock, lines = _FakeClock(), []

      def Sleep(seconds):
        clock.Sleep(seconds)
        if clock.now >= 2:
          worker.listen()  # The worker's server starts 2 s into the wait.

      preflight.WaitForWorkers({'worker': [address]}, timeout_s=120, poll_s=0.5, clock=clock.Now,
                               sleep=Sleep, log=lambda fmt, *args: lines.append(fmt % args))
      self.assertEqual(len(lines), 2, lines)
      self.assertRegex(lines[0], r'^TensorPipe: waiting up to 120 s \(--startup_timeout_s\) for '
                       r'task worker:0 at %s \(.+\)$' % re.escape(address))
      self.assertEqual(lines[1], 'TensorPipe: task worker:0 at %s answers after 2.0 s' % address)

  def testReachableWorkerIsFoundWithoutWaiting(self):
    with socket.socket() as listening:
      listening.bind(('127.0.0.1', 0))
      listening.listen()
      clock = _FakeClock()
      lines = []
      preflight.WaitForWorkers({'worker': ['127.0.0.1:%d' % listening.getsockname()[1]],
                                'controller': ['127.0.0.1:1']}, timeout_s=5, clock=clock.Now,
                               sleep=clock.Sleep, log=lambda *args: lines.append(args))
      self.assertEqual(clock.now, 0)  # Only worker tasks are waited for.
      self.assertEqual(lines, [])  # Nothing waited for, nothing said.


def _Spec(ports, workers=1):
  """controller, trainer_client and `workers` worker tasks at 127.0.0.1:ports[0], [1], [2:]."""
  return 'controller=127.0.0.1:%d@trainer_client=127.0.0.1:%d@worker=%s' % (
      ports[0], ports[1], ','.join('127.0.0.1:%d' % p for p in ports[2:2 + workers]))


class ClusterFlagsTest(test_utils.TestCase):
  """--cluster_spec, --job and --task: each mistake is one line naming the value and the fix."""

  def _SpecError(self, spec, pattern):
    with self.assertRaisesRegex(registry.UsageError, pattern):
      preflight.CheckClusterSpec(spec)

  def testAValidSpec(self):
    spec = 'controller=h0:7000@trainer_client=h0:7001@worker=10.0.0.3:7000,[::1]:7000'
    self.assertEqual(preflight.CheckClusterSpec(spec),
                     {'controller': ['h0:7000'], 'trainer_client': ['h0:7001'],
                      'worker': ['10.0.0.3:7000', '[::1]:7000']})
    self.assertEqual(list(preflight.CheckClusterSpec('evaler_test=h0:7000')), ['evaler_test'])

  def testAddressWithoutPort(self):
    self._SpecError('controller=h0:7000@worker=10.0.0.3',
                    r"^--cluster_spec: address '10\.0\.0\.3' of task worker:0 has no port; write "
                    r'HOST:PORT, e\.g\. 10\.0\.0\.3:7000$')
    self._SpecError('worker=10.0.0.3:', "address '10.0.0.3:' of task worker:0 has no port")

  def testPortOutOfRange(self):
    self._SpecError('worker=h1:7000,h2:70000',
                    r"^--cluster_spec: address 'h2:70000' of task worker:1: port 70000 is outside "
                    r'1-65535; pick a port in that range$')
    self._SpecError('worker=h1:0', 'port 0 is outside 1-65535')
    self._SpecError('worker=h1:7o00', r"port '7o00' is not a number; write HOST:PORT with PORT in "
                    r'1-65535')

  def testMalformedHostsAndEmptyAddresses(self):
    self._SpecError('worker=:7000', r"address ':7000' of task worker:0 has no host")
    self._SpecError('worker=h 1:7000', r"'h 1' is not a host name or IP address")
    self._SpecError('worker=::1:7000', r"'::1' is not a host name or IP address; write HOST:PORT "
                    r'\(an IPv6 address in brackets: \[::1\]:7000\)')
    self._SpecError('worker=h1:7000,', r'the address of task worker:1 is empty')

  def testDuplicateAddress(self):
    self._SpecError('controller=127.0.0.1:7000@worker=127.0.0.1:7001,127.0.0.1:07001',
                    r'^--cluster_spec gives task worker:0 and task worker:1 the same address '
                    r'127\.0\.0\.1:07001; every task needs an address of its own')
    self._SpecError('controller=H0:7000@trainer_client=h0:7000',
                    'gives task controller:0 and task trainer_client:0 the same address')

  def testJobNamedTwice(self):
    self._SpecError('worker=h1:7000@worker=h2:7000',
                    r'names job worker 2 times; list all its tasks in one part: '
                    r'worker=HOST:PORT,HOST:PORT')

  def testUnknownJob(self):
    self._SpecError('controller=h0:7000@workers=h1:7000',
                    r"^--cluster_spec has unknown job 'workers'; did you mean worker\? Lingvo's jobs "
                    r'are controller, trainer_client, worker \(sync mode\)')
    self._SpecError('evaler=h0:7000', "unknown job 'evaler'")
    self._SpecError('foo=h0:7000', r"unknown job 'foo'; Lingvo's jobs are")

  def _TaskError(self, job, task, pattern, spec='controller=h0:1@trainer_client=h0:2@worker=h1:1',
                 mode='sync'):
    with self.assertRaisesRegex(registry.UsageError, pattern):
      preflight.CheckClusterTask(preflight.CheckClusterSpec(spec), job, task, mode)

  def testJobAndTask(self):
    spec = preflight.CheckClusterSpec('controller=h0:1@trainer_client=h0:2@worker=h1:1,h2:1')
    for job, task in (('controller', 0), ('trainer_client', 0), ('worker', 1)):
      preflight.CheckClusterTask(spec, job, task, 'sync')
    self._TaskError('', 0, r'^--cluster_spec needs --job and --task: .*\(controller, '
                    r'trainer_client, worker\)$')
    self._TaskError('controller,trainer_client', 0, r'^--job=controller,trainer_client: with '
                    r'--cluster_spec a process runs one task')
    self._TaskError('trainer', 0, r'^--job=trainer is not a job of --cluster_spec \(its jobs: '
                    r'controller, trainer_client, worker\); give one of them, or add '
                    r'trainer=HOST:PORT to the spec$')
    self._TaskError('worker', 1, r'^--task=1 is out of range for job worker: --cluster_spec gives '
                    r'it 1 task, so --task=0\.\.0$')
    self._TaskError('worker', -1, r'^--task=-1 is out of range for job worker')
    self._TaskError('controller', 0, r'^--mode=sync runs the training steps on worker tasks, but '
                    r'--cluster_spec has no worker job; add worker=HOST:PORT', spec='controller=h0:1')
    self._TaskError('trainer_client', 1, r"^--task=1 of trainer_client: Lingvo's trainer client "
                    r'sends its steps to worker task --task, and --cluster_spec has 1 worker task',
                    spec='trainer_client=h0:1,h0:2@worker=h1:1')

  def testWritable(self):
    logdir = self.create_tempdir().full_path
    preflight.CheckWritable(os.path.join(logdir, 'train'), 'task worker:0')
    self.assertEqual(os.listdir(os.path.join(logdir, 'train')), [])  # The probe is gone.
    blocker = os.path.join(logdir, 'file')
    with open(blocker, 'w') as f:
      f.write('not a directory')
    with self.assertRaisesRegex(
        registry.UsageError, r'^cannot write to .*/file/train from this host \(task worker:1: '
        r'.*not a directory\): checkpoints go there, .*make --logdir writable on every host'):
      preflight.CheckWritable(os.path.join(blocker, 'train'), 'task worker:1')

  def testPortTaken(self):
    with helpers.HeldPorts(2, listen=(0,)) as (listening, bound):
      for port in (listening, bound):
        address = '127.0.0.1:%d' % port
        with self.assertRaisesRegex(
            registry.UsageError,
            r'^task trainer_client:0 cannot listen on %s \(Address already in use\): another '
            r'process, e\.g\. a task of an earlier run, holds %s; stop it or pick another port in '
            r'--cluster_spec$' % (address, address)):
          preflight.CheckPortFree(address, 'task trainer_client:0')

  def testPrivilegedPort(self):
    self.assertEqual(
        preflight.PortTakenMessage('10.0.0.2:700', 'task controller:0',
                                   OSError(errno.EACCES, 'Permission denied')),
        'task controller:0 cannot listen on 10.0.0.2:700 (Permission denied): ports below 1024 '
        'need root; pick a port from 1024 up in --cluster_spec')

  def testPortAServerCouldBind(self):
    # Bound with SO_REUSEADDR and not listening, as a port in TIME_WAIT after an earlier run's
    # task ended: TensorFlow's server binds it, so the check passes.
    with helpers.HeldPorts(1, reuse=(0,)) as (port,):
      preflight.CheckPortFree('127.0.0.1:%d' % port, 'task worker:0')


def _Trainer(*args):
  return [sys.executable, '-m', 'tensorpipe.trainer.train', '--model=%s' % MODEL,
          '--mode=sync', '--cpu_devices=4'] + list(args)


class ClusterFlagsCommandLineTest(test_utils.TestCase):
  """The real trainer: a bad several-hosts flag ends it with one line, exit status 2, before any
  TensorFlow server starts and before any wait for other tasks (--startup_timeout_s is an hour, so
  a check that came after the wait would end the test by its time-out instead)."""

  TIMEOUT_S = 300  # A bound for a hung process only: a passing run takes seconds.

  def _CheckError(self, argv, pattern):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='0')  # So a started server would log.
    proc = subprocess.Popen(argv + ['--startup_timeout_s=3600'], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
      output, _ = proc.communicate(timeout=self.TIMEOUT_S)
    finally:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # Its own session: the trainer and nothing else.
        proc.wait()
    self.assertEqual(proc.returncode, 2, output[-3000:])
    self.assertNotIn('Traceback', output)
    self.assertNotIn('Started server with target', output)
    lines = output.strip().splitlines()
    self.assertRegex(lines[-1], r'^tensorpipe\.trainer\.train: error: ' + pattern)
    self.assertLen([l for l in lines if 'error: ' in l], 1, output[-3000:])

  @pytest.mark.slow
  def testWorkerAddressWithoutPort(self):
    # Today's trainer client would wait --startup_timeout_s for "127.0.0.1" before "not reachable".
    with helpers.HeldPorts(2) as ports:
      spec = _Spec(ports, workers=0) + '127.0.0.1'
      self._CheckError(_Trainer('--cluster_spec=%s' % spec, '--job=trainer_client', '--task=0',
                                '--logdir=%s' % self.create_tempdir().full_path),
                       r"--cluster_spec: address '127\.0\.0\.1' of task worker:0 has no port; "
                       r'write HOST:PORT, e\.g\. 127\.0\.0\.1:7000$')

  @pytest.mark.slow
  def testTaskOutOfRange(self):
    with helpers.HeldPorts(4) as ports:
      self._CheckError(_Trainer('--cluster_spec=%s' % _Spec(ports, workers=2), '--job=worker',
                                '--task=2', '--logdir=%s' % self.create_tempdir().full_path),
                       r'--task=2 is out of range for job worker: --cluster_spec gives it 2 '
                       r'tasks, so --task=0\.\.1$')

  @pytest.mark.slow
  def testSecondTrainerClient(self):
    # The trainer client's port is held by a listening socket, as by the first run's trainer
    # client; the controller's and the worker's ports are bound, not listening (refused).
    with helpers.HeldPorts(3, listen=(1,)) as ports:
      self._CheckError(_Trainer('--cluster_spec=%s' % _Spec(ports), '--job=trainer_client',
                                '--task=0', '--logdir=%s' % self.create_tempdir().full_path),
                       r'task trainer_client:0 cannot listen on 127\.0\.0\.1:%d \(Address already in '
                       r'use\): another process, e\.g\. a task of an earlier run, holds '
                       r'127\.0\.0\.1:%d; stop it or pick another port in --cluster_spec$' %
                       (ports[1], ports[1]))

  @pytest.mark.slow
  def testReadOnlyLogdirOnAWorkerHost(self):
    # A read-only bind mount of the logdir in a mount namespace of the trainer's own (as root):
    # the worker's host sees it read-only, nothing else does.
    if os.geteuid() != 0 or not shutil.which('unshare'):
      self.skipTest('a read-only mount needs root and unshare(1)')
    if subprocess.run(['unshare', '-m', 'true'], capture_output=True, timeout=30,
                      check=False).returncode:
      self.skipTest('unshare -m is not permitted here')
    logdir = self.create_tempdir().full_path
    mount = ('mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"')
    with helpers.HeldPorts(3) as ports:
      self._CheckError(['unshare', '-m', 'sh', '-c', mount, logdir] +
                       _Trainer('--cluster_spec=%s' % _Spec(ports), '--job=worker', '--task=0',
                                '--logdir=%s' % logdir),
                       r'cannot write to %s/train from this host \(task worker:0: %s/train; '
                       r'Read-only file system\): checkpoints go there, and the controller, the '
                       r'trainer client and every worker write their part; make --logdir writable '
                       r'on every host' % (re.escape(logdir), re.escape(logdir)))
    self.assertEqual(os.listdir(logdir), [])  # Read-only for the trainer, as meant.


class _FakeClock:
  """Time that passes only when the code under test sleeps."""

  def __init__(self):
    self.now = 0.0

  def Now(self):
    return self.now

  def Sleep(self, seconds):
    self.now += seconds


if __name__ == '__main__':
  test_utils.main()
