"""Decoding states: what a pipeline's entries keep between decode steps, each on its own device.

Incremental decoding runs a pipeline one position at a time, as Lingvo's decoders do with
InitStates and ExtendStep. An entry decodes with a state when its layer has both methods:

  InitStates(theta, batch_size, max_length[, context]) -> states (a structure of tensors)
  ExtendStep(theta, *inputs, states, t) -> (outputs, new states)

`inputs` are what the entry's FProp gets (the previous entry's output, then its skip connections),
for one position; `t` is that position's index (int32 scalar); `context`, when the pipeline's
InitStates is given one, is the micro-batch's piece of it (e.g. an encoder's output, whose attention
keys a decoder layer computes once). Every other entry runs its FProp (a SharedLayer entry, its
method) on the step: right for a layer that treats each position alone (embeddings, norms,
feed-forward blocks, a softmax), wrong for one that looks at other positions. Such a layer is known
by the decoding methods it or a sublayer has (`STATE_METHODS`) and refused without its own
(`Check`), before anything is built.

Partition k's states are made on partition k's device, one set per micro-batch (`Create`). Each
decode step's ops of partition k on micro-batch t take and return that set on that device, so the
states never leave it. Beam search reorders them there (`Reorder`): each leaf is gathered along its
batch axis, which `BatchAxes` finds by making the states of 2 and of 3 examples.
"""

from typing import Any, Callable, List, Optional, Sequence, Union

import tensorflow as tf2
from lingvo import compat as tf
from lingvo.core import base_layer

from tensorpipe import micro_batching

# Methods of Lingvo's incremental and streaming layers: a layer that has one (or whose sublayer has
# one) computes a position from the positions before it.
STATE_METHODS = ('InitStates', 'ExtendStep', 'zero_state', 'StreamStep')

# An entry's states for one micro-batch: (batch size, context piece or None) -> states.
InitFn = Callable[[Union[int, tf.Tensor], Any], Any]


def Decodes(layer: base_layer.BaseLayer, method: str) -> bool:
  """Whether the entry that calls `method` of `layer` runs its ExtendStep (with a state) on a
  decode step, rather than `method` itself."""
  return method == 'FProp' and all(callable(getattr(layer, m, None))
                                   for m in ('InitStates', 'ExtendStep'))


def _Sublayers(layer, path):
  """(path, sublayer) of every layer below `layer`, depth first."""
  for name, child in sorted(layer.children.items()):
    for i, sub in enumerate(child if isinstance(child, (list, tuple)) else [child]):
      if isinstance(sub, base_layer.BaseLayer):
        sub_path = '%s/%s' % (path, name) + ('[%d]' % i if isinstance(child, (list, tuple)) else '')
        yield sub_path, sub
        yield from _Sublayers(sub, sub_path)


def Check(layer: base_layer.BaseLayer, method: str, entry: str, partition: int,
          where: str) -> None:
  """Refuses an entry whose layer keeps state between positions but cannot extend it one step.

  Raises:
    ValueError: naming the entry, its partition, what shows the state (a method of the layer or
      of a sublayer) and the fix: the layer's own InitStates and ExtendStep.
  """
  if method != 'FProp' or Decodes(layer, method):
    return
  cls = type(layer).__name__
  own = [m for m in ('InitStates', 'ExtendStep') if callable(getattr(layer, m, None))]
  if own:
    missing = [m for m in ('InitStates', 'ExtendStep') if m not in own][0]
    evidence = 'has %s but no %s' % (own[0], missing)
  else:
    evidence = None
    for path, sub in _Sublayers(layer, entry):
      found = [m for m in STATE_METHODS if callable(getattr(sub, m, None))]
      if found:
        evidence = ('keeps state between positions (its sublayer %r, a %s, has %s) but has no '
                    'ExtendStep' % (path, type(sub).__name__, found[0]))
        break
    if evidence is None:
      return
  raise ValueError(
      '%s: layer %r (a %s, in partition %d) %s, so a decode step cannot run it: its FProp on one '
      'position would not see the positions before it. Give %s both InitStates(theta, '
      'batch_size, max_length[, context]) -> states and ExtendStep(theta, *inputs, states, t) -> '
      '(outputs, new states) (docs/guide.md, "Decoding")' %
      (where, entry, cls, partition, evidence, cls))


