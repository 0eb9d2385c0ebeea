"""A translation task whose Transformer encoder and decoder stacks each run in a TensorPipeLayer.

`PipelinedTransformer` is a Lingvo BaseTask:
  - a shared source/target embedding (x sqrt(D), plus sinusoidal positions) on the encoder's first
    device;
  - `encoder`: a TensorPipeLayer over transformer.StackLayers(is_decoder=False), fed
    NestedMap(vec, paddings);
  - `decoder`: a TensorPipeLayer over decoder layers, fed NestedMap(vec, paddings, aux_vec,
    aux_paddings): the encoder output and source paddings travel through the pipeline as fields, so
    every decoder layer of every partition and micro-batch gets its slice of them;
  - a softmax (with logit clipping) and label-smoothed cross-entropy on the decoder's last device.
Any layer mapping those NestedMaps works as `encoder` / `decoder` (e.g. a SequentialLayer over the
same layers: the unpipelined model, with the same variable names).

With a decoder schedule other than 'gpipe' (e.g. '1f1b'), each micro-batch's loss must be known in
the decoder's last partition: the softmax and the per-token cross-entropy then run there as the
decoder's loss layer (`TokenSoftmax`, variables decoder/softmax/{w,b} instead of softmax_w and
softmax_b), fed the target labels. The encoder keeps 'gpipe': its outputs' gradients come from the
decoder's backward passes, which need every encoder output.

Decode runs greedy decoding (beam_size = 1) or beam search (tensorpipe/tasks/mt/beam_search.py).
By default both decode incrementally (`incremental_decode`): the decoder pipeline's InitStates gives
each decoder layer, on its partition's device, its self-attention cache and the encoder output's
keys and values, and each step runs its ExtendStep on the new token only (O(L) positions for L
steps). Otherwise they re-run the decoder on the whole growing prefix each step (O(L^2)), the
reference. PostProcessDecodeOut scores corpus BLEU overall and per language (input_batch.lang
indexes `languages`), with Lingvo's CorpusBleuMetric.
"""

import math

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import base_model
from lingvo.core import layers
from lingvo.core import metrics
from lingvo.core import py_utils

from tensorpipe import layer as layer_lib
from tensorpipe import randomness
from tensorpipe.tasks import sampling
from tensorpipe.tasks.mt import beam_search
from tensorpipe.tasks.mt import transformer


def _Devices(child):
  devices = getattr(child, 'devices', None)
  return devices if devices else ['']


def _SoftmaxParams(p):
  """(weight, bias) WeightParams of a [model_dim] -> [vocab_size] softmax."""
  return (py_utils.WeightParams([p.model_dim, p.vocab_size],
                                py_utils.WeightInit.Gaussian(1.0 / math.sqrt(p.model_dim))),
          py_utils.WeightParams([p.vocab_size], py_utils.WeightInit.Constant(0.0)))


def _Logits(vec, w, b, logits_abs_max):
  logits = tf.einsum('BTD,DV->BTV', vec, w) + b
  if logits_abs_max:
    logits = tf.clip_by_value(logits, -logits_abs_max, logits_abs_max)
  return logits


def _TokenLosses(logits, labels, vocab_size, label_smoothing):
  """(nll, xent) per token: the negative log-likelihood, and the label-smoothed cross-entropy."""
  log_probs = tf.nn.log_softmax(logits, axis=-1)
  nll = -tf.reduce_sum(tf.one_hot(tf.cast(labels, tf.int32), vocab_size) * log_probs, axis=-1)
  if not label_smoothing:
    return nll, nll
  smooth = -tf.reduce_mean(log_probs, axis=-1)
  return nll, (1.0 - label_smoothing) * nll + label_smoothing * smooth


