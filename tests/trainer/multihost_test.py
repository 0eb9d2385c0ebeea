"""A job on several hosts: network namespaces with their own addresses (tests/hosts.py).

Each task runs the per-host command of docs/guide.md ("Scale-out", "Several hosts") in its own
host, with the hosts' real addresses in --cluster_spec. Faults are made as on real hosts: a worker
host's link taken down, a host that never starts its task, a killed controller or trainer client,
a frozen worker (SIGSTOP), SIGTERM to every task (a preemption). Each must end every task with one
line naming the lost task and its address (no hang), and the same commands must then resume from
the last checkpoint: the first step after a restart is the checkpoint's step + 1. A network blip
shorter than --lost_task_timeout_s and a worker killed and started again at once end no task, or,
where a step is left waiting on a broken connection, end the job with the step watchdog's line.
And through all of them training is the same as without them: the same loss at every step, the
same final weights."""

import glob
import os
import re
import signal
import subprocess
import sys
import time
import unittest

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import test_utils

from tests import helpers
from tests import layer_helpers
from tests import server_helpers
from tests import hosts

_MODEL = 'digits.TinyConvPipeline'
_WORKERS = ['w0', 'w1', 'w2', 'w3']
_PORT = 7000  # Each host is a namespace of its own: no other process binds its ports.
_LOST_S = 5  # --lost_task_timeout_s
_START_S = 10  # The controller's and trainer client's --startup_timeout_s when a host never starts.
_WAIT_S = 240  # Bound on every wait for a job's processes (a hang fails the test, after it).
_STEPS = 300  # train.max_steps of every run.
_BLIP_S = 15  # A network outage that fails a step (TensorFlow's RPC gives up) ...
# ... and the --lost_task_timeout_s of the run it strikes, longer by what a round of connection
# attempts may add (up to 3 s after the link is back) and by the start-up of a restarted worker.
_BLIP_LOST_S = 30
# --step_timeout_s: a step that a fault left waiting (an RPC on a connection the outage broke, which
# TensorFlow does not bound) ends the job with the step watchdog's line, and the same commands
# resume; a step takes about 50 ms.
_STEP_TIMEOUT_S = 60
_STUCK = re.compile(r'^(training step \d+|the first step of this run, step \d+,) did not finish within '
                    r'(3 x )?--step_timeout_s=%d ' % _STEP_TIMEOUT_S)
_ERROR = re.compile(r'^tensorpipe\.trainer\.train: error: (.*)$', re.M)
_STEP = re.compile(r'\] step: *(\d+),')
# The held-out accuracy of the final checkpoint, with or without faults: 0.96657383 (347 / 359)
# here; other CPUs round differently.
_MIN_ACCURACY = 0.95


# A TF server at address argv[1]. It boots as job 'boot', so that a session can name it a task of
# job 'worker' through the cluster it carries (TensorFlow's cluster-spec propagation).
_SERVER = """
import sys
import tensorflow as tf
import lingvo.core.ops  # Lingvo's custom ops, which graphs built with Lingvo may use.
tf.distribute.Server(tf.train.ClusterSpec({'boot': [sys.argv[1]]}), job_name='boot', task_index=0,
                     config=tf.compat.v1.ConfigProto(device_count={'CPU': 1})).join()
"""
# Exits 0 once every task at argv[1] (comma-separated HOST:PORT) accepts connections; bounded by
# argv[2] seconds.
_LISTENING = """
import sys
from tensorpipe.trainer import preflight
preflight.WaitForWorkers({'worker': sys.argv[1].split(',')}, int(sys.argv[2]))
"""
# Once the servers at argv[1] accept connections, the gradients of
# server_helpers.ScaleOutPipeline with partition k on server k, saved to argv[2] (.npz).
_CLIENT = """
import sys
import numpy as np
from tensorpipe.trainer import preflight
from tests import server_helpers
addresses = sys.argv[1].split(',')
preflight.WaitForWorkers({'worker': addresses}, 120)
np.savez(sys.argv[2], **server_helpers.RemotePipelineGradients(addresses)[0])
"""


