"""The trainer's checks before any job starts (tensorpipe.trainer.validation.Validate)."""

import os
import re
import tempfile
from unittest import mock

from absl.testing import flagsaver
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import registry
from tensorpipe.trainer import startup_plan
from tensorpipe.trainer import validation
from tests import trainer_helpers

MODEL = 'digits.TinyConvPipeline'


class ValidateTest(test_utils.TestCase):

  def _Validate(self, **flags):
    defaults = dict(model=MODEL, mode='sync', run_locally='cpu', logdir=self.get_temp_dir(),
                    cpu_devices=4, worker_split_size=4, job='')
    defaults.update(flags)
    with flagsaver.flagsaver(**defaults):
      validation.Validate()

  def testValidConfiguration(self):
    self._Validate()

  def testPlanIsLoggedAndItsFlagsApply(self):
    cache_dir = self.create_tempdir().full_path
    with mock.patch.object(startup_plan, '_Log') as log:
      self._Validate(tensorpipe_plan=4, tensorpipe_plan_device='V100-16GB',
                     tensorpipe_plan_cache_dir=cache_dir)
    lines = [call.args[1] for call in log.call_args_list if call.args[0] == 'plan: %s']
    progress = [call.args[1] for call in log.call_args_list if call.args[0] == 'planning: %s']
    self.assertEqual(progress[0], 'cost model: building the distinct layers of 4: 4 to do')
    self.assertTrue(progress[-1].startswith('simulating steps, best first by a lower bound: done '
                                            'in '), progress)
    self.assertNotEmpty(os.listdir(os.path.join(cache_dir, 'layer_facts')))
    self.assertIn('rank', lines[1])
    best = re.search(r'best: S=(\d+) K=(\d+) M=(\d+) (\S+) (\S+); train it with: '
                     r'--worker_gpus=(\d+) --worker_split_size=(\d+) '
                     r'--model_params_override="(.*)"', lines[-1])
    s, k, m, sched, recompute, gpus, split, override = best.groups()
    self.assertEqual((int(gpus), int(split)), (int(s) * int(k), int(k)))
    with flagsaver.flagsaver(model_params_override=override):
      cfg = registry.ModelParams(MODEL, 'Train')
    p = cfg.task.pipeline
    self.assertEqual((p.num_devices, p.num_micro_batches, p.schedule, p.recompute),
                     (int(k), int(m), sched, recompute))

  def testPlanWithABadCacheDirectory(self):
    not_a_dir = self.create_tempfile().full_path
    with self.assertRaisesRegex(registry.UsageError, r"^--tensorpipe_plan_cache_dir: cache "
                                r"directory '%s/c' cannot be created \(Not a directory\); give a "
                                r"writable directory, or --tensorpipe_plan_cache_dir=none$" %
                                re.escape(not_a_dir)):
      self._Validate(tensorpipe_plan=4, tensorpipe_plan_device='V100-16GB',
                     tensorpipe_plan_cache_dir=not_a_dir + '/c')

  def testPlanWithAnUnknownProfile(self):
    with self.assertRaisesRegex(registry.UsageError, r"--tensorpipe_plan: unknown device profile "
                                r"'V200'; known profiles: cpu, A100-40GB"):
      self._Validate(tensorpipe_plan=4, tensorpipe_plan_device='V200',
                     tensorpipe_plan_cache_dir='none')

  def testTooFewCpuDevices(self):
    with self.assertRaisesRegex(registry.UsageError, r'needs 4 devices per model split.*'
                                r'--cpu_devices=2'):
      self._Validate(cpu_devices=2, worker_split_size=2)

  def testMissingDataDir(self):
    missing = os.path.join(self.get_temp_dir(), 'no-such-dir')
    with self.assertRaisesRegex(registry.UsageError,
                                r"data directory '.*no-such-dir' of dataset Train"):
      self._Validate(model_params_override='input.data_dir: %s' % missing)

  def testSyntheticInputNeedsNoDataDir(self):
    missing = os.path.join(self.get_temp_dir(), 'no-such-dir')
    self._Validate(model='resnet.ImageNetResNet101',
                   model_params_override='input.synthetic: True; input.data_dir: %s' % missing)
    with self.assertRaisesRegex(registry.UsageError, r"data directory '.*no-such-dir'"):
      self._Validate(model='resnet.ImageNetResNet101',
                     model_params_override='input.data_dir: %s' % missing)

  def testEvalWithoutCheckpoint(self):
    with self.assertRaisesRegex(registry.UsageError, 'no checkpoint in .*train to evaluate'):
      self._Validate(job='evaler_test', logdir=tempfile.mkdtemp(dir=self.get_temp_dir()))


class TaskTrainOverrideTest(test_utils.TestCase):
  """A task.train override the trainer does not read is named once, with the override to use."""

  def testWarnsOnceNamingTheKeyAndTheFix(self):
    with mock.patch.object(tf.logging, 'warning') as warning, flagsaver.flagsaver(
        model=MODEL, mode='sync', run_locally='cpu', logdir=self.get_temp_dir(), cpu_devices=4,
        worker_split_size=4, job='controller,trainer_client,evaler_test',
        model_params_override='task.train.max_steps: 750'):
      validation.Validate()
    messages = [c.args[0] % c.args[1:] for c in warning.call_args_list]
    unread = [m for m in messages if 'task.train.max_steps' in m]
    self.assertLen(unread, 1, messages)
    self.assertIn('which the trainer does not read', unread[0])
    self.assertIn('--model_params_override="train.max_steps: 750"', unread[0])


class EarlyStoppedRunTest(test_utils.TestCase):
  """Evaluating a run that stopped before train.max_steps: the check says what to run instead."""

  def _Validate(self, logdir, job, override=''):
    with mock.patch.object(tf.logging, 'warning') as warning, flagsaver.flagsaver(
        model=MODEL, mode='sync', run_locally='cpu', logdir=logdir, cpu_devices=4,
        worker_split_size=4, job=job, model_params_override=override):
      validation.Validate()
    return [c.args[0] % c.args[1:] for c in warning.call_args_list]

  def testPreflightOfAnEarlyStoppedRun(self):
    logdir = self.create_tempdir().full_path
    ckpt = trainer_helpers.WriteStepCheckpoint(os.path.join(logdir, 'train'), 5)
    messages = self._Validate(logdir, 'evaler_test')
    self.assertLen(messages, 1)
    self.assertIn('train.max_steps = 800; the latest, %s, is at step 5' % ckpt, messages[0])
    self.assertIn('run --job=evaler_once_test@5', messages[0])
    # The once job, or a fixed checkpoint, evaluates what is there: nothing to say.
    self.assertEqual(self._Validate(logdir, 'evaler_once_test@5'), [])
    self.assertEqual(
        self._Validate(logdir, 'evaler_test', 'task.eval.load_checkpoint_from: %s' % ckpt), [])
    self.assertEqual(self._Validate(logdir, 'evaler_test', 'train.max_steps: 5'), [])
    with self.assertRaisesRegex(registry.UsageError,
                                'task.eval.load_checkpoint_from: .*ckpt-00000009 is no checkpoint'):
      self._Validate(logdir, 'evaler_test',
                     'task.eval.load_checkpoint_from: %s' % ckpt.replace('5', '9'))


if __name__ == '__main__':
  tf.test.main()
