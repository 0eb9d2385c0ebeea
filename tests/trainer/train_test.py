"""The trainer's command line (tensorpipe.trainer.train): one-line errors, what main does at start,
and the real trainer path.

TrainerSmokeTest runs `python -m tensorpipe.trainer.train` (Lingvo's trainer, sync mode: controller
+ trainer_client) on digits.TinyConvPipeline cut into K = 2 partitions on --cpu_devices=2: it kills
the trainer once a checkpoint is written, starts it again (training resumes from that checkpoint),
then evaluates the final checkpoint with --job=evaler_once_test@STEP. About half a minute on 2
cores: the runners start as soon as the model is ready (tensorpipe.trainer.startup).
"""

import collections
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from unittest import mock

from absl.testing import flagsaver
import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import cluster_task
from tensorpipe.trainer import ending
from tensorpipe.trainer import model_listing
from tensorpipe.trainer import registry
from tensorpipe.trainer import run_summary
from tensorpipe.trainer import runners
from tensorpipe.trainer import train
from tensorpipe.trainer import validation
from tests import helpers
from tests import layer_helpers  # pylint: disable=unused-import
from tests import server_helpers
from tests import task_helpers  # pylint: disable=unused-import
from tests import trace_helpers
from tests import trainer_helpers
# The user modules below import these in the trainer's processes (declared here for their Bazel
# target's runfiles).

REPO = helpers.REPO
MODEL = 'digits.TinyConvPipeline'


# A user's params module (not in TensorPipe's params package) registering one model.
_USER_MODULE = """
from lingvo import model_registry
from lingvo.core import base_model_params

from tests.task_helpers import ConstantInput, TimeMajorTask


@model_registry.RegisterSingleTaskModel
class UserTimeMajor(base_model_params.SingleTaskModelParams):
  \"\"\"A user's model.\"\"\"

  def Train(self):
    return ConstantInput.Params()

  def Task(self):
    return TimeMajorTask(batch_dim=1)
"""


def _Launcher(*args):
  return [sys.executable, '-m', 'tensorpipe.trainer.train'] + list(args)


def _Run(args, timeout):
  """Runs the launcher; returns (exit status, stdout, stderr)."""
  proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                        check=False)
  return proc.returncode, proc.stdout, proc.stderr


def _StepLosses(log):
  """{step: loss} of the trainer's log (the last time each step was logged)."""
  return {step: losses[-1] for step, losses in helpers.StepLosses(log).items()}


def _LatestStep(train_dir):
  """Step of the checkpoint the `checkpoint` state file names (what a restart restores), or -1."""
  path = tf.train.latest_checkpoint(train_dir) if os.path.isdir(train_dir) else None
  return int(re.search(r'ckpt-(\d+)$', path).group(1)) if path else -1


def _Checkpoints(train_dir):
  steps = []
  if os.path.isdir(train_dir):
    for name in os.listdir(train_dir):
      m = re.match(r'ckpt-(\d+)\.index$', name)
      if m:
        steps.append(int(m.group(1)))
  return sorted(steps)


