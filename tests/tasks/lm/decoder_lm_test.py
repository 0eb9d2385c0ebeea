"""DecoderLm: the pipelined tied-embedding language model trains exactly for every schedule.

Every pipelined variant is compared with the same task built with `unpipelined=True` (the layers
one after another, plain TensorFlow gradients; the same variables and dropout masks). The variants
of a test share one graph: they are built with one name under one variable store with reuse, so
they share their variables, and their dropout masks (keyed by the layers' variable scopes) agree.
Gradients are compared relative to the largest reference gradient norm: Lingvo's attention
key-projection bias has a zero gradient by symmetry (float noise of ~1e-8), which has no meaningful
relative error of its own.
"""

import zlib

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import cluster_factory
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import check_failure
from tensorpipe import placement
from tensorpipe.tasks.lm import decoder_lm
from tests import layer_helpers
from tests import trainer_helpers

BATCH = 6  # M = 3 divides it, M = 4 does not (micro-batches of 2, 2, 1, 1).
MAX_NUMBERS = 2  # T = 10.
TOLERANCE = 1e-5  # Of the largest reference gradient norm; float32 rounding gives ~1e-7.
TIED = 'pipeline/softmax/weight_0/var'


def _Params(k=2, m=3, schedule='gpipe', unpipelined=False, dropout_prob=0.3, num_layers=2,
            **kwargs):
  p = decoder_lm.DecoderLmParams(model_dim=16, hidden_dim=32, num_heads=2, num_layers=num_layers,
                                 num_partitions=k, num_micro_batches=m, schedule=schedule,
                                 dropout_prob=dropout_prob, name='lm')
  p.pipeline.Set(unpipelined=unpipelined, **kwargs)
  return p


def _NumpyBatch(rows=range(0, 5 * BATCH, 5), split='train'):
  """ids, labels, paddings [len(rows), T] of the counting corpus, as CountingInput makes them."""
  tokens, lengths = decoder_lm.CountingTable(split, max_numbers=MAX_NUMBERS)
  tokens, lengths = tokens[list(rows)], lengths[list(rows)]
  t = decoder_lm.SequenceLength(MAX_NUMBERS)
  paddings = (np.arange(t)[None, :] >= lengths[:, None] - 1).astype(np.float32)
  return tokens[:, :-1], tokens[:, 1:], paddings


def _Batch(dynamic=False):
  ids, labels, paddings = _NumpyBatch()
  if not dynamic:
    return py_utils.NestedMap(ids=tf.constant(ids), labels=tf.constant(labels),
                              paddings=tf.constant(paddings))
  # Batch and sequence sizes known only when the graph runs.
  return py_utils.NestedMap(
      ids=tf.placeholder_with_default(ids, [None, None]),
      labels=tf.placeholder_with_default(labels, [None, None]),
      paddings=tf.placeholder_with_default(paddings, [None, None]))


def _Build(variants, batch_fn=_Batch, num_devices=3):
  """Builds each task Params of `variants` ({name: Params}) in one graph, sharing variables.

  Returns (graph, {name: (loss, {variable name: gradient})}, {name: task}, {name: its input
  batch}); the graph has a global step (0), as in training.
  """
  graph = tf.Graph()
  fetches, tasks, batches = {}, {}, {}
  with graph.as_default(), layer_helpers.Cluster(num_devices):
    tf.random.set_seed(1234)  # Lingvo then seeds each initialiser from its variable's name.
    py_utils.GetOrCreateGlobalStepVar()
    with py_utils.VariableStore(), tf.variable_scope('', reuse=tf.AUTO_REUSE):
      for name, params in variants.items():
        task = tasks[name] = params.Instantiate()
        batch = batches[name] = batch_fn()
        loss = task.FPropDefaultTheta(batch)[0]['loss'][0]
        variables = tf.trainable_variables()
        grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
        fetches[name] = (loss, {v.op.name[len('lm/'):]: g for v, g in zip(variables, grads)})
  return graph, fetches, tasks, batches


def _Run(graph, fetches, num_devices=3, feed_dict=None):
  with tf.Session(graph=graph, config=layer_helpers.ValuesOnlyConfig(num_devices)) as sess:
    sess.run(tf.global_variables_initializer())
    return sess.run(fetches, feed_dict=feed_dict)


def _Error(grads, reference):
  """max over variables of |g - g_ref|, over the largest |g_ref| (Frobenius norms)."""
  assert sorted(grads) == sorted(reference), (sorted(grads), sorted(reference))
  scale = max(np.linalg.norm(g) for g in reference.values())
  return max(np.linalg.norm(grads[name] - reference[name]) for name in grads) / scale


