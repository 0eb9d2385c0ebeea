"""Evaluation jobs waiting for a checkpoint (tensorpipe.trainer.eval_wait): the messages say what
to run instead, once per checkpoint."""

import collections
import os
from unittest import mock

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import eval_wait
from tensorpipe.trainer import registry
from tests import trainer_helpers

MODEL = 'digits.TinyConvPipeline'


class EvalWaitTest(test_utils.TestCase):
  """Evaluating a run that stopped before train.max_steps: the messages say what to run instead."""

  def testOnceCommands(self):
    ckpt = '/logs/train/ckpt-00000750'
    self.assertEqual(eval_wait.OnceCommand('evaler_test', ckpt), '--job=evaler_once_test@750')
    self.assertEqual(eval_wait.OnceCommand('decoder_test', ckpt),
                     '--job=decoder_test --model_params_override='
                     '"task.eval.load_checkpoint_from: /logs/train/ckpt-00000750"')

  def testWaitMessage(self):
    message = eval_wait.WaitMessage('decoder_test', '/logs/train/ckpt-00000750', 750, 1500)
    self.assertIn('until one reaches train.max_steps = 1500', message)
    self.assertIn('is at step 750', message)
    self.assertIn('"task.eval.load_checkpoint_from: /logs/train/ckpt-00000750"', message)
  def testWaitingRunnerSaysWhyOnceAndFindsTheNextCheckpoint(self):
    train_dir = self.create_tempdir().full_path
    first = trainer_helpers.WriteStepCheckpoint(train_dir, 5)
    runner = _WaitingRunner(train_dir, max_steps=800)
    sleeps = []

    def _Sleep(seconds):
      sleeps.append(seconds)
      if len(sleeps) == 3:  # Training writes a new checkpoint while the runner waits.
        trainer_helpers.WriteStepCheckpoint(train_dir, 10)

    with mock.patch.object(eval_wait.time, 'sleep', side_effect=_Sleep), \
         mock.patch.object(tf.logging, 'warning') as warning:
      found = runner._FindNewCheckpoint(None, {first})
    self.assertEqual(found, os.path.join(train_dir, 'ckpt-00000010'))
    self.assertLen(sleeps, 3)
    self.assertLen(warning.call_args_list, 1)  # Once, not once per poll.
    message = warning.call_args.args[0] % warning.call_args.args[1:]
    self.assertIn('evaler_test evaluates the checkpoints', message)
    self.assertIn('run --job=evaler_once_test@5', message)


class _WaitingRunner(eval_wait.ExplainedCheckpointWait):
  """What ExplainedCheckpointWait uses of Lingvo's Evaler: job name, checkpoint dir, params."""

  def __init__(self, train_dir, max_steps):
    self._job_name = 'evaler_test'
    self._checkpointer = collections.namedtuple('Checkpointer', 'checkpoint_dir')(train_dir)
    self.params = registry.ModelParams(MODEL, 'Test')
    self.params.train.max_steps = max_steps

  def _ShouldStop(self, sess, step):
    del sess
    return step >= self.params.train.max_steps


if __name__ == '__main__':
  tf.test.main()