class CommandLineErrorsTest(test_utils.TestCase):
  """The command line: one-line messages and exit status 2, no traceback."""

  def _CheckError(self, args, pattern):
    """The error is the last line of everything the trainer prints (stdout and stderr, in order)."""
    proc = subprocess.run(_Launcher(*args), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120, check=False)
    output = proc.stdout
    self.assertEqual(proc.returncode, ending.ERROR_EXIT_CODE, output[-2000:])
    self.assertNotIn('Traceback', output)
    lines = output.strip().splitlines()
    self.assertRegex(lines[-1], r'^tensorpipe\.trainer\.train: error: ' + pattern)
    self.assertLen([l for l in lines if 'error: ' in l], 1, output[-2000:])

  def testUnknownModel(self):
    self._CheckError(['--model=digits.NoSuchModel', '--cpu_devices=4', '--mode=sync',
                      '--run_locally=cpu', '--logdir=%s' % self.get_temp_dir()],
                     r'unknown --model=digits\.NoSuchModel; registered models: .*' + MODEL)

  @pytest.mark.slow
  def testUnknownFlag(self):
    self._CheckError(['--model=%s' % MODEL, '--cpu_devices=4', '--mode=sync', '--run_locally=cpu',
                      '--logdir=%s' % self.get_temp_dir(), '--no_such_flag=1'],
                     r"Unknown command line flag 'no_such_flag' \(see --helpfull\)$")

  def testTooFewCpuDevices(self):
    self._CheckError(['--model=%s' % MODEL, '--cpu_devices=2', '--mode=sync', '--run_locally=cpu',
                      '--logdir=%s' % self.get_temp_dir()],
                     r'model digits\.TinyConvPipeline needs 4 devices per model split .* run with '
                     r'--cpu_devices=4$')

  @pytest.mark.slow
  def testUnreachableWorker(self):
    # Ports held bound but not listening for the whole test: connections to them are refused, and
    # no other process can take them meanwhile. The trainer client's own is held with SO_REUSEADDR,
    # so its server could bind it too (the check that its port is free passes).
    with helpers.HeldPorts(3, reuse=(1,)) as (controller, client, port):
      spec = ('controller=127.0.0.1:%d@trainer_client=127.0.0.1:%d@worker=127.0.0.1:%d' %
              (controller, client, port))
      self._CheckError(['--model=%s' % MODEL, '--cpu_devices=4', '--mode=sync',
                        '--job=trainer_client', '--task=0', '--cluster_spec=%s' % spec,
                        '--startup_timeout_s=2', '--logdir=%s' % self.get_temp_dir()],
                       r'task worker:0 at 127\.0\.0\.1:%d is not reachable after 2 s .*start it, '
                       r'or fix its address in --cluster_spec$' % port)

  def testWorkerTasksPerReplicaMustDivideTheTasks(self):
    self._CheckError(['--model=%s' % MODEL, '--cpu_devices=2', '--mode=sync', '--job=worker',
                      '--task=0', '--worker_tasks_per_replica=2',
                      '--cluster_spec=worker=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3',
                      '--logdir=%s' % self.get_temp_dir()],
                     r'--worker_tasks_per_replica=2 must divide the 3 worker tasks of '
                     r'--cluster_spec$')

  def testSplitSpansTheWorkerTasksOfAReplica(self):
    # --worker_split_size defaults to --cpu_devices x --worker_tasks_per_replica: 1 x 2 < K = 4.
    # The check fails before any connection: ports nobody listens on (held for the test).
    with helpers.HeldPorts(3) as ports:
      self._CheckSplitError('controller=127.0.0.1:%d@worker=127.0.0.1:%d,127.0.0.1:%d' %
                            tuple(ports))

  def _CheckSplitError(self, spec):
    self._CheckError(['--model=%s' % MODEL, '--cpu_devices=1', '--mode=sync', '--job=controller',
                      '--task=0', '--worker_tasks_per_replica=2', '--cluster_spec=%s' % spec,
                      '--startup_timeout_s=2', '--logdir=%s' % self.get_temp_dir()],
                     r'model digits\.TinyConvPipeline needs 4 devices per model split .* but '
                     r'--cpu_devices=1 with --worker_split_size=2 gives 2; run with '
                     r'--cpu_devices=2 --worker_split_size=4 '
                     r'\(with --worker_tasks_per_replica=2\)$')

  @pytest.mark.slow  # Builds every registered model's params for its K.
  def testListModels(self):
    # A user's module on PYTHONPATH, named by --params_module: its model is listed beside ours.
    directory = self.create_tempdir().full_path
    with open(os.path.join(directory, 'tp_list_models_user.py'), 'w') as f:
      f.write(_USER_MODULE)
    path = os.pathsep.join([directory, REPO, os.environ.get('PYTHONPATH', '')])
    with mock.patch.dict(os.environ, {'PYTHONPATH': path}):
      status, stdout, stderr = _Run(_Launcher('--list_models',
                                              '--params_module=tp_list_models_user'), timeout=120)
    self.assertEqual(status, 0, stderr[-2000:])
    lines = stdout.splitlines()
    self.assertEqual(lines[0], model_listing.LIST_LEGEND)
    self.assertIn('%s  [tiny, K=4]  Tiny conv net on the digits' % MODEL, stdout)
    self.assertIn('tp_list_models_user.UserTimeMajor  [paper-scale, K=2]  A user\'s model.', lines)
    self.assertEqual(len(lines) - 2, len(registry.RegisteredModels()))


