"""The trainer (tensorpipe.trainer.train): flag checks, one-line errors, and the real trainer path.

TrainerSmokeTest runs `python -m tensorpipe.trainer.train` (Lingvo's trainer, sync mode: controller
+ trainer_client) on digits.TinyConvPipeline cut into K = 2 partitions on --cpu_devices=2: it kills
the trainer once a checkpoint is written, starts it again (training resumes from that checkpoint),
then evaluates the final checkpoint with --job=evaler_once_test@STEP. About half a minute on 2
cores: the runners start as soon as the model is ready (tensorpipe.trainer.startup).
"""

import collections
import functools
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from unittest import mock

from absl.testing import flagsaver
import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe.trainer import job_failure
from tensorpipe.trainer import liveness
from tensorpipe.trainer import registry
from tensorpipe.trainer import startup_plan
from tensorpipe.trainer import step_watchdog
from tensorpipe.trainer import train
from tests import helpers
# The user modules below import these in the trainer's processes (declared here for their Bazel
# target's runfiles).
from tests import layer_helpers  # pylint: disable=unused-import
from tests import server_helpers
from tests import task_helpers  # pylint: disable=unused-import

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


class ValidateTest(test_utils.TestCase):

  def _Validate(self, **flags):
    defaults = dict(model=MODEL, mode='sync', run_locally='cpu', logdir=self.get_temp_dir(),
                    cpu_devices=4, worker_split_size=4, job='')
    defaults.update(flags)
    with flagsaver.flagsaver(**defaults):
      train.Validate()

  def testValidConfiguration(self):
    self._Validate()

  def testPlanIsLoggedAndItsFlagsApply(self):
    cache_dir = self.create_tempdir().full_path
    with mock.patch.object(startup_plan, '_Log') as log:
      self._Validate(tensorpipe_plan=4, tensorpipe_plan_device='V100-16GB',
                     tensorpipe_plan_cache_dir=cache_dir)
    lines = [call.args[1] for call in log.call_args_list if call.args[0] == 'plan: %s']
    progress = [call.args[1] for call in log.call_args_list if call.args[0] == 'planning: %s']
    self.assertEqual(progress[0], 'cost model: building the distinct layers of 4: 4 to do')
    self.assertTrue(progress[-1].startswith('simulating steps, best first by a lower bound: done '
                                            'in '), progress)
    self.assertNotEmpty(os.listdir(os.path.join(cache_dir, 'layer_facts')))
    self.assertIn('rank', lines[1])
    best = re.search(r'best: S=(\d+) K=(\d+) M=(\d+) (\S+) (\S+); train it with: '
                     r'--worker_gpus=(\d+) --worker_split_size=(\d+) '
                     r'--model_params_override="(.*)"', lines[-1])
    s, k, m, sched, recompute, gpus, split, override = best.groups()
    self.assertEqual((int(gpus), int(split)), (int(s) * int(k), int(k)))
    with flagsaver.flagsaver(model_params_override=override):
      cfg = registry.ModelParams(MODEL, 'Train')
    p = cfg.task.pipeline
    self.assertEqual((p.num_partitions, p.num_micro_batches, p.schedule, p.recompute),
                     (int(k), int(m), sched, recompute))

  def testPlanWithABadCacheDirectory(self):
    not_a_dir = self.create_tempfile().full_path
    with self.assertRaisesRegex(registry.UsageError, r"^--tensorpipe_plan_cache_dir: cache "
                                r"directory '%s/c' cannot be created \(Not a directory\); give a "
                                r"writable directory, or --tensorpipe_plan_cache_dir=none$" %
                                re.escape(not_a_dir)):
      self._Validate(tensorpipe_plan=4, tensorpipe_plan_device='V100-16GB',
                     tensorpipe_plan_cache_dir=not_a_dir + '/c')

  def testPlanWithAnUnknownProfile(self):
    with self.assertRaisesRegex(registry.UsageError, r"--tensorpipe_plan: unknown device profile "
                                r"'V200'; known profiles: cpu, A100-40GB"):
      self._Validate(tensorpipe_plan=4, tensorpipe_plan_device='V200',
                     tensorpipe_plan_cache_dir='none')

  def testTooFewCpuDevices(self):
    with self.assertRaisesRegex(registry.UsageError, r'needs 4 devices per model split.*'
                                r'--cpu_devices=2'):
      self._Validate(cpu_devices=2, worker_split_size=2)

  def testMissingDataDir(self):
    missing = os.path.join(self.get_temp_dir(), 'no-such-dir')
    with self.assertRaisesRegex(registry.UsageError,
                                r"data directory '.*no-such-dir' of dataset Train"):
      self._Validate(model_params_override='input.data_dir: %s' % missing)

  def testSyntheticInputNeedsNoDataDir(self):
    missing = os.path.join(self.get_temp_dir(), 'no-such-dir')
    self._Validate(model='resnet.ImageNetResNet101',
                   model_params_override='input.synthetic: True; input.data_dir: %s' % missing)
    with self.assertRaisesRegex(registry.UsageError, r"data directory '.*no-such-dir'"):
      self._Validate(model='resnet.ImageNetResNet101',
                     model_params_override='input.data_dir: %s' % missing)

  def testEvalWithoutCheckpoint(self):
    with self.assertRaisesRegex(registry.UsageError, 'no checkpoint in .*train to evaluate'):
      self._Validate(job='evaler_test', logdir=tempfile.mkdtemp(dir=self.get_temp_dir()))


