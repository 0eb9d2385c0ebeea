"""tensorpipe.trainer.job_failure: the line a job ended with is read back by the tasks of that run,
and an earlier run's is not; a process's start is when it started, not when it asks."""

import os
import subprocess
import sys
import tempfile
import time
import unittest

from tensorpipe.trainer import job_failure
from tests import helpers

_LINE = "TensorPipeLayer 'pipe': the batch_dim check failed"


class JobFailureTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self._dir = tempfile.TemporaryDirectory()  # pylint: disable=consider-using-with
    self.addCleanup(self._dir.cleanup)
    self.logdir = self._dir.name

  def testTheRecordedLineIsReadBack(self):
    self.assertIsNone(job_failure.Recorded(self.logdir, since=0))  # Nothing recorded.
    job_failure.Record(self.logdir, _LINE)
    with open(os.path.join(self.logdir, 'tensorpipe_job_failure.txt')) as f:
      self.assertEqual(f.read(), _LINE + '\n')
    self.assertEqual(job_failure.Recorded(self.logdir, since=time.time()), _LINE)

  def testAnEarlierRunsRecordCountsForNothing(self):
    job_failure.Record(self.logdir, _LINE)
    os.utime(os.path.join(self.logdir, job_failure.FILE), (1000, 1000))
    self.assertIsNone(job_failure.Recorded(self.logdir, since=1002))  # Written before the start.
    self.assertEqual(job_failure.Recorded(self.logdir, since=1000.5), _LINE)  # Within the margin.

  def testAnEmptyRecordCountsForNothing(self):
    job_failure.Record(self.logdir, '')
    self.assertIsNone(job_failure.Recorded(self.logdir, since=0))

  def testARecordNobodyCanWriteRaises(self):
    with self.assertRaises(OSError):
      job_failure.Record(os.path.join(self.logdir, 'no-such-dir'), _LINE)

  def testProcessStartIsWhenTheProcessStarted(self):
    # A child started now, which sleeps 2 s before it asks: its start is the start, not the ask.
    before = time.time()
    out = subprocess.run(
        [sys.executable, '-c', 'import time; time.sleep(2); from tensorpipe.trainer import '
         'job_failure; print(repr(job_failure.ProcessStart()), repr(time.time()))'],
        cwd=helpers.REPO, capture_output=True, text=True, timeout=60, check=True).stdout
    start, asked = (float(x) for x in out.split())
    # The kernel gives the boot time in whole seconds (and the start in ticks): the start may
    # read up to a second early.
    self.assertLessEqual(before - 1.5, start)
    self.assertLessEqual(start + 2.0, asked)
    self.assertLessEqual(job_failure.ProcessStart(), time.time())


if __name__ == '__main__':
  unittest.main()
