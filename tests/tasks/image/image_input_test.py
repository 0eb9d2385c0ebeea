"""ImageInput: missing data named, synthetic batches, image folders through tfds, and Cutout."""

import os
import tempfile

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.tasks.image import image_input
from tensorpipe.trainer import preflight
from tensorpipe.trainer import registry
from tests import trainer_helpers


class ImageInputTest(test_utils.TestCase):

  def testMissingDataDirIsNamed(self):
    missing = os.path.join(tempfile.gettempdir(), 'no-such-imagenet-dir')
    p = image_input.ImageInput.Params().Set(tfds_name='imagenet2012', data_dir=missing)
    with self.assertRaisesRegex(ValueError, "data_dir '.*no-such-imagenet-dir' does not exist"):
      p.Instantiate()
    cfg = trainer_helpers.ModelParams('amoebanet.ImageNetAmoebaNetB18x512')
    cfg.input.data_dir = missing
    with self.assertRaisesRegex(registry.UsageError, 'no-such-imagenet-dir'):
      preflight.CheckDataDirs(cfg, 'Train')

  def testUnpreparedDatasetAndImageFolderAreNamed(self):
    with tempfile.TemporaryDirectory() as tmp:
      p = image_input.ImageInput.Params().Set(tfds_name='imagenet2012', data_dir=tmp,
                                              manual_dir='/manual')
      with self.assertRaisesRegex(ValueError, "'imagenet2012' is not prepared under data_dir "
                                  ".*manual download in manual_dir '/manual'"):
        image_input.CheckDataSource(p)
      p = image_input.ImageInput.Params().Set(tfds_name='image_folder:birdsnap', data_dir=tmp)
      with self.assertRaisesRegex(ValueError, "image folder '.*birdsnap/train' does not exist"):
        image_input.CheckDataSource(p)

  def testSyntheticBatches(self):
    p = image_input.ImageInput.Params().Set(synthetic=True, image_size=16, num_classes=7,
                                            batch_size=4)
    with tf.Graph().as_default():
      batch = p.Instantiate().GetPreprocessedInputBatch()
      with self.session() as sess:
        value = sess.run(batch)
    self.assertEqual(value.image.shape, (4, 16, 16, 3))
    self.assertTrue(np.all((value.label >= 0) & (value.label < 7)))
    self.assertAllEqual(value.weight, np.ones([4]))

  def testImageFolderThroughTensorflowDatasets(self):
    """Real files read by tensorflow-datasets' ImageFolder, resized, flipped and cut out."""
    from PIL import Image  # pylint: disable=g-import-not-at-top
    with tempfile.TemporaryDirectory() as tmp:
      for split in ('train', 'test'):
        for label, value in (('cat', 40), ('dog', 200)):
          folder = os.path.join(tmp, 'pets', split, label)
          os.makedirs(folder)
          for i in range(3):
            Image.fromarray(np.full([10, 12, 3], value + i, np.uint8)).save(
                os.path.join(folder, '%d.png' % i))
      values = {}
      for split in ('train', 'test'):
        p = image_input.ImageInput.Params().Set(
            tfds_name='image_folder:pets', data_dir=tmp, split=split, image_size=16,
            num_classes=2, batch_size=4, cutout_size=6, seed=1)
        with tf.Graph().as_default():
          inp = p.Instantiate()
          batch = inp.GetPreprocessedInputBatch()
          with self.session() as sess:
            inp.Initialize(sess)
            values[split] = [sess.run(batch) for _ in range(2)]
    train_batch = values['train'][0]
    self.assertEqual(train_batch.image.shape, (4, 16, 16, 3))
    self.assertTrue(set(train_batch.label.tolist()) <= {0, 1})
    self.assertTrue(np.any(train_batch.image == 0))  # Cutout in training.
    test_batches = values['test']
    # Eval: 6 images = one full batch and one padded with weight 0, no cutout.
    self.assertAllEqual(np.concatenate([b.weight for b in test_batches]), [1] * 6 + [0] * 2)
    self.assertFalse(np.any(test_batches[0].image == 0))
    pixel = test_batches[0].image[:, 0, 0, 0] * 255.0
    expected = np.where(test_batches[0].label == 0, 41, 201)
    self.assertAllClose(pixel, expected, atol=1.5)

  def testCutoutZeroesOneSquare(self):
    with tf.Graph().as_default():
      out = image_input.Cutout(tf.ones([32, 32, 3]), 8, seed=3)
      with self.session() as sess:
        value = sess.run(out)
    zeros = value[:, :, 0] == 0
    self.assertAllEqual(zeros, value[:, :, 2] == 0)
    self.assertBetween(int(zeros.sum()), 16, 64)  # An 8x8 square, possibly cut by the border.
    rows, cols = np.nonzero(zeros)
    self.assertLessEqual(rows.max() - rows.min(), 7)
    self.assertLessEqual(cols.max() - cols.min(), 7)


if __name__ == '__main__':
  tf.test.main()
