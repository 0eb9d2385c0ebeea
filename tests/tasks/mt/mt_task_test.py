"""PipelinedTransformer: pipelined encoder-decoder gives the plain model's gradients (dropout on).

The encoder and decoder stacks run as TensorPipeLayers with K in {1, 2, 4} partitions and M in {1,
2, 4} micro-batches (re-computation on); the reference runs the same layers in SequentialLayers.
Weights are set to the same values by name, dropout (keep 0.8) is on, so equal gradients also show
that every dropout mask is the same in the forward pass and in its re-computation, whatever K and M
are.
"""

import functools
import os
import re
import tempfile
import zlib

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import builder_layers
from lingvo.core import cluster_factory
from lingvo.core import metrics
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe.tasks.mt import mt_input
from tensorpipe.tasks.mt import mt_task
from tensorpipe.tasks.mt import num2words_corpus
from tests import layer_helpers

VOCAB, BATCH, SRC_LEN, TGT_LEN = 40, 4, 7, 6


def _Params(num_devices, num_micro_batches=1, pipelined=True, keep=0.8, num_layers=3):
  p = mt_task.TransformerParams(num_layers=num_layers, ffn_dim=24, num_heads=2, model_dim=16, head_dim=8,
                                vocab_size=VOCAB, num_devices=num_devices,
                                num_micro_batches=num_micro_batches, dropout_keep_prob=keep)
  if not pipelined:
    p.encoder = builder_layers.SequentialLayer.Params().Set(name='encoder', sub=p.encoder.layers)
    p.decoder = builder_layers.SequentialLayer.Params().Set(name='decoder', sub=p.decoder.layers)
  return p


def _Batch():
  rng = np.random.RandomState(0)
  src_len = rng.randint(2, SRC_LEN + 1, size=BATCH)
  tgt_len = rng.randint(2, TGT_LEN + 1, size=BATCH)
  src_pad = (np.arange(SRC_LEN)[None, :] >= src_len[:, None]).astype(np.float32)
  tgt_pad = (np.arange(TGT_LEN)[None, :] >= tgt_len[:, None]).astype(np.float32)
  return py_utils.NestedMap(
      src=py_utils.NestedMap(ids=tf.constant(rng.randint(4, VOCAB, size=[BATCH, SRC_LEN]),
                                             tf.int32),
                             paddings=tf.constant(src_pad)),
      tgt=py_utils.NestedMap(ids=tf.constant(rng.randint(4, VOCAB, size=[BATCH, TGT_LEN]),
                                             tf.int32),
                             labels=tf.constant(rng.randint(4, VOCAB, size=[BATCH, TGT_LEN]),
                                                tf.int32),
                             paddings=tf.constant(tgt_pad), weights=tf.constant(1.0 - tgt_pad)))


def _Value(name, shape):
  rng = np.random.RandomState(zlib.crc32(name.encode()))
  return (rng.normal(size=shape) * 0.3).astype(np.float32)


# The softmax's variables when it runs in the decoder's last partition (decoder schedules other than
# 'gpipe'), by the names they have otherwise.
_SOFTMAX_IN_DECODER = {'mt/decoder/softmax/w/var': 'mt/softmax_w/var',
                       'mt/decoder/softmax/b/var': 'mt/softmax_b/var'}


def Gradients(params, num_devices=4):
  """({variable: gradient}, loss, number of dropout masks) of one step at global step 5, weights set
  by name (the softmax's by its name outside the decoder)."""
  graph = tf.Graph()
  with graph.as_default(), layer_helpers.Cluster(num_devices):
    step = py_utils.GetOrCreateGlobalStepVar()
    task = params.Instantiate()
    loss = task.FPropDefaultTheta(_Batch())[0]['loss'][0]
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    grads = [tf.convert_to_tensor(g) for g in grads]
    config = layer_helpers.ValuesOnlyConfig(num_devices)  # Build speed only.
    with tf.Session(graph=graph, config=config) as sess:
      sess.run(tf.global_variables_initializer())
      for v in variables:
        v.load(_Value(_SOFTMAX_IN_DECODER.get(v.op.name, v.op.name), v.shape.as_list()), sess)
      step.load(5, sess)
      values, loss_value = sess.run([grads, loss])
    hashes = len([op for op in graph.get_operations()
                  if op.type == 'Cast' and re.search(r'dropout_mask(_\d+)?$', op.name)])
  return ({_SOFTMAX_IN_DECODER.get(v.op.name, v.op.name): g for v, g in zip(variables, values)},
          loss_value, hashes)


