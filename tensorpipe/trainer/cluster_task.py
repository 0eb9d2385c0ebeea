"""This process's task of a --cluster_spec job: ending with the job, and SIGTERM (preemption).
"""

import os
import threading
import time

import lingvo.compat as tf

from tensorpipe.trainer import ending
from tensorpipe.trainer import flags as trainer_flags
from tensorpipe.trainer import liveness
from tensorpipe.trainer import preflight
from tensorpipe.trainer import registry

FLAGS = trainer_flags.FLAGS

PREEMPTION = liveness.Preemption()  # Installed by the trainer's main for a --cluster_spec task.


def _Log(msg, *args):
  tf.logging.info('TensorPipe: ' + msg, *args)


_CONTROLLER_END_S = 120  # Bound on the trainer client's wait for the controller to end.


class ClusterTask:
  """This process's task of a --cluster_spec job (controller, trainer client or worker).

  Ends the process with one line when another task of the job is lost, or is not the task the spec
  puts at its address (liveness.PeerWatch), or has ended the job with a line it recorded
  (ending.EndJob: a failed check, a stuck step, a task at another's address), and handles SIGTERM:
  the trainer client saves its current step (runners.CheckpointsBetweenSteps) and ends; the others
  keep serving until it has ended, at most --sigterm_grace_s seconds.
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
    Started at once: it also ends a task that waits for the workers (WaitForWorkers). The first
    look at the record is now (ending.RecordedJobFailure)."""
    self._EndIfRecorded()
    threading.Thread(target=self._WatchJobFailure, daemon=True,
                     name='tensorpipe-job-failure-watch').start()

  def StartWatch(self):
    """From now on, a lost task, or one at another task's address, ends this task
    (liveness.PeerWatch)."""
    threading.Thread(target=self.watch.Run, args=(self._OnLost, self._OnWrongTask, self._stop),
                     daemon=True, name='tensorpipe-peer-watch').start()

  def _WatchJobFailure(self):
    """A line another task ended the job with (ending.EndJob: a failed check or a stuck step in the
    trainer client, a task at another task's address) ends this task too, with that line."""
    while not self._stop.wait(liveness.POLL_S):
      if self._EndIfRecorded():
        return

  @staticmethod
  def _EndIfRecorded():
    """Ends the process with the line another task recorded when it ended the job, if there is one
    (returns False if not)."""
    line = ending.RecordedJobFailure()
    if not line or ending.ENDING.is_set():
      return False
    ending.Fail(line)
    ending.Exit(ending.ERROR_EXIT_CODE)
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
    ending.EndJob(message, record=True)

  def _OnLost(self, message):
    if PREEMPTION.received.is_set() and self.job != 'trainer_client':
      return  # _OnSigterm ends this task.
    if self._EndIfRecorded():  # The lost task ended the job with a line: that line, not "lost".
      return
    if self.job == 'worker':
      done = _TrainingDone()
      if done:
        _Log('training is done (%s); this worker ends', done)
        ending.Exit(0)
    ending.Fail('%s; this %s task ends too. Start every task of the job again with the same '
                'commands: training resumes from the last checkpoint in %s' %
                (message, self.job, os.path.join(FLAGS.logdir, 'train')))
    ending.Exit(ending.ERROR_EXIT_CODE)

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
      ending.Fail('SIGTERM: the current step cannot be saved: %s; training resumes from the last '
                  'checkpoint in %s' % (why, os.path.join(FLAGS.logdir, 'train')))
      ending.Exit(ending.ERROR_EXIT_CODE)
    self._stop.set()
    _Log('SIGTERM: this %s task serves until the trainer client has saved its current step and '
         'ended (at most --sigterm_grace_s=%d s)', self.job, FLAGS.sigterm_grace_s)
    while not self.watch.Gone('trainer_client') and time.monotonic() < deadline:
      time.sleep(liveness.POLL_S)
    _Log('SIGTERM: this %s task ends', self.job)
    ending.Exit(0)


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
