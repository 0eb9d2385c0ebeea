"""The trainer's error line and the end of a job (tensorpipe.trainer.ending)."""

import os
from unittest import mock

from absl.testing import flagsaver
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import ending
from tensorpipe.trainer import job_failure


class EndingTest(test_utils.TestCase):

  def testFailWritesOneLineAndReturnsTheStatus(self):
    with mock.patch.object(ending.sys, 'stderr') as stderr:
      self.assertEqual(ending.Fail('no --logdir'), ending.ERROR_EXIT_CODE)
    self.assertEqual(''.join(c.args[0] for c in stderr.write.call_args_list),
                     'tensorpipe.trainer.train: error: no --logdir\n')
    self.assertEqual(ending.ERROR_EXIT_CODE, 2)

  def testEndJobRecordsTheLineForTheOtherTasks(self):
    logdir = self.create_tempdir().full_path
    with flagsaver.flagsaver(logdir=logdir), mock.patch.object(ending, 'Exit') as exit_, \
        mock.patch.object(ending, 'Fail') as fail, mock.patch.object(ending, 'ENDING') as ending_:
      self.assertIsNone(ending.RecordedJobFailure())
      ending.EndJob('the step is stuck', record=True)
      with open(os.path.join(logdir, job_failure.FILE), encoding='utf-8') as f:
        self.assertEqual(f.read(), 'the step is stuck\n')
      self.assertEqual(ending.RecordedJobFailure(), 'the step is stuck')
    ending_.set.assert_called_once_with()
    fail.assert_called_once_with('the step is stuck')
    exit_.assert_called_once_with(ending.ERROR_EXIT_CODE)

  def testEndJobWithoutRecordWritesNothing(self):
    logdir = self.create_tempdir().full_path
    with flagsaver.flagsaver(logdir=logdir), mock.patch.object(ending, 'Exit'), \
        mock.patch.object(ending, 'Fail'), mock.patch.object(ending, 'ENDING'):
      ending.EndJob('an evaler\'s check failed', record=False)
    self.assertFalse(os.path.exists(os.path.join(logdir, job_failure.FILE)))


if __name__ == '__main__':
  tf.test.main()
