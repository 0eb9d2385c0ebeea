"""Evaluation jobs waiting for a checkpoint: what they say, and the command that evaluates
what is there instead (an evaler or decoder of a run that stopped before train.max_steps would wait
without end).
"""

import re
import time

import lingvo.compat as tf

from tensorpipe.trainer import jobs as jobs_lib
from tensorpipe.trainer import runner_mixin

def OnceCommand(job, checkpoint):
  """The flags that make eval job `job` ('evaler_test', 'decoder_test', ...) read `checkpoint` once
  and exit (Lingvo 0.14.0: --job=evaler_once_DATASET@STEP; for a decoder, the task's
  eval.load_checkpoint_from, which evalers read too)."""
  m = re.search(r'ckpt-(\d+)$', checkpoint)
  if job.startswith('evaler_') and m:
    return '--job=evaler_once_%s@%d' % (jobs_lib.DatasetOfJob(job), int(m.group(1)))
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