class ClusterStartTest(test_utils.TestCase):
  """What the trainer does at start besides the checks: stale checkpoint files, a taken port."""

  def _Main(self, logdir, job):
    """Runs train.main for `job` (in this process, run_locally) with the runners stubbed out."""
    with flagsaver.flagsaver(model=MODEL, mode='sync', run_locally='cpu', logdir=logdir,
                             worker_split_size=4, job=job), \
         mock.patch.object(runners.RunnerManager, 'Start') as start:
      self.assertEqual(train.main(['train']), 0)
    start.assert_called_once()

  def testTheTrainerClientRemovesKilledSavesBeforeItStarts(self):
    logdir = self.create_tempdir().full_path
    train_dir = os.path.join(logdir, 'train')
    trainer_helpers.WriteStepCheckpoint(train_dir, 5)
    os.makedirs(os.path.join(train_dir, 'ckpt-00000009_temp'))
    self._Main(logdir, 'controller')  # In sync mode not the job that saves: it removes nothing.
    self.assertTrue(os.path.isdir(os.path.join(train_dir, 'ckpt-00000009_temp')))
    self._Main(logdir, 'trainer_client')
    self.assertFalse(os.path.exists(os.path.join(train_dir, 'ckpt-00000009_temp')))
    self.assertTrue(os.path.exists(os.path.join(train_dir, 'ckpt-00000005.index')))

# layer that mixes time steps and Lingvo's BatchNormLayer in every partition, with batch_dim left at
# 0 (it should be 1).
WRONG_BATCH_DIM_MODULE = """
from lingvo import model_registry
from lingvo.core import base_model_params
from lingvo.core import bn_layers

from tensorpipe import layer as layer_lib
from tests import layer_helpers
from tests import task_helpers


@model_registry.RegisterSingleTaskModel
class WrongBatchDim(base_model_params.SingleTaskModelParams):
  \"\"\"FC + time mixing + batch norm on time-major inputs, batch_dim left at 0.\"\"\"

  def Train(self):
    return task_helpers.ConstantInput.Params()

  def Task(self):
    dim = task_helpers.TIME_MAJOR_SHAPE[2]
    dense = layer_helpers.DenseLayers(2, dim)
    bn = [bn_layers.BatchNormLayer.Params().Set(name='bn%d' % i, dim=dim) for i in range(2)]
    partitions = [[dense[0], task_helpers.TimeMix.Params().Set(name='mix'), bn[0]],
                  [dense[1], bn[1]]]
    p = task_helpers.PipelineTask.Params().Set(pipeline=layer_lib.TensorPipeLayer.Params().Set(
        name='pipe', partitions=partitions, num_micro_batches=2))
    p.train.max_steps = 1000
    return p
"""


# Runs a --cluster_spec job of three processes on fixed loopback ports (run in a network namespace
# of its own, where no other process can hold them), each with the flags after LOGDIR; each task's
# output goes to LOGDIR/JOB.log. Every task is stopped by pid after 180 s at most; prints
# {job: status}.
_CLUSTER_DRIVER = """
import json, os, subprocess, sys, time
logdir, flags = sys.argv[1], sys.argv[2:]
spec = 'controller=127.0.0.1:7000@trainer_client=127.0.0.1:7001@worker=127.0.0.1:7002'
procs = {}
for job in ('worker', 'controller', 'trainer_client'):
  with open(os.path.join(logdir, job + '.log'), 'w') as log:
    procs[job] = subprocess.Popen(
        [sys.executable, '-m', 'tensorpipe.trainer.train', '--mode=sync', '--logdir=' + logdir,
         '--cluster_spec=' + spec, '--job=' + job, '--task=0'] + flags,
        stdout=log, stderr=subprocess.STDOUT)
deadline = time.time() + 180
status = {}
for job, proc in procs.items():
  try:
    status[job] = proc.wait(timeout=max(1.0, deadline - time.time()))
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
    status[job] = None
print(json.dumps(status))
"""


def _WriteModule(test, name, text):
  """Writes a user's module `name` holding `text` into a new directory; returns the directory and
  the environment in which the trainer imports it."""
  directory = test.create_tempdir().full_path
  with open(os.path.join(directory, name + '.py'), 'w') as f:
    f.write(text)
  return directory, dict(os.environ, PYTHONPATH=os.pathsep.join([directory, REPO]),
                         TF_CPP_MIN_LOG_LEVEL='2')


