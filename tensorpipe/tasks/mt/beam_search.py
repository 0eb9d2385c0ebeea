"""Beam search over any model given as "log-probs of the next token given these prefixes".

The search never looks inside the model, so it is tested with toy callbacks against brute-force
enumeration, and the translation task (mt_task.PipelinedTransformer) and the language model
(decoder_lm.DecoderLm) plug in their pipelined decoders. The callback gets whole prefixes: a model
may re-run itself on the whole prefix every step (L steps cost O(L^2) positions), or decode
incrementally from the prefix's last token and states it keeps (O(L)); the search then hands the
states back reordered, each hypothesis getting its parent's (`reorder_fn`).

What is searched: a hypothesis is y_1..y_n ending with eos (n <= max_length, eos counted in n), or
max_length tokens without eos. Its score is the GNMT length-normalised log-probability
(Wu et al. 2016, eq. 14), log P(y) / lp(n) with lp(n) = ((5 + n) / 6)^alpha; alpha = 0 ranks by
log P(y) alone, larger alpha favours longer hypotheses.

How: every step extends the K alive hypotheses by every token and ranks the K * V candidates by
log P. Candidates among the top K that end (eos, or max_length reached) are finished: the best
finished one per example is kept by normalised score. The K best candidates that do not end with eos
stay alive, so the beam never shrinks. The loop stops once no alive hypothesis can beat the best
finished one (log P only falls as tokens are added, and lp(n) <= lp(max_length)), which never
changes the result. With K = 1 and alpha = 0 this is exactly greedy decoding; with alpha > 0 a
K = 1 search may go on past an eos that greedy stops at, when a longer hypothesis could still score
higher.
"""

from typing import Any, Tuple

from lingvo import compat as tf
from lingvo.core import py_utils


def LengthPenalty(length, alpha):
  """GNMT's lp(n) = ((5 + n) / 6)^alpha, the divisor of log P for a hypothesis of n tokens."""
  return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _Check(batch_size, beam_size, max_length, length_normalization):
  checks = (
      ('beam_size', beam_size, isinstance(beam_size, int) and beam_size >= 1, 'an int >= 1'),
      ('max_length', max_length, isinstance(max_length, int) and max_length >= 1, 'an int >= 1'),
      ('length_normalization', length_normalization,
       isinstance(length_normalization, (int, float)) and length_normalization >= 0,
       'a number >= 0'),
      ('batch_size', batch_size, not isinstance(batch_size, int) or batch_size >= 1, '>= 1'),
  )
  for name, value, ok, want in checks:
    if not ok:
      raise ValueError('BeamSearch: %s must be %s, got %r' % (name, want, value))


