"""An input generator over in-memory numpy arrays: shuffled, repeated batches, or one padded pass.

The example tasks' built-in data sets (the digits, the counting corpus) are small arrays with one
row per example. `ArrayInput` keeps them in host memory and feeds them to an initializable tf.data
iterator, so the graph holds no copy of the data; `Initialize(sess)` / `Reset(sess)` (called by
Lingvo's runners) (re)start it. A training split is shuffled each epoch and repeated forever in
batches of InfeedBatchSize(); an evaluation split is read once, its last batch padded to the same
static size with each array's pad value, and a weight per row says which rows are real.

Subclasses give the arrays (`_LoadArrays`), optionally map single examples (`_MapExample`, e.g.
augmentation), and build the batch's NestedMap from the batched arrays and the weights (`_Batch`).
"""

from typing import Any, Sequence, Tuple

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_input_generator
from lingvo.core import py_utils


class ArrayInput(base_input_generator.BaseInputGenerator):
  """Batches of rows of in-memory arrays (see the module docstring)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('split', 'train',
             "Which split to read (the subclass lists its splits); 'train' is shuffled and "
             'repeated unless shuffle or repeat say otherwise.')
    p.Define('shuffle', None, 'Shuffle the examples (each epoch); None: only for the train split.')
    p.Define('repeat', None,
             'Cycle through the split forever; None: only for the train split. A non-repeating '
             'split raises OutOfRangeError after one pass (set resettable=True for eval).')
    return p

  def __init__(self, params):
    super().__init__(params)
    self._arrays = tuple(self._LoadArrays())
    self._is_train = self.params.split == 'train'
    self._iterator = None
    self._feeds = None

  def _LoadArrays(self) -> Sequence[np.ndarray]:
    """The arrays, each with one row per example."""
    raise NotImplementedError

  def _ShuffleSeed(self) -> int:
    """The seed of the shuffling."""
    raise NotImplementedError

  def _PadValues(self) -> Sequence[Any]:
    """The value each array's padding rows hold (default 0)."""
    return [0] * len(self._arrays)

  def _MapExample(self, *example: tf.Tensor) -> Tuple[tf.Tensor, ...]:
    """One example's arrays, mapped before batching (default: unchanged)."""
    return example

  def _Batch(self, *batch: tf.Tensor) -> py_utils.NestedMap:
    """The input batch from each array's [b, ...] rows and then the weights [b] float32 (1.0 for a
    real row, 0.0 for padding)."""
    raise NotImplementedError

  @property
  def num_examples(self) -> int:
    return int(self._arrays[0].shape[0])

  def _Flag(self, value):
    return self._is_train if value is None else bool(value)

  def _InputBatch(self):
    p = self.params
    b = self.InfeedBatchSize()
    self._feeds = tuple(tf.placeholder(tf.as_dtype(a.dtype), [None] + list(a.shape[1:]),
                                       name='array%d' % i) for i, a in enumerate(self._arrays))
    ds = tf.data.Dataset.from_tensor_slices(self._feeds)
    if self._Flag(p.shuffle):
      ds = ds.shuffle(self.num_examples, seed=self._ShuffleSeed(), reshuffle_each_iteration=True)
    ds = ds.map(self._MapExample)
    if self._Flag(p.repeat):
      ds = ds.repeat().batch(b, drop_remainder=True)
      ds = ds.map(lambda *xs: xs + (tf.ones([b], tf.float32),))
    else:
      pads = self._PadValues()

      def Pad(*xs):
        n = tf.shape(xs[0])[0]
        padded = tuple(tf.pad(x, [[0, b - n]] + [[0, 0]] * (x.shape.rank - 1), constant_values=v)
                       for x, v in zip(xs, pads))
        return padded + (tf.pad(tf.ones([n], tf.float32), [[0, b - n]]),)

      ds = ds.batch(b).map(Pad)
    ds = ds.prefetch(2)
    self._iterator = tf.data.make_initializable_iterator(ds)
    batch = self._iterator.get_next()
    for x, a in zip(batch, self._arrays + (np.zeros([0]),)):
      x.set_shape([b] + list(a.shape[1:]))
    return self._Batch(*batch)

  def Initialize(self, sess=None):
    super().Initialize(sess)
    self.Reset(sess)

  def Reset(self, sess=None):
    """(Re)starts the iterator at the beginning of the split."""
    if self._iterator is None or sess is None:
      return
    sess.run(self._iterator.initializer, feed_dict=dict(zip(self._feeds, self._arrays)))
