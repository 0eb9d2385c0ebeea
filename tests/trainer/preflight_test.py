"""Checks before any job starts: the model's pipelines, its data directories, the worker tasks."""

import os
import socket

from lingvo.core import base_model
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

  def testOverrideKeys(self):
    self.assertEqual(preflight.OverrideKeys('task.train.max_steps: 750; train.max_steps:5\n'
                                            '# a comment: no key\ninput.data_dir : /x:y'),
                     ['task.train.max_steps', 'train.max_steps', 'input.data_dir'])
    self.assertEqual(preflight.OverrideKeys(''), [])

  def _Unused(self, override):
    # As Lingvo applies --model_params_override, after building the params.
    cfg = registry.ModelParams(MODEL, 'Train').FromText(override.replace(';', '\n'))
    return preflight.UnusedTaskTrainOverrides(cfg, override)

  def testTaskTrainOverrideTheTrainerDoesNotReadIsNamedWithTheFix(self):
    messages = self._Unused('task.train.max_steps: 750; task.train.save_interval_steps: 10')
    self.assertLen(messages, 2)
    self.assertIn('sets task.train.max_steps: 750, which the trainer does not read', messages[0])
    self.assertIn('train.max_steps (still 800)', messages[0])
    self.assertIn('--model_params_override="train.max_steps: 750"', messages[0])
    self.assertIn('--model_params_override="train.save_interval_steps: 10"', messages[1])

  def testOverridesTheTrainerReadsAreNotNamed(self):
    self.assertEqual(self._Unused('train.max_steps: 750'), [])
    self.assertEqual(self._Unused('train.max_steps: 750; task.train.max_steps: 750'), [])
    # The learning rate is the task's own: its learner reads task.train.
    self.assertEqual(self._Unused('task.train.learning_rate: 0.5'), [])

  def testModelLevelTrainKeysAreTheOnesLingvoCopiesFromTheTask(self):
    task = base_model.BaseTask.Params().Set(name='task')
    model = base_model.SingleTaskModel.Params(task.Copy())
    shared = [k for k, _ in model.train.IterParams() if k in task.train]
    markers = {k: object() for k in shared}
    task.train.Set(**markers)
    base_model.SingleTaskModel.CopyTaskParams(task, model)
    copied = sorted(k for k in shared if model.train.Get(k) is markers[k])
    self.assertEqual(copied, sorted(preflight.MODEL_LEVEL_TRAIN_KEYS))

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