def _AssertLikeUnpipelined(test, variants):
  """Builds `variants` ({name: Params}, one 'unpipelined') in one graph; every other's loss and
  gradients, the tied weight's included, equal the unpipelined one's."""
  graph, fetches, tasks, _ = _Build(variants)
  for name, task in tasks.items():  # Per-example masks only: nothing depends on M.
    test.assertEqual(task.pipeline.MicroBatchDependence(), [], name)
  results = _Run(graph, fetches)
  ref_loss, reference = results.pop('unpipelined')
  test.assertLen(results, len(variants) - 1)
  test.assertGreater(np.linalg.norm(reference[TIED]), 0.0)
  for name, (loss, grads) in results.items():
    test.assertAllClose(loss, ref_loss, rtol=1e-6, msg=name)
    test.assertLess(_Error(grads, reference), TOLERANCE, name)
    # The tied weight's gradient: the embedding's use on device 0 plus the softmax's on the last.
    test.assertLess(np.linalg.norm(grads[TIED] - reference[TIED]),
                    TOLERANCE * np.linalg.norm(reference[TIED]), name)


class DecoderLmVirtualStagesTest(test_utils.TestCase):
  """Two partitions per device: the tied weight's two uses are on device 0 in the V of 'zbv'."""

  @pytest.mark.slow
  def testVirtualSchedulesLikeUnpipelined(self):
    # K = 2 devices, 4 partitions: the embedding and 3 layers, one each.
    _AssertLikeUnpipelined(self, {
        'unpipelined': _Params(unpipelined=True, num_layers=3),
        'interleaved_1f1b K2 M4': _Params(4, 4, 'interleaved_1f1b', num_layers=3,
                                          virtual_stages=2),
        'zbv K2 M3': _Params(4, 3, 'zbv', num_layers=3, virtual_stages=2)})


class DecoderLmGradientsTest(test_utils.TestCase):
  """Pipelined gradients equal the unpipelined task's, with dropout on, for every schedule."""

  @pytest.mark.slow
  def testEveryScheduleLikeUnpipelined(self):
    # Each schedule for two of K in {1, 2, 3}, with an M that divides the batch of 6 and one that
    # does not (two micro-batch sizes); all in one graph beside one unpipelined reference.
    cases = {'gpipe': [(1, 3), (2, 4)], '1f1b': [(2, 3), (3, 4)], 'zero_bubble': [(3, 3), (2, 4)]}
    variants = {'unpipelined': _Params(unpipelined=True)}
    for schedule, ks_ms in cases.items():
      for k, m in ks_ms:
        variants['%s K%d M%d' % (schedule, k, m)] = _Params(k, m, schedule)
    _AssertLikeUnpipelined(self, variants)

  @pytest.mark.slow
  def testDropoutChangesTheGradients(self):
    """The dropout the comparisons above run with really drops (so equal masks are shown)."""
    graph, fetches, _, _ = _Build({'with': _Params(unpipelined=True),
                                   'without': _Params(unpipelined=True, dropout_prob=0.0)})
    results = _Run(graph, fetches)
    self.assertGreater(_Error(results['with'][1], results['without'][1]), 1e-2)

  @pytest.mark.slow
  def testRunTimeBatchAndSequenceSizes(self):
    """ids, labels and paddings of shape [None, None]: 1f1b takes the unpipelined step, for the
    default batch (6 x 10) and for a fed one of another size (5 x 7)."""
    variants = {'unpipelined': _Params(unpipelined=True), '1f1b': _Params(2, 4, '1f1b')}
    graph, fetches, _, batches = _Build(variants, lambda: _Batch(dynamic=True))
    self.assertEqual(batches['1f1b'].ids.shape.as_list(), [None, None])
    ids, labels, paddings = _NumpyBatch(rows=range(1, 40, 8))
    other = {}
    for batch in batches.values():
      other.update({batch.ids: ids[:, :7], batch.labels: labels[:, :7],
                    batch.paddings: paddings[:, :7]})
    for feed_dict in (None, other):
      results = _Run(graph, fetches, feed_dict=feed_dict)
      ref_loss, reference = results.pop('unpipelined')
      for name, (loss, grads) in results.items():
        self.assertAllClose(loss, ref_loss, rtol=1e-6, msg=name)
        self.assertLess(_Error(grads, reference), TOLERANCE, name)


