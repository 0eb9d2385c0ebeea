"""An input generator over in-memory numpy arrays: shuffled, repeated batches, or one padded pass.

The example tasks' built-in data sets (the digits, the counting corpus) are small arrays with one
row per example. `ArrayInput` keeps them in host memory and feeds them to an initializable tf.data
iterator, so the graph holds no copy of the data; `Initialize(sess)` / `Reset(sess)` (called by
Lingvo's runners) (re)start it. A training split is shuffled each epoch and repeated forever in
batches of InfeedBatchSize(); an evaluation split is read once, its last batch padded to the same
static size with each array's pad value, and a weight per row says which rows are real.

Where a training batch comes from is a function of its place in the stream alone: example i of the
endless stream is row `index_shuffle(i mod n, seed=(shuffle seed, epoch i div n))` of the arrays
(a stateless permutation per epoch), and a random augmentation of it draws from the stateless seed
(shuffle seed, i). So `StartAtStep(sess, step)` starts the stream at the batch that training step
step + 1 reads in a run without interruption, at once, and the trainer calls it after every restore
(tensorpipe.trainer.input_position): a retried step or a restart reads the same batches as a run
without the fault.

Subclasses give the arrays (`_LoadArrays`), optionally map single examples (`_MapExample`, e.g.
augmentation), and build the batch's NestedMap from the batched arrays and the weights (`_Batch`).
"""

from typing import Any, Sequence, Tuple

import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils

from tensorpipe.tasks import fed_input


class ArrayInput(fed_input.FedInput):
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
    self._feeds: Tuple[Any, ...] = ()  # Per array its placeholder, made with the input batch.

  def _LoadArrays(self) -> Sequence[np.ndarray]:
    """The arrays, each with one row per example."""
    raise NotImplementedError

  def _ShuffleSeed(self) -> int:
    """The seed of the shuffling and of the seeds `_MapExample` gets."""
    raise NotImplementedError

  def _PadValues(self) -> Sequence[Any]:
    """The value each array's padding rows hold (default 0)."""
    return [0] * len(self._arrays)

  def _MapExample(self, seed: tf.Tensor, *example: tf.Tensor) -> Tuple[tf.Tensor, ...]:
    """One example's arrays, mapped before batching (default: unchanged). `seed` ([2] int64) is a
    stateless seed of its own for this place of the stream: random ops here must be stateless ones
    (tf.random.stateless_*, tf.image.stateless_*) drawing from it, so that a batch is the same
    whether the stream started at step 0 or at a later step."""
    del seed
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
    n = self.num_examples
    self._feeds = tuple(tf.placeholder(tf.as_dtype(a.dtype), [None] + list(a.shape[1:]),
                                       name='array%d' % i) for i, a in enumerate(self._arrays))
    self._first = tf.placeholder(tf.int64, [], name='first_example')
    seed = self._ShuffleSeed()
    shuffle = self._Flag(p.shuffle)

    def Example(i):
      """Example i of the stream: row (i mod n) of epoch (i div n)'s order, mapped."""
      epoch, row = i // n, i % n
      seed_t = tf.constant(seed, tf.int64)
      if shuffle:
        row = tf.random.experimental.index_shuffle(row, tf.stack([seed_t, epoch]), n - 1)
      example = tuple(tf.gather(f, row) for f in self._feeds)
      return self._MapExample(tf.stack([seed_t, i]), *example)

    end = np.iinfo(np.int64).max if self._Flag(p.repeat) else n
    ds = tf.data.Dataset.range(self._first, end).map(Example)
    if self._Flag(p.repeat):
      ds = ds.batch(b, drop_remainder=True)
      ds = ds.map(lambda *xs: xs + (tf.ones([b], tf.float32),))
    else:
      pads = self._PadValues()

      def Pad(*xs):
        k = tf.shape(xs[0])[0]
        padded = tuple(tf.pad(x, [[0, b - k]] + [[0, 0]] * (x.shape.rank - 1), constant_values=v)
                       for x, v in zip(xs, pads))
        return padded + (tf.pad(tf.ones([k], tf.float32), [[0, b - k]]),)

      ds = ds.batch(b).map(Pad)
    ds = ds.prefetch(2)
    self._iterator = tf.data.make_initializable_iterator(ds)
    batch = self._iterator.get_next()
    for x, a in zip(batch, self._arrays + (np.zeros([0]),)):
      x.set_shape([b] + list(a.shape[1:]))
    return self._Batch(*batch)

  def _Feeds(self):
    return dict(zip(self._feeds, self._arrays))

  def _Position(self, global_step):
    """A repeating split: the first example of training step `global_step` + 1; a split read once
    (evaluation) starts at its beginning."""
    return global_step * self.InfeedBatchSize() if self._Flag(self.params.repeat) else 0
