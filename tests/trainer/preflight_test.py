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
    # Held bound, never listening: connections are refused and no other process can take the port.
    with socket.socket() as held:
      held.bind(('127.0.0.1', 0))
      port = held.getsockname()[1]
      clock = _FakeClock()
      with self.assertRaisesRegex(registry.UsageError,
                                  r'task worker:0 at 127.0.0.1:%d is not reachable after 5 s' % port):
        preflight.WaitForWorkers({'worker': ['127.0.0.1:%d' % port]}, timeout_s=5, poll_s=0.5,
                                 clock=clock.Now, sleep=clock.Sleep)
      self.assertGreater(clock.now, 5)  # It tried until the deadline, not once.
      self.assertLessEqual(clock.now, 5.5)

  def testReachableWorkerIsFoundWithoutWaiting(self):
    with socket.socket() as listening:
      listening.bind(('127.0.0.1', 0))
      listening.listen()
      clock = _FakeClock()
      preflight.WaitForWorkers({'worker': ['127.0.0.1:%d' % listening.getsockname()[1]],
                                'controller': ['127.0.0.1:1']}, timeout_s=5, clock=clock.Now,
                               sleep=clock.Sleep)
      self.assertEqual(clock.now, 0)  # Only worker tasks are waited for.


class _FakeClock:
  """Time that passes only when the code under test sleeps."""

  def __init__(self):
    self.now = 0.0

  def Now(self):
    return self.now

  def Sleep(self, seconds):
    self.now += seconds


if __name__ == '__main__':
  test_utils.main()