def _RunClusterJob(test, directory, env, *flags):
  """Runs the three tasks of _CLUSTER_DRIVER with `flags` and LOGDIR = `directory`/logdir in a
  network namespace of their own; returns {job: (exit status, last line of its output)}. Skips
  `test` where no namespace can be made."""
  logdir = os.path.join(directory, 'logdir')
  args = helpers.InPrivateNetwork([sys.executable, '-c', _CLUSTER_DRIVER, logdir] + list(flags))
  if args is None:
    test.skipTest('needs root with unshare and ip, to run the job in its own network namespace')
  os.makedirs(logdir)
  proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
                        env=env)
  test.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
  status = json.loads(proc.stdout.strip().splitlines()[-1])
  out = {}
  for job in ('controller', 'trainer_client', 'worker'):
    with open(os.path.join(logdir, job + '.log')) as f:
      log = f.read()
    test.assertEqual(status[job], ending.ERROR_EXIT_CODE, (job, log[-3000:]))
    out[job] = (status[job], log.strip().splitlines()[-1])
  return out


class CheckFailureEndsTheJobTest(test_utils.TestCase):
  """A TensorPipe check that fails in the step ends the trainer at once with its line, instead of
  Lingvo's retries (minutes of them, then an idle process)."""

  def _WriteModel(self):
    """The directory of the module registering WrongBatchDim, and the environment to import it."""
    return _WriteModule(self, 'tp_wrong_batch_dim', WRONG_BATCH_DIM_MODULE)

  @pytest.mark.slow
  def testEveryTaskOfAClusterJobEndsWithTheLine(self):
    directory, env = self._WriteModel()
    ends = _RunClusterJob(self, directory, env, '--model=tp_wrong_batch_dim.WrongBatchDim',
                          '--cpu_devices=2')
    for job, (_, last) in ends.items():
      self.assertRegex(last,
                       r"^tensorpipe\.trainer\.train: error: TensorPipeLayer 'pipe': the batch_dim "
                       r"check failed: layer 'mix' .*set batch_dim=1", job)

  @pytest.mark.slow
  def testWrongBatchDimEndsTheRunWithItsLine(self):
    directory, env = self._WriteModel()
    logdir = os.path.join(directory, 'logdir')
    # The guide's trainer command. Lingvo's retries would outlast the timeout (which fails the
    # test); the check ends the run at its first step.
    proc = subprocess.run(
        _Launcher('--model=tp_wrong_batch_dim.WrongBatchDim', '--cpu_devices=2', '--mode=sync',
                  '--run_locally=cpu', '--logdir=%s' % logdir),
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=env)
    log = proc.stdout + proc.stderr
    self.assertEqual(proc.returncode, ending.ERROR_EXIT_CODE, log[-3000:])
    last = proc.stderr.strip().splitlines()[-1]
    self.assertRegex(
        last, r"^tensorpipe\.trainer\.train: error: TensorPipeLayer 'pipe': the batch_dim check "
        r"failed: layer 'mix' \(layer 1 of partition 0\) mixes examples along batch_dim=0 \(batch "
        r'norm probed with its moving statistics\): .*set batch_dim=1')
    self.assertNotIn('Retrying as expected', log)
    self.assertNotRegex(log, r'\] step:\s*1,')  # No step was trained.
    # The line is recorded for the other tasks of a multi-process job (ClusterTask ends them too).
    with open(os.path.join(logdir, 'tensorpipe_job_failure.txt')) as f:
      self.assertEqual(f.read().strip(), last[len('tensorpipe.trainer.train: error: '):])


