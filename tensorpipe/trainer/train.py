r"""Launcher: Lingvo's trainer (all of its flags) plus what TensorPipe models need on CPU.

  .venv/bin/python -m tensorpipe.trainer.train --model=digits.TinyConvPipeline --cpu_devices=4 \
      --mode=sync --run_locally=cpu --logdir=/tmp/digits                    # controller + trainer
  .venv/bin/python -m tensorpipe.trainer.train --model=digits.TinyConvPipeline --cpu_devices=4 \
      --mode=sync --run_locally=cpu --logdir=/tmp/digits --job=evaler_test  # evaluate
  .venv/bin/python -m tensorpipe.trainer.train --list_models

Installed with pip, `tensorpipe-train FLAGS` is the same command as `python -m
tensorpipe.trainer.train FLAGS`. --help lists the flags below and the Lingvo flags every run sets;
--helpfull lists every flag.

Extra flags:
  --cpu_devices=K  gives this process K logical CPU devices: every TF server it starts (and every
                   in-process session) is created with ConfigProto(device_count={'CPU': K}); every
                   job spec of the cluster (controller, worker, ps, evaler, decoder, ...) gets
                   cpus_per_replica = K, and the jobs that build the model on one split (controller,
                   evaler, decoder) get devices_per_split = --worker_split_size, which defaults to
                   K. So a TensorPipeLayer with K partitions puts partition k on /device:CPU:k.
                   Without --cpu_devices nothing is changed: the stock flags apply (e.g. on GPUs
                   --worker_gpus=K --worker_split_size=K).
  --worker_tasks_per_replica=T (with --cluster_spec)
                   one worker replica spans T worker tasks of --cpu_devices devices each, so the
                   partitions of a TensorPipeLayer run in separate processes (see
                   tensorpipe.trainer.launch, which starts such a job on one machine); then
                   --worker_split_size defaults to T x K, one model split per replica.
  --startup_timeout_s=S (with --cluster_spec, default 120)
                   the controller and trainer client wait S seconds for every worker task to accept
                   connections, then stop with an error naming the unreachable task; any task ends
                   the same way when another has not answered S seconds after this one started.
  --lost_task_timeout_s=S (with --cluster_spec, default 60)
                   every task (controller, trainer client, workers) asks every other task for an
                   answer each second (a TCP connection, then gRPC's handshake); one that stops
                   answering for S seconds (host, network or process gone, or the process stopped
                   or hung) ends this task with an error naming it and its address. So after a
                   fault every task ends by itself; start them all again to resume from the last
                   checkpoint. A worker that finds the last checkpoint at train.max_steps ends with
                   status 0 instead (training is done).
  --step_timeout_s=S (default 600; 0: off)
                   the trainer ends the job when the global step does not advance for S seconds
                   (checkpoint saves and restores not counted; the first step of a run, which also
                   starts the graph on every task, gets 3 x S), with an error naming the step and
                   the tasks that give no answer to a status request within 5 s, or saying that
                   every task answers and the step is stuck inside TensorFlow; with --cluster_spec
                   every other task of the job ends with the same line. A step of a tiny model
                   takes well under a second on 2 CPU cores; for paper-scale models on slow devices
                   set S above the slowest step, or 0.
  --sigterm_grace_s=S (with --cluster_spec, default 60)
                   on SIGTERM (preemption) the trainer client saves a checkpoint of its current step
                   and ends; the controller and workers keep serving until it has ended, at most S
                   seconds.
  --list_models    prints the registered models and exits: each marked tiny (trains on 2 CPU cores
                   in minutes) or paper-scale, with its K and its description. Models a user's
                   module registers are listed too when --model names one of them or
                   --params_module=MODULE names the module.
  --tensorpipe_plan=N (with --tensorpipe_plan_device, --tensorpipe_plan_memory,
                   --tensorpipe_plan_cache_dir, --tensorpipe_plan_quick)
                   logs the planner's ranked configurations of the model for N devices at
                   start-up, and the flags that apply the best (see tools.plan), with a progress
                   line per phase ('planning: ...'); what it built and measured is cached.
  --tensorpipe_profile_every_n_steps=N (default 100; 0: off)
                   the trainer traces step 2 and every N-th step, and logs and summarises
                   per-partition forward/backward/re-computation times and per-device busy time and
                   peak step memory (tensorpipe/... scalars in TensorBoard).

Models are looked up in TensorPipe's top-level `params` package first (--model=digits.X imports
params.digits), then wherever Lingvo looks. Before any job starts, the launcher checks the model
name, the data directories of the datasets the jobs read, that the model's TensorPipeLayers fit the
devices of one model split, and (for eval-only jobs) that a checkpoint exists; with --cluster_spec,
also the spec's jobs and HOST:PORT addresses, that --job and --task name one of its tasks, that this
host can write LOGDIR/train, and that this task's port is free, all before any server starts. A
failed check prints one line `tensorpipe.trainer.train: error: ...` and exits with status 2. So
does a TensorPipe check that fails inside a step (tensorpipe.check_failure; EndOnCheckFailure), and
a step that does not finish within --step_timeout_s (WatchedSteps), in every task of the job: the
trainer records its line in LOGDIR (_EndJob) and the other tasks end with it (ClusterTask). With
--cluster_spec a task at an address the spec gives another task (--task swapped between two hosts)
ends every task of the job with a line naming both. The job that saves checkpoints (the trainer
client in sync mode) removes what killed saves left in LOGDIR/train before it restores
(tensorpipe.trainer.stale_checkpoints).
"""

import glob
import logging
import os
import re
import sys
import threading
import time

from absl import app
from absl import flags
from lingvo import runners
from lingvo import trainer
import lingvo.compat as tf
from lingvo.core import py_utils

from tensorpipe import check_failure
from tensorpipe.trainer import cpu_devices
from tensorpipe.trainer import input_position
from tensorpipe.trainer import job_failure
from tensorpipe.trainer import liveness
from tensorpipe.trainer import preflight
from tensorpipe.trainer import registry
from tensorpipe.trainer import runner_mixin
from tensorpipe.trainer import stale_checkpoints
from tensorpipe.trainer import startup
from tensorpipe.trainer import startup_plan
from tensorpipe.trainer import step_watchdog
from tensorpipe.trainer import trainer_profiling

