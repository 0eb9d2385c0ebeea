"""The trainer's runners: Lingvo's Controller, Trainer, Evaler and Decoder with TensorPipe's mixins,
and the RunnerManager that builds them (TensorPipe's model lookup, the --cpu_devices cluster).

One mixin per concern: where checkpoints are written (CheckpointsBetweenSteps), quiet after SIGTERM
(QuietOnSigterm), a failed in-step check ends the job (EndOnCheckFailure), a stuck step ends the job
(WatchedSteps); the evaluation jobs' waits (eval_wait.ExplainedCheckpointWait); start-up without
Lingvo's fixed sleep (startup.PromptStart).
"""

import time

from lingvo import runners as lingvo_runners
from lingvo import trainer
import lingvo.compat as tf
from lingvo.core import py_utils

from tensorpipe import check_failure
from tensorpipe.trainer import cluster_task
from tensorpipe.trainer import cpu_devices
from tensorpipe.trainer import ending
from tensorpipe.trainer import eval_wait
from tensorpipe.trainer import flags as trainer_flags
from tensorpipe.trainer import input_position
from tensorpipe.trainer import jobs as jobs_lib
from tensorpipe.trainer import liveness
from tensorpipe.trainer import preflight
from tensorpipe.trainer import registry
from tensorpipe.trainer import runner_mixin
from tensorpipe.trainer import startup
from tensorpipe.trainer import step_watchdog
from tensorpipe.trainer import trainer_profiling

FLAGS = trainer_flags.FLAGS


def _Log(msg, *args):
  tf.logging.info('TensorPipe: ' + msg, *args)


class CheckpointsBetweenSteps(runner_mixin.RunnerMixin):
  """Mixin for Lingvo's Trainer: in sync mode the trainer client writes every checkpoint, between
  two steps, so a checkpoint holds one step whole and is named after that step.

  Lingvo's controller saves beside the training steps: its asynchronous saver copies the variables
  in one session run and reads the global step for the name in another, and neither waits for the
  trainer client, so a checkpoint could hold a step part-applied or be named after a later step
  than the one it holds (ckpt-189 holding step 173). With --checkpoint_in_trainer_cpu (on by
  default in sync mode, see train.main) the trainer client restores or initialises the variables,
  saves every save_interval between two steps, and this mixin adds the save of the last step when
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
    # Set in __init__ whenever a caller saves: --checkpoint_in_trainer_cpu gives Lingvo's trainer
    # its checkpointer, and a SIGTERM save needs one.
    assert self._final_checkpointer is not None, 'no checkpointer to save step %d with' % step
    latest = tf.train.latest_checkpoint(self._train_dir)  # pylint: disable=no-member
    if latest is None or not latest.endswith('ckpt-%08d' % step):
      self._final_checkpointer.Save(sess, step)

  def _ShouldStop(self, sess=None, step=None, check_early_stop=True):
    if cluster_task.PREEMPTION.received.is_set() and self._final_checkpointer and step is not None:
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
    while cluster_task.PREEMPTION.received.is_set():
      time.sleep(1.0)
    return super()._ShouldStop(sess, step, check_early_stop)  # pylint: disable=no-member


class EndOnCheckFailure(runner_mixin.RunnerMixin):
  """Mixin for Lingvo's runners: a failed TensorPipe in-step check (see tensorpipe.check_failure)
  ends the process at once with its one line and ending.ERROR_EXIT_CODE. Lingvo's `_RunLoop` would
  retry it as an expected error (InvalidArgumentError), for minutes, then leave the process idle;
  the check fails the same way every time. The training runners record the line for the other
  tasks of the job (ending.EndJob); evaluation jobs, which share the logdir of a training job, do
  not."""

  RECORD_JOB_FAILURE = True

  def _RunLoop(self, job_name, loop_func, loop_args=(), cleanup_func=None):

    def Loop(*args):
      try:
        return loop_func(*args)
      except Exception as e:  # pylint: disable=broad-except
        line = check_failure.OneLine(e)
        if line is None:
          raise
        ending.EndJob(line, self.RECORD_JOB_FAILURE)
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
    the line for `stall` (ending.EndJob), unless the step finished meanwhile or a SIGTERM's save
    ends this task (returns False)."""
    if cluster_task.PREEMPTION.received.is_set():
      return False
    silent = None  # A job of one process.
    if jobs_lib.StartsServer():
      peers = liveness.Peers(preflight.ParseClusterSpec(FLAGS.cluster_spec), FLAGS.job,
                             FLAGS.task)
      silent = liveness.Silent(peers, liveness.STATUS_TIMEOUT_S)
    line = step_watchdog.StallLine(stall, silent, liveness.STATUS_TIMEOUT_S)
    if self._loop_watch is None or self._loop_watch.watchdog.Check() is None:
      _Log('the step after global step %d finished after all', stall.global_step)
      return False
    ending.EndJob(line, record=True)
    return True  # Not reached: the process has ended.


class TensorPipeController(EndOnCheckFailure, startup.PromptStart, QuietOnSigterm,
                           lingvo_runners.Controller):
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


class TensorPipeEvaler(EndOnCheckFailure, eval_wait.ExplainedCheckpointWait,
                       lingvo_runners.Evaler):
  """Lingvo's Evaler, saying why it waits for a checkpoint (eval_wait.ExplainedCheckpointWait),
  ending at a failed check (EndOnCheckFailure)."""

  RECORD_JOB_FAILURE = False

  def _UpdateProcessedCheckpoints(self, runner_dir, ckpt_path):
    # Lingvo 0.14.0's Evaler calls this method, which it lacks, after evaluating the checkpoint of
    # task.eval.load_checkpoint_from (the Decoder calls py_utils' function of that name).
    py_utils.UpdateProcessedCheckpoints(runner_dir, ckpt_path)


class TensorPipeDecoder(EndOnCheckFailure, eval_wait.ExplainedCheckpointWait,
                        lingvo_runners.Decoder):
  """Lingvo's Decoder, saying why it waits for a checkpoint (eval_wait.ExplainedCheckpointWait),
  ending at a failed check (EndOnCheckFailure)."""

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
      ending.Fail(preflight.PortTakenMessage(address, 'task %s:%d' % (FLAGS.job, FLAGS.task)))
      ending.Exit(ending.ERROR_EXIT_CODE)
