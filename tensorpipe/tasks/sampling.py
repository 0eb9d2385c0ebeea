"""Greedy decoding and sampling over any model given as "log-probs of the next token".

Like beam_search, the loop never looks inside the model: `log_probs_fn(ids, step[, states])` gives
the distribution of the token at position step + 1 of every row, either from the whole prefix in
`ids` (re-running the model on it) or from the token at `step` and incremental decoding's states,
which it returns updated. The translation task decodes greedily with it, the language model samples
with it.

Each step picks a token per row: the most likely ('greedy'), or a draw from softmax(logits /
temperature) ('temperature'), optionally among the `top_k` most likely only. Draws are Gumbel-max
with noise from a stateless generator keyed by (seed, step), so a row's draw does not depend on how
the model computes its distribution (pipelined or not, incremental or not): equal distributions give
equal tokens. After eos a row repeats eos. A row's score is the log-probability (temperature 1) of
its tokens up to and including the first eos.
"""

from typing import Any, Tuple

from lingvo import compat as tf
from lingvo.core import py_utils

METHODS = ('greedy', 'temperature', 'top_k')


def _Check(method, temperature, top_k, num_steps):
  if method not in METHODS:
    raise ValueError('Sample: method must be one of %s, got %r' % (METHODS, method))
  if not isinstance(num_steps, int) or num_steps < 1:
    raise ValueError('Sample: num_steps must be an int >= 1, got %r' % (num_steps,))
  if method != 'greedy' and not (isinstance(temperature, (int, float)) and temperature > 0):
    raise ValueError('Sample: temperature must be > 0, got %r' % (temperature,))
  if method == 'top_k' and not (isinstance(top_k, int) and top_k >= 1):
    raise ValueError("Sample: method='top_k' needs top_k, an int >= 1, got %r" % (top_k,))


def Pick(log_probs, step, method='greedy', temperature=1.0, top_k=None, seed=0):
  """[B] int32 tokens from log_probs [B, V] at step `step` (see the module docstring)."""
  if method == 'greedy':
    return tf.argmax(log_probs, axis=-1, output_type=tf.int32)
  logits = log_probs / temperature
  if method == 'top_k':
    kth = tf.math.top_k(logits, top_k).values[:, -1:]
    logits = tf.where(logits < kth, tf.fill(tf.shape(logits), -float('inf')), logits)
  uniform = tf.random.stateless_uniform(tf.shape(logits), seed=tf.stack([seed, step]),
                                        minval=1e-20, maxval=1.0)
  return tf.argmax(logits - tf.math.log(-tf.math.log(uniform)), axis=-1, output_type=tf.int32)


def Sample(log_probs_fn, first_ids, num_steps, eos_id, method='greedy', temperature=1.0,
           top_k=None, seed=0, states=None):
  """Tokens after `first_ids`, one per step, for num_steps steps.

  Args:
    log_probs_fn: (ids, step) -> [B, V] float32 log-probabilities of the token at position step + 1
      (with `states`: (ids, step, states) -> (log-probabilities, new states)). `ids` is [B,
      num_steps + 1] int32: first_ids in column 0, the tokens picked so far in columns 1..step, 0
      after them (a causal model ignores them). `step` is a scalar int32 tensor.
    first_ids: [B] int32, the token at position 0 (e.g. sos, or a prompt's last token).
    num_steps: the number of tokens to pick.
    eos_id: the token that ends a row (None: none does).
    method, temperature, top_k, seed: how a token is picked (see `Pick`).
    states: incremental decoding's states before step 0, or None.

  Returns:
    NestedMap(ids [B, num_steps] int32, scores [B] float32, lengths [B] int32: tokens up to and
    including the first eos, or num_steps).
  """
  _Check(method, temperature, top_k, num_steps)
  b = py_utils.GetShape(first_ids)[0]
  width = num_steps + 1
  ids = tf.concat([tf.cast(first_ids, tf.int32)[:, None], tf.zeros([b, num_steps], tf.int32)], 1)

  def Body(step, ids, scores, done, lengths, *rest):
    if states is None:
      log_probs = log_probs_fn(ids, step)
    else:
      log_probs, new_states = log_probs_fn(ids, step, rest[0])
      rest = (new_states,)
    token = Pick(log_probs, step, method, temperature, top_k, seed)
    if eos_id is not None:
      token = tf.where(done, tf.fill([b], eos_id), token)
    chosen = tf.gather(log_probs, token, batch_dims=1)
    scores += tf.where(done, tf.zeros_like(chosen), chosen)
    lengths += tf.cast(tf.logical_not(done), tf.int32)
    if eos_id is not None:
      done = tf.logical_or(done, tf.equal(token, eos_id))
    ids += tf.one_hot(step + 1, width, dtype=tf.int32)[None, :] * token[:, None]
    return (step + 1, ids, scores, done, lengths) + tuple(rest)

  init: Tuple[Any, ...] = (tf.constant(0), ids, tf.zeros([b]), tf.zeros([b], tf.bool),
                           tf.zeros([b], tf.int32))
  if states is not None:
    init += (states,)
  out = tf.while_loop(lambda step, *_: step < num_steps, Body, init, back_prop=False)
  return py_utils.NestedMap(ids=out[1][:, 1:], scores=out[2], lengths=out[4])