@functools.lru_cache(maxsize=None)
def PipelinedGradients(num_devices, num_micro_batches, decoder_schedule='gpipe'):
  """Gradients(_Params(K, M)) with the given decoder schedule, built once per process: the
  K = 2, M = 2 'gpipe' model is both a pipelined variant checked against the unpipelined model and
  the reference of the other decoder schedules (each build takes seconds)."""
  p = _Params(num_devices, num_micro_batches)
  p.decoder.schedule = decoder_schedule
  return Gradients(p)


class PipelinedTransformerTest(test_utils.TestCase):

  @pytest.mark.slow
  def testGradientsMatchUnpipelinedForSeveralKAndMWithDropout(self):
    reference, ref_loss, ref_hashes = Gradients(_Params(1, pipelined=False))
    self.assertGreater(len(reference), 30)
    # Dropout is really on: 3 masks per encoder layer, 4 per decoder layer, 2 on the embeddings.
    self.assertEqual(ref_hashes, 3 * 3 + 3 * 4 + 2)
    for k, m in ((1, 4), (2, 2), (4, 1)):
      grads, loss, _ = PipelinedGradients(k, m)
      self.assertAllClose(loss, ref_loss, rtol=1e-6, msg='K=%d M=%d' % (k, m))
      self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-5, 'K=%d M=%d' % (k, m))

  @pytest.mark.slow
  def testDecoderSchedulesWithTheSoftmaxInTheLastPartition(self):
    reference, ref_loss, _ = PipelinedGradients(2, 2)
    # The task moves the softmax for every schedule but gpipe alike; zero_bubble also splits the
    # backward passes.
    for name in ('zero_bubble',):
      grads, loss, _ = PipelinedGradients(2, 2, name)
      self.assertAllClose(loss, ref_loss, rtol=1e-6, msg=name)
      self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-5, name)

  @pytest.mark.slow
  def testDecodingWithTheSoftmaxInTheLastPartition(self):

    def GreedyIds(params):
      graph = tf.Graph()
      with graph.as_default(), cluster_factory.ForTestingWorker(cpus=2, split_size=2, do_eval=True):
        py_utils.GetOrCreateGlobalStepVar()
        params.max_decode_length = 5
        task = params.Instantiate()
        ids = task.GreedyDecode(task.theta, _Batch().src).ids
        with layer_helpers.Session(graph, 2) as sess:
          sess.run(tf.global_variables_initializer())
          for v in tf.trainable_variables():
            v.load(_Value(_SOFTMAX_IN_DECODER.get(v.op.name, v.op.name), v.shape.as_list()), sess)
          return sess.run(ids)

    p = _Params(2, 2)
    p.decoder.schedule = 'zero_bubble'
    self.assertAllEqual(GreedyIds(p), GreedyIds(_Params(2, 2)))

  def testEncoderKeepsFillDrain(self):
    p = _Params(2, 2)
    p.encoder.schedule = '1f1b'
    with self.assertRaisesRegex(ValueError, r"PipelinedTransformer 'mt': encoder schedule='1f1b'; "
                                r"the encoder must use 'gpipe'.*Set the schedule on the decoder"):
      with layer_helpers.Cluster(2):
        p.Instantiate()


def _DecodeValue(name, shape):
  """Weights under which the random model's tokens vary: the embedding dominates the residual
  stream, the softmax maps it to a permuted successor token, biases are zero."""
  rng = np.random.RandomState(zlib.crc32(name.encode()))
  if name.endswith('softmax_w/var') or name.endswith('softmax/w/var'):
    emb = _DecodeValue('mt/emb/var', [shape[1], shape[0]])
    return emb[np.random.RandomState(5).permutation(shape[1])].T
  if name.endswith('emb/var'):
    return rng.normal(size=shape).astype(np.float32)
  if 'bias' in name or re.search(r'(ffn_b\d|/b)/var$', name) or name.endswith('softmax_b/var'):
    return np.zeros(shape, np.float32)
  if 'scale' in name:
    return (1.0 + rng.normal(size=shape) * 0.1).astype(np.float32)
  return (rng.normal(size=shape) * 0.2).astype(np.float32)