def _WriteCheckpoint(train_dir, step):
  """Writes a checkpoint train_dir/ckpt-<step> holding just global_step = `step`, as Lingvo names
  its checkpoints, and makes it the latest."""
  with tf.Graph().as_default():
    global_step = tf.train.get_or_create_global_step()
    with tf.Session() as sess:
      sess.run(global_step.assign(step))
      return tf.train.Saver().save(sess, os.path.join(train_dir, 'ckpt-%08d' % step))


class TaskTrainOverrideTest(test_utils.TestCase):
  """A task.train override the trainer does not read is named once, with the override to use."""

  def testWarnsOnceNamingTheKeyAndTheFix(self):
    with mock.patch.object(tf.logging, 'warning') as warning, flagsaver.flagsaver(
        model=MODEL, mode='sync', run_locally='cpu', logdir=self.get_temp_dir(), cpu_devices=4,
        worker_split_size=4, job='controller,trainer_client,evaler_test',
        model_params_override='task.train.max_steps: 750'):
      train.Validate()
    messages = [c.args[0] % c.args[1:] for c in warning.call_args_list]
    unread = [m for m in messages if 'task.train.max_steps' in m]
    self.assertLen(unread, 1, messages)
    self.assertIn('which the trainer does not read', unread[0])
    self.assertIn('--model_params_override="train.max_steps: 750"', unread[0])