def Create(init: InitFn, sizes: Sequence[Union[int, tf.Tensor]],
           contexts: Sequence[Any]) -> List[Any]:
  """An entry's states, one per micro-batch of `sizes` (with its piece of the context), made in
  the caller's device scope."""
  return [init(size, context) for size, context in zip(sizes, contexts)]


def BatchAxes(init: InitFn, context: Any, batch_dim: int, what: str) -> Any:
  """Per leaf of the states `init` makes, its batch axis, or None for a leaf without one: the axis
  whose size follows the number of examples, found by making the states of 2 and of 3 examples
  (with `context` leaves of that many examples along `batch_dim`).

  Those states are only traced, in graph functions never called, so the caller's graph gets no op.

  Raises:
    ValueError: naming `what` for a leaf whose examples share an axis with something else (its
      size grows by more than one per example), which no gather of rows could reorder.
  """
  def Shapes(size):
    leaves = [x for x in tf.nest.flatten(context) if x is not None]
    specs = []
    for x in leaves:
      shape = x.shape.as_list()
      if micro_batching.IsBatched(x, batch_dim):
        shape[batch_dim] = size
      specs.append(tf.TensorSpec(shape, x.dtype))

    def Made(*xs):
      it = iter(xs)
      filled = tf.nest.map_structure(lambda x: None if x is None else next(it), context)
      return init(size, filled)

    made = tf2.function(Made, autograph=False).get_concrete_function(*specs).structured_outputs
    return made, [x.shape.as_list() for x in tf.nest.flatten(made)]

  made, two = Shapes(2)
  _, three = Shapes(3)
  axes = []
  for a, b in zip(two, three):
    grows = [(i, n - m) for i, (m, n) in enumerate(zip(a, b))
             if m is not None and n is not None and m != n]
    if grows and (len(grows) > 1 or grows[0][1] != 1):
      raise ValueError('%s: a decoding state of shape %s for 3 examples has no axis of its own for '
                       'the examples (its shape for 2 is %s), so beam search cannot reorder it; '
                       'keep the examples on one axis' % (what, b, a))
    axes.append(grows[0][0] if grows else None)
  return tf.nest.pack_sequence_as(made, axes)


def Reorder(states: Sequence[Any], axes: Any, rows: tf.Tensor,
            sizes: Sequence[Union[int, tf.Tensor]]) -> List[Any]:
  """One partition's states per micro-batch (`states[t]`, structured like `axes`), with row r of the
  whole batch taken from row rows[r], in the caller's device scope.

  Each leaf is gathered along its batch axis (leaves without one stay); with several micro-batches
  a leaf's pieces are first joined, since a row's source may lie in another micro-batch.
  """
  flat = [tf.nest.flatten(s) for s in states]
  out: List[List[Optional[tf.Tensor]]] = [[None] * len(f) for f in flat]
  offsets = micro_batching.Offsets(sizes)
  for i, axis in enumerate(tf.nest.flatten(axes)):
    column = [f[i] for f in flat]
    if axis is None:
      for t, x in enumerate(column):
        out[t][i] = x
      continue
    whole = column[0] if len(column) == 1 else tf.concat(column, axis)
    for t, (offset, size) in enumerate(zip(offsets, sizes)):
      mine = rows if len(column) == 1 else rows[offset:offset + size]
      out[t][i] = tf.gather(whole, mine, axis=axis)
  return [tf.nest.pack_sequence_as(s, o) for s, o in zip(states, out)]


def Bytes(states: Any) -> int:
  """Bytes of the tensors of `states` (static shapes)."""
  return sum(x.shape.num_elements() * x.dtype.size for x in tf.nest.flatten(states))
