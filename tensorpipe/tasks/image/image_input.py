"""Image classification input from tensorflow-datasets (ImageNet, CIFAR, Cars, ...), or synthetic.

Batches (b = InfeedBatchSize()): image [b, S, S, C] float32 (pixels scaled to [0, 1];
S = image_size), label [b] int32, weight [b] float32 (0 for the padding of a non-repeating eval
split's last batch).

- Real data: `tfds_name` read from `data_dir`, which must already hold the prepared data set
  (nothing is downloaded while training). `tfds_name='image_folder:NAME'` reads
  data_dir/NAME/<split>/<class>/* image files instead (data sets tensorflow-datasets lacks, e.g.
  FGVC Aircraft, Birdsnap). ImageNet ('imagenet2012') cannot be downloaded by tensorflow-datasets:
  put the manual download (ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar) in `manual_dir` and
  prepare it once with `PrepareDataset(p)`. A missing directory or unprepared data set raises a
  ValueError naming it.
- Training augmentation: resize to image_size, random left-right flips, cutout (a random
  cutout_size x cutout_size square set to 0), as in the paper's transfer-learning runs.
- `synthetic=True`: random images and labels generated on the device, for speed runs without data.
"""

import os

from lingvo import compat as tf
from lingvo.core import base_input_generator
from lingvo.core import py_utils


IMAGE_FOLDER = 'image_folder:'


def _FolderDir(p):
  """For tfds_name 'image_folder:NAME', the directory data_dir/NAME of split/class/image files."""
  return os.path.join(p.data_dir, p.tfds_name[len(IMAGE_FOLDER):])


def _Builder(p):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  if p.tfds_name.startswith(IMAGE_FOLDER):
    return tfds.folder_dataset.ImageFolder(_FolderDir(p))
  return tfds.builder(p.tfds_name, data_dir=p.data_dir)


def CheckDataSource(p, where=None):
  """Raises ValueError (naming the directory) unless `p` is synthetic or its data is prepared."""
  where = where or 'ImageInput %r' % p.name
  if p.synthetic:
    return
  if not p.tfds_name:
    raise ValueError('%s: set tfds_name (a tensorflow-datasets name) or synthetic=True' % where)
  if not p.data_dir:
    raise ValueError('%s: data_dir is empty; set it to the tensorflow-datasets directory '
                     'holding %r (or synthetic=True)' % (where, p.tfds_name))
  if not os.path.isdir(p.data_dir):
    raise ValueError('%s: data_dir %r does not exist or is not a directory (it must hold the '
                     'prepared tensorflow-datasets %r)' % (where, p.data_dir, p.tfds_name))
  if p.tfds_name.startswith(IMAGE_FOLDER):
    split_dir = os.path.join(_FolderDir(p), p.split)
    if not os.path.isdir(split_dir):
      raise ValueError('%s: image folder %r does not exist (expected <split>/<class>/<image> files '
                       'under %r)' % (where, split_dir, _FolderDir(p)))
    return
  prepared = os.path.isdir(os.path.join(p.data_dir, p.tfds_name.split(':')[0].split('/')[0]))
  if not prepared:
    hint = ''
    if p.tfds_name.startswith('imagenet2012'):
      hint = ('; ImageNet needs the manual download in manual_dir %r, then PrepareDataset(p)' %
              (p.manual_dir,))
    raise ValueError('%s: tensorflow-datasets %r is not prepared under data_dir %r%s' %
                     (where, p.tfds_name, p.data_dir, hint))