class IncrementalDecodingTest(test_utils.TestCase):
  """Greedy and beam-4 decoding through the decoder pipeline's ExtendStep (each layer's cache on its
  partition's device) give the tokens, and scores within 1e-5, of the unpipelined incremental
  decoder and of re-running the decoder on the whole prefix, for K in {1, 2, 3} and M in {1, 2, 3}
  (3 does not divide the batch of 4, nor its 16 hypotheses), with the softmax after the decoder or
  in its last partition."""

  @pytest.mark.slow
  def testPipelinedIncrementalLikeUnpipelinedAndFullPrefix(self):
    configs = [(1, 1, 'gpipe'), (2, 2, 'gpipe'), (3, 3, 'gpipe'), (2, 3, '1f1b'),
               (2, 1, 'unpipelined')]
    graph = tf.Graph()
    with graph.as_default(), cluster_factory.ForTestingWorker(cpus=3, split_size=3, do_eval=True):
      py_utils.GetOrCreateGlobalStepVar()
      fetches = {}
      for k, m, sched in configs:
        p = _Params(k, m, keep=1.0)
        p.name = 'K%dM%d%s' % (k, m, sched)
        p.max_decode_length = 6
        if sched == 'unpipelined':
          p.decoder.unpipelined = True
        else:
          p.decoder.schedule = sched
        task = p.Instantiate()
        src = _Batch().src
        # The unpipelined model's full-prefix decoding is the reference.
        for incremental in (True, False) if sched == 'unpipelined' else (True,):
          greedy = task.GreedyDecode(task.theta, src, incremental=incremental)
          beam = task.BeamSearchDecode(task.theta, src, 4, 0.0, incremental=incremental)
          fetches[(p.name, incremental)] = (greedy.ids, greedy.scores, beam.ids, beam.scores)
      variables = tf.trainable_variables()
      with tf.Session(graph=graph, config=layer_helpers.ValuesOnlyConfig(3)) as sess:
        values = {}
        for v in variables:
          name = 'mt/' + v.op.name.split('/', 1)[1]
          values[v.initial_value] = _DecodeValue(_SOFTMAX_IN_DECODER.get(name, name),
                                                 v.shape.as_list())
        sess.run([v.initializer for v in variables], feed_dict=values)
        sess.run([v.initializer for v in tf.global_variables() if v not in variables])
        decoded = sess.run(fetches)
    reference = decoded.pop(('K2M1unpipelined', False))
    # The check means something: tokens vary within a row and between rows, and beam search finds
    # another hypothesis than greedy decoding for some example.
    self.assertGreater(len(np.unique(reference[0])), 8)
    self.assertFalse(np.array_equal(reference[0], reference[2]))
    self.assertLen(decoded, len(configs))
    for key, got in sorted(decoded.items()):
      for i, what in enumerate(('greedy ids', 'greedy scores', 'beam ids', 'beam scores')):
        if i % 2:
          # Scores sum log-probabilities computed in another order against a cache than against the
          # whole prefix: float32 rounding grows with their size.
          self.assertAllClose(got[i], reference[i], rtol=1e-5, atol=1e-5,
                              msg='%s %s' % (key, what))
        else:
          self.assertAllEqual(got[i], reference[i], msg='%s %s' % (key, what))

  def testASequentialDecoderNeedsTheFullPrefixPath(self):
    with tf.Graph().as_default(), layer_helpers.Cluster(1):
      task = _Params(1, pipelined=False).Instantiate()
      with self.assertRaisesRegex(ValueError, r"the decoder \(a SequentialLayer\) has no "
                                  'InitStates for incremental decoding; set incremental_decode='
                                  'False'):
        task.GreedyDecode(task.theta, _Batch().src)


