"""ArrayInput: one padded pass over an evaluation split, shuffled repeats of a training split, and a
stream that starts at any training step with the batches a run from step 0 reads there."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe.tasks import array_input


class Rows(array_input.ArrayInput):
  """Five rows: x = 0..4 (pad -1) and y = 10 x (pad 0)."""

  def _LoadArrays(self):
    x = np.arange(5, dtype=np.int32)
    return x, 10 * x

  def _ShuffleSeed(self):
    return 3

  def _PadValues(self):
    return [-1, 0]

  def _Batch(self, x, y, weight):
    return py_utils.NestedMap(x=x, y=y, weight=weight)


class ShiftedRows(Rows):
  """Rows with x + a random offset in [0, 100) drawn from each example's seed."""

  def _MapExample(self, seed, x, y):
    return x + tf.random.stateless_uniform([], seed, 0, 100, tf.int32), y


class ArrayInputTest(test_utils.TestCase):

  def _Batches(self, split, count):
    with self.session(graph=tf.Graph()) as sess:
      gen = Rows.Params().Set(name='rows', batch_size=2, split=split).Instantiate()
      batch = gen.GetPreprocessedInputBatch()
      self.assertEqual(batch.x.shape.as_list(), [2])
      gen.Initialize(sess)
      return [sess.run(batch) for _ in range(count)]

  def testEvaluationSplitIsOnePaddedPass(self):
    batches = self._Batches('test', 3)
    self.assertAllEqual(np.concatenate([b.x for b in batches]), [0, 1, 2, 3, 4, -1])
    self.assertAllEqual(np.concatenate([b.y for b in batches]), [0, 10, 20, 30, 40, 0])
    self.assertAllEqual(np.concatenate([b.weight for b in batches]), [1, 1, 1, 1, 1, 0])

  def testTrainingSplitIsShuffledAndRepeats(self):
    batches = self._Batches('train', 5)  # Two epochs.
    xs = np.concatenate([b.x for b in batches])
    self.assertCountEqual(xs[:5], range(5))
    self.assertCountEqual(xs[5:], range(5))
    self.assertNotEqual(list(xs[:5]), list(range(5)))  # Shuffled (a fixed seed: not by chance).
    self.assertAllEqual(np.concatenate([b.y for b in batches]), 10 * xs)
    self.assertTrue(all((b.weight == 1).all() for b in batches))

  def _Stream(self, cls, split, first_step, count, batch_size=2):
    """`count` batches of the x column from the stream started at `first_step` (StartAtStep), in
    a fresh graph and session."""
    with self.session(graph=tf.Graph()) as sess:
      gen = cls.Params().Set(name='rows', batch_size=batch_size, split=split).Instantiate()
      batch = gen.GetPreprocessedInputBatch()
      gen.Initialize(sess)
      gen.StartAtStep(sess, first_step)
      return [sess.run(batch).x for _ in range(count)]

  def testStartAtStepReadsTheBatchesOfARunFromStepZero(self):
    for cls in (Rows, ShiftedRows):
      # Batch size 3 over 5 rows: batches straddle epochs, and 7 steps cross four of them.
      through = self._Stream(cls, 'train', 0, 12, batch_size=3)
      self.assertNotEqual(list(np.concatenate(through[:5]))[:5], list(range(5)))  # Shuffled.
      for step in (1, 2, 5, 7):
        with self.subTest(cls=cls.__name__, step=step):
          self.assertAllEqual(self._Stream(cls, 'train', step, 12 - step, batch_size=3),
                              through[step:])

  def testAugmentationDiffersBetweenEpochsOfTheSameRow(self):
    xs = np.concatenate(self._Stream(ShiftedRows, 'train', 0, 10))  # Four epochs of 5 rows.
    plain = np.concatenate(self._Stream(Rows, 'train', 0, 10))
    offsets = xs - plain
    self.assertTrue(((offsets >= 0) & (offsets < 100)).all(), offsets)
    self.assertGreater(len(set(offsets.tolist())), 10)  # Seeds by place: a fixed draw, not luck.

  def testStartAtStepOfAnEvaluationSplitStartsItsOnePass(self):
    self.assertAllEqual(np.concatenate(self._Stream(Rows, 'test', 4, 3)), [0, 1, 2, 3, 4, -1])


if __name__ == '__main__':
  test_utils.main()