class EvalWaitTest(test_utils.TestCase):
  """Evaluating a run that stopped before train.max_steps: the messages say what to run instead."""

  def testOnceCommands(self):
    ckpt = '/logs/train/ckpt-00000750'
    self.assertEqual(train.OnceCommand('evaler_test', ckpt), '--job=evaler_once_test@750')
    self.assertEqual(train.OnceCommand('decoder_test', ckpt),
                     '--job=decoder_test --model_params_override='
                     '"task.eval.load_checkpoint_from: /logs/train/ckpt-00000750"')

  def testWaitMessage(self):
    message = train.WaitMessage('decoder_test', '/logs/train/ckpt-00000750', 750, 1500)
    self.assertIn('until one reaches train.max_steps = 1500', message)
    self.assertIn('is at step 750', message)
    self.assertIn('"task.eval.load_checkpoint_from: /logs/train/ckpt-00000750"', message)

  def _Validate(self, logdir, job, override=''):
    with mock.patch.object(tf.logging, 'warning') as warning, flagsaver.flagsaver(
        model=MODEL, mode='sync', run_locally='cpu', logdir=logdir, cpu_devices=4,
        worker_split_size=4, job=job, model_params_override=override):
      train.Validate()
    return [c.args[0] % c.args[1:] for c in warning.call_args_list]

  def testPreflightOfAnEarlyStoppedRun(self):
    logdir = self.create_tempdir().full_path
    ckpt = _WriteCheckpoint(os.path.join(logdir, 'train'), 5)
    messages = self._Validate(logdir, 'evaler_test')
    self.assertLen(messages, 1)
    self.assertIn('train.max_steps = 800; the latest, %s, is at step 5' % ckpt, messages[0])
    self.assertIn('run --job=evaler_once_test@5', messages[0])
    # The once job, or a fixed checkpoint, evaluates what is there: nothing to say.
    self.assertEqual(self._Validate(logdir, 'evaler_once_test@5'), [])
    self.assertEqual(
        self._Validate(logdir, 'evaler_test', 'task.eval.load_checkpoint_from: %s' % ckpt), [])
    self.assertEqual(self._Validate(logdir, 'evaler_test', 'train.max_steps: 5'), [])
    with self.assertRaisesRegex(registry.UsageError,
                                'task.eval.load_checkpoint_from: .*ckpt-00000009 is no checkpoint'):
      self._Validate(logdir, 'evaler_test',
                     'task.eval.load_checkpoint_from: %s' % ckpt.replace('5', '9'))

  def testWaitingRunnerSaysWhyOnceAndFindsTheNextCheckpoint(self):
    train_dir = self.create_tempdir().full_path
    first = _WriteCheckpoint(train_dir, 5)
    runner = _WaitingRunner(train_dir, max_steps=800)
    sleeps = []

    def _Sleep(seconds):
      sleeps.append(seconds)
      if len(sleeps) == 3:  # Training writes a new checkpoint while the runner waits.
        _WriteCheckpoint(train_dir, 10)

    with mock.patch.object(train.time, 'sleep', side_effect=_Sleep), \
         mock.patch.object(tf.logging, 'warning') as warning:
      found = runner._FindNewCheckpoint(None, {first})
    self.assertEqual(found, os.path.join(train_dir, 'ckpt-00000010'))
    self.assertLen(sleeps, 3)
    self.assertLen(warning.call_args_list, 1)  # Once, not once per poll.
    message = warning.call_args.args[0] % warning.call_args.args[1:]
    self.assertIn('evaler_test evaluates the checkpoints', message)
    self.assertIn('run --job=evaler_once_test@5', message)


  def testEvalerRecordsAFixedCheckpointAsProcessed(self):
    # Lingvo 0.14.0's Evaler calls a method it lacks after evaluating
    # task.eval.load_checkpoint_from; TensorPipe's records the checkpoint as the Decoder does.
    eval_dir = self.create_tempdir().full_path
    train.TensorPipeEvaler._UpdateProcessedCheckpoints(None, eval_dir, '/logs/train/ckpt-00000005')
    self.assertEqual(py_utils.GetProcessedCheckpoints(eval_dir), ['/logs/train/ckpt-00000005'])


class _WaitingRunner(train.ExplainedCheckpointWait):
  """What ExplainedCheckpointWait uses of Lingvo's Evaler: job name, checkpoint dir, params."""

  def __init__(self, train_dir, max_steps):
    self._job_name = 'evaler_test'
    self._checkpointer = collections.namedtuple('Checkpointer', 'checkpoint_dir')(train_dir)
    self.params = registry.ModelParams(MODEL, 'Test')
    self.params.train.max_steps = max_steps

  def _ShouldStop(self, sess, step):
    del sess
    return step >= self.params.train.max_steps


class CommandLineErrorsTest(test_utils.TestCase):
  """The command line: one-line messages and exit status 2, no traceback."""

  def _CheckError(self, args, pattern):
    """The error is the last line of everything the trainer prints (stdout and stderr, in order)."""
    proc = subprocess.run(_Launcher(*args), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120, check=False)
    output = proc.stdout
    self.assertEqual(proc.returncode, train.ERROR_EXIT_CODE, output[-2000:])
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
    self.assertEqual(lines[0], train.LIST_LEGEND)
    self.assertIn('%s  [tiny, K=4]  Tiny conv net on the digits' % MODEL, stdout)
    self.assertIn('tp_list_models_user.UserTimeMajor  [paper-scale, K=2]  A user\'s model.', lines)
    self.assertEqual(len(lines) - 2, len(registry.RegisteredModels()))