class DecoderLmTest(test_utils.TestCase):

  def testTheTiedEmbeddingIsOneVariableOnTheFirstDevice(self):
    with tf.Graph().as_default(), layer_helpers.Cluster(2):
      task = _Params(2, 4, '1f1b').Instantiate()
      names = [v.op.name for v in tf.trainable_variables()]
      self.assertEqual([n for n in names if 'softmax' in n or 'emb' in n],
                       ['lm/' + TIED, 'lm/pipeline/softmax/bias_0/var'])
      self.assertEqual(task.pipeline.partition_layer_names,
                       [['embed', 'position', 'layer0'], ['layer1', 'xent']])
      tied = [v for v in tf.trainable_variables() if v.op.name == 'lm/' + TIED][0]
      self.assertEqual(tied.shape.as_list(), [16, decoder_lm.VOCAB_SIZE])
      self.assertTrue(tied.device.endswith('CPU:0'), tied.device)

  @pytest.mark.slow
  def testTheWrongBatchDimFailsTheFirstStep(self):
    """Time-major inputs split along T (batch_dim=0) would let attention see part of a sequence:
    the first training step fails, saying what to set."""
    graph, fetches, _, _ = _Build({'lm': _Params(2, 2, '1f1b', batch_dim=0)}, num_devices=2)
    with self.assertRaises(tf.errors.InvalidArgumentError) as failure:
      _Run(graph, fetches, num_devices=2)
    self.assertRegex(check_failure.OneLine(failure.exception),
                     r"the batch_dim check failed: layer 'layer0' \(layer 2 of partition 0\) mixes "
                     r'examples along batch_dim=0.*set batch_dim=1')

  def testMissingPipelineOrLossLayerIsRefused(self):
    with self.assertRaisesRegex(ValueError, r"DecoderLm 'lm': set `pipeline`"):
      decoder_lm.DecoderLm.Params().Set(name='lm').Instantiate()
    p = _Params()
    p.pipeline.loss_layer = None
    with self.assertRaisesRegex(ValueError, 'needs a loss_layer'), layer_helpers.Cluster(2):
      p.Instantiate()
    with self.assertRaisesRegex(ValueError, '3 partitions need num_layers >= 2 .*got num_layers=1'):
      _Params(3, num_layers=1)
    with self.assertRaisesRegex(ValueError, "decode_method must be one of .*got 'nucleus'"), \
        layer_helpers.Cluster(2):
      _Params().Set(decode_method='nucleus').Instantiate()

  def testTheDecoderJobWritesSamplesAndTokensPerSecond(self):
    """Decode and PostProcessDecodeOut, as Lingvo's decoder job runs them on the held-out split."""
    p = _Params(2, 2, dropout_prob=0.0)
    p.decode_new_tokens = 5
    p.input = decoder_lm.CountingInput.Params().Set(split='test', batch_size=4, max_numbers=2,
                                                    resettable=True)
    graph = tf.Graph()
    with graph.as_default(), cluster_factory.ForTestingWorker(cpus=2, split_size=2, do_eval=True):
      py_utils.GetOrCreateGlobalStepVar()
      task = p.Instantiate()
      dec_out = task.Decode(task.input_generator.GetPreprocessedInputBatch())
      with tf.Session(graph=graph, config=layer_helpers.ValuesOnlyConfig(2)) as sess:
        sess.run(tf.global_variables_initializer())
        task.input_generator.Initialize(sess)
        dec_metrics = task.CreateDecoderMetrics()
        samples = []
        for _ in range(2):
          out = sess.run(dec_out)
          samples += task.PostProcessDecodeOut(out, dec_metrics)
    self.assertEqual(out['hyp_ids'].shape, (4, 5))
    self.assertEqual(out['prompt_ids'].shape, (4, p.decode_prompt_length))
    self.assertLen(samples, 8)
    prompt, text = samples[0]
    self.assertTrue(prompt.startswith('<s> '), prompt)
    self.assertRegex(text, r'^%s => (\S+ ?){1,5} \(reference: .*; score -?\d+\.\d+\)$' % prompt)
    self.assertEqual(dec_metrics['num_samples_in_batch'].GetTotalValue(), 8)
    self.assertGreater(dec_metrics['tokens_per_second'].value, 0.0)
    self.assertBetween(dec_metrics['continuation_accuracy'].value, 0.0, 1.0)


class _AddSkip(base_layer.BaseLayer):
  """vec plus a skip connection's vec, per position: no weights, no state."""

  def FProp(self, theta, inputs, skip):
    return py_utils.NestedMap(vec=inputs.vec + skip.vec, paddings=inputs.paddings)