# A user's model whose input never yields: x is dequeued from a queue nothing fills, so the first
# training step waits inside TensorFlow without end (while every task still answers).
STUCK_INPUT_MODULE = """
from lingvo import compat as tf
from lingvo import model_registry
from lingvo.core import base_input_generator
from lingvo.core import base_model_params
from lingvo.core import py_utils

from tests import task_helpers



class NeverYields(base_input_generator.BaseInputGenerator):
  \"\"\"x [T, B, D] from an empty queue.\"\"\"

  @classmethod
  def Params(cls):
    p = super().Params()
    p.batch_size = task_helpers.TIME_MAJOR_SHAPE[1]
    return p

  def _InputBatch(self):
    queue = tf.queue.FIFOQueue(1, tf.float32, shapes=[task_helpers.TIME_MAJOR_SHAPE])
    return py_utils.NestedMap(x=queue.dequeue())


@model_registry.RegisterSingleTaskModel
class StuckInput(base_model_params.SingleTaskModelParams):
  \"\"\"A time-major pipeline (K = 2) on an input that never yields.\"\"\"

  def Train(self):
    return NeverYields.Params()

  def Task(self):
    return task_helpers.TimeMajorTask(batch_dim=1)
"""


class StuckStepEndsTheJobTest(test_utils.TestCase):
  """--step_timeout_s: a step that does not finish within it ends the job with one line (every
  task of a --cluster_spec job), checkpoint saves and restores not counted."""

  @pytest.mark.slow
  def testAStuckFirstStepEndsTheRunWithItsLine(self):
    directory, env = _WriteModule(self, 'tp_stuck_input', STUCK_INPUT_MODULE)
    logdir = os.path.join(directory, 'logdir')
    # The first step never ends, so its bound (3 x 5 s) passes however slow the machine is.
    proc = subprocess.run(
        _Launcher('--model=tp_stuck_input.StuckInput', '--cpu_devices=2', '--mode=sync',
                  '--run_locally=cpu', '--logdir=%s' % logdir, '--step_timeout_s=5'),
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=env)
    self.assertEqual(proc.returncode, ending.ERROR_EXIT_CODE, (proc.stdout + proc.stderr)[-3000:])
    line = ('the first step of this run, step 1, did not finish within 3 x --step_timeout_s=5 = '
            '15 s (a run\'s first step also starts the graph; the global step stayed at 0, '
            'checkpoint saves and restores not counted): the step is stuck inside TensorFlow in '
            'this process (e.g. a deadlocked op or an input that never yields); look at the log '
            'for the cause, or raise --step_timeout_s if steps of this model really take that long '
            '(0 turns the bound off)')
    self.assertEqual(proc.stderr.strip().splitlines()[-1], 'tensorpipe.trainer.train: error: ' +
                     line)
    with open(os.path.join(logdir, 'tensorpipe_job_failure.txt')) as f:
      self.assertEqual(f.read(), line + '\n')

  @pytest.mark.slow
  def testEveryTaskOfAClusterJobEndsWithTheStuckStepsLine(self):
    directory, env = _WriteModule(self, 'tp_stuck_input', STUCK_INPUT_MODULE)
    ends = _RunClusterJob(self, directory, env, '--model=tp_stuck_input.StuckInput',
                          '--cpu_devices=2', '--step_timeout_s=5')
    with open(os.path.join(directory, 'logdir', 'tensorpipe_job_failure.txt')) as f:
      recorded = f.read().strip()
    self.assertStartsWith(
        recorded, 'the first step of this run, step 1, did not finish within 3 x '
        '--step_timeout_s=5 = 15 s (a run\'s first step also starts the graph; the global step '
        'stayed at 0, checkpoint saves and restores not counted')
    # The trainer client ended the job; the controller and the worker end with its line, not with
    # "trainer_client stopped answering".
    self.assertEqual(ends, {job: (ending.ERROR_EXIT_CODE,
                                  'tensorpipe.trainer.train: error: ' + recorded)
                            for job in ('controller', 'trainer_client', 'worker')})


