"""The trainer's progress lines around a run (tensorpipe.trainer.run_summary)."""

import os
from unittest import mock

from absl.testing import flagsaver
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import run_summary


class RunSummaryTest(test_utils.TestCase):

  def _WriteScore(self, logdir, step, text):
    eval_dir = os.path.join(logdir, 'eval_test')
    os.makedirs(eval_dir, exist_ok=True)
    with open(os.path.join(eval_dir, 'score-%08d.txt' % step), 'w', encoding='utf-8') as f:
      f.write(text)

  def testLatestScoreReadsTheNewestScoreFile(self):
    logdir = self.create_tempdir().full_path
    self.assertIsNone(run_summary.LatestScore(logdir, 'Test'))
    self._WriteScore(logdir, 90, 'accuracy: 0.5\n')
    self._WriteScore(logdir, 100, 'accuracy: 0.875\ntotal_samples: 359\nnote: text\n')
    self.assertEqual(run_summary.LatestScore(logdir, 'Test'),
                     (100, {'accuracy': 0.875, 'total_samples': 359.0}))

  def testOutcomeNamesTheEvalersScores(self):
    logdir = self.create_tempdir().full_path
    self._WriteScore(logdir, 100, 'accuracy: 0.875\n')
    with flagsaver.flagsaver(logdir=logdir), mock.patch.object(run_summary, '_Log') as log:
      run_summary.LogOutcome(['evaler_once_test@100'])
    log.assert_called_once_with('eval %s at step %d: %s', 'test', 100, 'accuracy 0.8750')

  def testPlanNamesTheSplitsOfTheCpuDevices(self):
    with flagsaver.flagsaver(model='digits.TinyConvPipeline', logdir='/logs', mode='sync',
                             cpu_devices=4, worker_split_size=2, cluster_spec='',
                             worker_tasks_per_replica=None), \
        mock.patch.object(run_summary, '_Log') as log:
      run_summary.LogPlan(['controller', 'trainer_client'])
    lines = [c.args[0] % c.args[1:] for c in log.call_args_list]
    self.assertEqual(lines[0], 'model digits.TinyConvPipeline, jobs controller,trainer_client, '
                     'mode sync, logdir /logs')
    self.assertEqual(lines[1], '4 logical CPU devices in this process; 2 model splits of 2 devices '
                     '(partition k of a TensorPipeLayer on /device:CPU:2*s+k), data parallel: '
                     'split s gets 1/2 of each batch')
    self.assertEqual(lines[-1], 'view with: tensorboard --logdir=/logs')


if __name__ == '__main__':
  tf.test.main()