flags.DEFINE_integer(
    'cpu_devices', None,
    'Give this process K logical CPU devices and configure every job of the cluster to use them '
    '(cpus_per_replica = K; devices_per_split = --worker_split_size, default K, or K x '
    '--worker_tasks_per_replica). Unset: the stock Lingvo behaviour.', lower_bound=1)
flags.DEFINE_bool(
    'list_models', False,
    'Print the registered models, each marked tiny (CPU-sized) or paper-scale, with its K, and '
    'exit. With --model or --params_module, also the models of that user\'s module.')
flags.DEFINE_string(
    'params_module', None,
    'With --list_models: a module on PYTHONPATH (e.g. mymodels) whose registered models are listed '
    'beside TensorPipe\'s own.')
flags.DEFINE_integer(
    'worker_tasks_per_replica', None,
    'With --cluster_spec: one worker replica (a model split of --worker_split_size devices, '
    'default N x --cpu_devices) spans this many worker tasks, each with --cpu_devices devices, so '
    'the partitions of a TensorPipeLayer run in separate processes; the worker tasks of '
    '--cluster_spec then hold (number of tasks) / N data-parallel replicas. Unset: Lingvo\'s '
    'default, one replica per worker task.', lower_bound=1)
flags.DEFINE_integer(
    'startup_timeout_s', 120,
    'With --cluster_spec: seconds the controller and trainer client wait for every worker task to '
    'accept connections before giving up with an error naming the task; any task also ends, naming '
    'it, when another task of the job has not answered this long after this task started.',
    lower_bound=1)
flags.DEFINE_integer(
    'lost_task_timeout_s', 60,
    'With --cluster_spec: a task of the job that stops answering (a TCP connection, then gRPC\'s '
    'handshake) for this many seconds (its host or network is gone, it died, or it is stopped or '
    'hung) ends every other task with an error naming '
    'it and its address; then start every task again with the same commands to resume from the '
    'last checkpoint. Lower it to notice faults sooner, raise it on a network with long outages.',
    lower_bound=1)
flags.DEFINE_integer(
    'step_timeout_s', 600,
    'End the job with an error naming the step, and the tasks that give no answer, when the '
    'global step does not advance for this many seconds (checkpoint saves and restores not '
    'counted; the first step of a run, which also starts the graph, gets 3 times as long). Steps '
    'of the tiny models take well under a second on CPU; for paper-scale models on slow devices '
    'set it above the slowest step (e.g. 3600), or 0 to turn it off.', lower_bound=0)
flags.DEFINE_integer(
    'sigterm_grace_s', 60,
    'With --cluster_spec: after SIGTERM (preemption), the trainer client saves a checkpoint of its '
    'current step and ends, and the other tasks keep serving until it has ended, at most this many '
    'seconds; set it below the time your scheduler waits between SIGTERM and SIGKILL.',
    lower_bound=1)

FLAGS = flags.FLAGS
# --help lists these beside the flags above (--helpfull lists every flag): the --tensorpipe_plan
# flags and the Lingvo trainer flags every run sets.
flags.adopt_module_key_flags(startup_plan)
for _name in ('model', 'logdir', 'mode', 'run_locally', 'job', 'task', 'cluster_spec',
              'worker_split_size', 'model_params_override'):
  flags.declare_key_flag(_name)

ERROR_EXIT_CODE = 2

_TRAIN_JOBS = ('controller', 'trainer', 'trainer_client', 'train_summaries', 'executor_tpu',
               'host_driven_executor_tpu')
# Jobs that write into LOGDIR/train: checkpoints (controller, trainer client, trainer) or the
# shards of the variables they hold (worker, ps).
_WRITING_JOBS = ('controller', 'trainer', 'trainer_client', 'worker', 'ps')


def _Log(msg, *args):
  tf.logging.info('TensorPipe: ' + msg, *args)


def OnceCommand(job, checkpoint):
  """The flags that make eval job `job` ('evaler_test', 'decoder_test', ...) read `checkpoint` once
  and exit (Lingvo 0.14.0: --job=evaler_once_DATASET@STEP; for a decoder, the task's
  eval.load_checkpoint_from, which evalers read too)."""
  m = re.search(r'ckpt-(\d+)$', checkpoint)
  if job.startswith('evaler_') and m:
    return '--job=evaler_once_%s@%d' % (_DatasetOfJob(job), int(m.group(1)))
  return '--job=%s --model_params_override="task.eval.load_checkpoint_from: %s"' % (job, checkpoint)


def WaitMessage(job, latest, step, max_steps):
  """What an evaler or decoder job waiting for a checkpoint newer than `latest` (at global step
  `step`) tells the user: why it waits, and what to run to evaluate what is there."""
  return ('%s evaluates the checkpoints of a running training job until one reaches '
          'train.max_steps = %d; the latest, %s, is at step %d, so after it the job waits (with no '
          'end) for newer ones. If no training job is running on this --logdir (it stopped early, '
          'or was trained with a smaller train.max_steps), stop this one and run %s, or give it '
          '--model_params_override="train.max_steps: %d" (the step training stopped at)' %
          (job, max_steps, latest, step, OnceCommand(job, latest), step))


class ExplainedCheckpointWait(runner_mixin.RunnerMixin):
  """Mixin for Lingvo's Evaler and Decoder: waiting for a new checkpoint says why, once.

  Lingvo's `_FindNewCheckpoint` retries until training writes a checkpoint newer than the ones
  evaluated, and logs a traceback for every retry, without end when training stopped before the
  model's train.max_steps. This one polls as Lingvo does (delays growing from 1 s to
  `MAX_POLL_S`) and logs `WaitMessage` once per latest checkpoint instead.
  """

  MAX_POLL_S = 60.0

  def _FindNewCheckpoint(self, sess=None, processed_ckpts=None):
    # pylint: disable=no-member  # A mixin: Lingvo's Evaler or Decoder has these members.
    delay, announced = 1.0, None
    while True:
      if self._ShouldStop(sess, step=0):  # Lingvo's check: early stopping.
        return None
      path = tf.train.latest_checkpoint(self._checkpointer.checkpoint_dir)
      if path and path not in processed_ckpts:
        return path
      if path and path != announced:
        step = int(re.findall(r'ckpt-(\d+)$', path)[0])  # Lingvo's checkpoint names.
        tf.logging.warning('TensorPipe: %s', WaitMessage(self._job_name, path, step,
                                                          self.params.train.max_steps))
        announced = path
      elif not path and announced is None:
        tf.logging.info('TensorPipe: %s waits for the first checkpoint in %s',
                        self._job_name, self._checkpointer.checkpoint_dir)
        announced = ''
      time.sleep(delay)
      delay = min(self.MAX_POLL_S, delay * 1.5)


