"""The trainer's flags (tensorpipe.trainer.flags): defined, and listed by the trainer's --help."""

from absl import flags
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import flags as trainer_flags
from tensorpipe.trainer import train


class FlagsTest(test_utils.TestCase):

  def testTheTrainersKeyFlagsAreTheFlagsItsHelpLists(self):
    # absl's --help lists the main module's key flags; train adopts this module's.
    keys = {f.name for f in flags.FLAGS.get_key_flags_for_module(train.__name__)}
    self.assertEqual(keys, {f.name for f in
                            flags.FLAGS.get_key_flags_for_module(trainer_flags.__name__)})
    self.assertTrue({'cpu_devices', 'list_models', 'params_module', 'worker_tasks_per_replica',
                     'startup_timeout_s', 'lost_task_timeout_s', 'step_timeout_s',
                     'sigterm_grace_s'} <= keys, keys)
    self.assertTrue({'tensorpipe_plan', 'tensorpipe_plan_device', 'tensorpipe_plan_quick'} <= keys,
                    keys)
    self.assertTrue({'model', 'logdir', 'mode', 'run_locally', 'job', 'task', 'cluster_spec',
                     'worker_split_size', 'model_params_override'} <= keys, keys)

  def testDefaults(self):
    self.assertEqual((trainer_flags.FLAGS['step_timeout_s'].default,
                      trainer_flags.FLAGS['startup_timeout_s'].default,
                      trainer_flags.FLAGS['lost_task_timeout_s'].default,
                      trainer_flags.FLAGS['sigterm_grace_s'].default), (600, 120, 60, 60))
    self.assertIsNone(trainer_flags.FLAGS['cpu_devices'].default)


if __name__ == '__main__':
  tf.test.main()