def _DecodeValue(name, shape):
  """Weights under which the random model's continuations vary (and beam search beats greedy)."""
  rng = np.random.RandomState(zlib.crc32(name.encode()))
  if 'bias' in name or name.endswith('/b/var') or name.endswith('_b/var'):
    return np.zeros(shape, np.float32)
  if 'scale' in name:
    return (1.0 + 0.1 * rng.normal(size=shape)).astype(np.float32)
  return (rng.normal(size=shape) * (1.0 if name == TIED else 0.3)).astype(np.float32)


def _Prompts():
  """Five prompts of 4 tokens ('<s> w w ,' and the like): M = 2 and 3 divide neither them nor
  their 20 beam-search hypotheses."""
  tokens, _ = decoder_lm.CountingTable('test', max_numbers=3)
  return tokens[::7][:5, :4]


class DecoderLmDecodingTest(test_utils.TestCase):
  """The pipelined incremental decoder (each layer's cache on its partition's device) continues
  prompts with the tokens, and scores within 1e-5, of the unpipelined incremental decoder and of
  re-running the pipeline on the whole prefix: greedy, beam search of 4 and top-k sampling, for K in
  {1, 2, 3} and M in {1, 2, 3}, with a skip connection from the first partition to the last in one
  case."""

  @pytest.mark.slow
  def testPipelinedIncrementalLikeUnpipelinedAndFullPrefix(self):
    # (K, M, skip connection): each group is compared with the unpipelined model of its group.
    configs = [(1, 1, False), (2, 2, False), (2, 3, False), (3, 3, True)]
    graph = tf.Graph()
    fetches = {}
    with graph.as_default(), cluster_factory.ForTestingWorker(cpus=3, split_size=3,
                                                              do_eval=True):
      py_utils.GetOrCreateGlobalStepVar()
      with py_utils.VariableStore(), tf.variable_scope('', reuse=tf.AUTO_REUSE):
        for k, m, skip in configs + [(3, 1, False), (3, 1, True)]:
          unpipelined = m == 1 and k == 3
          p = _Params(k, m, dropout_prob=0.0, unpipelined=unpipelined)
          p.decode_new_tokens = 6
          if skip:
            p.pipeline.partitions[-1].append(_AddSkip.Params().Set(name='add'))
            p.pipeline.skip_connections = [('position', 'add')]
          task = p.Instantiate()
          prompt = tf.constant(_Prompts())
          name = ('unpipelined' if unpipelined else 'K%dM%d' % (k, m)) + ('skip' if skip else '')
          paths = (True, False) if unpipelined else (True,)
          methods = ('greedy', 'beam') + (('top_k',) if m == 3 or unpipelined else ())
          for incremental in paths:
            for method in methods:
              out = task.Generate(task.theta, prompt, method, incremental)
              fetches[(name, method, incremental)] = (out.ids, out.scores)
      variables = tf.trainable_variables()
      with tf.Session(graph=graph, config=layer_helpers.ValuesOnlyConfig(3)) as sess:
        sess.run(tf.global_variables_initializer())
        sess.run([v.initializer for v in variables], feed_dict={
            v.initial_value: _DecodeValue(v.op.name[len('lm/'):], v.shape.as_list())
            for v in variables})
        decoded = sess.run(fetches)
    reference = {key[1:]: value for key, value in decoded.items() if key[0] == 'unpipelined'}
    greedy, beam = reference[('greedy', False)], reference[('beam', False)]
    # The check means something: continuations vary, beam search beats greedy decoding somewhere.
    self.assertGreater(len(np.unique(greedy[0])), 4)
    self.assertFalse(np.array_equal(greedy[0], beam[0]))
    self.assertTrue(np.all(beam[1] >= greedy[1] - 1e-5))
    # Two unpipelined models with both paths and three methods; four pipelined ones.
    self.assertLen(decoded, 2 * 2 * 3 + 2 + 2 + 3 + 3)
    for (name, method, incremental), (ids, scores) in sorted(decoded.items()):
      want = decoded[('unpipelinedskip' if name.endswith('skip') else 'unpipelined', method,
                      False)]
      what = '%s %s incremental=%s' % (name, method, incremental)
      self.assertAllEqual(ids, want[0], msg=what)
      # A score sums the log-probabilities of the new tokens, computed in another order against a
      # cache than against the whole prefix: float32 rounding grows with the score's size.
      self.assertAllClose(scores, want[1], rtol=1e-5, atol=1e-5, msg=what)


