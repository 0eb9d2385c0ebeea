"""Input generator for the handwritten-digits data set shipped with scikit-learn (1797 8x8 images).

The data is real (UCI optical recognition of handwritten digits, as bundled in
`sklearn/datasets/data/digits.csv.gz`), so no download is needed. The split is deterministic: the
last `holdout_fraction` of the rows (in file order) is the held-out 'test' split, the rest is
'train'.

Batches (b = InfeedBatchSize()):
  image:  [b, H, W, C] float32, pixels scaled to [0, 1].
  label:  [b] int32 class ids.
  weight: [b] float32, 1.0 for a real example, 0.0 for padding (only the last batch of a
          non-repeating split is padded, so that every batch has the same static size).

Sources, chosen by params:
  - default: scikit-learn's bundled copy (`data_dir=''`);
  - `data_dir=DIR`: DIR/`file_name` in the same CSV format (64 pixel columns, then the label);
  - `tfds_name=NAME`: a tensorflow-datasets data set already prepared under `data_dir`
    (e.g. 'mnist' with image_shape=(28, 28, 1) and max_pixel=255); nothing is downloaded.

The arrays are kept in host memory and fed to an initializable tf.data iterator
(`array_input.ArrayInput`), so the graph holds no copy of the data set.
"""

import os

import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils

from tensorpipe.tasks import array_input

SPLITS = ('train', 'test', 'all')


def SklearnDataDir():
  """The directory holding scikit-learn's bundled digits.csv.gz."""
  import sklearn.datasets  # pylint: disable=g-import-not-at-top
  return os.path.join(os.path.dirname(sklearn.datasets.__file__), 'data')


def CheckDataDir(p, where='DigitsInput'):
  """Raises ValueError (one line, naming the directory) if the data `p` points at is missing."""
  if not p.data_dir:
    return
  if not isinstance(p.data_dir, str):
    raise ValueError('%s: data_dir must be a directory path, or empty for scikit-learn\'s bundled '
                     'copy; got %r' % (where, p.data_dir))
  if not os.path.isdir(p.data_dir):
    raise ValueError('%s: data_dir %r does not exist or is not a directory' % (where, p.data_dir))
  if not p.tfds_name:
    path = os.path.join(p.data_dir, p.file_name)
    if not os.path.isfile(path):
      raise ValueError('%s: data_dir %r has no %s (expected CSV rows of %d pixels and a label, '
                       'as in scikit-learn\'s digits.csv.gz)' %
                       (where, p.data_dir, p.file_name, int(np.prod(p.image_shape))))


def SplitRows(num_rows, split, holdout_fraction):
  """Row indices of `split`: the last round(holdout_fraction * num_rows) rows are 'test'."""
  num_test = int(round(holdout_fraction * num_rows))
  if split == 'test':
    return np.arange(num_rows - num_test, num_rows)
  if split == 'train':
    return np.arange(0, num_rows - num_test)
  return np.arange(num_rows)


def LoadArrays(p):
  """Returns (images [N, H, W, C] float32 in [0, 1], labels [N] int32) for the split `p` names."""
  where = 'DigitsInput %r' % p.name
  if p.split not in SPLITS:
    raise ValueError('%s: split=%r is not one of %s' % (where, p.split, SPLITS))
  CheckDataDir(p, where)
  if p.tfds_name:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    with tf.Graph().as_default():  # Not in the model's graph: read once into host memory.
      images, labels = tfds.as_numpy(
          tfds.load(p.tfds_name, split=p.tfds_split or p.split, data_dir=p.data_dir,
                    download=False, batch_size=-1, as_supervised=True))
    images = np.asarray(images, np.float32)
    labels = np.asarray(labels)
  else:
    path = os.path.join(p.data_dir or SklearnDataDir(), p.file_name)
    table = np.loadtxt(path, delimiter=',', dtype=np.float32, ndmin=2)
    rows = SplitRows(table.shape[0], p.split, p.holdout_fraction)
    images, labels = table[rows, :-1], table[rows, -1]
  images = images.reshape([-1] + list(p.image_shape)).astype(np.float32) / float(p.max_pixel)
  labels = labels.astype(np.int32)
  if images.shape[0] == 0:
    raise ValueError('%s: split %r of the data is empty' % (where, p.split))
  return images, labels


class DigitsInput(array_input.ArrayInput):
  """Batches of (image, label, weight) from the scikit-learn digits (or a swapped-in source)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.name = 'digits_input'
    p.batch_size = 64
    p.Define('data_dir', '',
             'Empty: scikit-learn\'s bundled copy. Otherwise a directory holding `file_name` '
             '(same CSV format), or the tensorflow-datasets data_dir when `tfds_name` is set.')
    p.Define('file_name', 'digits.csv.gz', 'CSV file (pixels then label per row) inside data_dir.')
    p.Define('tfds_name', '',
             'If set, read this already-prepared tensorflow-datasets data set from data_dir '
             'instead (no download).')
    p.Define('tfds_split', '', 'TFDS split name; empty uses `split`.')
    p.Define('holdout_fraction', 0.2,
             'Fraction of the rows, taken from the end of the file, that form the test split.')
    p.Define('image_shape', (8, 8, 1), 'Shape of one image, (height, width, channels).')
    p.Define('max_pixel', 16.0, 'Pixel values are divided by this (16 for the digits).')
    p.Define('shuffle_seed', 1234, 'Seed of the shuffling (and of the random shifts).')
    p.Define('max_shift', 0,
             'Data augmentation: shift each image by up to this many pixels in each direction '
             '(zero-filled), drawn at random per example. 0 disables it.')
    return p

  @classmethod
  def CheckDataSource(cls, p):
    """Raises ValueError naming the directory if the data `p` points at is missing (no loading)."""
    CheckDataDir(p, 'DigitsInput %r' % p.name)

  def _LoadArrays(self):
    p = self.params
    images, labels = LoadArrays(p)
    tf.logging.info('DigitsInput %r: split %r, %d examples of shape %s from %s', p.name, p.split,
                    images.shape[0], list(images.shape[1:]),
                    p.tfds_name or os.path.join(p.data_dir or SklearnDataDir(), p.file_name))
    return images, labels

  def _ShuffleSeed(self):
    return self.params.shuffle_seed

  def _MapExample(self, seed, image, label):
    """A random shift of up to max_shift pixels (zero-filled), if set, drawn from `seed`."""
    p = self.params
    if not p.max_shift:
      return image, label
    h, w, c = p.image_shape
    s = p.max_shift
    padded = tf.pad(image, [[s, s], [s, s], [0, 0]])
    return tf.image.stateless_random_crop(padded, [h, w, c], seed=seed), label

  def _Batch(self, image, label, weight):
    return py_utils.NestedMap(image=image, label=label, weight=weight)