class ClusterStartTest(test_utils.TestCase):
  """What the trainer does at start besides the checks: stale checkpoint files, a taken port."""

  def _Main(self, logdir, job):
    """Runs train.main for `job` (in this process, run_locally) with the runners stubbed out."""
    with flagsaver.flagsaver(model=MODEL, mode='sync', run_locally='cpu', logdir=logdir,
                             worker_split_size=4, job=job), \
         mock.patch.object(train.RunnerManager, 'Start') as start:
      self.assertEqual(train.main(['train']), 0)
    start.assert_called_once()

  def testTheTrainerClientRemovesKilledSavesBeforeItStarts(self):
    logdir = self.create_tempdir().full_path
    train_dir = os.path.join(logdir, 'train')
    _WriteCheckpoint(train_dir, 5)
    os.makedirs(os.path.join(train_dir, 'ckpt-00000009_temp'))
    self._Main(logdir, 'controller')  # In sync mode not the job that saves: it removes nothing.
    self.assertTrue(os.path.isdir(os.path.join(train_dir, 'ckpt-00000009_temp')))
    self._Main(logdir, 'trainer_client')
    self.assertFalse(os.path.exists(os.path.join(train_dir, 'ckpt-00000009_temp')))
    self.assertTrue(os.path.exists(os.path.join(train_dir, 'ckpt-00000005.index')))

  def testPortTakenAfterTheCheckIsNamed(self):
    # The port is taken between the check and the server's start: TensorFlow's 'Could not start
    # gRPC server' becomes the line naming the address.
    with socket.socket() as held:
      held.bind(('127.0.0.1', 0))
      held.listen()
      address = '127.0.0.1:%d' % held.getsockname()[1]
      with flagsaver.flagsaver(cluster_spec='worker=%s' % address, job='worker', task=0,
                               mode='sync', run_locally='', tf_master=''), \
           mock.patch.object(train, '_Exit', side_effect=SystemExit) as end, \
           mock.patch.object(train.sys, 'stderr') as stderr, \
           self.assertRaises(SystemExit):
        train.RunnerManager(MODEL).MaybeLaunchTensorFlow()
    end.assert_called_once_with(train.ERROR_EXIT_CODE)
    self.assertEqual(
        ''.join(c.args[0] for c in stderr.write.call_args_list),
        'tensorpipe.trainer.train: error: task worker:0 cannot listen on %s: another process, '
        'e.g. a task of an earlier run, holds %s; stop it or pick another port in '
        '--cluster_spec\n' % (address, address))


class ListModelsTest(test_utils.TestCase):

  def _Line(self, name):
    return train.ModelLine(name, registry.RegisteredModels()[name])

  def testTinyAndPaperScaleWithTheirK(self):
    self.assertEqual(
        self._Line(MODEL),
        MODEL + '  [tiny, K=4]  Tiny conv net on the digits, pipelined over 4 devices with 8 '
        'micro-batches.')
    self.assertStartsWith(self._Line('amoebanet.AmoebaNetDPipeline8'),
                          'amoebanet.AmoebaNetDPipeline8  [paper-scale, K=8]  Table 1, ')
    self.assertStartsWith(self._Line('mt.Num2WordsTinyT'),
                          'mt.Num2WordsTinyT  [tiny, K=2 (encoder), 2 (decoder)]  T(3, 256, 4)')
    self.assertStartsWith(self._Line('mt.T24H8192A16'),
                          'mt.T24H8192A16  [paper-scale, K=4 (encoder), 4 (decoder)]  ')


