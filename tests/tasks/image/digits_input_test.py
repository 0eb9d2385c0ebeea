"""DigitsInput: the held-out split, train and eval batches, data directories, the tfds source."""

import os
import shutil
import tempfile
from unittest import mock

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.tasks.image import digits_input


class DigitsInputTest(test_utils.TestCase):

  def _Params(self, split, batch_size=32, **kwargs):
    return digits_input.DigitsInput.Params().Set(split=split, batch_size=batch_size, **kwargs)

  def testDeterministicHeldOutSplit(self):
    from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
    images, labels = load_digits(return_X_y=True)
    train_x, train_y = digits_input.LoadArrays(self._Params('train'))
    test_x, test_y = digits_input.LoadArrays(self._Params('test'))
    all_x, _ = digits_input.LoadArrays(self._Params('all'))
    self.assertEqual(train_x.shape, (1438, 8, 8, 1))
    self.assertEqual(test_x.shape, (359, 8, 8, 1))
    self.assertEqual(all_x.shape[0], 1797)
    # The held-out split is the last 20% of the rows, in order.
    self.assertAllClose(test_x.reshape([-1, 64]), images[-359:] / 16.0)
    self.assertAllEqual(test_y, labels[-359:])
    self.assertAllEqual(train_y, labels[:1438])
    self.assertEqual(train_x.dtype, np.float32)
    self.assertBetween(float(train_x.min()), 0.0, 0.0)
    self.assertBetween(float(train_x.max()), 1.0, 1.0)

  def _Batches(self, p, num_batches, reset_after=None):
    graph = tf.Graph()
    with graph.as_default():
      inp = p.Instantiate()
      batch = inp.GetPreprocessedInputBatch()
    out = []
    with tf.Session(graph=graph) as sess:
      inp.Initialize(sess)
      for i in range(num_batches):
        if reset_after is not None and i == reset_after:
          inp.Reset(sess)
        try:
          out.append(sess.run(batch))
        except tf.errors.OutOfRangeError:
          out.append(None)
    return out

  def testTrainBatchesRepeatShuffledWithShifts(self):
    batches = self._Batches(self._Params('train', batch_size=64, max_shift=1), 30)
    labels = np.concatenate([b.label for b in batches])
    for b in batches:
      self.assertEqual(b.image.shape, (64, 8, 8, 1))
      self.assertEqual(b.image.dtype, np.float32)
      self.assertAllEqual(b.weight, np.ones([64]))
      self.assertBetween(float(b.image.min()), 0.0, 1.0)
      self.assertBetween(float(b.image.max()), 0.0, 1.0)
    self.assertEqual(set(labels.tolist()), set(range(10)))
    # 30 x 64 > 1438: the split repeats; shuffled, so not in file order.
    self.assertGreater(labels.size, 1438)
    _, file_labels = digits_input.LoadArrays(self._Params('train'))
    self.assertNotAllEqual(labels[:64], file_labels[:64])

  def testEvalCoversTheSplitOnceWithPaddingAndResets(self):
    batches = self._Batches(self._Params('test', batch_size=100), 6, reset_after=5)
    self.assertIsNone(batches[4])  # 359 examples = 3 full batches + 59, then OutOfRange.
    weights = np.concatenate([b.weight for b in batches[:4]])
    self.assertEqual(weights.sum(), 359)
    self.assertAllEqual(batches[3].weight, [1.0] * 59 + [0.0] * 41)
    _, test_y = digits_input.LoadArrays(self._Params('test'))
    labels = np.concatenate([b.label for b in batches[:4]])[:359]
    self.assertAllEqual(labels, test_y)  # In order, each example once.
    self.assertAllEqual(batches[5].label, batches[0].label)  # Reset restarts the split.

  def testMissingDataDirNamesIt(self):
    missing = os.path.join(tempfile.gettempdir(), 'no-such-digits-dir')
    with self.assertRaisesRegex(ValueError, 'no-such-digits-dir.*does not exist'):
      self._Params('train', data_dir=missing).Instantiate()
    with self.assertRaisesRegex(ValueError, 'no-such-digits-dir'):
      digits_input.DigitsInput.CheckDataSource(self._Params('train', data_dir=missing))

  def testDataDirWithoutTheFileNamesIt(self):
    with tempfile.TemporaryDirectory() as tmp:
      with self.assertRaisesRegex(ValueError, 'has no digits.csv.gz'):
        digits_input.LoadArrays(self._Params('train', data_dir=tmp))

  def testTfdsSourceIsSwappedInByParams(self):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    images = np.arange(5 * 28 * 28, dtype=np.uint8).reshape([5, 28, 28, 1])
    labels = np.array([3, 1, 4, 1, 5], np.int64)
    calls = []

    def FakeLoad(name, **kwargs):
      calls.append((name, kwargs))
      return tf.constant(images), tf.constant(labels)

    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(tfds, 'load', FakeLoad):
      p = self._Params('test', tfds_name='mnist', data_dir=tmp, image_shape=(28, 28, 1),
                       max_pixel=255.0)
      x, y = digits_input.LoadArrays(p)
    self.assertEqual(calls, [('mnist', dict(split='test', data_dir=tmp, download=False,
                                            batch_size=-1, as_supervised=True))])
    self.assertEqual(x.shape, (5, 28, 28, 1))
    self.assertAllClose(x, images.astype(np.float32) / 255.0)
    self.assertAllEqual(y, labels)
    self.assertEqual(y.dtype, np.int32)

  def testDataDirCopyGivesTheSameData(self):
    with tempfile.TemporaryDirectory() as tmp:
      shutil.copy(os.path.join(digits_input.SklearnDataDir(), 'digits.csv.gz'), tmp)
      x, y = digits_input.LoadArrays(self._Params('test', data_dir=tmp))
    ref_x, ref_y = digits_input.LoadArrays(self._Params('test'))
    self.assertAllEqual(x, ref_x)
    self.assertAllEqual(y, ref_y)


if __name__ == '__main__':
  tf.test.main()
