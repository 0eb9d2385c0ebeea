"""A decoder-only language model with tied embeddings, pipelined whole, loss in the last partition.

This is the language model to copy for a pipeline of your own. Everything from token ids to the
per-token loss runs inside one TensorPipeLayer, built from stock Lingvo layers:

  partition 0:    embed     SharedLayer -> TiedEmbeddingSoftmax.Embed (ids -> vectors)
                  position  AddPositions (sinusoidal positions, dropout)
                  layer0 .. DecoderBlock = Lingvo's layers_with_attention.TransformerLayer
  ...                       (causal self-attention)
  last partition: ... layerN-1 (with a final layer norm)
                  xent      the loss_layer: SharedLayer -> TiedEmbeddingSoftmax.PerTokenXent

- **Tied weights.** `embed` and `xent` are SharedLayer entries whose `layer` Params carry one name
  (`softmax`), so the pipeline builds ONE Lingvo SharedSoftmaxLayer with one [D, V] weight on
  partition 0's device. The last partition reads it from there, and the weight's gradient is the
  sum of both uses, as in an unpipelined model.
- **Time-major.** Lingvo's attention layers take [T, B, D] vectors and [T, B] paddings, so the task
  transposes its [B, T] batch once and the pipeline runs with `batch_dim=1`: micro-batches are
  split along B and the per-token losses [T, B] are joined along B. A wrong batch_dim fails the
  first training step (TensorPipeLayer's `check_batch_dim`) with a message that says to set
  batch_dim=1.
- **Loss inside the pipeline.** The loss layer returns per-token values only, NestedMap(xent [T, B],
  argmax [T, B]) (a pipeline output needs a batch dimension; Lingvo's softmax FProp also returns
  mini-batch scalars). The task's loss, sum(xent * (1 - paddings)) / (number of real tokens), is
  computed after the pipeline, and its gradient with respect to xent depends only on the paddings.
  So every schedule (schedule_builders.NAMES) can run a micro-batch's backward pass as soon as its
  forward pass is done, also when the batch and sequence sizes are known only at run time.
- **Dropout** is on the embedding output and in the feed-forward blocks (residual and ReLU). Those
  masks are per example, so training does not depend on M. Lingvo's attention-probability dropout
  and its attention residual dropout act on tensors whose batch axis was merged into another, so
  their masks would change with M (docs/guide.md, "Stock Lingvo layers in a pipeline"); they are
  left off.

The built-in corpus needs no download: `CountingInput` generates runs of consecutive numbers written
in English words, e.g. '<s> ninety eight , ninety nine , one hundred </s>', over a fixed 33-token
word vocabulary (`VOCABULARY`). A seeded random `holdout_fraction` of the start numbers, with all
their runs, is the held-out 'test' split. Only a run's first number and its length are random: a
model that has learned to count predicts the rest.

`DecoderLmParams` builds the task's Params; params/lm.py registers `lm.TinyTiedLm` (K = 2, M = 4,
'1f1b', model dimension 32, 2 layers):

  python -m tensorpipe.trainer.train --model=lm.TinyTiedLm --cpu_devices=2 --mode=sync \
      --run_locally=cpu --logdir=/tmp/tiny_lm                      # train (1000 steps)
  python -m tensorpipe.trainer.train --model=lm.TinyTiedLm --cpu_devices=2 --mode=sync \
      --run_locally=cpu --logdir=/tmp/tiny_lm --job=evaler_test    # held-out loss, log_pplx
"""

from typing import Any, Callable

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import base_model
from lingvo.core import layers
from lingvo.core import layers_with_attention
from lingvo.core import metrics as metrics_lib
from lingvo.core import py_utils

from tensorpipe import layer as layer_lib
from tensorpipe import shared_layer
from tensorpipe.tasks import array_input
from tensorpipe.tasks import sampling
from tensorpipe.tasks.mt import beam_search

# The corpus: English number words of 0..999 and the tokens around them.
_ONES = ('zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen '
         'fifteen sixteen seventeen eighteen nineteen').split()