class ClusterTaskEndsTest(test_utils.TestCase):
  """How a task of a --cluster_spec job ends when another task ended the job, or answers at another
  task's address."""

  def _Main(self, error, recorded):
    """Runs train.main for worker 0 of a --cluster_spec job whose runners fail with `error`, while
    `recorded` is the line another task ended the job with (or None)."""
    jobs = cluster_task.ClusterTask.JOBS
    with flagsaver.flagsaver(model=MODEL, mode='sync', run_locally='', tf_master='',
                             cluster_spec='worker=127.0.0.1:1', job='worker', task=0,
                             logdir=self.create_tempdir().full_path), \
         mock.patch.object(validation, 'Validate'), \
         mock.patch.object(cluster_task, 'ClusterTask') as task, \
         mock.patch.object(runners.RunnerManager, 'Start', side_effect=error), \
         mock.patch.object(ending, 'RecordedJobFailure', return_value=recorded), \
         mock.patch.object(ending, 'EndJob') as end:
      task.JOBS = jobs
      train.main(['train'])
    return end

  def testAnErrorAfterAnotherTaskEndedTheJobEndsWithItsLine(self):
    # The workers ended the job (one at another's address) while this task started its servers.
    error = tf.errors.UnavailableError(None, None, 'failed to connect to all addresses')
    end = self._Main(error, 'the line')
    end.assert_called_once_with('the line', record=False)
    with self.assertRaises(tf.errors.UnavailableError):
      self._Main(error, None)  # Nothing recorded: the error is the task's own.

  @pytest.mark.slow
  def testATaskAtAnotherTasksAddressEndsTheTaskWithItsLine(self):
    # Ports held (with SO_REUSEADDR, not listening) for the whole test: nothing answers at the
    # controller's and the trainer client's; the worker task under test and the server playing
    # worker 1 bind theirs.
    with helpers.HeldPorts(4, reuse=(0, 1, 2, 3)) as ports:
      controller, client, worker0, worker1 = ['127.0.0.1:%d' % port for port in ports]
      # The host of worker 1 was started with --task=0: it listens at worker 1's address (see
      # liveness_test's TaskAtTest) and is task 0.
      server_helpers.StartTfServer(self, {'worker': [worker1, worker0]}, 'worker', 0)
      spec = 'controller=%s@trainer_client=%s@worker=%s,%s' % (controller, client, worker0,
                                                                worker1)
      proc = subprocess.run(
          _Launcher('--model=%s' % MODEL, '--cpu_devices=4', '--mode=sync', '--job=worker',
                    '--task=0', '--cluster_spec=%s' % spec, '--logdir=%s' % self.get_temp_dir()),
          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
          check=False)
    self.assertEqual(proc.returncode, ending.ERROR_EXIT_CODE, proc.stdout[-3000:])
    self.assertEqual(
        proc.stdout.strip().splitlines()[-1],
        'tensorpipe.trainer.train: error: --cluster_spec puts task worker:1 at %s, but the task '
        'answering there is worker:0 (started with --job=worker --task=0); start on each host the '
        'task the spec puts at its address (each job\'s addresses in --cluster_spec are in task '
        'order): --job=worker --task=1 at %s' % (worker1, worker1))