# A user's model registered from a module of its own: time-major x [T, B, D] through FC layers, a
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
    test.assertEqual(status[job], train.ERROR_EXIT_CODE, (job, log[-3000:]))
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

  def testOtherTasksOfAClusterJobEndWithTheRecordedLine(self):
    """The controller and the workers end with the line the trainer client recorded in --logdir;
    a line an earlier run left there ends nothing."""
    logdir = self.create_tempdir().full_path
    path = os.path.join(logdir, job_failure.FILE)
    with open(path, 'w') as f:
      f.write("TensorPipeLayer 'pipe': the batch_dim check failed\n")
    task = object.__new__(train.ClusterTask)  # Only its watch of recorded failures runs here.
    task._stop = mock.Mock()  # pylint: disable=protected-access
    task._stop.wait.side_effect = [False, False, True]  # pylint: disable=protected-access
    with flagsaver.flagsaver(logdir=logdir), mock.patch.object(train, '_Exit') as exit_, \
        mock.patch.object(train, '_Fail') as fail:
      os.utime(path, (0, 0))  # Written before this process started: an earlier run's.
      task._WatchJobFailure()  # pylint: disable=protected-access
      fail.assert_not_called()
      os.utime(path, None)
      task._stop.wait.side_effect = [False, True]  # pylint: disable=protected-access
      task._WatchJobFailure()  # pylint: disable=protected-access
    fail.assert_called_once_with("TensorPipeLayer 'pipe': the batch_dim check failed")
    exit_.assert_called_once_with(train.ERROR_EXIT_CODE)

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
    self.assertEqual(proc.returncode, train.ERROR_EXIT_CODE, log[-3000:])
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


class _WatchedTrainer(train.WatchedSteps, _FakeLingvoTrainer):
  pass


class StuckStepEndsTheJobTest(test_utils.TestCase):
  """--step_timeout_s: a step that does not finish within it ends the job with one line (every
  task of a --cluster_spec job), checkpoint saves and restores not counted."""

  def _Trainer(self, step_s, max_steps, **flags):
    """A _WatchedTrainer on a fake clock whose watching thread is not started but kept in
    `self.spawned`; returns it and the clock."""
    clock = types.SimpleNamespace(now=0.0)
    self.spawned = []
    watch = functools.partial(step_watchdog.LoopWatch, clock=lambda: clock.now,
                              spawn=self.spawned.append)
    with flagsaver.flagsaver(**dict(dict(step_timeout_s=10), **flags)), \
         mock.patch.object(train.step_watchdog, 'LoopWatch', watch):
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
         mock.patch.object(train, '_EndJob') as end:
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
         mock.patch.object(train.liveness, 'Silent', return_value=silent) as ask, \
         mock.patch.object(train, '_EndJob') as end:
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
         mock.patch.object(train.liveness, 'Silent', side_effect=Silent), \
         mock.patch.object(train, '_EndJob') as end:
      self.assertFalse(trainer._OnStall(stall))  # pylint: disable=protected-access
    end.assert_not_called()

  @pytest.mark.slow
  def testAStuckFirstStepEndsTheRunWithItsLine(self):
    directory, env = _WriteModule(self, 'tp_stuck_input', STUCK_INPUT_MODULE)
    logdir = os.path.join(directory, 'logdir')
    # The first step never ends, so its bound (3 x 5 s) passes however slow the machine is.
    proc = subprocess.run(
        _Launcher('--model=tp_stuck_input.StuckInput', '--cpu_devices=2', '--mode=sync',
                  '--run_locally=cpu', '--logdir=%s' % logdir, '--step_timeout_s=5'),
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=env)
    self.assertEqual(proc.returncode, train.ERROR_EXIT_CODE, (proc.stdout + proc.stderr)[-3000:])
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
    self.assertEqual(ends, {job: (train.ERROR_EXIT_CODE,
                                  'tensorpipe.trainer.train: error: ' + recorded)
                            for job in ('controller', 'trainer_client', 'worker')})