class TokenSoftmax(base_layer.BaseLayer):
  """The decoder's softmax and per-token losses, as a TensorPipeLayer's loss layer:
  (decoder output NestedMap, labels [B, T] or None) -> NestedMap(logits[, nll, xent])."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 64000, 'Output vocabulary size.')
    p.Define('model_dim', 1024, 'Width of the decoder output.')
    p.Define('label_smoothing', 0.1, 'Label smoothing of the training cross-entropy (0 disables).')
    p.Define('logits_abs_max', 30.0, 'Clip logits to [-v, v]; None disables.')
    return p

  def __init__(self, params):
    super().__init__(params)
    w, b = _SoftmaxParams(self.params)
    self.CreateVariable('w', w)
    self.CreateVariable('b', b)

  def FProp(self, theta, out, labels):
    p = self.params
    with tf.name_scope(p.name):
      logits = _Logits(out.vec, theta.w, theta.b, p.logits_abs_max)
      if labels is None:  # Decoding.
        return py_utils.NestedMap(logits=logits)
      nll, xent = _TokenLosses(logits, labels, p.vocab_size,
                               0.0 if self.do_eval else p.label_smoothing)
      return py_utils.NestedMap(logits=logits, nll=nll, xent=xent)


class PipelinedTransformer(base_model.BaseTask):
  """Encoder-decoder Transformer: pipelined stacks, greedy or beam decoding, per-language BLEU."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 64000, 'Size of the shared SentencePiece vocabulary.')
    p.Define('model_dim', 1024, 'Model width D (embedding and every layer).')
    # BaseTask's `encoder` / `decoder` params: the two stacks, each a TensorPipeLayer (or any layer
    # mapping the NestedMaps described in the module docstring).
    p.Define('dropout_keep_prob', 1.0, 'Keep probability of the embedding dropout.')
    p.Define('label_smoothing', 0.1, 'Label smoothing of the training cross-entropy (0 disables).')
    p.Define('logits_abs_max', 30.0,
             'Clip logits to [-v, v] for stability of deep models; None disables.')
    p.Define('sos_id', 2, 'Id that starts every target sequence (SentencePiece bos).')
    p.Define('eos_id', 3, 'Id that ends every sequence (SentencePiece eos).')
    p.Define('max_decode_length', 32, 'Decoding emits at most this many tokens, eos included.')
    p.Define('beam_size', 1, 'Hypotheses kept per example when decoding; 1 decodes greedily.')
    p.Define('length_normalization', 0.0,
             'Beam search ranks log P / ((5 + length) / 6)^alpha with this alpha >= 0; larger '
             'favours longer outputs (0: plain log P; 0.6 is common). Unused when beam_size is 1.')
    p.Define('languages', [], 'Language codes indexed by input_batch.lang, for per-language BLEU.')
    p.Define('incremental_decode', True,
             "True: decode with the decoder's InitStates/ExtendStep (each decoder layer's cache on "
             'its partition\'s device, one new position per step); False: re-run the decoder on '
             'the whole prefix each step (the reference, O(L^2)).')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.encoder is None or p.decoder is None:
      raise ValueError('PipelinedTransformer %r: set both `encoder` and `decoder`' % p.name)
    if not isinstance(p.beam_size, int) or p.beam_size < 1:
      raise ValueError('PipelinedTransformer %r: beam_size must be an int >= 1 (1 = greedy), got %r'
                       % (p.name, p.beam_size))
    if not isinstance(p.length_normalization, (int, float)) or p.length_normalization < 0:
      raise ValueError('PipelinedTransformer %r: length_normalization must be >= 0, got %r'
                       % (p.name, p.length_normalization))
    if p.vocab_size <= 0 or p.model_dim <= 0:
      raise ValueError('PipelinedTransformer %r: vocab_size and model_dim must be positive, '
                       'got %r, %r' % (p.name, p.vocab_size, p.model_dim))
    encoder = p.encoder.Copy().Set(name=p.encoder.name or 'encoder')
    decoder = p.decoder.Copy().Set(name=p.decoder.name or 'decoder')
    if getattr(encoder, 'schedule', 'gpipe') != 'gpipe':
      raise ValueError(
          "PipelinedTransformer %r: encoder schedule=%r; the encoder must use 'gpipe' (its "
          "outputs' gradients come from the decoder's backward passes, which need every encoder "
          "output). Set the schedule on the decoder." % (p.name, encoder.schedule))
    self._softmax_in_decoder = getattr(decoder, 'schedule', 'gpipe') != 'gpipe'
    if self._softmax_in_decoder:
      decoder.loss_layer = TokenSoftmax.Params().Set(
          name='softmax', vocab_size=p.vocab_size, model_dim=p.model_dim,
          label_smoothing=p.label_smoothing, logits_abs_max=p.logits_abs_max)
    self.CreateChild('encoder', encoder)
    self.CreateChild('decoder', decoder)
    with tf.device(_Devices(self.encoder)[0]):
      self.CreateVariable('emb', py_utils.WeightParams(
          [p.vocab_size, p.model_dim], py_utils.WeightInit.Gaussian(1.0 / math.sqrt(p.model_dim))))
      self.CreateChild('position', layers.PositionalEmbeddingLayer.Params().Set(
          embedding_dim=p.model_dim))
    if not self._softmax_in_decoder:
      w, b = _SoftmaxParams(p)
      with tf.device(_Devices(self.decoder)[-1]):
        self.CreateVariable('softmax_w', w)
        self.CreateVariable('softmax_b', b)

  def _Embed(self, theta, ids, use, position=None):
    """The embedding of ids [B, T] at positions 0..T-1, or of ids [B, 1] at `position`."""
    p = self.params
    length = py_utils.GetShape(ids)[1]
    x = tf.gather(theta.emb, ids) * math.sqrt(p.model_dim)
    if position is None:
      x += self.position.FProp(theta.position, length)[None, :, :]
    else:
      x += self.position.FPropWithPosition(theta.position, tf.reshape(position, [1, 1]))
    if not self.do_eval and p.dropout_keep_prob < 1.0:
      x = randomness.Dropout(x, p.dropout_keep_prob, randomness.Site(self, use),
                             where='PipelinedTransformer %r' % p.name)
    return x

  def Encode(self, theta, src):
    """The encoder stack's output NestedMap(vec [B, S, D], ...) for src.ids / src.paddings."""
    with tf.device(_Devices(self.encoder)[0]):
      x = self._Embed(theta, src.ids, 'src_embedding')
    return self.encoder.FProp(theta.encoder, py_utils.NestedMap(
        vec=x, paddings=tf.cast(src.paddings, x.dtype)))

  def DecoderLogits(self, theta, enc_vec, src_paddings, tgt_ids, tgt_paddings, labels=None):
    """NestedMap(logits [B, T, V]) of the decoder given the encoder output and target prefix ids;
    with the softmax in the decoder and `labels`, also its per-token nll and xent [B, T]."""
    with tf.device(_Devices(self.decoder)[0]):
      y = self._Embed(theta, tgt_ids, 'tgt_embedding')
    inputs = py_utils.NestedMap(vec=y, paddings=tf.cast(tgt_paddings, y.dtype), aux_vec=enc_vec,
                                aux_paddings=tf.cast(src_paddings, y.dtype))
    if self._softmax_in_decoder:
      return self.decoder.FProp(theta.decoder, inputs, labels)
    return py_utils.NestedMap(logits=self._SoftmaxLogits(theta, self.decoder.FProp(theta.decoder,
                                                                                    inputs)))

  def ComputePredictions(self, theta, input_batch):
    enc = self.Encode(theta, input_batch.src)
    return self.DecoderLogits(theta, enc.vec, input_batch.src.paddings, input_batch.tgt.ids,
                              input_batch.tgt.paddings, input_batch.tgt.labels)

  def ComputeLoss(self, theta, predictions, input_batch):
    p = self.params
    tgt = input_batch.tgt
    with tf.device(_Devices(self.decoder)[-1]), tf.name_scope('loss'):
      logits = predictions.logits
      weights = tf.cast(tgt.weights, tf.float32)
      labels = tf.cast(tgt.labels, tf.int32)
      if 'xent' in predictions:  # From the decoder's loss layer.
        nll, xent = predictions.nll, predictions.xent
      else:
        nll, xent = _TokenLosses(logits, labels, p.vocab_size,
                                 0.0 if self.do_eval else p.label_smoothing)
      num = tf.reduce_sum(weights)
      denom = tf.maximum(num, 1.0)
      loss = tf.reduce_sum(xent * weights) / denom
      log_pplx = tf.reduce_sum(nll * weights) / denom
      correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
      accuracy = tf.reduce_sum(correct * weights) / denom
      per_example = tf.reduce_sum(nll * weights, axis=1)
    m = {
        'loss': (loss, num),
        'log_pplx': (log_pplx, num),
        'token_accuracy': (accuracy, num),
        'num_predictions': (num, tf.constant(1.0)),
    }
    if 'weight' in input_batch and input_batch.weight is not None:
      m['num_samples_in_batch'] = (tf.reduce_sum(input_batch.weight), tf.constant(1.0))
    return m, {'loss': per_example}

  def _SoftmaxLogits(self, theta, out):
    """The logits of the decoder's outputs: its loss layer's, or the softmax after it."""
    if self._softmax_in_decoder:
      return out.logits
    with tf.device(_Devices(self.decoder)[-1]):
      return _Logits(out.vec, theta.softmax_w, theta.softmax_b, self.params.logits_abs_max)

  def _StepLogProbs(self, theta, tokens, step, states):
    """Incremental decoding's step: ([N, V] log-probabilities of the token after `tokens` [N] at
    position `step`, the decoder's new states)."""
    with tf.device(_Devices(self.decoder)[0]):
      y = self._Embed(theta, tokens[:, None], 'tgt_embedding', step)
    inputs = py_utils.NestedMap(vec=y, paddings=tf.zeros(py_utils.GetShape(y)[:2], y.dtype))
    step_inputs = (inputs, None) if self._softmax_in_decoder else inputs
    out, states = self.decoder.ExtendStep(theta.decoder, step_inputs, states, step)
    logits = self._SoftmaxLogits(theta, out)
    return tf.nn.log_softmax(logits[:, 0, :], axis=-1), states

  def _DecoderStates(self, theta, enc_vec, src_paddings, rows):
    """The decoder's InitStates for `rows` rows, each decoder layer keeping the encoder output's
    keys and values."""
    if not callable(getattr(self.decoder, 'InitStates', None)):
      raise ValueError('PipelinedTransformer %r: the decoder (a %s) has no InitStates for '
                       'incremental decoding; set incremental_decode=False' %
                       (self.params.name, type(self.decoder).__name__))
    context = py_utils.NestedMap(aux_vec=enc_vec, aux_paddings=tf.cast(src_paddings, enc_vec.dtype))
    return self.decoder.InitStates(theta.decoder, rows, self.params.max_decode_length, context)

  def _Incremental(self, incremental):
    return self.params.incremental_decode if incremental is None else incremental

  def GreedyDecode(self, theta, src, incremental=None):
    """Greedy decoding of src.ids / src.paddings: NestedMap(ids [B, max_decode_length] (after eos:
    eos), scores [B] (log P of the tokens up to eos), lengths [B]); `incremental` (default
    `incremental_decode`) chooses the decoder's ExtendStep over re-running it on the prefix."""
    p = self.params
    enc = self.Encode(theta, src)
    b = py_utils.GetShape(src.ids)[0]
    sos = tf.fill([b], p.sos_id)
    if self._Incremental(incremental):
      return sampling.Sample(
          lambda ids, step, states: self._StepLogProbs(theta, ids[:, step], step, states), sos,
          p.max_decode_length, p.eos_id,
          states=self._DecoderStates(theta, enc.vec, src.paddings, b))
    paddings = tf.zeros([b, p.max_decode_length + 1], tf.float32)

    def LogProbs(ids, step):
      logits = self.DecoderLogits(theta, enc.vec, src.paddings, ids, paddings).logits
      return tf.nn.log_softmax(tf.gather(logits, step, axis=1), axis=-1)

    return sampling.Sample(LogProbs, sos, p.max_decode_length, p.eos_id)

  def BeamSearchDecode(self, theta, src, beam_size, length_normalization, incremental=None):
    """beam_search.BeamSearch's NestedMap(ids [B, max_decode_length], scores, lengths) for src;
    `incremental` as for GreedyDecode (the decoder's states reordered on their devices)."""
    p = self.params
    enc = self.Encode(theta, src)
    b = py_utils.GetShape(src.ids)[0]
    enc_vec, src_paddings = [tf.repeat(x, beam_size, axis=0) for x in (enc.vec, src.paddings)]
    if self._Incremental(incremental):
      return beam_search.BeamSearch(
          lambda ids, step, states: self._StepLogProbs(theta, ids[:, step], step, states),
          b, beam_size, p.max_decode_length, p.sos_id, p.eos_id, length_normalization,
          states=self._DecoderStates(theta, enc_vec, src_paddings, b * beam_size),
          reorder_fn=self.decoder.ReorderStates)
    paddings = tf.zeros([b * beam_size, p.max_decode_length + 1], tf.float32)

    def LogProbs(ids, step):
      logits = self.DecoderLogits(theta, enc_vec, src_paddings, ids, paddings).logits
      return tf.nn.log_softmax(tf.gather(logits, step, axis=1), axis=-1)

    return beam_search.BeamSearch(LogProbs, b, beam_size, p.max_decode_length, p.sos_id, p.eos_id,
                                  length_normalization)

  def Decode(self, input_batch):
    p = self.params
    with tf.name_scope('decode'):
      if p.beam_size == 1:
        hyps = self.GreedyDecode(self.theta, input_batch.src).ids
      else:
        hyps = self.BeamSearchDecode(self.theta, input_batch.src, p.beam_size,
                                     p.length_normalization).ids
    out = {
        'hyp_ids': hyps,
        'ref_ids': input_batch.tgt.labels,
        'ref_paddings': input_batch.tgt.paddings,
        'src_ids': input_batch.src.ids,
        'src_paddings': input_batch.src.paddings,
        'lang': input_batch.lang,
    }
    if 'weight' in input_batch and input_batch.weight is not None:
      out['weight'] = input_batch.weight
    return out

  def CreateDecoderMetrics(self):
    m = {
        'num_samples_in_batch': metrics.AverageMetric(),
        'corpus_bleu': metrics.CorpusBleuMetric(),
    }
    for lang in self.params.languages:
      m['corpus_bleu_%s' % lang] = metrics.CorpusBleuMetric()
    return m

  def _IdsToText(self, ids):
    """Text of ids up to (excluding) eos, via the input generator's tokenizer."""
    ids = [int(i) for i in ids]
    if self.params.eos_id in ids:
      ids = ids[:ids.index(self.params.eos_id)]
    return self.input_generator.IdsToText(ids)

  def PostProcessDecodeOut(self, dec_out, dec_metrics):
    p = self.params
    num = len(dec_out['hyp_ids'])
    weights = dec_out.get('weight', np.ones([num]))
    pairs = []
    count = 0
    for i in range(num):
      if weights[i] <= 0:
        continue
      count += 1
      n_ref = int(round(np.sum(1.0 - dec_out['ref_paddings'][i])))
      ref = self._IdsToText(dec_out['ref_ids'][i][:n_ref])
      hyp = self._IdsToText(dec_out['hyp_ids'][i])
      n_src = int(round(np.sum(1.0 - dec_out['src_paddings'][i])))
      src = self._IdsToText(dec_out['src_ids'][i][:n_src])
      dec_metrics['corpus_bleu'].Update(ref, hyp)
      lang = p.languages[int(dec_out['lang'][i])] if p.languages else None
      if lang is not None:
        dec_metrics['corpus_bleu_%s' % lang].Update(ref, hyp)
      pairs.append((src, 'lang: %s src: %s ref: %s hyp: %s' % (lang, src, ref, hyp)))
    dec_metrics['num_samples_in_batch'].Update(count)
    return pairs


