"""This process's task of a --cluster_spec job (tensorpipe.trainer.cluster_task): how it ends when
another task ended the job, or answers at another task's address."""

import os
from unittest import mock

from absl.testing import flagsaver
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import cluster_task
from tensorpipe.trainer import ending
from tensorpipe.trainer import job_failure


class ClusterTaskEndsTest(test_utils.TestCase):
  """How a task of a --cluster_spec job ends when another task ended the job, or answers at another
  task's address."""

  def testALostTaskThatEndedTheJobIsNamedByItsLine(self):
    logdir = self.create_tempdir().full_path
    with open(os.path.join(logdir, 'tensorpipe_job_failure.txt'), 'w') as f:
      f.write('training step 8 did not finish within --step_timeout_s=10 s (...)\n')
    task = object.__new__(cluster_task.ClusterTask)  # Only its handlers run here.
    task.job = 'controller'
    with flagsaver.flagsaver(logdir=logdir), mock.patch.object(ending, 'Exit') as exit_, \
        mock.patch.object(ending, 'Fail') as fail:
      task._OnLost('task trainer_client:0 at 10.0.0.2:7001 stopped answering: no answer for 60 s '
                   '([Errno 111] Connection refused)')  # pylint: disable=protected-access
    fail.assert_called_once_with('training step 8 did not finish within --step_timeout_s=10 s '
                                 '(...)')
    exit_.assert_called_once_with(ending.ERROR_EXIT_CODE)

  def testATaskAtAnotherTasksAddressEndsTheJob(self):
    with mock.patch.object(ending, 'EndJob') as end:
      on_wrong_task = cluster_task.ClusterTask._OnWrongTask  # pylint: disable=protected-access
      on_wrong_task('--cluster_spec puts task worker:1 at ...')
    end.assert_called_once_with('--cluster_spec puts task worker:1 at ...', record=True)

  def testOtherTasksOfAClusterJobEndWithTheRecordedLine(self):
    """The controller and the workers end with the line the trainer client recorded in --logdir;
    a line an earlier run left there ends nothing."""
    logdir = self.create_tempdir().full_path
    path = os.path.join(logdir, job_failure.FILE)
    with open(path, 'w') as f:
      f.write("TensorPipeLayer 'pipe': the batch_dim check failed\n")
    task = object.__new__(cluster_task.ClusterTask)  # Only its watch of recorded failures runs.
    task._stop = mock.Mock()  # pylint: disable=protected-access
    task._stop.wait.side_effect = [False, False, True]  # pylint: disable=protected-access
    with flagsaver.flagsaver(logdir=logdir), mock.patch.object(ending, 'Exit') as exit_, \
        mock.patch.object(ending, 'Fail') as fail:
      os.utime(path, (0, 0))  # Written before this process started: an earlier run's.
      task._WatchJobFailure()  # pylint: disable=protected-access
      fail.assert_not_called()
      os.utime(path, None)
      task._stop.wait.side_effect = [False, True]  # pylint: disable=protected-access
      task._WatchJobFailure()  # pylint: disable=protected-access
    fail.assert_called_once_with("TensorPipeLayer 'pipe': the batch_dim check failed")
    exit_.assert_called_once_with(ending.ERROR_EXIT_CODE)


if __name__ == '__main__':
  tf.test.main()
