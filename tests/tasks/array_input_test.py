"""ArrayInput: one padded pass over an evaluation split, shuffled repeats of a training split."""

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


if __name__ == '__main__':
  test_utils.main()