class ClusterTaskEndsTest(test_utils.TestCase):
  """How a task of a --cluster_spec job ends when another task ended the job, or answers at another
  task's address."""

  def testALostTaskThatEndedTheJobIsNamedByItsLine(self):
    logdir = self.create_tempdir().full_path
    with open(os.path.join(logdir, 'tensorpipe_job_failure.txt'), 'w') as f:
      f.write('training step 8 did not finish within --step_timeout_s=10 s (...)\n')
    task = object.__new__(train.ClusterTask)  # Only its handlers run here.
    task.job = 'controller'
    with flagsaver.flagsaver(logdir=logdir), mock.patch.object(train, '_Exit') as exit_, \
        mock.patch.object(train, '_Fail') as fail:
      task._OnLost('task trainer_client:0 at 10.0.0.2:7001 stopped answering: no answer for 60 s '
                   '([Errno 111] Connection refused)')  # pylint: disable=protected-access
    fail.assert_called_once_with('training step 8 did not finish within --step_timeout_s=10 s '
                                 '(...)')
    exit_.assert_called_once_with(train.ERROR_EXIT_CODE)

  def testATaskAtAnotherTasksAddressEndsTheJob(self):
    with mock.patch.object(train, '_EndJob') as end:
      on_wrong_task = train.ClusterTask._OnWrongTask  # pylint: disable=protected-access
      on_wrong_task('--cluster_spec puts task worker:1 at ...')
    end.assert_called_once_with('--cluster_spec puts task worker:1 at ...', record=True)

  def _Main(self, error, recorded):
    """Runs train.main for worker 0 of a --cluster_spec job whose runners fail with `error`, while
    `recorded` is the line another task ended the job with (or None)."""
    jobs = train.ClusterTask.JOBS
    with flagsaver.flagsaver(model=MODEL, mode='sync', run_locally='', tf_master='',
                             cluster_spec='worker=127.0.0.1:1', job='worker', task=0,
                             logdir=self.create_tempdir().full_path), \
         mock.patch.object(train, 'Validate'), mock.patch.object(train, 'ClusterTask') as task, \
         mock.patch.object(train.RunnerManager, 'Start', side_effect=error), \
         mock.patch.object(train, '_RecordedJobFailure', return_value=recorded), \
         mock.patch.object(train, '_EndJob') as end:
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
    self.assertEqual(proc.returncode, train.ERROR_EXIT_CODE, proc.stdout[-3000:])
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
        'task.pipeline.num_partitions: 2',
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
    for path in glob.glob(os.path.join(train_dir, 'events.out.tfevents.*')):
      try:
        for event in tf.compat.v1.train.summary_iterator(path):
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
    for step in traced:
      with open(os.path.join(train_dir, 'tensorpipe_trace-%d.json' % step)) as f:
        events = json.load(f)['traceEvents']
      names = {e['name'] for e in events if e['ph'] == 'X'}
      self.assertTrue({'F(0,0)', 'B(1,0)', 'R(1,0)'} <= names, sorted(names))

    # 3. The loss went down: first steps of run 1 vs the last steps of run 2.
    first = np.mean([losses1[s] for s in sorted(losses1)[:10]])
    last = np.mean([losses2[s] for s in sorted(losses2)[-10:]])
    self.assertLess(last, 0.5 * first, (first, last))
    self.assertGreater(first, 1.5)  # ~ln(10) for 10 classes at the start.

    # 4. The evaler restores the final checkpoint and scores the whole held-out split.
    status, stdout, stderr = _Run(
        _Launcher('--model=%s' % MODEL, '--cpu_devices=2', '--mode=sync', '--run_locally=cpu',
                  '--logdir=%s' % logdir, '--job=evaler_once_test@%d' % final,
                  '--model_params_override=task.pipeline.num_partitions: 2'), timeout=180)
    self.assertEqual(status, 0, (stdout + stderr)[-3000:])
    score = train.LatestScore(logdir, 'test')
    self.assertIsNotNone(score, (stdout + stderr)[-3000:])
    step, metrics = score
    self.assertEqual(step, final)
    self.assertEqual(metrics['total_samples'], 359)
    self.assertGreater(metrics['accuracy'], 0.8)


if __name__ == '__main__':
  tf.test.main()