_TENS = 'twenty thirty forty fifty sixty seventy eighty ninety'.split()
PAD, BOS, EOS, SEPARATOR = '<pad>', '<s>', '</s>', ','
VOCABULARY = (PAD, BOS, EOS, SEPARATOR) + tuple(_ONES) + tuple(_TENS) + ('hundred',)
VOCAB_SIZE = len(VOCABULARY)  # 33
PAD_ID = VOCABULARY.index(PAD)
MAX_NUMBER = 999
MAX_WORDS_PER_NUMBER = 4  # 'nine hundred ninety nine'
SPLITS = ('train', 'test')
DECODE_METHODS = sampling.METHODS + ('beam',)


def NumberWords(n):
  """The English words of an integer 0 <= n <= 999 (no 'and', no hyphens), as a list."""
  if not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_NUMBER:
    raise ValueError('NumberWords: n must be an integer in [0, %d], got %r' % (MAX_NUMBER, n))
  hundreds, rest = divmod(int(n), 100)
  words = [_ONES[hundreds], 'hundred'] if hundreds else []
  if rest >= 20:
    words.append(_TENS[rest // 10 - 2])
    if rest % 10:
      words.append(_ONES[rest % 10])
  elif rest or not words:
    words.append(_ONES[rest])
  return words


def CountingSentence(start, count):
  """The tokens of the run start, start + 1, ..., start + count - 1: '<s> w , w , ... w </s>'."""
  tokens = [BOS]
  for i in range(count):
    if i:
      tokens.append(SEPARATOR)
    tokens.extend(NumberWords(start + i))
  return tokens + [EOS]


def SequenceLength(max_numbers):
  """T, the padded length of ids and labels for runs of up to `max_numbers` numbers."""
  # <s>, the words, the separators and </s>, less one for the shift between ids and labels.
  return 1 + max_numbers * MAX_WORDS_PER_NUMBER + (max_numbers - 1)


def SplitStarts(split, max_numbers, holdout_fraction, seed):
  """The start numbers of `split`: a seeded random `holdout_fraction` of them is 'test'."""
  if split not in SPLITS:
    raise ValueError('split=%r is not one of %s' % (split, SPLITS))
  if not 0.0 < holdout_fraction < 1.0:
    raise ValueError('holdout_fraction must be in (0, 1), got %r' % (holdout_fraction,))
  starts = np.random.RandomState(seed).permutation(MAX_NUMBER - max_numbers + 2)
  num_test = int(round(holdout_fraction * len(starts)))
  return np.sort(starts[:num_test] if split == 'test' else starts[num_test:])


def CountingTable(split, min_numbers=2, max_numbers=4, holdout_fraction=0.1, seed=1234):
  """Every run of `split` as token ids: (tokens [N, T + 1] int32 padded with PAD_ID, lengths [N]).

  One row per (start number of the split, count in [min_numbers, max_numbers]).
  """
  if not 1 <= min_numbers <= max_numbers:
    raise ValueError('need 1 <= min_numbers <= max_numbers, got min_numbers=%r max_numbers=%r' %
                     (min_numbers, max_numbers))
  if max_numbers > MAX_NUMBER:
    raise ValueError('max_numbers=%r is larger than the %d numbers' % (max_numbers, MAX_NUMBER))
  ids = {word: i for i, word in enumerate(VOCABULARY)}
  width = SequenceLength(max_numbers) + 1
  rows, lengths = [], []
  for start in SplitStarts(split, max_numbers, holdout_fraction, seed):
    for count in range(min_numbers, max_numbers + 1):
      tokens = [ids[w] for w in CountingSentence(int(start), count)]
      rows.append(tokens + [PAD_ID] * (width - len(tokens)))
      lengths.append(len(tokens))
  return np.array(rows, np.int32), np.array(lengths, np.int32)


class CountingInput(array_input.ArrayInput):
  """Next-token batches of the counting corpus (see the module docstring).

  Batches (B = InfeedBatchSize(), T = SequenceLength(max_numbers)):
    ids:      [B, T] int32, the tokens of a run but its last;
    labels:   [B, T] int32, the next tokens (ids shifted by one);
    paddings: [B, T] float32, 1.0 past the end of the run. Only the last batch of a non-repeating
              split holds whole padded examples (so every batch has the same static size).
  The splits are 'train' and 'test' (the held-out start numbers).
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.name = 'counting_input'
    p.batch_size = 32
    p.Define('min_numbers', 2, 'Fewest numbers in a run; raise it for longer sequences.')
    p.Define('max_numbers', 4,
             'Most numbers in a run; sets the sequence length T = 5 * max_numbers.')
    p.Define('holdout_fraction', 0.1, 'Fraction of the start numbers held out for the test split.')
    p.Define('seed', 1234, 'Seed of the held-out split and of the shuffling.')
    return p

  def _LoadArrays(self):
    p = self.params
    try:
      return CountingTable(p.split, p.min_numbers, p.max_numbers, p.holdout_fraction, p.seed)
    except ValueError as e:
      raise ValueError('CountingInput %r: %s' % (p.name, e)) from e

  def _ShuffleSeed(self):
    return self.params.seed

  def _PadValues(self):
    return [0, 1]  # Whole padding rows: length 1 leaves every position of ids and labels padded.

  def _Batch(self, tokens, lengths, weight):
    del weight  # Padding rows are whole padded runs: their paddings say so.
    t = SequenceLength(self.params.max_numbers)
    # Position i of ids predicts token i + 1; it is real while i + 1 < length.
    paddings = tf.cast(tf.range(t)[None, :] >= lengths[:, None] - 1, tf.float32)
    return py_utils.NestedMap(ids=tokens[:, :-1], labels=tokens[:, 1:], paddings=paddings)


class TiedEmbeddingSoftmax(layers.SharedSoftmaxLayer):
  """Lingvo's SharedSoftmaxLayer (one [D, V] weight for the softmax and, transposed, the embedding)
  with the two methods the pipeline's SharedLayer entries call, on time-major NestedMaps."""

  def Embed(self, theta, inputs):
    """NestedMap(ids [T, B], paddings [T, B]) -> NestedMap(vec [T, B, D], paddings)."""
    return py_utils.NestedMap(vec=self.EmbLookup(theta, inputs.ids), paddings=inputs.paddings)

  def PerTokenXent(self, theta, inputs, labels):
    """(NestedMap(vec [T, B, D], paddings [T, B]), labels [T, B]) -> per-token values.

    Returns NestedMap(xent [T, B] float, argmax [T, B] int32): Lingvo's FProp's per-example fields
    only, since its mini-batch scalars (avg_xent, total_weight) cannot be joined across
    micro-batches. Padded positions get a value too; the task weights them out. Without labels
    (decoding), NestedMap(logits [T, B, V]).
    """
    if labels is None:
      t, b, d = py_utils.GetShape(inputs.vec, 3)
      logits = self.Logits(theta, tf.reshape(inputs.vec, [t * b, d]))
      return py_utils.NestedMap(logits=tf.reshape(logits, [t, b, self.params.num_classes]))
    out = self.FProp(theta, inputs.vec, class_weights=1.0 - inputs.paddings,
                     class_ids=tf.cast(labels, tf.int32))
    return py_utils.NestedMap(xent=out.per_example_xent,
                              argmax=tf.cast(out.per_example_argmax, tf.int32))


class AddPositions(base_layer.BaseLayer):
  """vec [T, B, D] + Lingvo's sinusoidal position embeddings, then dropout (per example).

  NestedMap(vec, paddings) in and out; the run-time T sets the positions.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('model_dim', 64, 'D, the width of the vectors (must be even for the sinusoids).')
    p.Define('dropout_prob', 0.0, 'Dropout probability on the embedded tokens, in [0, 1).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.model_dim <= 0 or p.model_dim % 2:
      raise ValueError('AddPositions %r: model_dim must be a positive even number, got %r' %
                       (p.name, p.model_dim))
    if not 0.0 <= p.dropout_prob < 1.0:
      raise ValueError('AddPositions %r: dropout_prob must be in [0, 1), got %r' %
                       (p.name, p.dropout_prob))
    self.CreateChild('position', layers.PositionalEmbeddingLayer.Params().Set(
        embedding_dim=p.model_dim))
    self.CreateChild('dropout', layers.DropoutLayer.Params().Set(keep_prob=1.0 - p.dropout_prob))

  def FProp(self, theta, inputs):
    with tf.name_scope(self.params.name):
      time = py_utils.GetShape(inputs.vec)[0]
      vec = inputs.vec + self.position.FProp(theta.position, time)[:, None, :]
      return py_utils.NestedMap(vec=self.dropout.FProp(theta.dropout, vec),
                                paddings=inputs.paddings)

  def InitStates(self, theta, batch_size, max_length):
    """No state: a decode step needs only its position, t."""
    return py_utils.NestedMap()

  def ExtendStep(self, theta, inputs, states, t):
    """Position t: inputs NestedMap(vec [1, B, D], paddings [1, B]) plus position t's embedding."""
    with tf.name_scope(self.params.name):
      vec = inputs.vec + self.position.FPropWithPosition(theta.position, tf.reshape(t, [1, 1]))
      return py_utils.NestedMap(vec=self.dropout.FProp(theta.dropout, vec),
                                paddings=inputs.paddings), states


class DecoderBlock(layers_with_attention.TransformerLayer):
  """Lingvo's TransformerLayer on NestedMap(vec [T, B, D], paddings [T, B]), in and out.

  Its FProp returns (vectors, attention probabilities); this adapter passes the paddings on instead,
  so one block's output is the next block's input in a TensorPipeLayer's layer list.
  """

  def FProp(self, theta, inputs):  # pylint: disable=arguments-differ
    vec, _ = super().FProp(theta, inputs.vec, inputs.paddings)
    return py_utils.NestedMap(vec=vec, paddings=inputs.paddings)

  def InitStates(self, theta, batch_size, max_length):
    """The causal self-attention's cache: Lingvo's prefix states key and value [L, B, D]."""
    dim = self.params.source_dim
    zeros = tf.zeros([max_length, batch_size, dim], py_utils.FPropDtype(self.params))
    return py_utils.NestedMap(key=zeros, value=zeros)

  def ExtendStep(self, theta, inputs, states, t):  # pylint: disable=arguments-differ
    """Position t: inputs NestedMap(vec [1, B, D], paddings [1, B]) through Lingvo's ExtendStep."""
    vec, _, states = super().ExtendStep(theta, inputs.vec[0], states, t=t)
    return py_utils.NestedMap(vec=vec[None], paddings=inputs.paddings), states


class DecoderLm(base_model.BaseTask):
  """Next-token language model whose whole network, embedding to loss, is one TensorPipeLayer.

  Input batches: ids [B, T] int32, labels [B, T] int32, paddings [B, T] float (1.0 at padding).
  The task transposes them to time-major [T, B] and calls the pipeline with
  (NestedMap(ids, paddings), labels); its loss_layer returns NestedMap(xent [T, B], argmax [T, B])
  (see `DecoderLmParams`). Metrics, over the real (non-padded) tokens: loss and log_pplx (the mean
  per-token cross-entropy), accuracy (next-token argmax), num_predictions, and
  num_samples_in_batch (sequences with a real token).
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('pipeline', None,
             'TensorPipeLayer Params with batch_dim=1 and a loss_layer: FProp(NestedMap(ids [T, B],'
             ' paddings [T, B]), labels [T, B]) -> NestedMap(xent [T, B], argmax [T, B]). '
             'DecoderLmParams builds one.')
    p.Define('decode_prompt_length', 4,
             "Tokens of each held-out sequence the decoder job gives as the prompt; the rest of "
             'the sequence is the reference continuation.')
    p.Define('decode_new_tokens', 16, 'Tokens the decoder job generates after each prompt.')
    p.Define('decode_method', 'greedy',
             "How the decoder job picks tokens: 'greedy', 'temperature' (draws from "
             "softmax(logits / decode_temperature)), 'top_k' (the same among the decode_top_k "
             "most likely tokens) or 'beam' (beam search of decode_beam_size hypotheses).")
    p.Define('decode_temperature', 1.0, "Divides the logits of 'temperature' and 'top_k' draws.")
    p.Define('decode_top_k', 5, "'top_k' draws among this many most likely tokens.")
    p.Define('decode_beam_size', 4, "Hypotheses per prompt of 'beam' decoding.")
    p.Define('decode_seed', 1, 'Seed of the draws: the same seed gives the same samples.')
    p.Define('incremental_decode', True,
             "True: decode with the pipeline's InitStates/ExtendStep (each layer's cache on its "
             "partition's device, one new position per step); False: re-run the pipeline on the "
             'whole prefix each step (the reference, O(L^2)).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    where = 'DecoderLm %r' % p.name
    if p.pipeline is None:
      raise ValueError('%s: set `pipeline`, e.g. with decoder_lm.DecoderLmParams(...)' % where)
    if p.pipeline.loss_layer is None:
      raise ValueError(
          '%s: the pipeline needs a loss_layer returning per-token cross-entropy (e.g. a '
          "SharedLayer calling TiedEmbeddingSoftmax.PerTokenXent), so that every schedule works; "
          'DecoderLmParams sets it' % where)
    if p.decode_method not in DECODE_METHODS:
      raise ValueError('%s: decode_method must be one of %s, got %r' %
                       (where, DECODE_METHODS, p.decode_method))
    if p.decode_prompt_length < 1 or p.decode_new_tokens < 1:
      raise ValueError('%s: decode_prompt_length and decode_new_tokens must be >= 1, got %r, %r' %
                       (where, p.decode_prompt_length, p.decode_new_tokens))
    self.CreateChild('pipeline', p.pipeline.Copy().Set(name=p.pipeline.name or 'pipeline'))

  def ComputePredictions(self, theta, input_batch):
    """The pipeline's per-token outputs, NestedMap(xent [T, B], argmax [T, B])."""
    with tf.device(self.pipeline.devices[0]), tf.name_scope('time_major'):
      inputs = py_utils.NestedMap(ids=tf.transpose(tf.cast(input_batch.ids, tf.int32)),
                                  paddings=tf.transpose(tf.cast(input_batch.paddings, tf.float32)))
      labels = tf.transpose(tf.cast(input_batch.labels, tf.int32))
    return self.pipeline.FProp(theta.pipeline, inputs, labels)

  def ComputeLoss(self, theta, predictions, input_batch):
    """The mean cross-entropy of the real tokens; its gradient reads only the paddings."""
    with tf.device(self.pipeline.devices[-1]), tf.name_scope('loss'):
      weights = 1.0 - tf.transpose(tf.cast(input_batch.paddings, tf.float32))  # [T, B]
      labels = tf.transpose(tf.cast(input_batch.labels, tf.int32))
      num = tf.reduce_sum(weights)
      denom = tf.maximum(num, 1.0)
      loss = tf.reduce_sum(tf.cast(predictions.xent, tf.float32) * weights) / denom
      correct = tf.cast(tf.equal(predictions.argmax, labels), tf.float32)
      accuracy = tf.reduce_sum(correct * weights) / denom
      sequences = tf.reduce_sum(tf.cast(tf.reduce_max(weights, axis=0) > 0.0, tf.float32))
    metrics = {
        'loss': (loss, num),
        'log_pplx': (loss, num),
        'accuracy': (accuracy, num),
        'num_predictions': (num, tf.constant(1.0)),
        'num_samples_in_batch': (sequences, tf.constant(1.0)),
    }
    return metrics, {}


  # ------------------------------------------------------------------------------------------------
  # Decoding: continue a prompt.

  def _StepLogProbs(self, theta, tokens, position, states):
    """Incremental decoding's step: ([N, V] log-probabilities of the token after `tokens` [N] at
    `position`, the pipeline's new states)."""
    with tf.device(self.pipeline.devices[0]):
      inputs = py_utils.NestedMap(ids=tokens[None, :], paddings=tf.zeros([1, tf.size(tokens)]))
    out, states = self.pipeline.ExtendStep(theta.pipeline, (inputs, None), states, position)
    return tf.nn.log_softmax(out.logits[0], axis=-1), states

  def _PrefixLogProbs(self, theta, tokens, position):
    """[N, V] log-probabilities of the token after position `position` of tokens [N, T], from the
    pipeline re-run on the whole prefix (the reference of incremental decoding)."""
    with tf.device(self.pipeline.devices[0]):
      inputs = py_utils.NestedMap(ids=tf.transpose(tokens),
                                  paddings=tf.zeros(py_utils.GetShape(tf.transpose(tokens))))
    logits = self.pipeline.FProp(theta.pipeline, inputs, None).logits
    return tf.nn.log_softmax(tf.gather(logits, position), axis=-1)

  def _PromptStates(self, theta, prompt, max_length):
    """The pipeline's states after the prompt [N, P] but its last token, fed one step at a time."""
    rows, length = py_utils.GetShape(prompt, 2)
    states = self.pipeline.InitStates(theta.pipeline, rows, max_length)

    def Body(t, states):
      _, states = self._StepLogProbs(theta, prompt[:, t], t, states)
      return t + 1, states

    return tf.while_loop(lambda t, _: t < length - 1, Body, [tf.constant(0), states],
                         back_prop=False)[1]

  def Generate(self, theta, prompt, method=None, incremental=None):
    """The continuation of prompt [B, P] int32 by `method` (default: decode_method).

    Returns NestedMap(ids [B, decode_new_tokens] int32 (after eos: eos), scores [B] (log P of the
    tokens up to eos; beam search's best hypothesis' score), lengths [B]). `incremental` (default:
    incremental_decode) chooses the pipeline's ExtendStep over re-running it on the prefix.
    """
    p = self.params
    method = method or p.decode_method
    incremental = p.incremental_decode if incremental is None else incremental
    b, length = py_utils.GetShape(prompt, 2)
    eos = VOCABULARY.index(EOS)
    beam = p.decode_beam_size if method == 'beam' else 1
    prompt = tf.repeat(tf.cast(prompt, tf.int32), beam, axis=0)
    last = prompt[:, -1]  # The token at position length - 1, before the first new one.
    # (ids, step[, states]) -> the next token's log-probabilities[, the new states].
    log_probs_fn: Callable[..., Any]
    if incremental:
      states = self._PromptStates(theta, prompt, length + p.decode_new_tokens)
      log_probs_fn = lambda ids, step, states: self._StepLogProbs(
          theta, tf.where(tf.equal(step, 0), last, ids[:, step]), length - 1 + step, states)
    else:
      states = None
      log_probs_fn = lambda ids, step: self._PrefixLogProbs(
          theta, tf.concat([prompt, ids[:, 1:]], axis=1), length - 1 + step)
    if method == 'beam':
      return beam_search.BeamSearch(
          log_probs_fn, b, beam, p.decode_new_tokens, VOCABULARY.index(BOS), eos, states=states,
          reorder_fn=self.pipeline.ReorderStates if incremental else None)
    return sampling.Sample(log_probs_fn, last, p.decode_new_tokens, eos, method,
                           p.decode_temperature, p.decode_top_k, p.decode_seed, states)

  def Decode(self, input_batch):
    """The decoder job's fetches: each held-out sequence's prompt (its first decode_prompt_length
    tokens), the continuation generated after it, the reference, and the decode's wall time."""
    p = self.params
    prompt = input_batch.ids[:, :p.decode_prompt_length]
    start = tf.timestamp()
    with tf.control_dependencies([start]):
      prompt = tf.identity(prompt)
    with tf.name_scope('decode'):
      out = self.Generate(self.theta, prompt)
    with tf.control_dependencies([out.ids]):
      seconds = tf.timestamp() - start
    real = 1.0 - tf.cast(input_batch.paddings, tf.float32)
    return {
        'prompt_ids': prompt,
        'hyp_ids': out.ids,
        'scores': out.scores,
        'ref_ids': input_batch.labels[:, p.decode_prompt_length - 1:],
        'ref_paddings': 1.0 - real[:, p.decode_prompt_length - 1:],
        'real_rows': tf.reduce_max(real, axis=1),
        'decode_seconds': seconds,
    }

  def CreateDecoderMetrics(self):
    return {
        'num_samples_in_batch': metrics_lib.AverageMetric(),
        'tokens_per_second': metrics_lib.AverageMetric(),
        'continuation_accuracy': metrics_lib.AverageMetric(),
    }

  def PostProcessDecodeOut(self, dec_out, dec_metrics):
    """Text samples (prompt => continuation, and the reference) of the sequences with a real token;
    tokens/s of the batch's decode (every row's new tokens over its wall time); the share of the
    reference continuation's tokens the continuation matches, position by position."""
    p = self.params
    words = lambda ids: ' '.join(VOCABULARY[int(i)] for i in ids)
    samples = []
    matched = total = 0
    for i, real in enumerate(dec_out['real_rows']):
      if real <= 0:
        continue
      hyp = list(dec_out['hyp_ids'][i])
      ref_len = int(round(np.sum(1.0 - dec_out['ref_paddings'][i])))
      ref = list(dec_out['ref_ids'][i][:ref_len])
      n = min(len(ref), len(hyp))
      matched += sum(int(a == b) for a, b in zip(hyp[:n], ref[:n]))
      total += n
      if VOCABULARY.index(EOS) in hyp:
        hyp = hyp[:hyp.index(VOCABULARY.index(EOS)) + 1]
      prompt = words(dec_out['prompt_ids'][i])
      samples.append((prompt, '%s => %s (reference: %s; score %.4f)' % (
          prompt, words(hyp), words(ref), dec_out['scores'][i])))
    rows = len(dec_out['hyp_ids']) * (p.decode_beam_size if p.decode_method == 'beam' else 1)
    dec_metrics['tokens_per_second'].Update(
        rows * p.decode_new_tokens / max(float(dec_out['decode_seconds']), 1e-9))
    if total:
      dec_metrics['continuation_accuracy'].Update(matched / total, total)
    dec_metrics['num_samples_in_batch'].Update(len(samples))
    return samples


def DecoderLmParams(vocab_size=VOCAB_SIZE, model_dim=64, hidden_dim=256, num_heads=4,
                    num_layers=4, num_partitions=2, num_micro_batches=4, schedule='1f1b',
                    dropout_prob=0.1, recompute='always', name='lm'):
  """DecoderLm Params: tied embedding + `num_layers` causal Transformer layers + tied softmax loss.

  The embedding (with the positions) and the Transformer layers are cut into `num_partitions`
  explicit partitions of nearly equal numbers of them, in order, and the loss layer runs at the end
  of the last. The embedding and the loss layer are SharedLayer entries of one TiedEmbeddingSoftmax
  named 'softmax', so its one weight lives on partition 0's device.

  Args:
    vocab_size: V, the number of token ids (VOCAB_SIZE for CountingInput).
    model_dim: D, the width of embeddings and Transformer layers (even).
    hidden_dim: the hidden width of each feed-forward block.
    num_heads: attention heads per layer (must divide model_dim).
    num_layers: Transformer layers; at least num_partitions - 1.
    num_partitions: the pipeline's partitions: K devices x its virtual_stages (set on the returned
      `pipeline` Params; 1 by default).
    num_micro_batches: M, micro-batches per mini-batch (need not divide the batch).
    schedule: one of schedule_builders.NAMES ('interleaved_1f1b' and 'zbv' need
      pipeline.virtual_stages).
    dropout_prob: dropout on the embedding and the feed-forward residual and ReLU.
    recompute: the pipeline's re-computation ('always', 'except_last', 'never' or 'selective').
    name: the task's name.
  """
  where = 'DecoderLmParams'
  if num_layers + 1 < num_partitions:
    raise ValueError('%s: %d partitions need num_layers >= %d (every partition needs the embedding '
                     'or a Transformer layer), got num_layers=%d' %
                     (where, num_partitions, num_partitions - 1, num_layers))
  if model_dim % num_heads:
    raise ValueError('%s: num_heads=%d does not divide model_dim=%d' %
                     (where, num_heads, model_dim))
  softmax = TiedEmbeddingSoftmax.Params().Set(
      name='softmax', input_dim=model_dim, num_classes=vocab_size, scale_sqrt_depth=True,
      params_init=py_utils.WeightInit.Gaussian(model_dim**-0.5))
  embedding = [
      shared_layer.SharedLayer.Params().Set(name='embed', layer=softmax, method='Embed'),
      AddPositions.Params().Set(name='position', model_dim=model_dim, dropout_prob=dropout_prob),
  ]
  units = [embedding]  # What the partitions are cut from: the embedding, then each layer.
  for i in range(num_layers):
    block = DecoderBlock.Params().Set(name='layer%d' % i, source_dim=model_dim,
                                      output_dim=model_dim, mask_self_atten=True)
    block.tr_atten_tpl.num_attention_heads = num_heads
    block.tr_fflayer_tpl.hidden_dim = hidden_dim
    block.tr_fflayer_tpl.residual_dropout_prob = dropout_prob
    block.tr_fflayer_tpl.relu_dropout_prob = dropout_prob
    if i == num_layers - 1:  # Pre-layer-norm blocks leave the stack's output unnormalised.
      block.tr_post_ln_tpl = layers.LayerNorm.Params()
    units.append([block])
  # Nearly equal numbers of units, the first partitions taking one more (the last one also holds
  # the softmax).
  partitions = [sum((units[i] for i in part), [])
                for part in np.array_split(np.arange(len(units)), num_partitions)]
  p = DecoderLm.Params().Set(name=name)
  p.pipeline = layer_lib.TensorPipeLayer.Params().Set(
      name='pipeline', partitions=partitions, num_micro_batches=num_micro_batches,
      batch_dim=1, schedule=schedule, recompute=recompute,
      loss_layer=shared_layer.SharedLayer.Params().Set(name='xent', layer=softmax.Copy(),
                                                       method='PerTokenXent'))
  return p