def TransformerParams(num_layers, ffn_dim, num_heads, model_dim=1024, vocab_size=64000,
                      num_devices=1, num_micro_batches=1, head_dim=64, dropout_keep_prob=1.0,
                      recompute='always', name='mt'):
  """PipelinedTransformer Params for T(L, H, A): L encoder/decoder layers, feed-forward H, A heads.

  The encoder and the decoder stack are each a TensorPipeLayer cut into partitions on the same
  `num_devices` devices K (partition k of both on device k), both with `num_micro_batches`
  micro-batches. The feed-forward init is scaled by 1/sqrt(L) and logits are clipped
  (PipelinedTransformer.logits_abs_max).
  """
  p = PipelinedTransformer.Params().Set(name=name, vocab_size=vocab_size, model_dim=model_dim,
                                        dropout_keep_prob=dropout_keep_prob)
  for side, is_decoder in (('encoder', False), ('decoder', True)):
    stack = transformer.StackLayers(num_layers, model_dim, ffn_dim, num_heads, is_decoder,
                                    head_dim=head_dim, dropout_keep_prob=dropout_keep_prob)
    p.Set(**{side: layer_lib.TensorPipeLayer.Params().Set(
        name=side, layers=stack, num_devices=num_devices,
        num_micro_batches=num_micro_batches, recompute=recompute)})
  return p
