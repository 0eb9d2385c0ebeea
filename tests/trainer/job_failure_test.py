"""tensorpipe.trainer.job_failure: the line a job ended with is read back by the tasks of that run,
and an earlier run's is not, even by tasks started again at once; a process's start is when it
started, not when it asks."""

import os
import subprocess
import sys
import tempfile
import time
import unittest

from tensorpipe.trainer import job_failure
from tests import helpers

_LINE = "TensorPipeLayer 'pipe': the batch_dim check failed"

# A task started again: its first look at the record, as it ends (argv[1] is the logdir); prints
# what it reads, or None.
_RESTARTED_TASK = """
import sys
from tensorpipe.trainer import job_failure
print(repr(job_failure.Records(sys.argv[1], job_failure.ProcessStart()).Line()))
"""


class JobFailureTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self._dir = tempfile.TemporaryDirectory()  # pylint: disable=consider-using-with
    self.addCleanup(self._dir.cleanup)
    self.logdir = self._dir.name
    self.path = os.path.join(self.logdir, job_failure.FILE)

  def testTheRecordedLineIsReadBack(self):
    records = job_failure.Records(self.logdir, since=time.time())
    self.assertIsNone(records.Line())  # Nothing recorded.
    job_failure.Record(self.logdir, _LINE)
    with open(self.path, encoding='utf-8') as f:
      self.assertEqual(f.read(), _LINE + '\n')
    self.assertEqual(records.Line(), _LINE)
    self.assertEqual(os.listdir(self.logdir), [job_failure.FILE])  # No partial file left.

  def testAnEarlierRunsRecordCountsForNothing(self):
    job_failure.Record(self.logdir, _LINE)
    os.utime(self.path, (1000, 1000))
    # There at the first look and written before the start: an earlier run's.
    self.assertIsNone(job_failure.Records(self.logdir, since=1000.001).Line())
    # Written after the start (a failure while this task was still starting): this run's.
    self.assertEqual(job_failure.Records(self.logdir, since=999.999).Line(), _LINE)

  def testARecordWrittenAfterTheFirstLookCountsWhateverItsTime(self):
    job_failure.Record(self.logdir, 'an earlier run\'s line')
    os.utime(self.path, (1000, 1000))
    records = job_failure.Records(self.logdir, since=2000)
    self.assertIsNone(records.Line())
    job_failure.Record(self.logdir, _LINE)
    os.utime(self.path, (1000, 1000))  # The host that wrote it has a clock far behind.
    self.assertEqual(records.Line(), _LINE)

  def testTasksStartedAgainAtOnceDoNotReadTheRecordOfTheRunTheyFollow(self):
    # A scheduler starts the job again as soon as it ended: half a second after its record.
    job_failure.Record(self.logdir, _LINE)
    written = time.time() - 0.5
    os.utime(self.path, (written, written))
    out = subprocess.run([sys.executable, '-c', _RESTARTED_TASK, self.logdir], cwd=helpers.REPO,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    self.assertEqual(out.strip(), 'None')

  def testAnEmptyRecordCountsForNothing(self):
    records = job_failure.Records(self.logdir, since=0)
    job_failure.Record(self.logdir, '')
    self.assertIsNone(records.Line())

  def testARecordNobodyCanWriteRaises(self):
    with self.assertRaises(OSError):
      job_failure.Record(os.path.join(self.logdir, 'no-such-dir'), _LINE)

  def testAFailedRecordLeavesNoPartialFile(self):
    os.mkdir(self.path)  # The record's name is taken by a directory: the rename fails.
    with self.assertRaises(OSError):
      job_failure.Record(self.logdir, _LINE)
    self.assertEqual(os.listdir(self.logdir), [job_failure.FILE])

  def testProcessStartIsWhenTheProcessStarted(self):
    # A child started now, which sleeps 2 s before it asks: its start is the start, not the ask.
    before = time.time()
    out = subprocess.run(
        [sys.executable, '-c', 'import time; time.sleep(2); from tensorpipe.trainer import '
         'job_failure; print(repr(job_failure.ProcessStart()), repr(time.time()))'],
        cwd=helpers.REPO, capture_output=True, text=True, timeout=60, check=True).stdout
    start, asked = (float(x) for x in out.split())
    # The kernel gives the start in clock ticks: it may read up to a tick (10 ms) early.
    self.assertLessEqual(before - 0.05, start)
    self.assertLessEqual(start + 2.0, asked)
    self.assertLessEqual(job_failure.ProcessStart(), time.time())


if __name__ == '__main__':
  unittest.main()