def PrepareDataset(p):
  """Prepares `p.tfds_name` under p.data_dir (ImageNet from p.manual_dir); run once, offline."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  if p.manual_dir and not os.path.isdir(p.manual_dir):
    raise ValueError('ImageInput %r: manual_dir %r does not exist' % (p.name, p.manual_dir))
  config = tfds.download.DownloadConfig(manual_dir=p.manual_dir or None)
  _Builder(p).download_and_prepare(download_config=config)


class ImageInput(base_input_generator.BaseInputGenerator):
  """Batches of (image, label, weight) from TFDS, augmented for training, or synthetic."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.name = 'image_input'
    p.batch_size = 64
    p.Define('tfds_name', '',
             "tensorflow-datasets name, e.g. 'imagenet2012', 'cifar10', 'cars196'.")
    p.Define('data_dir', '', 'tensorflow-datasets data directory holding the prepared data set.')
    p.Define('manual_dir', '',
             'For ImageNet: the directory of the manual download (see module doc).')
    p.Define('split', 'train', "tensorflow-datasets split, e.g. 'train', 'validation', 'test'.")
    p.Define('image_size', 224, 'Images are resized to image_size x image_size.')
    p.Define('num_channels', 3, 'Channels of the images.')
    p.Define('num_classes', 1000,
             'Number of classes (labels of synthetic data are drawn below it).')
    p.Define('random_flip', None, 'Random left-right flips; None: in training only.')
    p.Define('cutout_size', 0, 'Side of the cutout square in training (0: no cutout).')
    p.Define('shuffle_buffer', 10000, 'Shuffle buffer (training).')
    p.Define('repeat', None, 'Repeat the split forever; None: in training only.')
    p.Define('synthetic', False, 'Generate random images and labels instead of reading data.')
    p.Define('seed', None, 'Seed of shuffling and augmentation (None: nondeterministic).')
    return p

  @classmethod
  def CheckDataSource(cls, p):
    """Raises ValueError naming the directory if the data `p` points at is missing (no loading)."""
    CheckDataSource(p)

  def __init__(self, params):
    super().__init__(params)
    CheckDataSource(self.params)
    self._iterator = None

  def _IsTrain(self):
    return self.params.split.startswith('train')

  def _Flag(self, value):
    return self._IsTrain() if value is None else bool(value)

  def _Preprocess(self, image, label):
    p = self.params
    image = tf.image.resize(tf.cast(image, tf.float32) / 255.0, [p.image_size, p.image_size])
    if p.num_channels == 3 and image.shape[-1] == 1:
      image = tf.image.grayscale_to_rgb(image)
    if self._Flag(p.random_flip):
      image = tf.image.random_flip_left_right(image, seed=p.seed)
    if self._IsTrain() and p.cutout_size:
      image = Cutout(image, p.cutout_size, p.seed)
    return image, tf.cast(label, tf.int32)

  def _InputBatch(self):
    p = self.params
    b = self.InfeedBatchSize()
    shape = [b, p.image_size, p.image_size, p.num_channels]
    if p.synthetic:
      image = tf.random.uniform(shape, seed=p.seed)
      label = tf.random.uniform([b], maxval=p.num_classes, dtype=tf.int32, seed=p.seed)
      return py_utils.NestedMap(image=image, label=label, weight=tf.ones([b], tf.float32))
    ds = _Builder(p).as_dataset(split=p.split, as_supervised=True,
                                shuffle_files=self._IsTrain())
    if self._IsTrain():
      ds = ds.shuffle(p.shuffle_buffer, seed=p.seed)
    ds = ds.map(self._Preprocess, num_parallel_calls=tf.data.AUTOTUNE)
    if self._Flag(p.repeat):
      ds = ds.repeat().batch(b, drop_remainder=True)
      ds = ds.map(lambda x, y: (x, y, tf.ones([b], tf.float32)))
    else:

      def Pad(x, y):
        n = tf.shape(y)[0]
        return (tf.pad(x, [[0, b - n], [0, 0], [0, 0], [0, 0]]), tf.pad(y, [[0, b - n]]),
                tf.pad(tf.ones([n], tf.float32), [[0, b - n]]))

      ds = ds.batch(b).map(Pad)
    self._iterator = tf.data.make_initializable_iterator(ds.prefetch(2))
    image, label, weight = self._iterator.get_next()
    image.set_shape(shape)
    label.set_shape([b])
    weight.set_shape([b])
    return py_utils.NestedMap(image=image, label=label, weight=weight)

  def Initialize(self, sess=None):
    super().Initialize(sess)
    self.Reset(sess)

  def Reset(self, sess=None):
    """(Re)starts the split (real data only)."""
    if self._iterator is not None and sess is not None:
      sess.run(self._iterator.initializer)


def Cutout(image, size, seed=None):
  """Sets a random size x size square of `image` ([H, W, C]) to 0 (it may cross the border)."""
  h, w = tf.shape(image)[0], tf.shape(image)[1]
  cy = tf.random.uniform([], 0, h, dtype=tf.int32, seed=seed)
  cx = tf.random.uniform([], 0, w, dtype=tf.int32, seed=seed)
  ys = tf.range(h)[:, None]
  xs = tf.range(w)[None, :]
  inside = ((ys >= cy - size // 2) & (ys < cy - size // 2 + size) &
            (xs >= cx - size // 2) & (xs < cx - size // 2 + size))
  return image * tf.cast(~inside, image.dtype)[:, :, None]