PREEMPTION = liveness.Preemption()  # Installed by main() for a task of a --cluster_spec job.


class CheckpointsBetweenSteps(runner_mixin.RunnerMixin):
  """Mixin for Lingvo's Trainer: in sync mode the trainer client writes every checkpoint, between
  two steps, so a checkpoint holds one step whole and is named after that step.

  Lingvo's controller saves beside the training steps: its asynchronous saver copies the variables
  in one session run and reads the global step for the name in another, and neither waits for the
  trainer client, so a checkpoint could hold a step part-applied or be named after a later step
  than the one it holds (ckpt-189 holding step 173). With --checkpoint_in_trainer_cpu (on by
  default in sync mode, see main) the trainer client restores or initialises the variables, saves
  every save_interval between two steps, and this mixin adds the save of the last step when
  training ends, and after SIGTERM (preemption, --cluster_spec) the save of the step just run.
  Without that flag (the user turned it off) the trainer client keeps a checkpointer of its own for
  the SIGTERM save alone.
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    # pylint: disable=no-member  # Lingvo's runner's members.
    self._final_checkpointer = getattr(self, '_checkpointer', None)
    if (self._final_checkpointer is None and FLAGS.cluster_spec and
        not py_utils.IsEagerMode()):
      with self._graph.as_default(), tf.container(self._container_id):
        self._final_checkpointer = self._CreateCheckpointer(self._train_dir, self._model)

  def _SaveUnlessSaved(self, sess, step):
    latest = tf.train.latest_checkpoint(self._train_dir)  # pylint: disable=no-member
    if latest is None or not latest.endswith('ckpt-%08d' % step):
      self._final_checkpointer.Save(sess, step)

  def _ShouldStop(self, sess=None, step=None, check_early_stop=True):
    if PREEMPTION.received.is_set() and self._final_checkpointer and step is not None:
      self._SaveUnlessSaved(sess, step)
      _Log('SIGTERM: saved a checkpoint of step %d; training ends here. Start every task again '
           'with the same commands to resume from it', step)
      return True
    stop = super()._ShouldStop(sess, step, check_early_stop)  # pylint: disable=no-member
    if stop and FLAGS.checkpoint_in_trainer_cpu and step is not None:
      self._SaveUnlessSaved(sess, step)
    return stop


class QuietOnSigterm(runner_mixin.RunnerMixin):
  """Mixin for Lingvo's Controller: after SIGTERM it writes nothing more (the trainer client saves
  the current step) and waits until the SIGTERM thread ends the process."""

  def _ShouldStop(self, sess=None, step=None, check_early_stop=True):
    while PREEMPTION.received.is_set():
      time.sleep(1.0)
    return super()._ShouldStop(sess, step, check_early_stop)  # pylint: disable=no-member


_STARTED = job_failure.ProcessStart()
_ENDING = threading.Event()  # Set once this process ends the job with a line (_EndJob).


def _RecordedJobFailure():
  """The line another task of this job ended the job with since this process started (recorded
  in --logdir by _EndJob: a failed check, a stuck step, a task at another task's address), or
  None."""
  return job_failure.Recorded(FLAGS.logdir, _STARTED) if FLAGS.logdir else None


def _EndJob(line, record):
  """Ends the process with `line` as its last output; with `record`, first writes it to --logdir,
  where the other tasks of a --cluster_spec job find it and end with it too (ClusterTask)."""
  _ENDING.set()
  if record and FLAGS.logdir:
    try:
      job_failure.Record(FLAGS.logdir, line)
    except OSError as e:
      tf.logging.warning('TensorPipe: cannot record the line for the other tasks of the job: %s', e)
  # No other thread logs after the line: hold every logging handler's lock until the process ends.
  for handler in logging.getLogger().handlers + logging.getLogger('absl').handlers:
    handler.acquire()
  _Fail(line)
  _Exit(ERROR_EXIT_CODE)


class EndOnCheckFailure(runner_mixin.RunnerMixin):
  """Mixin for Lingvo's runners: a failed TensorPipe in-step check (see tensorpipe.check_failure)
  ends the process at once with its one line and ERROR_EXIT_CODE. Lingvo's `_RunLoop` would
  retry it as an expected error (InvalidArgumentError), for minutes, then leave the process idle;
  the check fails the same way every time. The training runners record the line for the other
  tasks of the job (_EndJob); evaluation jobs, which share the logdir of a training job, do not."""

  RECORD_JOB_FAILURE = True

  def _RunLoop(self, job_name, loop_func, loop_args=(), cleanup_func=None):

    def Loop(*args):
      try:
        return loop_func(*args)
      except Exception as e:  # pylint: disable=broad-except
        line = check_failure.OneLine(e)
        if line is None:
          raise
        _EndJob(line, self.RECORD_JOB_FAILURE)
        raise  # Not reached: the process has ended.

    return super()._RunLoop(job_name, Loop, loop_args, cleanup_func)  # pylint: disable=no-member


# The checkpointer methods that save or restore; their time does not count towards
# --step_timeout_s.
_CHECKPOINTER_IO = ('Save', 'Sync', 'Restore', 'RestoreIfNeeded', 'RestoreFromPath',
                    'RestoreGlobalStepIfNeeded')


class WatchedSteps(runner_mixin.RunnerMixin):
  """Mixin for Lingvo's Trainer: a step that does not finish within --step_timeout_s ends the job
  with one line (tensorpipe.trainer.step_watchdog), instead of a trainer that waits without end.

  Lingvo's training loop calls `_ShouldStop(sess, global_step)` before every step: there the loop
  reports the global step (step_watchdog.LoopWatch). The trainer's checkpointers save and restore
  unchanged, their time left out of the bound. `_OnStall` ends the job.
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._loop_watch = None
    if FLAGS.step_timeout_s:
      self._loop_watch = step_watchdog.LoopWatch(FLAGS.step_timeout_s, self._OnStall)
      checkpointers = [getattr(self, name, None)
                       for name in ('_checkpointer', '_final_checkpointer')]
      for checkpointer in {id(c): c for c in checkpointers if c is not None}.values():
        self._loop_watch.ExcludeFrom(checkpointer, _CHECKPOINTER_IO)
      _Log('every training step must finish within --step_timeout_s=%d s (the first of a run '
           'within %d s), checkpoint saves and restores not counted', FLAGS.step_timeout_s,
           FLAGS.step_timeout_s * step_watchdog.FIRST_STEP_FACTOR)

  def _Loop(self):
    if self._loop_watch:
      self._loop_watch.LoopStarts()
    super()._Loop()  # pylint: disable=no-member  # Lingvo's Trainer's.
    if self._loop_watch:  # Training ended (an error that Lingvo retries leaves the watch on).
      self._loop_watch.Stop()

  def _ShouldStop(self, sess=None, step=None, check_early_stop=True):
    watched = bool(self._loop_watch and step is not None and self._loop_watch.Observe(int(step)))
    stop = super()._ShouldStop(sess, step, check_early_stop)  # pylint: disable=no-member
    if stop and watched and self._loop_watch:
      self._loop_watch.Stop()
    return stop

  def _OnStall(self, stall):
    """Asks every other task of the job for its status (liveness.Silent), then ends the job with
    the line for `stall` (_EndJob), unless the step finished meanwhile or a SIGTERM's save ends
    this task (returns False)."""
    if PREEMPTION.received.is_set():
      return False
    silent = None  # A job of one process.
    if _StartsServer():
      peers = liveness.Peers(preflight.ParseClusterSpec(FLAGS.cluster_spec), FLAGS.job,
                             FLAGS.task)
      silent = liveness.Silent(peers, liveness.STATUS_TIMEOUT_S)
    line = step_watchdog.StallLine(stall, silent, liveness.STATUS_TIMEOUT_S)
    if self._loop_watch is None or self._loop_watch.watchdog.Check() is None:
      _Log('the step after global step %d finished after all', stall.global_step)
      return False
    _EndJob(line, record=True)
    return True  # Not reached: the process has ended.


class TensorPipeController(EndOnCheckFailure, startup.PromptStart, QuietOnSigterm,
                           runners.Controller):
  """Lingvo's Controller, starting as soon as the model is ready (startup.PromptStart), quiet after
  SIGTERM (QuietOnSigterm), ending at a failed check (EndOnCheckFailure)."""


class TensorPipeTrainer(  # pylint: disable=too-many-ancestors  # One mixin per concern.
    EndOnCheckFailure, startup.PromptStart, WatchedSteps, input_position.InputAtStep,
    CheckpointsBetweenSteps, trainer_profiling.ProfilingTrainer):
  """The profiling trainer, starting as soon as the model is ready (startup.PromptStart), ending
  the job at a step that does not finish within --step_timeout_s (WatchedSteps), reading after
  every restore the batches a run without the restart reads (input_position.InputAtStep), writing
  the checkpoints between steps, the last one and a preempted one included
  (CheckpointsBetweenSteps), ending at a failed check (EndOnCheckFailure)."""


class TensorPipeEvaler(EndOnCheckFailure, ExplainedCheckpointWait, runners.Evaler):
  """Lingvo's Evaler, saying why it waits for a checkpoint (ExplainedCheckpointWait), ending at a
  failed check (EndOnCheckFailure)."""

  RECORD_JOB_FAILURE = False

  def _UpdateProcessedCheckpoints(self, runner_dir, ckpt_path):
    # Lingvo 0.14.0's Evaler calls this method, which it lacks, after evaluating the checkpoint of
    # task.eval.load_checkpoint_from (the Decoder calls py_utils' function of that name).
    py_utils.UpdateProcessedCheckpoints(runner_dir, ckpt_path)


class TensorPipeDecoder(EndOnCheckFailure, ExplainedCheckpointWait, runners.Decoder):
  """Lingvo's Decoder, saying why it waits for a checkpoint (ExplainedCheckpointWait), ending at a
  failed check (EndOnCheckFailure)."""

  RECORD_JOB_FAILURE = False


class RunnerManager(trainer.RunnerManager):
  """Lingvo's RunnerManager with TensorPipe's model lookup, the --cpu_devices cluster layout, and
  runners that start without Lingvo's fixed 30 s start-up sleep."""

  model_registry = registry.ModelRegistry
  Controller = TensorPipeController

  @property
  def Trainer(self):
    return TensorPipeTrainer if not py_utils.IsEagerMode() else super().Trainer

  @property
  def Evaler(self):
    return TensorPipeEvaler if not py_utils.IsEagerMode() else super().Evaler

  @property
  def Decoder(self):
    return TensorPipeDecoder if not py_utils.IsEagerMode() else super().Decoder

  def UpdateClusterParamsFromFlags(self, cluster, job_name):
    super().UpdateClusterParamsFromFlags(cluster, job_name)
    if FLAGS.cpu_devices:
      cpu_devices.ConfigureCpuCluster(cluster, FLAGS.cpu_devices, FLAGS.worker_split_size)
    if FLAGS.worker_tasks_per_replica and FLAGS.cluster_spec:
      workers = preflight.ParseClusterSpec(FLAGS.cluster_spec)['worker']
      cpu_devices.SpreadReplicas(cluster, len(workers), FLAGS.worker_tasks_per_replica,
                                 FLAGS.cpu_devices or 1)

  def MaybeLaunchTensorFlow(self):
    try:
      super().MaybeLaunchTensorFlow()
    except tf.errors.UnknownError as e:
      if not (FLAGS.cluster_spec and 'Could not start gRPC server' in str(e)):
        raise
      # The port was taken after preflight.CheckPortFree: TensorFlow's error names no address.
      address = preflight.ParseClusterSpec(FLAGS.cluster_spec)[FLAGS.job][FLAGS.task]
      _Fail(preflight.PortTakenMessage(address, 'task %s:%d' % (FLAGS.job, FLAGS.task)))
      _Exit(ERROR_EXIT_CODE)


# --------------------------------------------------------------------------------------------------
# Checks before any job starts.
# --------------------------------------------------------------------------------------------------


def _Jobs():
  """The jobs this process will run (Lingvo's defaults for --run_locally)."""
  if FLAGS.job:
    return [j for j in FLAGS.job.split(',') if j]
  if FLAGS.run_locally == 'tpu':
    return ['trainer_client']
  if FLAGS.run_locally:
    return ['controller', 'trainer'] if FLAGS.mode == 'async' else ['controller', 'trainer_client']
  return []


def _DatasetOfJob(job):
  """The dataset a job reads ('Train', 'Test', ...), or None for server-only jobs."""
  if job in _TRAIN_JOBS:
    return 'Train'
  m = re.match(r'(?:evaler_once|evaler|decoder)_([^@]+)', job)
  if m:
    return m.group(1)
  return None


def _IsEvalOnlyJob(job):
  return job.startswith('evaler_') or job.startswith('decoder_')


def Validate():
  """Checks the command line before any job starts; raises registry.UsageError (one line)."""
  if FLAGS.mode not in ('sync', 'async'):
    return  # inspect_* / shell / write_inference_graph modes: Lingvo handles them.
  if not FLAGS.model:
    raise registry.UsageError('--model is required (see --list_models)')
  registry.ImportModel(FLAGS.model)
  if not FLAGS.logdir:
    raise registry.UsageError('--logdir is required')
  if not (FLAGS.run_locally or FLAGS.cluster_spec or FLAGS.tpu or FLAGS.use_eager or
          FLAGS.tf_master.startswith('localhost')):
    raise registry.UsageError(
        'say where the jobs run: --run_locally=cpu (all jobs in this process) or '
        '--cluster_spec=JOB=HOST:PORT,...@...')
  _CheckClusterFlags()
  num_cpus = FLAGS.cpu_devices
  split = FLAGS.worker_split_size or 1
  tasks_per_replica = FLAGS.worker_tasks_per_replica or 1
  if FLAGS.worker_tasks_per_replica:
    _CheckSpreadReplicas()
  if num_cpus:
    if FLAGS.worker_gpus or FLAGS.run_locally in ('gpu', 'tpu') or FLAGS.worker_tpus:
      raise registry.UsageError('--cpu_devices is for CPU runs; with GPUs use the stock flags '
                                '(--worker_gpus=K --worker_split_size=K) without --cpu_devices')
    replica_devices = num_cpus * tasks_per_replica
    if split > replica_devices or replica_devices % split:
      spread = (' x --worker_tasks_per_replica=%d' % tasks_per_replica
                if FLAGS.worker_tasks_per_replica else '')
      raise registry.UsageError('--worker_split_size=%d must divide the %d devices of a replica '
                                '(--cpu_devices=%d%s)' % (split, replica_devices, num_cpus, spread))
    num_cpus = replica_devices
  jobs = _Jobs()
  datasets = []
  for job in jobs:
    dataset = _DatasetOfJob(job)
    if dataset and dataset not in datasets:
      datasets.append(dataset)
  for i, dataset in enumerate(datasets):
    cfg = registry.ModelParams(FLAGS.model, dataset)
    if i == 0:
      for message in preflight.UnusedTaskTrainOverrides(cfg, FLAGS.model_params_override):
        tf.logging.warning('TensorPipe: %s', message)
    preflight.CheckDataDirs(cfg, dataset)
    for path, name, k in preflight.PipelinePartitions(cfg):
      if k > split:
        if num_cpus:
          if tasks_per_replica > 1:
            fix = ('--cpu_devices=%d --worker_split_size=%d (with --worker_tasks_per_replica=%d)' %
                   (-(-k // tasks_per_replica), -(-k // tasks_per_replica) * tasks_per_replica,
                    tasks_per_replica))
          else:
            fix = '--cpu_devices=%d' % k
          raise registry.UsageError(
              'model %s needs %d devices per model split (TensorPipeLayer %r at %s has %d '
              'partitions) but --cpu_devices=%d with --worker_split_size=%d gives %d; run with '
              '%s' % (FLAGS.model, k, name, path, k, FLAGS.cpu_devices, split, split, fix))
        raise registry.UsageError(
            'model %s needs %d devices per model split (TensorPipeLayer %r at %s has %d '
            'partitions) but --worker_split_size=%d; use --cpu_devices=%d on CPU, or '
            '--worker_gpus=%d --worker_split_size=%d on GPUs' %
            (FLAGS.model, k, name, path, k, split, k, k, k))
  _CheckThisHost(jobs)
  if jobs and all(_IsEvalOnlyJob(j) for j in jobs):
    _CheckEvalCheckpoints(jobs, cfg)
  if FLAGS.tensorpipe_plan and datasets:
    startup_plan.LogModelPlan(registry.ModelParams(FLAGS.model, 'Train'), FLAGS.model)


def _CheckEvalCheckpoints(jobs, cfg):
  """For eval-only jobs: the checkpoint they read exists; a job that will wait for newer ones is
  told how to evaluate just the checkpoints there are (model params `cfg`, overrides applied)."""
  train_dir = os.path.join(FLAGS.logdir, 'train')
  fixed = cfg.task.eval.load_checkpoint_from if cfg.Get('task') is not None else None
  if fixed:
    if not (glob.glob(fixed + '.index') or tf.train.latest_checkpoint(fixed)):
      raise registry.UsageError('task.eval.load_checkpoint_from: %s is no checkpoint (PATH.index) '
                                'and no directory with one; see %s' % (fixed, train_dir))
    return  # The job evaluates that checkpoint once and exits.
  latest = tf.train.latest_checkpoint(train_dir)
  if not latest:
    raise registry.UsageError('no checkpoint in %s to evaluate; train first (same --logdir)' %
                              train_dir)
  for job in jobs:
    m = re.match(r'evaler_once_[^@]+@(\d+)$', job)
    if m and not glob.glob(os.path.join(train_dir, 'ckpt-%08d.index' % int(m.group(1)))):
      raise registry.UsageError('no checkpoint ckpt-%08d in %s for --job=%s' %
                                (int(m.group(1)), train_dir, job))
  step = int(tf.train.load_checkpoint(latest).get_tensor('global_step'))
  for job in jobs:
    if not job.startswith('evaler_once_') and step < cfg.train.max_steps:
      tf.logging.warning('TensorPipe: %s', WaitMessage(job, latest, step, cfg.train.max_steps))


def _StartsServer():
  """Whether Lingvo starts a TensorFlow server for --job/--task of --cluster_spec in this process
  (trainer.RunnerManager.MaybeLaunchTensorFlow)."""
  return bool(FLAGS.cluster_spec) and not (FLAGS.run_locally or FLAGS.tpu or FLAGS.use_eager or
                                           FLAGS.tf_master.startswith('localhost'))


def _CheckClusterFlags():
  """--cluster_spec is well-formed, and --job and --task name one of its tasks."""
  if FLAGS.cluster_spec:
    spec = preflight.CheckClusterSpec(FLAGS.cluster_spec)
    if _StartsServer():
      preflight.CheckClusterTask(spec, FLAGS.job, FLAGS.task, FLAGS.mode)


def _CheckThisHost(jobs):
  """After the flags' checks, before any server starts: this host can write LOGDIR/train for a job
  that writes there, and this task's port (with --cluster_spec) is free."""
  task = 'task %s:%d' % (FLAGS.job, FLAGS.task) if _StartsServer() else None
  if any(job in _WRITING_JOBS for job in jobs):
    preflight.CheckWritable(os.path.join(FLAGS.logdir, 'train'), task or 'this process')
  if task:
    preflight.CheckPortFree(preflight.ParseClusterSpec(FLAGS.cluster_spec)[FLAGS.job][FLAGS.task],
                            task)


def _CheckSpreadReplicas():
  if not FLAGS.cluster_spec:
    raise registry.UsageError(
        '--worker_tasks_per_replica needs --cluster_spec (worker tasks to spread over)')
  workers = preflight.ParseClusterSpec(FLAGS.cluster_spec).get('worker')
  if not workers:
    raise registry.UsageError('--worker_tasks_per_replica needs worker tasks in --cluster_spec')
  if len(workers) % FLAGS.worker_tasks_per_replica:
    raise registry.UsageError('--worker_tasks_per_replica=%d must divide the %d worker tasks of '
                              '--cluster_spec' % (FLAGS.worker_tasks_per_replica, len(workers)))


# --------------------------------------------------------------------------------------------------
# Progress lines.
# --------------------------------------------------------------------------------------------------


def _LogPlan(jobs):
  logdir = FLAGS.logdir
  _Log('model %s, jobs %s, mode %s, logdir %s', FLAGS.model, ','.join(jobs) or '(none)', FLAGS.mode,
       logdir)
  if FLAGS.worker_tasks_per_replica and FLAGS.cluster_spec:
    tasks = len(preflight.ParseClusterSpec(FLAGS.cluster_spec)['worker'])
    per = FLAGS.worker_tasks_per_replica
    _Log(
        '%d worker tasks of %d CPU devices, %d per replica (%d data-parallel replica%s): '
        'partition k of replica r runs on worker task r*%d + k//%d', tasks, FLAGS.cpu_devices or 1,
        per, tasks // per, '' if tasks // per == 1 else 's', per, FLAGS.cpu_devices or 1)
  elif FLAGS.cpu_devices:
    splits = FLAGS.cpu_devices // FLAGS.worker_split_size
    _Log('%d logical CPU devices in this process; %d model split%s of %d devices (partition k of a '
         'TensorPipeLayer on /device:CPU:%sk)%s', FLAGS.cpu_devices, splits,
         '' if splits == 1 else 's', FLAGS.worker_split_size,
         '' if splits == 1 else '%d*s+' % FLAGS.worker_split_size,
         '' if splits == 1 else ', data parallel: split s gets 1/%d of each batch' % splits)
  if any(j in _TRAIN_JOBS for j in jobs):
    _Log('checkpoints and train summaries -> %s; params, model analysis and controller summaries '
         '-> %s', os.path.join(logdir, 'train'), os.path.join(logdir, 'control'))
    _Log('progress: Lingvo logs "step: N, steps/sec: .., examples/sec: .. loss:.." for every '
         'training step and "Save checkpoint done: PATH" for every checkpoint')
  for job in jobs:
    if _IsEvalOnlyJob(job):
      kind, dataset = ('eval', _DatasetOfJob(job)) if job.startswith('evaler') else (
          'decoder', _DatasetOfJob(job))
      out = os.path.join(logdir, '%s_%s' % (kind, dataset.lower()) if kind == 'eval' else
                         'decoder_%s' % dataset.lower())
      _Log('%s results -> %s (summaries and score-STEP.txt)', job, out)
  _Log('view with: tensorboard --logdir=%s', logdir)


def LatestScore(logdir, dataset='test'):
  """(step, {metric: value}) from the newest eval_<dataset>/score-STEP.txt, or None."""
  files = glob.glob(os.path.join(logdir, 'eval_%s' % dataset.lower(), 'score-*.txt'))
  if not files:
    return None
  path = max(files, key=lambda f: int(re.findall(r'score-(\d+)\.txt$', f)[0]))
  step = int(re.findall(r'score-(\d+)\.txt$', path)[0])
  metrics = {}
  with open(path, encoding='utf-8') as f:
    for line in f:
      parts = line.replace(':', ' ').split()
      if len(parts) >= 2:
        try:
          metrics[parts[0]] = float(parts[-1])
        except ValueError:
          pass
  return step, metrics


def _LogOutcome(jobs):
  logdir = FLAGS.logdir
  if any(j in _TRAIN_JOBS for j in jobs):
    ckpt = tf.train.latest_checkpoint(os.path.join(logdir, 'train'))
    _Log('training done; latest checkpoint %s', ckpt)
  for job in jobs:
    if job.startswith('evaler_'):
      dataset = _DatasetOfJob(job)
      score = LatestScore(logdir, dataset)
      if score:
        step, metrics = score
        _Log('eval %s at step %d: %s', dataset, step,
             ', '.join('%s %.4f' % kv for kv in sorted(metrics.items())))


# --------------------------------------------------------------------------------------------------
# Entry points.
# --------------------------------------------------------------------------------------------------


LIST_LEGEND = (
    'tiny: trains on 2 CPU cores in minutes (run times and expected results: docs/guide.md, '
    '"Registered models"); paper-scale: the paper\'s configuration, for accelerators (on CPU it '
    'builds, but does not train in reasonable time or memory). K: partitions of each '
    'TensorPipeLayer, the devices of one model split (on CPU, --cpu_devices=K).')


def ModelLine(name, cls):
  """One --list_models line: `name  [tiny|paper-scale, K=..]  description` (K from its params)."""
  partitions = preflight.PipelinePartitions(registry.ModelParams(name, 'Train'))
  if len(partitions) == 1:
    k = 'K=%d' % partitions[0][2]
  elif partitions:
    k = 'K=' + ', '.join('%d (%s)' % (k, layer) for _, layer, k in partitions)
  else:
    k = 'no TensorPipeLayer'
  scale = 'tiny' if registry.IsTiny(cls) else 'paper-scale'
  return '%s  [%s, %s]  %s' % (name, scale, k, registry.Description(cls))


def ListModels(out=None):
  """Prints the legend and one ModelLine per registered model, as each is ready: TensorPipe's own
  and those of the user's module named by --model or --params_module (imported first, so that a
  model `--model=` trains is listed too).

  Raises:
    registry.UsageError: if that module does not exist or fails to import.
  """
  registry.ImportUserModules(FLAGS.model, FLAGS.params_module)
  out = out or sys.stdout
  verbosity = tf.logging.get_verbosity()
  tf.logging.set_verbosity(tf.logging.WARNING)  # Not Lingvo's per-model 'No dataset ...' lines.
  try:
    out.write(LIST_LEGEND + '\n')
    for name, cls in sorted(registry.RegisteredModels().items()):
      out.write(ModelLine(name, cls) + '\n')
      out.flush()
  finally:
    tf.logging.set_verbosity(verbosity)


def _Fail(message):
  sys.stdout.flush()  # Anything printed before comes before the error line, never after it.
  sys.stderr.write('tensorpipe.trainer.train: error: %s\n' % message)
  sys.stderr.flush()
  return ERROR_EXIT_CODE


def _Exit(status):
  """Ends the process now, from any thread (the main thread may be inside TensorFlow)."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access


_CONTROLLER_END_S = 120  # Bound on the trainer client's wait for the controller to end.


class ClusterTask:
  """This process's task of a --cluster_spec job (controller, trainer client or worker).

  Ends the process with one line when another task of the job is lost, or is not the task the spec
  puts at its address (liveness.PeerWatch), or has ended the job with a line it recorded (_EndJob:
  a failed check, a stuck step, a task at another's address), and handles SIGTERM: the trainer
  client saves its current step (CheckpointsBetweenSteps) and ends; the others keep serving until
  it has ended, at most --sigterm_grace_s seconds.
  """

  JOBS = ('controller', 'trainer_client', 'worker')

  def __init__(self, job, task):
    self.job, self.task = job, task
    self.watch = liveness.PeerWatch(preflight.ParseClusterSpec(FLAGS.cluster_spec), job, task,
                                    FLAGS.startup_timeout_s, FLAGS.lost_task_timeout_s)
    self._stop = threading.Event()

  def InstallSigterm(self):
    PREEMPTION.Install(self._OnSigterm)

  def WatchJobFailure(self):
    """From now on, a line another task ends the job with ends this task too (_WatchJobFailure).
    Started at once: it also ends a task that waits for the workers (WaitForWorkers)."""
    threading.Thread(target=self._WatchJobFailure, daemon=True,
                     name='tensorpipe-job-failure-watch').start()

  def StartWatch(self):
    """From now on, a lost task, or one at another task's address, ends this task
    (liveness.PeerWatch)."""
    threading.Thread(target=self.watch.Run, args=(self._OnLost, self._OnWrongTask, self._stop),
                     daemon=True, name='tensorpipe-peer-watch').start()

  def _WatchJobFailure(self):
    """A line another task ended the job with (_EndJob: a failed check or a stuck step in the
    trainer client, a task at another task's address) ends this task too, with that line."""
    while not self._stop.wait(liveness.POLL_S):
      if self._EndIfRecorded():
        return

  @staticmethod
  def _EndIfRecorded():
    """Ends the process with the line another task recorded when it ended the job, if there is one
    (returns False if not)."""
    line = _RecordedJobFailure()
    if not line or _ENDING.is_set():
      return False
    _Fail(line)
    _Exit(ERROR_EXIT_CODE)
    return True  # Reached only where _Exit is faked.

  def Finish(self):
    """After this task's runners ended: the trainer client waits for the controller to end."""
    self._stop.set()
    if self.job == 'trainer_client' and not PREEMPTION.received.is_set():
      deadline = time.monotonic() + _CONTROLLER_END_S
      while not self.watch.Gone('controller') and time.monotonic() < deadline:
        time.sleep(liveness.POLL_S)

  @staticmethod
  def _OnWrongTask(message):
    """Ends the job: a task it needs is not where the spec puts it. The line is recorded, so that
    tasks that did not see it (e.g. whose watch starts later) end with it too."""
    _EndJob(message, record=True)

  def _OnLost(self, message):
    if PREEMPTION.received.is_set() and self.job != 'trainer_client':
      return  # _OnSigterm ends this task.
    if self._EndIfRecorded():  # The lost task ended the job with a line: that line, not "lost".
      return
    if self.job == 'worker':
      done = _TrainingDone()
      if done:
        _Log('training is done (%s); this worker ends', done)
        _Exit(0)
    _Fail('%s; this %s task ends too. Start every task of the job again with the same commands: '
          'training resumes from the last checkpoint in %s' %
          (message, self.job, os.path.join(FLAGS.logdir, 'train')))
    _Exit(ERROR_EXIT_CODE)

  def _OnSigterm(self):
    deadline = time.monotonic() + FLAGS.sigterm_grace_s
    if self.job == 'trainer_client':
      self.watch.ignore.add('controller')  # It ends after SIGTERM too; the workers must not.
      _Log('SIGTERM: saving a checkpoint after the current step, then ending (at most '
           '--sigterm_grace_s=%d s)', FLAGS.sigterm_grace_s)
      why = 'it did not end within --sigterm_grace_s=%d s' % FLAGS.sigterm_grace_s
      while time.monotonic() < deadline:
        down = self.watch.Unreachable('worker')
        if down:  # The step waits for that task: it cannot end.
          why = 'task %s does not answer' % down
          break
        time.sleep(liveness.POLL_S)
      _Fail('SIGTERM: the current step cannot be saved: %s; training resumes from the last '
            'checkpoint in %s' % (why, os.path.join(FLAGS.logdir, 'train')))
      _Exit(ERROR_EXIT_CODE)
    self._stop.set()
    _Log('SIGTERM: this %s task serves until the trainer client has saved its current step and '
         'ended (at most --sigterm_grace_s=%d s)', self.job, FLAGS.sigterm_grace_s)
    while not self.watch.Gone('trainer_client') and time.monotonic() < deadline:
      time.sleep(liveness.POLL_S)
    _Log('SIGTERM: this %s task ends', self.job)
    _Exit(0)


def _TrainingDone():
  """'checkpoint PATH at step N >= train.max_steps M' if training reached its end, else None."""
  try:
    path = tf.train.latest_checkpoint(os.path.join(FLAGS.logdir, 'train'))
    if not path:
      return None
    step = int(tf.train.load_checkpoint(path).get_tensor('global_step'))
    max_steps = registry.ModelParams(FLAGS.model, 'Train').train.max_steps
  except (registry.UsageError, tf.errors.OpError, ValueError) as e:
    tf.logging.warning('TensorPipe: cannot tell whether training is done: %s', e)
    return None
  if step < max_steps:
    return None
  return 'checkpoint %s at step %d >= train.max_steps %d' % (path, step, max_steps)


def main(unused_argv):
  try:
    if FLAGS.cpu_devices and not FLAGS['worker_split_size'].present:
      # One model split per replica: its devices may span several worker tasks.
      FLAGS.worker_split_size = FLAGS.cpu_devices * (FLAGS.worker_tasks_per_replica or 1)
    Validate()
  except registry.UsageError as e:
    return _Fail(e)
  if FLAGS.cpu_devices:
    cpu_devices.InstallCpuDevices(FLAGS.cpu_devices)
  if FLAGS.mode == 'sync' and not FLAGS['checkpoint_in_trainer_cpu'].present:
    # Every task of the job decides alike: the trainer client saves, the controller does not.
    FLAGS.checkpoint_in_trainer_cpu = True  # See CheckpointsBetweenSteps.
  jobs = _Jobs()
  _LogPlan(jobs)
  # The job that saves checkpoints cleans up, before it restores one.
  if ('trainer_client' if FLAGS.checkpoint_in_trainer_cpu else 'controller') in jobs:
    stale_checkpoints.RemoveStale(os.path.join(FLAGS.logdir, 'train'))
  task = None
  if FLAGS.cluster_spec and FLAGS.mode == 'sync' and len(jobs) == 1 and jobs[0] in ClusterTask.JOBS:
    task = ClusterTask(jobs[0], FLAGS.task)
    task.InstallSigterm()
    task.WatchJobFailure()
    if task.job == 'worker':
      task.StartWatch()
  if FLAGS.cluster_spec and any(j in ('controller', 'trainer_client') for j in jobs):
    try:
      preflight.WaitForWorkers(preflight.ParseClusterSpec(FLAGS.cluster_spec),
                               FLAGS.startup_timeout_s)
    except registry.UsageError as e:
      return _Fail(e)
    if task:
      task.StartWatch()
  from lingvo.core import tpu_embedding_layers_v2  # pylint: disable=g-import-not-at-top
  from lingvo.core import tpu_embedding_manager  # pylint: disable=g-import-not-at-top
  tpu_embedding_layers_v2.TPU_EMBEDDING_MANAGER = tpu_embedding_manager.TPUEmbeddingManager()
  try:
    RunnerManager(FLAGS.model).Start()
  except Exception:  # pylint: disable=broad-except
    line = _RecordedJobFailure() if task else None
    if line is None:
      raise
    # Another task ended the job (e.g. a worker at another worker's address) while this one
    # started: TensorFlow's error here follows from it; the line says what to do.
    _EndJob(line, record=False)
  if task:
    task.Finish()
  _LogOutcome(jobs)
  return 0


def Run(argv=None):
  """Parses flags like lingvo.trainer's __main__ and runs main (or --list_models)."""
  argv = list(sys.argv if argv is None else argv)
  try:
    FLAGS(argv, known_only=True)
  except flags.Error as e:
    return _Fail(str(e).strip().splitlines()[0])
  if FLAGS.list_models:
    try:
      ListModels()
    except registry.UsageError as e:
      return _Fail(e)
    return 0
  if FLAGS.disable_tf2:
    tf.disable_v2_behavior()
  py_utils.SetEagerMode(FLAGS.use_eager)
  tf.config.run_functions_eagerly(FLAGS.run_functions_eagerly)
  if FLAGS.enable_tf_data_debug_mode:
    tf.data.experimental.enable_debug_mode()
  try:
    if FLAGS.model:
      # Model modules may define flags; import before the full parse.
      registry.ImportModel(FLAGS.model)
  except registry.UsageError as e:
    return _Fail(e)
  app.define_help_flags()  # --help, --helpshort, --helpfull (absl defines them in app.run).
  try:
    FLAGS(argv)  # Now every flag is defined: an unknown or bad one fails here, in one line.
  except flags.Error as e:
    return _Fail('%s (see --helpfull)' % str(e).strip().splitlines()[0])
  FLAGS.unparse_flags()
  tf.app.run(main, argv=argv)
  return 0


if __name__ == '__main__':
  sys.exit(Run())
