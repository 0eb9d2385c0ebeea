"""Checks before any job starts: the model's pipelines, its data directories, the worker tasks."""

import os
import socket

from lingvo.core import test_utils

from tensorpipe.trainer import preflight
from tensorpipe.trainer import registry

MODEL = 'digits.TinyConvPipeline'


class PreflightTest(test_utils.TestCase):

  def testPipelinePartitions(self):
    cfg = registry.ModelRegistry.GetParams(MODEL, 'Train')
    self.assertEqual(preflight.PipelinePartitions(cfg), [('task.pipeline', 'pipeline', 4)])

  def testMissingDataDirIsNamed(self):
    cfg = registry.ModelParams(MODEL, 'Train')
    cfg.input.data_dir = os.path.join(self.get_temp_dir(), 'no-such-dir')
    with self.assertRaisesRegex(
        registry.UsageError, r"data directory '.*no-such-dir' of dataset Train \(input.data_dir\)"):
      preflight.CheckDataDirs(cfg, 'Train')

  def testClusterSpec(self):
    self.assertEqual(preflight.ParseClusterSpec('worker=127.0.0.1:1,127.0.0.1:2@ps=127.0.0.1:3'),
                     {'worker': ['127.0.0.1:1', '127.0.0.1:2'], 'ps': ['127.0.0.1:3']})
    with self.assertRaisesRegex(registry.UsageError, "--cluster_spec part 'worker' is not JOB="):
      preflight.ParseClusterSpec('worker')

  def testUnreachableWorkerIsNamed(self):
    with socket.socket() as s:  # A free port that nothing listens on once the socket closes.
      s.bind(('127.0.0.1', 0))
      port = s.getsockname()[1]
    with self.assertRaisesRegex(registry.UsageError,
                                r'task worker:0 at 127.0.0.1:%d is not reachable after 1 s' % port):
      preflight.WaitForWorkers({'worker': ['127.0.0.1:%d' % port]}, timeout_s=1, poll_s=0.2)


if __name__ == '__main__':
  test_utils.main()