class TrainerSmokeTest(test_utils.TestCase):
  """Kill + resume, loss going down, and the evaler restoring the final checkpoint (K=2)."""

  EXTRA_STEPS = 40

  def _Args(self, logdir, max_steps, *extra):
    override = ';'.join([
        'task.pipeline.num_devices: 2',
        'train.max_steps: %d' % max_steps,
        'train.save_interval_steps: 10',
        'train.save_interval_seconds: 2',
    ])
    return _Launcher('--model=%s' % MODEL, '--cpu_devices=2', '--mode=sync', '--run_locally=cpu',
                     '--logdir=%s' % logdir, '--model_params_override=%s' % override, *extra)

  def _Log(self, path):
    with open(path) as f:
      return f.read()

  @pytest.mark.slow
  def testTrainKillResumeAndEval(self):
    logdir = tempfile.mkdtemp(dir=self.get_temp_dir())
    train_dir = os.path.join(logdir, 'train')

    # 1. Train with no step limit to speak of; kill -9 once a checkpoint past step 0 is recorded.
    log1 = os.path.join(logdir, 'run1.log')
    with open(log1, 'w') as out:
      proc = subprocess.Popen(self._Args(logdir, 100000), cwd=REPO, stdout=out,
                              stderr=subprocess.STDOUT)
      try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
          if _LatestStep(train_dir) > 0:
            break
          time.sleep(0.5)
      finally:
        if proc.poll() is None:
          os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    run1 = self._Log(log1)
    resume_from = _LatestStep(train_dir)
    self.assertGreater(resume_from, 0, 'no checkpoint after step 0; log tail:\n' + run1[-3000:])
    losses1 = _StepLosses(run1)
    self.assertNotEmpty(losses1, run1[-3000:])

    # 2. The same command again (a few more steps): resumes from the last checkpoint.
    final = resume_from + self.EXTRA_STEPS
    log2 = os.path.join(logdir, 'run2.log')
    status, stdout, stderr = _Run(
        self._Args(logdir, final, '--tensorpipe_profile_every_n_steps=15'), timeout=300)
    run2 = stdout + stderr
    with open(log2, 'w') as f:
      f.write(run2)
    self.assertEqual(status, 0, run2[-3000:])
    self.assertIn('Load from checkpoint %s' % os.path.join(train_dir, 'ckpt-%08d' % resume_from),
                  run2)
    losses2 = _StepLosses(run2)
    self.assertNotEmpty(losses2, run2[-3000:])
    # A trainer that waits for the controller's restore (whether it does depends on which thread
    # comes first) says so in one line, and no run logs a traceback.
    self.assertLessEqual(run2.count("TensorPipe: waiting for the model's variables"), 1,
                         run2[-3000:])
    for run in (run1, run2):
      self.assertNotRegex(run, r'Traceback|\n +File "')
    # The global step continues from the restored one; ckpt-N holds step N (the trainer client
    # saves between two steps).
    restored_step = int(tf.train.load_checkpoint(
        os.path.join(train_dir, 'ckpt-%08d' % resume_from)).get_tensor('global_step'))
    self.assertEqual(restored_step, resume_from)
    self.assertEqual(min(losses2), restored_step + 1)
    self.assertEqual(max(losses2), final)
    self.assertIn(final, _Checkpoints(train_dir))
    self.assertIn('TensorPipe: training done; latest checkpoint %s' %
                  os.path.join(train_dir, 'ckpt-%08d' % final), run2)

    # 2b. A restart reads the batches a run without it reads: from a checkpoint that run 2 passed
    # through, a run in a logdir of its own logs run 2's losses at every step after it.
    between = [c for c in _Checkpoints(train_dir) if restored_step + 1 < c < final - 5]
    self.assertNotEmpty(between, _Checkpoints(train_dir))
    middle = between[len(between) // 2]
    logdir3 = tempfile.mkdtemp(dir=self.get_temp_dir())
    os.makedirs(os.path.join(logdir3, 'train'))
    for path in glob.glob(os.path.join(train_dir, 'ckpt-%08d.*' % middle)):
      shutil.copy(path, os.path.join(logdir3, 'train'))
    with open(os.path.join(logdir3, 'train', 'checkpoint'), 'w') as f:
      f.write('model_checkpoint_path: "ckpt-%08d"\n' % middle)
    status, stdout, stderr = _Run(self._Args(logdir3, final, '--tensorpipe_profile_every_n_steps=0'),
                                  timeout=300)
    self.assertEqual(status, 0, (stdout + stderr)[-3000:])
    self.assertIn('TensorPipe: input digits_input starts at the batch of step %d (restored global '
                  'step %d)' % (middle + 1, middle), stdout + stderr)
    losses3 = _StepLosses(stdout + stderr)
    self.assertEqual(sorted(losses3), list(range(middle + 1, final + 1)))
    np.testing.assert_allclose([losses3[s] for s in sorted(losses3)],
                               [losses2[s] for s in sorted(losses3)], rtol=1e-6)

    # The trainer traced its second step and every 15th: per-device and per-partition tables in the
    # log, tensorpipe/ scalars and the timeline image in the summaries, a Chrome trace per step.
    self.assertIn('TensorPipe profile of step %d' % (restored_step + 2), run2)
    profile = run2[run2.index('TensorPipe profile of step'):]
    self.assertRegex(profile, r'CPU:1 .* [KM]iB')
    self.assertRegex(profile, r'\n1 +\d+\.\d+ms +\d+\.\d+ms +\d+\.\d+ms')
    tags = collections.defaultdict(list)
    images = []
    run_metadata = {}  # {tag: ops traced}, for TensorBoard's Graphs tab.
    has_graph = False
    for path in glob.glob(os.path.join(train_dir, 'events.out.tfevents.*')):
      try:
        for event in tf.compat.v1.train.summary_iterator(path):
          has_graph |= bool(event.graph_def)
          if event.HasField('tagged_run_metadata'):
            meta = tf.compat.v1.RunMetadata.FromString(event.tagged_run_metadata.run_metadata)
            run_metadata[event.tagged_run_metadata.tag] = sum(
                len(d.node_stats) for d in meta.step_stats.dev_stats)
          for value in event.summary.value:
            tags[value.tag].append((event.step, value.simple_value))
            if value.HasField('image'):
              images.append((event.step, value.tag, value.image.encoded_image_string[1:4]))
      except tf.errors.DataLossError:
        pass  # Run 1 was killed: its files may end in a truncated record.
    # The model's TensorPipeLayer is named 'pipeline'.
    for tag in ('tensorpipe/pipeline/partition0/forward_ms',
                'tensorpipe/pipeline/partition1/recompute_ms',
                'tensorpipe/CPU_1/peak_step_memory_mib', 'tensorpipe/CPU_0/busy_fraction'):
      self.assertNotEmpty(tags[tag], sorted(tags))
      self.assertTrue(all(v > 0 for _, v in tags[tag]), (tag, tags[tag]))
    # Steps 2, 15, 30 of run 2. The summaries may also hold steps of run 1 past the restored one
    # (killed, it may have left a step's summaries without its trace file): only run 2's are read.
    traced = [int(step) for step in re.findall(r'TensorPipe trace of step (\d+):', run2)]
    self.assertGreaterEqual(len(traced), 3, run2[-3000:])
    summarised = [step for step, _ in tags['tensorpipe/pipeline/partition0/forward_ms']]
    self.assertContainsSubset(traced, summarised)
    self.assertContainsSubset([(step, 'tensorpipe/timeline', b'PNG') for step in traced], images)
    self.assertTrue(has_graph)
    for step in traced:
      self.assertGreater(run_metadata.get('step_%d' % step, 0), 0, sorted(run_metadata))
    for step in traced:
      with open(os.path.join(train_dir, 'tensorpipe_trace-%d.json' % step)) as f:
        events = json.load(f)['traceEvents']
      names = {e['name'] for e in events if e['ph'] == 'X'}
      self.assertTrue({'F(0,0)', 'B(1,0)', 'R(1,0)'} <= names, sorted(names))
      # Both levels on the devices' rows, in device order: TensorFlow's ops inside the task slices
      # of their device, and the device's step-memory counter.
      rows = trace_helpers.TraceRows(events)
      self.assertEqual(list(dict.fromkeys(rows[tid][0] for tid in sorted(rows))),
                       ['CPU:0', 'CPU:1'])
      tasks = [e for e in events if e['ph'] == 'X' and 'partition' in e.get('args', {})]
      nested = collections.Counter(
          rows[op['tid']][0] for op in events if op['ph'] == 'X' and 'node' in op.get('args', {})
          and any(rows[t['tid']][0] == rows[op['tid']][0] and t['ts'] <= op['ts'] and
                  op['ts'] + op['dur'] <= t['ts'] + t['dur'] for t in tasks))
      self.assertEqual(sorted(nested), ['CPU:0', 'CPU:1'], step)
      counters = {e['name'] for e in events if e['ph'] == 'C'}
      self.assertEqual(counters, {'CPU:0 step memory', 'CPU:1 step memory'}, step)

    # 3. The loss went down: first steps of run 1 vs the last steps of run 2.
    first = np.mean([losses1[s] for s in sorted(losses1)[:10]])
    last = np.mean([losses2[s] for s in sorted(losses2)[-10:]])
    self.assertLess(last, 0.5 * first, (first, last))
    self.assertGreater(first, 1.5)  # ~ln(10) for 10 classes at the start.

    # 4. The evaler restores the final checkpoint and scores the whole held-out split.
    status, stdout, stderr = _Run(
        _Launcher('--model=%s' % MODEL, '--cpu_devices=2', '--mode=sync', '--run_locally=cpu',
                  '--logdir=%s' % logdir, '--job=evaler_once_test@%d' % final,
                  '--model_params_override=task.pipeline.num_devices: 2'), timeout=180)
    self.assertEqual(status, 0, (stdout + stderr)[-3000:])
    score = run_summary.LatestScore(logdir, 'test')
    self.assertIsNotNone(score, (stdout + stderr)[-3000:])
    step, metrics = score
    self.assertEqual(step, final)
    self.assertEqual(metrics['total_samples'], 359)
    self.assertGreater(metrics['accuracy'], 0.8)


if __name__ == '__main__':
  tf.test.main()
