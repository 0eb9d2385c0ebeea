"""Re-computation: one cell on one micro-batch as an op whose backward pass re-runs its forward pass.

`Recomputed` wraps F_{k,t} in `tf.custom_gradient` with the cell's weights (theta) passed in explicitly,
so the gradient function owns the cell's backward pass. Only the cell's inputs (the partition-boundary
activations) and theta are kept from the forward pass; the backward pass re-runs the forward pass and
differentiates it. The re-run depends on the incoming gradients through a control dependency: without
it grappler's common-subexpression elimination merges the re-computation into the original forward pass
and keeps its activations alive after all. It skips Lingvo's CheckNumerics, which the forward pass
already ran on the same values.
"""

import copy

from lingvo import compat as tf
from lingvo.core import cluster_factory

from tensorpipe import accumulation


class ReplayOrder:
  """Orders the re-computations of one cell across micro-batches (backward passes run t = M-1 .. 0).

  With `overlap` (the default), re-computing micro-batch t waits for its incoming gradients, for the
  re-computation of t + 1 and for the whole backward pass of t + 2. So it overlaps the backward pass
  of t + 1 (a device is not idle while it re-computes), yet at most two micro-batches' re-computed
  activations are alive per cell. Without `overlap` it waits for the whole backward pass of t + 1:
  one micro-batch's activations per cell, for a lower peak, and less overlap.
  `tf.gradients` builds the backward ops of t + 1 before those of t, which this relies on.
  """

  def __init__(self, overlap=True):
    self._overlap = overlap
    self._done = {}

  def Before(self, t):
    """Tensors the re-computation of micro-batch t must wait for."""
    return self._done.get(t + 1, [])

  def Record(self, t, recomputed, rest):
    """Micro-batch t re-computed `recomputed`; `rest` holds the gradients of micro-batches > t."""
    if self._overlap:
      self._done[t] = list(recomputed) + [r for r in rest if r is not None]

  def RecordBackward(self, t, grads):
    """Micro-batch t's backward pass produced `grads` (its input and accumulated weight gradients)."""
    if not self._overlap:
      self._done[t] = [g.values if isinstance(g, tf.IndexedSlices) else g
                       for g in grads if g is not None]


def _WithoutNumericChecks():
  """The current cluster with Lingvo's CheckNumerics off: a re-computation repeats values already checked."""
  cluster = copy.deepcopy(cluster_factory.Current())
  cluster.params.enable_check_numerics = False
  return cluster


def _IsDifferentiable(t):
  return t.dtype.is_floating or t.dtype.is_complex


def Recomputed(fn, theta, inputs, device, name, pass_theta=False, order=None, micro_batch=None):
  """Runs `fn(theta, inputs)` on `device`; its gradient re-computes `fn` instead of keeping activations.

  With `pass_theta` the op also returns theta for the next micro-batch (see `accumulation`): its
  backward pass then adds the next micro-batch's weight gradients to its own. With `order`, the
  re-computation runs in reverse micro-batch order, as fill-drain has it (see ReplayOrder).

  Args:
    fn: the cell's forward function, (theta NestedMap, inputs structure) -> outputs structure.
    theta: NestedMap of the cell's weights (variables or tensors).
    inputs: the micro-batch's inputs (tensors, tuples, NestedMaps; None allowed).
    device: device string for the forward pass and its re-computation.
    name: name scope of the re-computation.
    pass_theta: also return theta for the next micro-batch.
    order: optional ReplayOrder shared by the cell's micro-batches.
    micro_batch: this micro-batch's index t (with `order`).

  Returns:
    (outputs, next_theta): `fn`'s outputs, same structure, and theta for the next micro-batch (None
    unless pass_theta).

  Raises:
    ValueError: (when gradients are built) if `fn` reads a trainable variable other than through theta.
  """
  in_leaves = tf.nest.flatten(inputs)
  in_index = [i for i, x in enumerate(in_leaves) if x is not None]
  theta_leaves = theta.Flatten()
  num_x = len(in_index)
  structure = {}

  def Forward(xs, thetas):
    leaves = list(in_leaves)
    for i, x in zip(in_index, xs):
      leaves[i] = x
    out = fn(theta.Pack(list(thetas)), tf.nest.pack_sequence_as(inputs, leaves))
    ys = [y for y in tf.nest.flatten(out) if y is not None]
    for y in ys:
      if not isinstance(y, tf.Tensor):
        raise TypeError('%s: cell outputs must be tensors (None allowed), got %s' %
                        (name, type(y).__name__))
    return out, ys

  @tf.custom_gradient
  def Op(*args):
    xs, thetas = list(args[:num_x]), list(args[num_x:])
    out, ys = Forward(xs, thetas)
    structure['out'] = out
    with tf.control_dependencies(ys):
      passed = [tf.identity(t) for t in thetas] if pass_theta else []

    def Grad(*dys, variables=None):
      trainable = [v.name for v in variables or [] if v.trainable]
      if trainable:
        raise ValueError(
            '%s: the cell reads trainable variables %s directly instead of through theta; their '
            'gradients would be lost. Use the theta passed to FProp.' % (name, trainable))
      dy_out, dtheta_rest = dys[:len(ys)], dys[len(ys):]
      with tf.device(device), tf.name_scope(name):
        deps = [d for d in dy_out if d is not None] + (order.Before(micro_batch) if order else [])
        with tf.control_dependencies(deps):
          src = [tf.identity(a) for a in xs + thetas]
        with _WithoutNumericChecks():
          _, targets = Forward(src[:num_x], src[num_x:])
        if order:
          order.Record(micro_batch, targets, dtheta_rest)
        pairs = [(y, d) for y, d in zip(targets, dy_out) if d is not None and _IsDifferentiable(y)]
        if pairs:
          grads = tf.gradients([y for y, _ in pairs], src, grad_ys=[d for _, d in pairs])
        else:
          grads = [None] * len(src)
        dxs, dthetas = list(grads[:num_x]), list(grads[num_x:])
        if pass_theta:
          dthetas = [accumulation.Accumulate(own, rest) for own, rest in zip(dthetas, dtheta_rest)]
        if order:
          order.RecordBackward(micro_batch, dxs + dthetas)
      return dxs + dthetas, [None] * len(variables or [])

    return ys + passed, Grad

  with tf.device(device), tf.name_scope(name):
    results = Op(*([in_leaves[i] for i in in_index] + theta_leaves))
  results = list(results) if isinstance(results, (list, tuple)) else [results]
  num_passed = len(theta_leaves) if pass_theta else 0
  ys = iter(results[:len(results) - num_passed])
  out_leaves = [None if y is None else next(ys) for y in tf.nest.flatten(structure['out'])]
  outputs = tf.nest.pack_sequence_as(structure['out'], out_leaves)
  if not pass_theta:
    return outputs, None
  return outputs, theta.Pack(results[len(results) - num_passed:]) if num_passed else theta
