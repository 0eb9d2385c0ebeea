"""FedInput: Initialize and Reset start the fed stream at its beginning, StartAtStep where the
subclass's position for the step says; a stream without a start placeholder always at its
beginning; without a session or an iterator nothing runs."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe.tasks import fed_input


class Counter(fed_input.FedInput):
  """Batches of 2 consecutive entries of a fed array, from a fed start position (or from 0)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('positioned', True, 'Whether the stream has a start placeholder.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self._values = np.arange(100, 200, dtype=np.int64)
    self._feed = None

  def _InputBatch(self):
    self._feed = tf.placeholder(tf.int64, [None])
    first = tf.constant(0, tf.int64)
    if self.params.positioned:
      self._first = first = tf.placeholder(tf.int64, [])
    ds = tf.data.Dataset.range(first, 100).map(lambda i: tf.gather(self._feed, i)).batch(2)
    self._iterator = tf.data.make_initializable_iterator(ds)
    return py_utils.NestedMap(x=self._iterator.get_next())

  def _Feeds(self):
    return {self._feed: self._values}

  def _Position(self, global_step):
    return 2 * global_step


class FedInputTest(test_utils.TestCase):

  def _Next(self, sess, batch, count=1):
    return [list(sess.run(batch.x)) for _ in range(count)]

  def testInitializeResetAndStartAtStep(self):
    with self.session(graph=tf.Graph()) as sess:
      gen = Counter.Params().Set(name='counter', batch_size=2).Instantiate()
      batch = gen.GetPreprocessedInputBatch()
      gen.Initialize(sess)
      self.assertEqual(self._Next(sess, batch, 2), [[100, 101], [102, 103]])
      gen.StartAtStep(sess, 5)  # The batch training step 6 reads.
      self.assertEqual(self._Next(sess, batch), [[110, 111]])
      gen.Reset(sess)
      self.assertEqual(self._Next(sess, batch), [[100, 101]])

  def testAStreamWithoutAStartPlaceholderStartsAtItsBeginning(self):
    with self.session(graph=tf.Graph()) as sess:
      gen = Counter.Params().Set(name='counter', batch_size=2, positioned=False).Instantiate()
      batch = gen.GetPreprocessedInputBatch()
      gen.Initialize(sess)
      self._Next(sess, batch, 3)
      gen.StartAtStep(sess, 5)
      self.assertEqual(self._Next(sess, batch), [[100, 101]])

  def testNoSessionOrNoIteratorYetRunsNothing(self):
    with tf.Graph().as_default():
      gen = Counter.Params().Set(name='counter', batch_size=2).Instantiate()
      gen.Initialize(None)  # Lingvo calls it without a session before the graph has a batch.
      gen.StartAtStep(None, 3)
      self.assertIsNone(gen._iterator)  # pylint: disable=protected-access


if __name__ == '__main__':
  tf.test.main()
