"""sampling.Sample: greedy decoding and temperature / top-k draws over toy next-token models."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.tasks import sampling

V, EOS = 6, 1


def _Table(seed=0):
  """Log-probs of the next token given the previous one: [V, V]."""
  logits = np.random.RandomState(seed).normal(size=[V, V]) * 2.0
  return (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype(np.float32)


def _Run(fetches):
  with tf.Session() as sess:
    return sess.run(fetches)


class SampleTest(test_utils.TestCase):

  def testGreedyFollowsTheArgmaxAndStopsAtEos(self):
    table = _Table()
    first = np.array([0, 2, 3, 4, 5], np.int32)
    with tf.Graph().as_default():
      out = _Run(sampling.Sample(lambda ids, step: tf.gather(table, ids[:, step]),
                                 tf.constant(first), 5, EOS))
    for row, start in enumerate(first):
      token, score, want = start, 0.0, []
      while len(want) < 5 and (not want or want[-1] != EOS):
        nxt = int(np.argmax(table[token]))
        score += table[token, nxt]
        want.append(nxt)
        token = nxt
      self.assertAllEqual(out.ids[row][:len(want)], want)
      self.assertAllEqual(out.ids[row][len(want):], [EOS] * (5 - len(want)))
      self.assertEqual(out.lengths[row], len(want))
      self.assertAllClose(out.scores[row], score, rtol=1e-6)

  def testDrawsDependOnTheSeedAndStayInTheTopK(self):
    table = _Table(1)
    fn = lambda ids, step: tf.gather(table, ids[:, step])
    with tf.Graph().as_default():
      first = tf.constant(np.repeat(np.arange(2, V), 50).astype(np.int32))
      a, b, c, top2 = _Run([sampling.Sample(fn, first, 4, None, 'temperature', 1.0, None, 7),
                            sampling.Sample(fn, first, 4, None, 'temperature', 1.0, None, 7),
                            sampling.Sample(fn, first, 4, None, 'temperature', 1.0, None, 8),
                            sampling.Sample(fn, first, 4, None, 'top_k', 1.0, 2, 7)])
    self.assertAllEqual(a.ids, b.ids)
    self.assertFalse(np.array_equal(a.ids, c.ids))
    self.assertGreater(len(np.unique(a.ids[:, 0])), 2)
    previous = np.repeat(np.arange(2, V), 50)
    for step in range(4):
      allowed = np.argsort(-table[previous], axis=1)[:, :2]
      self.assertTrue(np.all((top2.ids[:, step:step + 1] == allowed).any(axis=1)))
      previous = top2.ids[:, step]

  def testStatesGiveTheTokensOfTheWholePrefix(self):
    table = _Table(2)

    def Whole(ids, step):  # The next token depends on the sum of the prefix's tokens.
      total = tf.reduce_sum(ids * tf.cast(tf.range(tf.shape(ids)[1]) <= step, tf.int32), 1)
      return tf.gather(table, total % V)

    def Incremental(ids, step, total):
      total += ids[:, step]
      return tf.gather(table, total % V), total

    with tf.Graph().as_default():
      first = tf.constant([0, 2, 3, 4], tf.int32)
      for method in ('greedy', 'temperature', 'top_k'):
        whole, incremental = _Run([
            sampling.Sample(Whole, first, 6, EOS, method, 0.7, 3, 1),
            sampling.Sample(Incremental, first, 6, EOS, method, 0.7, 3, 1,
                            states=tf.zeros([4], tf.int32))])
        self.assertAllEqual(whole.ids, incremental.ids, method)
        self.assertAllClose(whole.scores, incremental.scores, msg=method)

  def testBadArguments(self):
    fn = lambda ids, step: tf.zeros([1, V])
    for kwargs, message in ((dict(method='nucleus'), 'method must be one of'),
                            (dict(method='temperature', temperature=0.0), 'temperature must be > 0'),
                            (dict(method='top_k', top_k=None), "method='top_k' needs top_k"),
                            (dict(num_steps=0), 'num_steps must be an int >= 1')):
      args = dict(num_steps=3)
      args.update(kwargs)
      with self.assertRaisesRegex(ValueError, message), tf.Graph().as_default():
        sampling.Sample(fn, tf.zeros([1], tf.int32), eos_id=EOS, **args)


if __name__ == '__main__':
  test_utils.main()