class TinyTiedLmTest(test_utils.TestCase):

  @pytest.mark.slow
  def testTheRegisteredModelLearns(self):
    """150 training steps of lm.TinyTiedLm (Lingvo's train op: 1F1B, K = 2, M = 4, Adam) on the
    counting corpus: the mean loss of the last 20 steps is under half that of the first 5 (about
    4.5 nats per token at the start, about 1.5 after 150 steps)."""
    cfg = trainer_helpers.ModelParams('lm.TinyTiedLm', 'Train')
    self.assertEqual(cfg.task.pipeline.schedule, '1f1b')
    graph, task = trainer_helpers.TrainerGraph(cfg, 2)
    with graph.as_default():
      init = tf.global_variables_initializer()
    losses = []
    with tf.Session(graph=graph, config=placement.SessionConfig(2)) as sess:
      sess.run(init)
      task.input.Initialize(sess)
      for _ in range(150):
        metrics, _ = sess.run([task.eval_metrics, task.train_op])
        losses.append(metrics['loss'][0])
    self.assertTrue(np.all(np.isfinite(losses)))
    self.assertLess(np.mean(losses[-20:]), 0.5 * np.mean(losses[:5]), losses)


class CountingCorpusTest(test_utils.TestCase):

  def testNumberWords(self):
    self.assertEqual(decoder_lm.NumberWords(0), ['zero'])
    self.assertEqual(decoder_lm.NumberWords(17), ['seventeen'])
    self.assertEqual(decoder_lm.NumberWords(40), ['forty'])
    self.assertEqual(decoder_lm.NumberWords(305), ['three', 'hundred', 'five'])
    self.assertEqual(decoder_lm.NumberWords(999), ['nine', 'hundred', 'ninety', 'nine'])
    self.assertEqual(' '.join(decoder_lm.CountingSentence(99, 2)),
                     '<s> ninety nine , one hundred </s>')
    with self.assertRaisesRegex(ValueError, r'in \[0, 999\], got 1000'):
      decoder_lm.NumberWords(1000)
    every = {w for n in range(1000) for w in decoder_lm.NumberWords(n)}
    self.assertEqual(every | {'<pad>', '<s>', '</s>', ','}, set(decoder_lm.VOCABULARY))
    self.assertEqual(decoder_lm.VOCAB_SIZE, 33)

  def testSplitsAreDisjointAndCoverEveryStart(self):
    train = decoder_lm.SplitStarts('train', 4, 0.1, 1234)
    test = decoder_lm.SplitStarts('test', 4, 0.1, 1234)
    self.assertEmpty(set(train) & set(test))
    self.assertEqual(sorted(set(train) | set(test)), list(range(997)))
    self.assertLen(test, 100)

  def testBatchesPredictTheNextToken(self):
    with self.session(graph=tf.Graph()) as sess:
      gen = decoder_lm.CountingInput.Params().Set(batch_size=8, max_numbers=3).Instantiate()
      batch = gen.GetPreprocessedInputBatch()
      gen.Initialize(sess)
      b = sess.run(batch)
    t = decoder_lm.SequenceLength(3)
    self.assertEqual(b.ids.shape, (8, t))
    self.assertAllEqual(b.ids[:, 1:], b.labels[:, :-1])
    for ids, labels, paddings in zip(b.ids, b.labels, b.paddings):
      n = int((1 - paddings).sum())  # Real positions come first.
      self.assertAllEqual(paddings, [0] * n + [1] * (t - n))
      self.assertEqual(decoder_lm.VOCABULARY[ids[0]], '<s>')
      self.assertEqual(decoder_lm.VOCABULARY[labels[n - 1]], '</s>')
      self.assertNotIn(decoder_lm.PAD_ID, labels[:n])

  def testTheTestSplitIsOnePassPaddedToWholeBatches(self):
    with self.session(graph=tf.Graph()) as sess:
      gen = decoder_lm.CountingInput.Params().Set(batch_size=64, split='test',
                                                  resettable=True).Instantiate()
      batch = gen.GetPreprocessedInputBatch()
      gen.Initialize(sess)
      for _ in range(2):
        real = 0
        with self.assertRaises(tf.errors.OutOfRangeError):
          while True:
            b = sess.run(batch)
            self.assertEqual(b.ids.shape[0], 64)
            real += int((b.paddings.min(axis=1) == 0).sum())
        self.assertEqual(real, gen.num_examples)
        gen.Reset(sess)  # The next pass starts again at the beginning.
    self.assertEqual(gen.num_examples, 100 * 3)  # 100 held-out starts, runs of 2, 3 or 4.


if __name__ == '__main__':
  test_utils.main()