def _Read(path):
  with open(path, encoding='utf-8', errors='replace') as f:
    return f.read()


def _Checkpoints(logdir):
  return sorted(int(re.search(r'ckpt-(\d+)\.index$', f).group(1))
                for f in glob.glob(os.path.join(logdir, 'train', 'ckpt-*.index')))


def _LatestStep(logdir):
  """The step of the checkpoint that the checkpoint state file names, or -1. A save writes that
  file last (atomically), so a step named there is a save that has ended."""
  path = tf.train.latest_checkpoint(os.path.join(logdir, 'train'))
  return -1 if path is None else int(re.search(r'ckpt-(\d+)$', path).group(1))


def _CheckpointStep(logdir):
  """The global step inside the latest checkpoint (what a restart restores)."""
  path = tf.train.latest_checkpoint(os.path.join(logdir, 'train'))
  return int(tf.train.load_checkpoint(path).get_tensor('global_step'))


@pytest.mark.slow
# A hang guard above pytest.ini's: seven cold starts of six processes and about 650 steps (with the
# steps trained again after restores) take about 4.5 minutes beside another job, and several times
# that on a loaded machine.
@pytest.mark.timeout(1800)
class MultiHostTrainingTest(test_utils.TestCase):
  """S = 2 replicas x K = 2 partitions of the digits model on 4 worker hosts, the controller and
  the trainer client on a fifth; faults (a cut link, a killed controller, a killed trainer client, a
  frozen worker, a preemption) one after another, each followed by a restart of the same
  commands; then a blip and a worker killed and started again, which the job rides out; then
  training to the end: the losses and weights of a run without faults, and the held-out
  accuracy."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    ok, why = hosts.Available()
    if not ok:
      raise unittest.SkipTest(why)
    cls.hosts = hosts.Hosts(['h0'] + _WORKERS)

  @classmethod
  def tearDownClass(cls):
    cls.hosts.Close()
    super().tearDownClass()

  def _Spec(self):
    h = self.hosts
    return 'controller=%s:%d@trainer_client=%s:%d@worker=%s' % (
        h.Address('h0'), _PORT, h.Address('h0'), _PORT + 1,
        ','.join('%s:%d' % (h.Address(w), _PORT) for w in _WORKERS))

  def _Command(self, logdir, job, task, startup_timeout_s=_WAIT_S, lost_s=_LOST_S):
    """The guide's per-host command (2 worker tasks of 1 device per replica: K = 2), _STEPS steps."""
    return [sys.executable, '-m', 'tensorpipe.trainer.train', '--model=%s' % _MODEL,
            '--logdir=%s' % logdir, '--mode=sync', '--cluster_spec=%s' % self._Spec(),
            '--cpu_devices=1', '--worker_split_size=2', '--worker_tasks_per_replica=2',
            '--job=%s' % job, '--task=%d' % task, '--startup_timeout_s=%d' % startup_timeout_s,
            '--lost_task_timeout_s=%d' % lost_s, '--step_timeout_s=%d' % _STEP_TIMEOUT_S,
            '--model_params_override=task.pipeline.num_devices: 2; '
            'train.save_interval_steps: 20; train.max_steps: %d' % _STEPS,
            '--tensorpipe_profile_every_n_steps=0']

  def _Start(self, logdir, run, skip=(), client_startup_timeout_s=_WAIT_S, lost_s=_LOST_S,
             only=None, log_tag=''):
    """Starts every task (workers first; with `only` = (job, task), that task alone) in its host;
    {task: (Popen, log path)}. The controller and trainer client get --startup_timeout_s=
    `client_startup_timeout_s`, the workers _WAIT_S (a start-up bound only a failing run reaches,
    whatever the machine's load); every task --lost_task_timeout_s=`lost_s`."""
    env = dict(os.environ, PYTHONPATH=helpers.REPO, TF_CPP_MIN_LOG_LEVEL='2',
               PYTHONUNBUFFERED='1')
    tasks = [('worker', i, w) for i, w in enumerate(_WORKERS)]
    tasks += [('controller', 0, 'h0'), ('trainer_client', 0, 'h0')]
    job = {}
    for name, index, host in tasks:
      if host in skip or only not in (None, (name, index)):
        continue
      log = os.path.join(logdir, 'run%d.%s.%d%s.log' % (run, name, index, log_tag))
      timeout_s = _WAIT_S if name == 'worker' else client_startup_timeout_s
      proc = self.hosts.Run(host, self._Command(logdir, name, index, timeout_s, lost_s), log,
                            env=env)
      self.addCleanup(self.hosts.Stop, proc, signal.SIGKILL)
      job['%s:%d' % (name, index)] = (proc, log)
    return job

  @staticmethod
  def _WaitAll(job):
    """Waits (bounded) until every task ended; {task: (status, its one error line or None)}."""
    deadline = time.monotonic() + _WAIT_S
    out = {}
    for name, (proc, log) in job.items():
      try:
        status = proc.wait(timeout=max(1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        status = 'still running after %d s' % _WAIT_S
      errors = _ERROR.findall(_Read(log))
      assert len(errors) <= 1, (name, errors)
      out[name] = (status, errors[0] if errors else None)
    return out

  def _WaitForCheckpointAfter(self, logdir, step, job):
    """Waits (bounded) until a save after `step` has ended; its step."""
    deadline = time.monotonic() + _WAIT_S
    while _LatestStep(logdir) <= step:
      for name, (proc, log) in job.items():
        self.assertIsNone(proc.poll(), '%s ended: %s' % (name, _Read(log)[-3000:]))
      self.assertLess(time.monotonic(), deadline, 'no checkpoint after step %d' % step)
      time.sleep(1)
    return _CheckpointStep(logdir)

  def _AssertResumedFrom(self, job, step):
    """The trainer client's first step is `step` + 1: nothing lost, nothing repeated."""
    deadline = time.monotonic() + _WAIT_S
    _, log = job['trainer_client:0']
    while not _STEP.search(_Read(log)):
      self.assertLess(time.monotonic(), deadline, _Read(log)[-3000:])
      time.sleep(1)
    self.assertEqual(int(_STEP.search(_Read(log)).group(1)), step + 1)

  def _AssertLost(self, ended, lost, address):
    for name, (status, error) in ended.items():
      if name == lost:
        continue
      self.assertEqual(status, 2, (name, error))
      self.assertRegex(
          error, r'^task %s at %s stopped answering: no answer for %d s \(.*\); this %s task '
          r'ends too\. Start every task of the job again with the same commands: training resumes '
          r'from the last checkpoint in .*/train$' % (lost, re.escape(address), _LOST_S,
                                                     name.split(':')[0]))

  def testPartitionsOnTwoHostsGiveTheOneProcessGradients(self):
    tmp = self.create_tempdir().full_path
    workers = _WORKERS[:2]
    addresses = ['%s:%d' % (self.hosts.Address(w), _PORT) for w in workers]
    env = dict(os.environ, PYTHONPATH=helpers.REPO, TF_CPP_MIN_LOG_LEVEL='2')
    for w, address in zip(workers, addresses):
      proc = self.hosts.Run(w, [sys.executable, '-c', _SERVER, address],
                            os.path.join(tmp, '%s.log' % w), env=env)
      self.addCleanup(self.hosts.Stop, proc, signal.SIGKILL)
    out = os.path.join(tmp, 'remote.npz')
    client = self.hosts.Run('h0', [sys.executable, '-c', _CLIENT, ','.join(addresses), out],
                            os.path.join(tmp, 'client.log'), env=env)
    self.addCleanup(self.hosts.Stop, client, signal.SIGKILL)
    self.assertEqual(client.wait(timeout=_WAIT_S), 0, _Read(os.path.join(tmp, 'client.log')))
    with np.load(out) as remote:
      remote = dict(remote)
    reference, _ = layer_helpers.Gradients(
        server_helpers.ScaleOutPipeline(2), lambda: [tf.constant(server_helpers.ScaleOutInput())],
        num_devices=2, loss_fn=lambda out: tf.reduce_mean(tf.square(out)), seed=1234)
    self.assertLess(layer_helpers.MaxRelativeError(remote, reference), 1e-6)

  def _WaitUntilListening(self, logdir, workers):
    """Waits (bounded) until the tasks of `workers` accept connections, as seen from host h0."""
    addresses = ','.join('%s:%d' % (self.hosts.Address(w), _PORT) for w in workers)
    log = os.path.join(logdir, 'listening.log')
    probe = self.hosts.Run('h0', [sys.executable, '-c', _LISTENING, addresses, str(_WAIT_S)], log,
                           env=dict(os.environ, PYTHONPATH=helpers.REPO))
    self.addCleanup(self.hosts.Stop, probe, signal.SIGKILL)
    self.assertEqual(probe.wait(timeout=_WAIT_S + 30), 0, _Read(log))

  def testAWorkerHostThatNeverStarts(self):
    logdir = self.create_tempdir().full_path
    # The three started workers listen before the controller and the trainer client start their
    # _START_S wait, so that worker:3 is the one they name whatever the machine's load.
    job = self._Start(logdir, 0, skip=('w3', 'h0'))
    self._WaitUntilListening(logdir, _WORKERS[:3])
    job.update(self._Start(logdir, 0, skip=tuple(_WORKERS), client_startup_timeout_s=_START_S))
    clients = {k: v for k, v in job.items() if not k.startswith('worker')}
    ended = self._WaitAll(clients)
    w3 = '%s:%d' % (self.hosts.Address('w3'), _PORT)
    for name in clients:
      self.assertEqual(ended[name][0], 2, ended)
      self.assertRegex(ended[name][1], r'^task worker:3 at %s is not reachable after %d s \(.*\); '
                       r'start it, or fix its address in --cluster_spec$' % (re.escape(w3),
                                                                            _START_S))
    # The workers would end by themselves after their own --startup_timeout_s (liveness_test);
    # SIGTERM ends them at once, since the trainer client is gone.
    for name, (proc, _) in job.items():
      if name.startswith('worker'):
        proc.send_signal(signal.SIGTERM)
    workers = self._WaitAll({k: v for k, v in job.items() if k.startswith('worker')})
    self.assertEqual(workers, {'worker:%d' % i: (0, None) for i in range(3)})
    self.assertEqual(_Checkpoints(logdir), [])

  def _RideOut(self, logdir, job, run, step):
    """After a fault the job should ride out: waits (bounded) until a save after `step` has ended,
    or with `step` None until the job ended with status 0. A step the fault left waiting ends
    every task with the step watchdog's line instead; then the same commands (run `run`, then
    `run` + 1, ...) resume from the last checkpoint. Returns (the saved step or None, the running
    job, the next run's number)."""
    deadline = time.monotonic() + 3 * _WAIT_S
    while True:
      self.assertLess(time.monotonic(), deadline, 'no progress after the fault')
      if step is not None and _LatestStep(logdir) > step:
        return _CheckpointStep(logdir), job, run
      if any(proc.poll() is not None for proc, _ in job.values()):
        ended = self._WaitAll(job)
        if step is None and ended == {k: (0, None) for k in ended}:
          return None, job, run
        for name, (status, error) in ended.items():
          self.assertEqual(status, 2, (name, ended))
          self.assertRegex(error, _STUCK, (name, ended))
        job = self._Start(logdir, run, lost_s=_BLIP_LOST_S)
        run += 1
      time.sleep(1)

  def _Losses(self, logdir):
    """{step: [loss, ...]} of every trainer client log in `logdir`, runs in order."""
    out = {}
    for path in sorted(glob.glob(os.path.join(logdir, 'run*.trainer_client.0.log'))):
      for step, losses in helpers.StepLosses(_Read(path)).items():
        out.setdefault(step, []).extend(losses)
    return out

  def testFaultsAndRestartsEndWithTheLossesOfARunWithoutThem(self):
    # A run of the same commands without faults: its loss at every step.
    reference_dir = self.create_tempdir().full_path
    job = self._Start(reference_dir, 0)
    ended = self._WaitAll(job)
    self.assertEqual(ended, {k: (0, None) for k in ended})
    reference = self._Losses(reference_dir)
    self.assertEqual(sorted(reference), list(range(1, _STEPS + 1)))
    self.assertEqual({len(v) for v in reference.values()}, {1})

    logdir = self.create_tempdir().full_path
    h0 = self.hosts.Address('h0')
    # 1. The link of worker host w1 is cut mid-training.
    job = self._Start(logdir, 1)
    saved = self._WaitForCheckpointAfter(logdir, 0, job)
    self.hosts.Cut('w1')
    try:
      ended = self._WaitAll(job)
    finally:
      self.hosts.Restore('w1')
    self._AssertLost({k: v for k, v in ended.items() if k != 'worker:1'}, 'worker:1',
                     '%s:%d' % (self.hosts.Address('w1'), _PORT))
    # It lost every other task at once; it names one of them (which one depends on where in a round
    # of connection attempts the cut struck).
    self.assertEqual(ended['worker:1'][0], 2, ended)
    self.assertRegex(ended['worker:1'][1],
                     r'^task (controller|trainer_client|worker):\d at %s\d+:\d+ stopped answering: '
                     r'.*this worker task ends too\.' % re.escape(hosts.SUBNET))
    saved = _CheckpointStep(logdir)
    # 2. The same commands resume from the checkpoint; then the controller is killed.
    job = self._Start(logdir, 2)
    self._AssertResumedFrom(job, saved)
    saved = self._WaitForCheckpointAfter(logdir, saved, job)
    job['controller:0'][0].kill()
    self._AssertLost(self._WaitAll(job), 'controller:0', '%s:%d' % (h0, _PORT))
    saved = _CheckpointStep(logdir)
    # 3. Again; then the trainer client is killed.
    job = self._Start(logdir, 3)
    self._AssertResumedFrom(job, saved)
    saved = self._WaitForCheckpointAfter(logdir, saved, job)
    job['trainer_client:0'][0].kill()
    self._AssertLost(self._WaitAll(job), 'trainer_client:0', '%s:%d' % (h0, _PORT + 1))
    saved = _CheckpointStep(logdir)
    # 4. Again; then worker 2 is frozen (SIGSTOP; a deadlock or a swap storm looks the same): its
    # kernel still accepts connections, but it gives no gRPC answer, and every other task ends
    # naming it.
    job = self._Start(logdir, 4)
    self._AssertResumedFrom(job, saved)
    saved = self._WaitForCheckpointAfter(logdir, saved, job)
    frozen, _ = job.pop('worker:2')
    frozen.send_signal(signal.SIGSTOP)
    try:
      self._AssertLost(self._WaitAll(job), 'worker:2', '%s:%d' % (self.hosts.Address('w2'), _PORT))
    finally:
      frozen.kill()  # SIGKILL ends a stopped process too.
      frozen.wait(timeout=60)
    saved = _CheckpointStep(logdir)
    # 5. Again; then SIGTERM to every task (a preemption): the trainer client saves its step.
    job = self._Start(logdir, 5)
    self._AssertResumedFrom(job, saved)
    saved = self._WaitForCheckpointAfter(logdir, saved, job)
    for proc, _ in job.values():
      proc.send_signal(signal.SIGTERM)
    ended = self._WaitAll(job)
    self.assertEqual({k: v[0] for k, v in ended.items()}, {k: 0 for k in ended}, ended)
    trainer_log = _Read(job['trainer_client:0'][1])
    last_step = int(_STEP.findall(trainer_log)[-1])
    self.assertIn('TensorPipe: SIGTERM: saved a checkpoint of step %d; training ends here' %
                  last_step, trainer_log)
    self.assertEqual(_CheckpointStep(logdir), last_step)
    # 6. Again, with --lost_task_timeout_s=_BLIP_LOST_S: a network blip of _BLIP_S seconds at
    # worker host w1, shorter than that, ends no task (Lingvo retries the step it failed); then
    # worker 1 is killed and at once started again; then training goes on to the end. Where a step
    # is left waiting on a connection the fault broke, the step watchdog ends the job and the same
    # commands resume (_RideOut).
    job = self._Start(logdir, 6, lost_s=_BLIP_LOST_S)
    self._AssertResumedFrom(job, last_step)
    saved = self._WaitForCheckpointAfter(logdir, last_step, job)
    self.hosts.Cut('w1')
    try:
      time.sleep(_BLIP_S)  # The fault's length, not a wait for an outcome.
    finally:
      self.hosts.Restore('w1')
    run = 7
    saved, job, run = self._RideOut(logdir, job, run, saved)
    proc, _ = job.pop('worker:1')
    proc.kill()
    proc.wait(timeout=60)
    job.update(self._Start(logdir, run - 1, only=('worker', 1), lost_s=_BLIP_LOST_S,
                           log_tag='again'))
    self._RideOut(logdir, job, run, None)
    self.assertEqual(_CheckpointStep(logdir), _STEPS)

    # Every step's loss, each time it was trained (the steps after a restored checkpoint are trained
    # again), equals the run without faults': the same batches, the same weights.
    losses = self._Losses(logdir)
    self.assertEqual(sorted(losses), list(range(1, _STEPS + 1)))
    for step, values in sorted(losses.items()):
      np.testing.assert_allclose(values, reference[step] * len(values), rtol=1e-6,
                                 err_msg='step %d' % step)
    # Every checkpoint holds the step it is named after, through all the faults above.
    for step in _Checkpoints(logdir):
      prefix = os.path.join(logdir, 'train', 'ckpt-%08d' % step)
      self.assertEqual(tf.train.load_checkpoint(prefix).get_tensor('global_step'), step, prefix)
    # The final weights are the run without faults' (so is then any evaluation of them).
    final = tf.train.load_checkpoint(os.path.join(logdir, 'train', 'ckpt-%08d' % _STEPS))
    expected = tf.train.load_checkpoint(os.path.join(reference_dir, 'train',
                                                     'ckpt-%08d' % _STEPS))
    names = sorted(final.get_variable_to_shape_map())
    self.assertEqual(names, sorted(expected.get_variable_to_shape_map()))
    for name in names:
      np.testing.assert_allclose(final.get_tensor(name), expected.get_tensor(name), rtol=1e-5,
                                 atol=1e-7, err_msg=name)
    evaler = subprocess.run(
        [sys.executable, '-m', 'tensorpipe.trainer.train', '--model=%s' % _MODEL,
         '--logdir=%s' % logdir, '--mode=sync', '--run_locally=cpu', '--cpu_devices=2',
         '--job=evaler_once_test@%d' % _STEPS,
         '--model_params_override=task.pipeline.num_devices: 2'],
        cwd=helpers.REPO, capture_output=True, text=True, timeout=_WAIT_S, check=False)
    self.assertEqual(evaler.returncode, 0, evaler.stderr[-3000:])
    with open(os.path.join(logdir, 'eval_test', 'score-%08d.txt' % _STEPS)) as f:
      accuracy = float(re.search(r'^accuracy: *([\d.]+)', f.read(), re.M).group(1))
    self.assertGreaterEqual(accuracy, _MIN_ACCURACY)


if __name__ == '__main__':
  tf.test.main()