class GreedyDecodeBleuTest(test_utils.TestCase):
  """Trains a tiny pipelined T(1, 128, 4) (K = 2, M = 2) on a small num2words corpus, then decodes
  the test split greedily in eval mode and scores it with PostProcessDecodeOut (overall + per
  language)."""

  LANGS = ['de', 'es', 'it']

  def _Params(self, data_dir, vocab_size):
    p = mt_task.TransformerParams(num_layers=1, ffn_dim=128, num_heads=4, model_dim=64, head_dim=16,
                                  vocab_size=vocab_size, num_devices=2, num_micro_batches=2,
                                  dropout_keep_prob=1.0)
    p.label_smoothing = 0.0
    p.languages = self.LANGS
    p.max_decode_length = 15
    p.input = mt_input.MultilingualInput.Params().Set(
        data_dir=data_dir, split='test', languages=self.LANGS, target_max_length=16)
    p.input.batch_size = 16
    return p

  @pytest.mark.slow
  def testDecodeAndBleuEndToEnd(self):
    data_dir = os.path.join(tempfile.mkdtemp(), 'corpus')
    num2words_corpus.EnsureCorpus(data_dir, max_number=99, num_test=10, max_train=80, min_train=40,
                                  vocab_size=300)
    ckpt = os.path.join(tempfile.mkdtemp(), 'model')
    graph = tf.Graph()
    with graph.as_default(), layer_helpers.Cluster(2):
      step = py_utils.GetOrCreateGlobalStepVar()
      train_input = mt_input.MultilingualInput.Params().Set(
          data_dir=data_dir, split='train', languages=self.LANGS, target_max_length=16)
      train_input.batch_size = 32
      train_gen = train_input.Instantiate()
      task = self._Params(data_dir, train_gen.vocab_size).Instantiate()
      loss = task.FPropDefaultTheta(train_gen.GetPreprocessedInputBatch())[0]['loss'][0]
      train_op = tf.train.AdamOptimizer(3e-3).minimize(loss, global_step=step,
                                                       colocate_gradients_with_ops=True)
      saver = tf.train.Saver()
      with layer_helpers.Session(graph, 2) as sess:
        sess.run(tf.global_variables_initializer())
        train_gen.Initialize(sess)
        first = sess.run(loss)
        for _ in range(150):
          last, _ = sess.run([loss, train_op])
        saver.save(sess, ckpt)
    self.assertLess(last, 0.5 * first)

    graph = tf.Graph()
    with graph.as_default(), cluster_factory.ForTestingWorker(cpus=2, split_size=2, do_eval=True):
      py_utils.GetOrCreateGlobalStepVar()
      task = self._Params(data_dir, train_gen.vocab_size).Instantiate()
      self.assertTrue(task.do_eval)
      dec_out = task.Decode(task.input_generator.GetPreprocessedInputBatch())
      with layer_helpers.Session(graph, 2) as sess:
        tf.train.Saver().restore(sess, ckpt)
        task.input_generator.Initialize(sess)
        dec_metrics = task.CreateDecoderMetrics()
        pairs = []
        try:
          while True:
            pairs += task.PostProcessDecodeOut(sess.run(dec_out), dec_metrics)
        except tf.errors.OutOfRangeError:
          pass
    self.assertLen(pairs, 10 * len(self.LANGS))
    # The overall BLEU is the BLEU of the logged (reference, hypothesis) pairs, rescored here.
    rescored = metrics.CorpusBleuMetric()
    for _, info in pairs:
      ref, hyp = info.split(' ref: ')[1].split(' hyp: ')
      rescored.Update(ref, hyp)
    self.assertAllClose(dec_metrics['corpus_bleu'].value, rescored.value)
    self.assertGreater(dec_metrics['corpus_bleu'].value, 0.2)
    for lang in self.LANGS:
      self.assertIn('corpus_bleu_%s' % lang, dec_metrics)
      self.assertGreater(dec_metrics['corpus_bleu_%s' % lang].value, 0.0, lang)


if __name__ == '__main__':
  tf.test.main()
