"""beam_search.BeamSearch against brute force on toy models, and beam decoding in the MT task.

The toy models give next-token log-probs from a table over every prefix of a 4-token vocabulary, so
every hypothesis can be enumerated and scored with GNMT's formula in numpy.
"""

import itertools
import os
import tempfile

import numpy as np
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe.tasks.mt import beam_search
from tensorpipe.tasks.mt import mt_input
from tensorpipe.tasks.mt import mt_task
from tensorpipe.tasks.mt import num2words_corpus
from tests import layer_helpers

SOS, EOS, A, B = 0, 1, 2, 3
VOCAB = 4


def _LogSoftmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max()
  return x - np.log(np.exp(x).sum())


def _Probs(**probs):
  """Log-probs over (sos, eos, a, b) from named probabilities; unnamed tokens share what is left."""
  named = {EOS: probs.get('eos'), A: probs.get('a'), B: probs.get('b'), SOS: probs.get('sos')}
  rest = [t for t, q in named.items() if q is None]
  left = 1.0 - sum(q for q in named.values() if q is not None)
  out = np.zeros([VOCAB])
  for t, q in named.items():
    out[t] = q if q is not None else left / len(rest)
  with np.errstate(divide='ignore'):
    return np.log(out)


class ToyModel:
  """Next-token log-probs per example given each prefix (tokens after sos), from a full table."""

  def __init__(self, log_probs_fn, batch_size, max_length):
    self.batch_size, self.max_length = batch_size, max_length
    self._log_probs_fn = log_probs_fn
    self._offsets = np.cumsum([0] + [VOCAB**n for n in range(max_length)])
    rows = []
    for example in range(batch_size):
      table = np.zeros([self._offsets[-1], VOCAB], np.float32)
      for n in range(max_length):
        for prefix in itertools.product(range(VOCAB), repeat=n):
          table[self._Row(prefix)] = log_probs_fn(example, prefix)
      rows.append(table)
    self._table = np.stack(rows)

  def _Row(self, prefix):
    return self._offsets[len(prefix)] + sum(t * VOCAB**j for j, t in enumerate(prefix))

  def LogProbs(self, example, prefix):
    return self._log_probs_fn(example, tuple(prefix))

  def Callback(self, beam_size):
    """The (ids, step) -> [B * K, V] log-probs callback BeamSearch takes, over the same table."""
    table = tf.constant(self._table)
    offsets = tf.constant(self._offsets, tf.int32)

    def Fn(ids, step):
      n, t = py_utils.GetShape(ids)
      col = tf.range(t)
      weights = tf.where_v2((col >= 1) & (col <= step), VOCAB**tf.maximum(col - 1, 0), 0)
      row = offsets[step] + tf.reduce_sum(ids * weights[None, :], axis=1)
      return tf.gather_nd(table, tf.stack([tf.range(n) // beam_size, row], axis=1))

    return Fn

  def IncrementalCallback(self, beam_size):
    """(callback, states, reorder_fn) of incremental decoding over the same table: each row's
    state is its prefix's part of the table row, extended by one token per step; a row whose state
    was not its own hypothesis's would read another prefix's log-probs."""
    table = tf.constant(self._table)
    offsets = tf.constant(self._offsets, tf.int32)

    def Fn(ids, step, partial):
      partial += ids[:, step] * VOCAB**tf.maximum(step - 1, 0) * tf.cast(step >= 1, tf.int32)
      n = py_utils.GetShape(ids)[0]
      row = offsets[step] + partial
      return tf.gather_nd(table, tf.stack([tf.range(n) // beam_size, row], axis=1)), partial

    return (Fn, tf.zeros([self.batch_size * beam_size], tf.int32),
            lambda partial, rows: tf.gather(partial, rows))

  def Score(self, example, hyp, alpha):
    """GNMT-normalised log P of hyp (tokens up to and including eos, or max_length tokens)."""
    log_p = sum(self.LogProbs(example, hyp[:i])[tok] for i, tok in enumerate(hyp))
    return log_p / ((5.0 + len(hyp)) / 6.0)**alpha

  def Hypotheses(self):
    """Every hypothesis: ends with eos (only there), or max_length tokens without eos."""
    for n in range(1, self.max_length + 1):
      for body in itertools.product([t for t in range(VOCAB) if t != EOS], repeat=n - 1):
        yield body + (EOS,)
        if n == self.max_length:
          for last in range(VOCAB):
            if last != EOS:
              yield body + (last,)

  def BruteForce(self, example, alpha):
    """(best hypothesis, its score) by enumeration."""
    return max(((h, self.Score(example, h, alpha)) for h in self.Hypotheses()),
               key=lambda hs: hs[1])

  def Greedy(self, example):
    hyp = []
    while len(hyp) < self.max_length and (not hyp or hyp[-1] != EOS):
      hyp.append(int(np.argmax(self.LogProbs(example, hyp))))
    return tuple(hyp)


def _RandomModel(batch_size, max_length, seed, scale=2.0):
  def LogProbs(example, prefix):
    rng = np.random.RandomState(hash((seed, example, prefix)) % (2**32))
    return _LogSoftmax(rng.normal(size=VOCAB) * scale)
  return ToyModel(LogProbs, batch_size, max_length)


def _HandModel(probs, max_length, default=None):
  """One example; probs maps a prefix tuple to its _Probs; others get `default` (uniform)."""
  default = _Probs() if default is None else default
  return ToyModel(lambda e, prefix: probs.get(prefix, default), 1, max_length)


def _Search(model, beam_size, alpha=0.0):
  with tf.Graph().as_default():
    out = beam_search.BeamSearch(model.Callback(beam_size), model.batch_size, beam_size,
                                 model.max_length, SOS, EOS, alpha)
    with tf.Session() as sess:
      return sess.run(out)


def _Hyp(ids, length):
  return tuple(int(t) for t in ids[:length])


class BeamSearchTest(test_utils.TestCase):

  def assertWellFormed(self, out, model):
    """Lengths in 1..max_length, eos only at the end (or none at max_length), eos after the end."""
    for ids, length in zip(out.ids, out.lengths):
      self.assertBetween(length, 1, model.max_length)
      body = list(ids[:length - 1])
      self.assertNotIn(EOS, body)
      if length < model.max_length:
        self.assertEqual(ids[length - 1], EOS)
      self.assertAllEqual(ids[length:], [EOS] * (model.max_length - length))

  def testBeamFindsTheBetterSequenceGreedyMisses(self):
    # Greedy takes `a` (0.55) then can do no better than eos (0.4): P = 0.22. `b` (0.45) is followed
    # by eos with 0.95: P = 0.4275.
    model = _HandModel({(): _Probs(a=0.55, b=0.45, eos=0.0), (A,): _Probs(eos=0.4),
                        (B,): _Probs(eos=0.95)}, max_length=3)
    greedy, beam = _Search(model, 1), _Search(model, 2)
    self.assertEqual(_Hyp(greedy.ids[0], greedy.lengths[0]), (A, EOS))
    self.assertEqual(_Hyp(beam.ids[0], beam.lengths[0]), (B, EOS))
    self.assertAllClose(greedy.scores[0], np.log(0.55 * 0.4))
    self.assertAllClose(beam.scores[0], np.log(0.45 * 0.95))
    self.assertEqual(model.BruteForce(0, 0.0)[0], (B, EOS))

  def testWideBeamEqualsBruteForce(self):
    # K = 108 >= every candidate (3^3 alive prefixes x 4 tokens), so the search is exhaustive.
    for seed, alpha in ((0, 0.0), (1, 0.6), (2, 2.0)):
      model = _RandomModel(batch_size=3, max_length=4, seed=seed)
      out = _Search(model, 108, alpha)
      self.assertWellFormed(out, model)
      for e in range(model.batch_size):
        best, score = model.BruteForce(e, alpha)
        self.assertEqual(_Hyp(out.ids[e], out.lengths[e]), best, 'seed %d example %d' % (seed, e))
        self.assertAllClose(out.scores[e], score, rtol=1e-5)

  def testNarrowBeamScoresItsOwnHypothesisAndNeverBeatsTheOptimum(self):
    for seed, alpha in ((3, 0.0), (4, 1.0)):
      model = _RandomModel(batch_size=4, max_length=4, seed=seed, scale=1.0)
      for k in (1, 2, 3):
        out = _Search(model, k, alpha)
        self.assertWellFormed(out, model)
        for e in range(model.batch_size):
          hyp = _Hyp(out.ids[e], out.lengths[e])
          self.assertAllClose(out.scores[e], model.Score(e, hyp, alpha), rtol=1e-5)
          self.assertLessEqual(out.scores[e], model.BruteForce(e, alpha)[1] + 1e-5)

  def testBeamSizeOneIsGreedy(self):
    for seed in range(4):
      model = _RandomModel(batch_size=5, max_length=4, seed=10 + seed, scale=1.5)
      out = _Search(model, 1)
      for e in range(model.batch_size):
        self.assertEqual(_Hyp(out.ids[e], out.lengths[e]), model.Greedy(e), 'seed %d' % seed)

  def testFinishedHypothesisIsKeptWhileTheSearchGoesOn(self):
    # Step 1: eos (0.4) finishes; `a` (0.45) could still win, so the search goes on, but every
    # longer hypothesis scores at most 0.45 * 0.25.
    model = _HandModel({(): _Probs(eos=0.4, a=0.45, b=0.15, sos=0.0)}, max_length=4)
    out = _Search(model, 2)
    self.assertAllEqual(out.ids[0], [EOS] * 4)
    self.assertEqual(out.lengths[0], 1)
    self.assertAllClose(out.scores[0], np.log(0.4))

  def testEosEndsAHypothesisAndFillsTheRest(self):
    model = _HandModel({(): _Probs(a=0.9, eos=0.0), (A,): _Probs(eos=0.9)}, max_length=4)
    out = _Search(model, 2)
    self.assertAllEqual(out.ids[0], [A, EOS, EOS, EOS])
    self.assertEqual(out.lengths[0], 2)

  def testMaxLengthEndsHypothesesWithoutEos(self):
    never_eos = _Probs(eos=1e-6, a=0.7)
    model = _HandModel({}, max_length=3, default=never_eos)
    out = _Search(model, 3)
    self.assertAllEqual(out.ids[0], [A, A, A])
    self.assertEqual(out.lengths[0], 3)
    self.assertAllClose(out.scores[0], 3 * np.log(0.7))
    one = _Search(_HandModel({}, max_length=1, default=never_eos), 2)
    self.assertAllEqual(one.ids[0], [A])
    self.assertEqual(one.lengths[0], 1)

  def testLengthNormalisationChoosesAsTheFormulaPredicts(self):
    # Two dominant hypotheses: (eos,) with P = 0.5 and (a, b, eos) with P = 0.5 * 0.8 * 0.9 = 0.36.
    model = _HandModel({(): _Probs(eos=0.5, a=0.4999), (A,): _Probs(b=0.8),
                        (A, B): _Probs(eos=0.9)}, max_length=4)
    short, long = (EOS,), (A, B, EOS)
    chosen = set()
    for alpha in (0.0, 1.0, 1.5, 2.0, 3.0):
      predicted = long if model.Score(0, long, alpha) > model.Score(0, short, alpha) else short
      self.assertEqual(model.BruteForce(0, alpha)[0], predicted)
      out = _Search(model, 2, alpha)
      self.assertEqual(_Hyp(out.ids[0], out.lengths[0]), predicted, 'alpha %g' % alpha)
      self.assertAllClose(out.scores[0], model.Score(0, predicted, alpha), rtol=1e-5)
      chosen.add(predicted)
    self.assertEqual(chosen, {short, long})

  def testIncrementalStatesFollowTheirHypotheses(self):
    for seed, k, alpha in ((5, 2, 0.0), (6, 3, 0.6), (7, 108, 0.0)):
      model = _RandomModel(batch_size=3, max_length=4, seed=seed, scale=1.0)
      with tf.Graph().as_default():
        fn, states, reorder = model.IncrementalCallback(k)
        incremental = beam_search.BeamSearch(fn, model.batch_size, k, model.max_length, SOS, EOS,
                                             alpha, states=states, reorder_fn=reorder)
        with tf.Session() as sess:
          incremental = sess.run(incremental)
      whole = _Search(model, k, alpha)
      self.assertAllEqual(incremental.ids, whole.ids, msg=str((seed, k)))
      self.assertAllClose(incremental.scores, whole.scores, msg=str((seed, k)))
    with self.assertRaisesRegex(ValueError, 'give both states and reorder_fn'):
      beam_search.BeamSearch(fn, 3, 2, 4, SOS, EOS, states=tf.zeros([6]))

  def testBadArguments(self):
    model = _RandomModel(batch_size=1, max_length=2, seed=0)
    for kwargs, message in (({'beam_size': 0}, 'beam_size must be an int >= 1, got 0'),
                            ({'max_length': 0}, 'max_length must be an int >= 1, got 0'),
                            ({'length_normalization': -0.5},
                             'length_normalization must be a number >= 0, got -0.5')):
      args = dict(beam_size=2, max_length=2, length_normalization=0.0)
      args.update(kwargs)
      with tf.Graph().as_default(), self.assertRaisesRegex(ValueError, message):
        beam_search.BeamSearch(model.Callback(2), 1, args['beam_size'], args['max_length'], SOS,
                               EOS, args['length_normalization'])
    with tf.Graph().as_default(), self.assertRaisesRegex(ValueError, r'static V >= 2.*\(2, 1\)'):
      beam_search.BeamSearch(lambda ids, step: tf.zeros([2, 1]), 1, 2, 2, SOS, EOS)


class PipelinedTransformerBeamSearchTest(test_utils.TestCase):
  """An untrained tiny pipelined T(1, 32, 2) (K = 2, M = 2) decodes a num2words test split."""

  LANGS = ['de', 'fr']
  MAX_LENGTH = 6

  def _Params(self, data_dir, vocab_size, beam_size):
    p = mt_task.TransformerParams(num_layers=1, ffn_dim=32, num_heads=2, model_dim=16, head_dim=8,
                                  vocab_size=vocab_size, num_devices=2, num_micro_batches=2)
    p.Set(languages=self.LANGS, max_decode_length=self.MAX_LENGTH, beam_size=beam_size,
          length_normalization=0.6)
    p.input = mt_input.MultilingualInput.Params().Set(
        data_dir=data_dir, split='test', languages=self.LANGS, target_max_length=8)
    p.input.batch_size = 4
    return p

  def testBadBeamSize(self):
    for bad in (0, -1, 2.0):
      with self.assertRaisesRegex(ValueError, 'beam_size must be an int >= 1.*got %r' % bad):
        mt_task.TransformerParams(num_layers=1, ffn_dim=8, num_heads=1, model_dim=8,
                                  vocab_size=10).Set(beam_size=bad).Instantiate()

  def testBeamDecodeEndToEnd(self):
    data_dir = os.path.join(tempfile.mkdtemp(), 'corpus')
    num2words_corpus.EnsureCorpus(data_dir, max_number=99, num_test=4, max_train=40, min_train=20,
                                  vocab_size=300)
    graph = tf.Graph()
    with graph.as_default(), cluster_factory.ForTestingWorker(cpus=2, split_size=2, do_eval=True):
      py_utils.GetOrCreateGlobalStepVar()
      vocab_size = mt_input.MultilingualInput.Params().Set(
          data_dir=data_dir, split='test', languages=self.LANGS).Instantiate().vocab_size
      task = self._Params(data_dir, vocab_size, beam_size=2).Instantiate()
      batch = task.input_generator.GetPreprocessedInputBatch()
      dec_out = task.Decode(batch)
      theta, src = task.theta, batch.src
      greedy = task.GreedyDecode(theta, src).ids
      one = task.BeamSearchDecode(theta, src, 1, 0.0)
      two = task.BeamSearchDecode(theta, src, 2, 0.6)
      # The model's own log P of the beam's hypotheses, by teacher forcing.
      enc = task.Encode(theta, src)
      prefix = tf.concat([tf.fill([4, 1], task.params.sos_id), two.ids[:, :-1]], axis=1)
      logits = task.DecoderLogits(theta, enc.vec, src.paddings, prefix,
                                  tf.zeros([4, self.MAX_LENGTH])).logits
      token_log_p = tf.reduce_sum(tf.nn.log_softmax(logits) * tf.one_hot(two.ids, vocab_size), -1)
      counted = tf.sequence_mask(two.lengths, self.MAX_LENGTH, tf.float32)
      rescored = (tf.reduce_sum(token_log_p * counted, -1)
                  / beam_search.LengthPenalty(two.lengths, 0.6))
      with layer_helpers.Session(graph, 2) as sess:
        sess.run(tf.global_variables_initializer())
        task.input_generator.Initialize(sess)
        first, greedy, one, two, rescored = sess.run([dec_out, greedy, one, two, rescored])
        dec_metrics = task.CreateDecoderMetrics()
        pairs = task.PostProcessDecodeOut(first, dec_metrics)
        try:
          while True:
            pairs += task.PostProcessDecodeOut(sess.run(dec_out), dec_metrics)
        except tf.errors.OutOfRangeError:
          pass
    self.assertAllEqual(one.ids, greedy)
    self.assertAllClose(two.scores, rescored, rtol=1e-4, atol=1e-4)
    self.assertEqual(first['hyp_ids'].shape, (4, self.MAX_LENGTH))
    self.assertAllEqual(first['hyp_ids'], two.ids)
    self.assertLen(pairs, 4 * len(self.LANGS))
    self.assertEqual(dec_metrics['num_samples_in_batch'].total_value, 4 * len(self.LANGS))
    for lang in self.LANGS:
      self.assertIn('corpus_bleu_%s' % lang, dec_metrics)


if __name__ == '__main__':
  tf.test.main()
