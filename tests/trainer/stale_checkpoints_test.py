"""What killed checkpoint saves leave in train/ goes at the next start; committed checkpoints stay."""

import os
from unittest import mock

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import stale_checkpoints


def _Save(train_dir, steps, max_to_keep=5):
  """Saves a tiny variable (value = step) as committed checkpoints ckpt-<step, 8 digits>, sharded
  as Lingvo's checkpointer saves, with the `checkpoint` state file naming them."""
  with tf.Graph().as_default():
    var = tf.get_variable('w', initializer=np.zeros([2], np.float32))
    saver = tf.train.Saver([var], sharded=True, max_to_keep=max_to_keep, pad_step_number=True)
    with tf.Session() as sess:
      for step in steps:
        sess.run(var.assign([step, step]))
        saver.save(sess, os.path.join(train_dir, 'ckpt'), global_step=step)


def _Touch(path, text='x'):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(text)


def _KilledSaves(train_dir):
  """What killed saves leave: shard directories of saves killed before their merge, and the merged
  files of a save killed before its commit (step 30, newer than any committed one)."""
  for step in (25, 30, 40):
    _Touch(os.path.join(train_dir, 'ckpt-%08d_temp' % step, 'part-00000-of-00002.index'))
    _Touch(os.path.join(train_dir, 'ckpt-%08d_temp' % step, 'part-00000-of-00002.data-00000-of-'
                        '00001'))
  for suffix in ('.index', '.data-00000-of-00002', '.data-00001-of-00002', '.meta'):
    _Touch(os.path.join(train_dir, 'ckpt-00000030' + suffix))
  return ['ckpt-00000025_temp', 'ckpt-00000030.data-00000-of-00002',
          'ckpt-00000030.data-00001-of-00002', 'ckpt-00000030.index', 'ckpt-00000030.meta',
          'ckpt-00000030_temp', 'ckpt-00000040_temp']


class StaleCheckpointsTest(test_utils.TestCase):

  def testKilledSavesGoCommittedCheckpointsStay(self):
    train_dir = self.create_tempdir().full_path
    _Save(train_dir, [10, 20])
    committed = sorted(os.listdir(train_dir))
    self.assertIn('ckpt-00000020.index', committed)
    # An older checkpoint the state file does not name (a copy kept on purpose) stays, as does a
    # failed sanity check's record.
    for name in ('ckpt-00000005.index', 'ckpt-00000005.data-00000-of-00001',
                 'ckpt-00000030.failed'):
      _Touch(os.path.join(train_dir, name))
    stale = _KilledSaves(train_dir)
    with mock.patch.object(tf.logging, 'info') as info:
      self.assertEqual(stale_checkpoints.RemoveStale(train_dir), stale)
    self.assertEqual(sorted(os.listdir(train_dir)),
                     sorted(committed + ['ckpt-00000005.index', 'ckpt-00000005.data-00000-of-00001',
                                         'ckpt-00000030.failed']))
    self.assertLen(info.call_args_list, 1)
    line = info.call_args.args[0] % info.call_args.args[1:]
    self.assertEqual(
        line, 'TensorPipe: removed what killed checkpoint saves left in %s: ckpt-00000025_temp/, '
        'ckpt-00000030.data-00000-of-00002, ckpt-00000030.data-00001-of-00002, '
        'ckpt-00000030.index, ckpt-00000030.meta, ckpt-00000030_temp/, ckpt-00000040_temp/ (the '
        'committed checkpoints stay; the latest is ckpt-00000020)' % train_dir)
    # Both committed checkpoints still restore, with their own values.
    for step in (10, 20):
      reader = tf.train.load_checkpoint(os.path.join(train_dir, 'ckpt-%08d' % step))
      self.assertAllEqual(reader.get_tensor('w'), [step, step])
    self.assertEqual(tf.train.latest_checkpoint(train_dir),
                     os.path.join(train_dir, 'ckpt-00000020'))
    # Nothing left to remove: nothing is logged.
    with mock.patch.object(tf.logging, 'info') as info:
      self.assertEqual(stale_checkpoints.RemoveStale(train_dir), [])
    info.assert_not_called()

  def testEveryCheckpointTheStateFileNamesStays(self):
    # The state file names ckpt-00000020 and ckpt-00000030 (max_to_keep 2); a killed save's files
    # at step 25, between them, are older than the latest and stay: only newer ones are a killed
    # save's for sure.
    train_dir = self.create_tempdir().full_path
    _Save(train_dir, [10, 20, 30], max_to_keep=2)
    _Touch(os.path.join(train_dir, 'ckpt-00000025.index'))
    _Touch(os.path.join(train_dir, 'ckpt-00000035.index'))
    before = set(os.listdir(train_dir))
    self.assertEqual(stale_checkpoints.RemoveStale(train_dir), ['ckpt-00000035.index'])
    self.assertEqual(set(os.listdir(train_dir)), before - {'ckpt-00000035.index'})
    self.assertNotIn('ckpt-00000010.index', before)  # The saver's own garbage collection.

  def testWithoutAStateFileOnlyTempDirectoriesGo(self):
    # Nothing tells a committed checkpoint from a killed save's: the checkpoint files stay.
    train_dir = self.create_tempdir().full_path
    _Save(train_dir, [10])
    os.remove(os.path.join(train_dir, 'checkpoint'))
    stale = _KilledSaves(train_dir)
    self.assertEqual(stale_checkpoints.RemoveStale(train_dir),
                     [name for name in stale if name.endswith('_temp')])
    self.assertTrue(os.path.exists(os.path.join(train_dir, 'ckpt-00000030.index')))
    self.assertTrue(os.path.exists(os.path.join(train_dir, 'ckpt-00000010.index')))

  def testNoTrainDirectory(self):
    self.assertEqual(
        stale_checkpoints.RemoveStale(os.path.join(self.create_tempdir().full_path, 'train')), [])


if __name__ == '__main__':
  tf.test.main()
