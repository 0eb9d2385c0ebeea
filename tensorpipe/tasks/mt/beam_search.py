"""Beam search over any model given as "log-probs of the next token given these prefixes".

The search never looks inside the model, so it is tested with toy callbacks against brute-force
enumeration, and the translation task (mt_task.PipelinedTransformer) plugs in its pipelined decoder.
The callback gets whole prefixes, and the task simply re-runs its decoder on the whole prefix every
step, as its greedy decoding does (no incremental state cache): L steps cost O(L^2) decoder
positions, fine for the short sequences decoded here, and the pipelined decoder stays untouched.

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
               length_normalization=0.0):
  """The best hypothesis per example under the length-normalised score (see the module docstring).

  Args:
    log_probs_fn: (ids, step) -> [batch_size * beam_size, V] float32 log-probabilities (each row a
      normalised distribution, so every entry <= 0) of the token at position step + 1. `ids` is
      [batch_size * beam_size, max_length + 1] int32: sos in column 0, the hypothesis' tokens in
      columns 1..step, eos as filler after that (a causal decoder ignores it). Row b * beam_size + k
      is hypothesis k of example b. `step` is a scalar int32 tensor. V must be static.
    batch_size: number of examples B (int or scalar tensor).
    beam_size: K, alive hypotheses per example.
    max_length: most tokens per hypothesis, eos included.
    sos_id: id in column 0 of every prefix.
    eos_id: id that ends a hypothesis.
    length_normalization: GNMT alpha >= 0.

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

  def Extend(alive_ids, alive_scores, step):
    log_probs = log_probs_fn(tf.reshape(alive_ids, [b * k, t]), step)
    v = log_probs.shape[-1]
    if v is None or v < 2:
      raise ValueError('BeamSearch: log_probs_fn must return [B * K, V] with a static V >= 2, got '
                       'shape %s' % log_probs.shape)
    total = alive_scores[:, :, None] + tf.reshape(log_probs, [b, k, v])
    scores, index = tf.math.top_k(tf.reshape(total, [b, k * v]), 2 * k)
    tokens = index % v
    parents = tf.gather(alive_ids, index // v, batch_dims=1)
    ids = tf.where_v2(tf.equal(columns, step + 1)[None, None, :], tokens[:, :, None], parents)
    return ids, scores, tokens

  def Body(step, alive_ids, alive_scores, best_ids, best_scores, best_lengths):
    ids, scores, tokens = Extend(alive_ids, alive_scores, step)
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
    return step + 1, alive_ids, alive_scores, best_ids, best_scores, best_lengths

  def Continue(step, unused_alive_ids, alive_scores, unused_best_ids, best_scores, unused_lengths):
    bound = tf.reduce_max(alive_scores, axis=1) / LengthPenalty(max_length, alpha)
    return tf.logical_and(step < max_length, tf.logical_not(tf.reduce_all(bound < best_scores)))

  start = tf.concat([tf.fill([b * k, 1], sos_id), tf.fill([b * k, t - 1], eos_id)], axis=1)
  alive_scores = tf.tile(tf.constant([[0.0] + [-float('inf')] * (k - 1)]), [b, 1])
  init = (tf.constant(0), tf.reshape(start, [b, k, t]), alive_scores,
          tf.reshape(start, [b, k, t])[:, 0, :], tf.fill([b], -float('inf')),
          tf.zeros([b], tf.int32))
  _, _, _, best_ids, best_scores, best_lengths = tf.while_loop(Continue, Body, init,
                                                               back_prop=False)
  return py_utils.NestedMap(ids=best_ids[:, 1:], scores=best_scores, lengths=best_lengths)