def BeamSearch(log_probs_fn, batch_size, beam_size, max_length, sos_id, eos_id,
               length_normalization=0.0, states=None, reorder_fn=None):
  """The best hypothesis per example under the length-normalised score (see the module docstring).

  Args:
    log_probs_fn: (ids, step) -> [batch_size * beam_size, V] float32 log-probabilities (each row a
      normalised distribution, so every entry <= 0) of the token at position step + 1. `ids` is
      [batch_size * beam_size, max_length + 1] int32: sos in column 0, the hypothesis' tokens in
      columns 1..step, eos as filler after that (a causal decoder ignores it). Row b * beam_size + k
      is hypothesis k of example b. `step` is a scalar int32 tensor. V must be static. With
      `states`: (ids, step, states) -> (log-probabilities, new states).
    batch_size: number of examples B (int or scalar tensor).
    beam_size: K, alive hypotheses per example.
    max_length: most tokens per hypothesis, eos included.
    sos_id: id in column 0 of every prefix.
    eos_id: id that ends a hypothesis.
    length_normalization: GNMT alpha >= 0.
    states: incremental decoding's states of the batch_size * beam_size rows before step 0 (every
      row's the same as its example's), or None.
    reorder_fn: with `states`, (states, rows) -> states with row r taken from row rows[r] ([B * K]
      int32): after each step, hypothesis k of example b continues the one in row rows[b * K + k].

  Returns:
    NestedMap(ids=[B, max_length] int32 tokens y_1..y_n then eos, scores=[B] float32 normalised
    log P, lengths=[B] int32 n).

  Raises:
    ValueError: naming the bad argument (beam_size < 1, max_length < 1, alpha < 0, V unknown or
      < 2).
  """
  _Check(batch_size, beam_size, max_length, length_normalization)
  b, k, t = batch_size, beam_size, max_length + 1
  alpha = float(length_normalization)
  columns = tf.range(t)

  if (states is None) != (reorder_fn is None):
    raise ValueError('BeamSearch: give both states and reorder_fn (incremental decoding) or '
                     'neither')

  def Extend(alive_ids, alive_scores, step, states):
    if states is None:
      log_probs = log_probs_fn(tf.reshape(alive_ids, [b * k, t]), step)
    else:
      log_probs, states = log_probs_fn(tf.reshape(alive_ids, [b * k, t]), step, states)
    v = log_probs.shape[-1]
    if v is None or v < 2:
      raise ValueError('BeamSearch: log_probs_fn must return [B * K, V] with a static V >= 2, got '
                       'shape %s' % log_probs.shape)
    total = alive_scores[:, :, None] + tf.reshape(log_probs, [b, k, v])
    scores, index = tf.math.top_k(tf.reshape(total, [b, k * v]), 2 * k)
    tokens = index % v
    parents = tf.gather(alive_ids, index // v, batch_dims=1)
    ids = tf.where_v2(tf.equal(columns, step + 1)[None, None, :], tokens[:, :, None], parents)
    return ids, scores, tokens, index // v, states

  def Body(step, alive_ids, alive_scores, best_ids, best_scores, best_lengths, *states):
    ids, scores, tokens, parent_beams, new_states = Extend(alive_ids, alive_scores, step,
                                                           states[0] if states else None)
    is_eos = tf.equal(tokens, eos_id)
    ends = tf.logical_or(is_eos, step + 1 >= max_length)
    in_beam = tf.range(2 * k) < k
    normalised = scores / LengthPenalty(step + 1, alpha)
    ending = tf.where_v2(tf.logical_and(ends, in_beam[None, :]), normalised, -float('inf'))
    pick = tf.argmax(ending, axis=1, output_type=tf.int32)
    new_score = tf.gather(ending, pick, batch_dims=1)
    better = new_score > best_scores
    best_ids = tf.where_v2(better[:, None], tf.gather(ids, pick, batch_dims=1), best_ids)
    best_scores = tf.where_v2(better, new_score, best_scores)
    best_lengths = tf.where_v2(better, step + 1, best_lengths)
    alive_scores, keep = tf.math.top_k(tf.where_v2(is_eos, -float('inf'), scores), k)
    alive_ids = tf.gather(ids, keep, batch_dims=1)
    out = (step + 1, alive_ids, alive_scores, best_ids, best_scores, best_lengths)
    if not states:
      return out
    rows = tf.gather(parent_beams, keep, batch_dims=1) + tf.range(b)[:, None] * k
    return out + (reorder_fn(new_states, tf.reshape(rows, [b * k])),)

  def Continue(step, unused_alive_ids, alive_scores, unused_best_ids, best_scores, unused_lengths,
               *unused_states):
    bound = tf.reduce_max(alive_scores, axis=1) / LengthPenalty(max_length, alpha)
    return tf.logical_and(step < max_length, tf.logical_not(tf.reduce_all(bound < best_scores)))

  start = tf.concat([tf.fill([b * k, 1], sos_id), tf.fill([b * k, t - 1], eos_id)], axis=1)
  alive_scores = tf.tile(tf.constant([[0.0] + [-float('inf')] * (k - 1)]), [b, 1])
  init: Tuple[Any, ...] = (tf.constant(0), tf.reshape(start, [b, k, t]), alive_scores,
                           tf.reshape(start, [b, k, t])[:, 0, :], tf.fill([b], -float('inf')),
                           tf.zeros([b], tf.int32))
  if states is not None:
    init += (states,)
  _, _, _, best_ids, best_scores, best_lengths = tf.while_loop(Continue, Body, init,
                                                               back_prop=False)[:6]
  return py_utils.NestedMap(ids=best_ids[:, 1:], scores=best_scores, lengths=best_lengths)
