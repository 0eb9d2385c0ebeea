"""Re-computation: one cell on one micro-batch as an op whose backward pass re-runs its forward pass.

`Recomputed` wraps F_{k,t} in `tf.custom_gradient` with the cell's weights (theta) passed in explicitly,
so the gradient function owns the cell's backward pass. Only the cell's inputs (the partition-boundary
activations) and theta are kept from the forward pass; the backward pass re-runs the forward pass and
differentiates it. The re-run depends on the incoming gradients through a control dependency: without
it grappler's common-subexpression elimination merges the re-computation into the original forward pass
and keeps its activations alive after all. It skips Lingvo's CheckNumerics, which the forward pass
already ran on the same values.

A cell given as stages (one per layer) is differentiated stage by stage, last to first, and each
stage's backward pass waits for two things (see ReplayOrder): the summed weight gradients of the
stage after it (j + 1) in the same micro-batch, and those of the same stage in the micro-batch
back-propagated before. Left alone, the executor may run the chain of input gradients far ahead of
the cheap weight-gradient ops beside it (e.g. a bias gradient's reduction), and each layer's output
gradient stays alive until they run (0.5 MiB per layer and micro-batch on the dense benchmark); or
run two micro-batches' weight gradients of a stage at once, each held until the other is summed.
A stage's summed weight gradients exist only after its input gradients, the last ops that read its
weights: so when the sum of the last micro-batch is ready nothing reads the weights any more, and the
optimizer updates them in place instead of copying them (11-12 of 16 weights were copied every step
on the dense benchmark otherwise).
"""

import copy

from lingvo import compat as tf
from lingvo.core import cluster_factory

from tensorpipe import accumulation


class ReplayOrder:
  """Orders the backward passes of one cell across micro-batches (they run t = M-1 .. 0).

  With `overlap` (the default), re-computing micro-batch t waits for its incoming gradients, for the
  re-computation of t + 1 and for the whole backward pass of t + 2. So it overlaps the backward pass
  of t + 1 (a device is not idle while it re-computes), yet at most two micro-batches' re-computed
  activations are alive per cell. Without `overlap` it waits for the whole backward pass of t + 1:
  one micro-batch's activations per cell, and less overlap.
  In both, stage j's backward pass of t waits for the summed weight gradients of stage j + STAGE_LAG
  of t and of stage j of t + 1 (see the module docstring).
  `tf.gradients` builds the backward ops of t + 1 before those of t, which this relies on.
  """

  STAGE_LAG = 1

  def __init__(self, overlap=True):
    self._overlap = overlap
    self._done = {}
    self._stage_sums = {}

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
      self._done[t] = _Dense(grads)

  def StageBefore(self, t, stage, done):
    """Tensors stage `stage` of t's backward pass waits for; `done`: t's summed gradients by stage."""
    return done.get(stage + self.STAGE_LAG, []) + self._stage_sums.get((t + 1, stage), [])

  def RecordStage(self, t, stage, sums):
    """Stage `stage` of micro-batch t summed its weight gradients into `sums`."""
    self._stage_sums[(t, stage)] = sums


def _Dense(grads):
  """The tensors behind gradients that may be None or IndexedSlices (for control dependencies)."""
  return [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]


def _After(grad, deps):
  """`grad` (a tensor or IndexedSlices) as it is once `deps` have run."""
  with tf.control_dependencies(deps):
    if isinstance(grad, tf.IndexedSlices):
      return tf.IndexedSlices(tf.identity(grad.values), grad.indices, grad.dense_shape)
    return tf.identity(grad)


def _WithoutNumericChecks():
  """The current cluster with Lingvo's CheckNumerics off: a re-computation repeats values already checked."""
  cluster = copy.deepcopy(cluster_factory.Current())
  cluster.params.enable_check_numerics = False
  return cluster


def _IsDifferentiable(t):
  return t.dtype.is_floating or t.dtype.is_complex


def Recomputed(fn, theta, inputs, device, name, pass_theta=False, order=None, micro_batch=None,
               forward_theta=None, forward_after=None):
  """Runs `fn(theta, inputs)` on `device`; its gradient re-computes `fn` instead of keeping activations.

  With `pass_theta` the op also returns theta for the next micro-batch (see `accumulation`): its
  backward pass then adds the next micro-batch's weight gradients to its own. With `order`, the
  re-computation runs in reverse micro-batch order, as fill-drain has it (see ReplayOrder).

  The theta a micro-batch gets passed on exists only once the previous micro-batch's forward pass
  is done. With `forward_theta` (the same values, read before that chain) the forward pass need not
  wait for it, so two micro-batches of a cell can run at once; the gradients still flow through
  `theta` and its chain.

  Args:
    fn: the cell's forward function, (theta NestedMap, inputs structure) -> outputs structure; or a
      list of such functions (stages, e.g. one per layer) applied in order, each to the previous
      one's outputs, so that the backward pass can run stage by stage. A stage must get every
      tensor it uses from its inputs or theta: gradients do not flow through other paths.
    theta: NestedMap of the cell's weights (variables or tensors).
    inputs: the micro-batch's inputs (tensors, tuples, NestedMaps; None allowed).
    device: device string for the forward pass and its re-computation.
    name: name scope of the re-computation.
    pass_theta: also return theta for the next micro-batch.
    order: optional ReplayOrder shared by the cell's micro-batches.
    micro_batch: this micro-batch's index t (with `order`).
    forward_theta: optional NestedMap like theta with the same values, read by the forward pass
      (not by the re-computation); it gets no gradient.
    forward_after: optional tensors the forward pass waits for.

  Returns:
    (outputs, next_theta): `fn`'s outputs, same structure, and theta for the next micro-batch (None
    unless pass_theta).

  Raises:
    ValueError: (when gradients are built) if `fn` reads a trainable variable other than through theta.
  """
  stages = list(fn) if isinstance(fn, (list, tuple)) else [fn]
  in_leaves = tf.nest.flatten(inputs)
  in_index = [i for i, x in enumerate(in_leaves) if x is not None]
  theta_leaves = theta.Flatten()
  num_x = len(in_index)
  structure = {}

  def Forward(xs, thetas, boundaries=None):
    """(outputs, their non-None leaves); `boundaries` gets every stage's inputs and the outputs."""
    leaves = list(in_leaves)
    for i, x in zip(in_index, xs):
      leaves[i] = x
    out = tf.nest.pack_sequence_as(inputs, leaves)
    stage_theta = theta.Pack(list(thetas))
    for stage in stages:
      if boundaries is not None:
        boundaries.append(out)
      out = stage(stage_theta, out)
    if boundaries is not None:
      boundaries.append(out)
    ys = [y for y in tf.nest.flatten(out) if y is not None]
    for y in ys:
      if not isinstance(y, tf.Tensor):
        raise TypeError('%s: cell outputs must be tensors (None allowed), got %s' %
                        (name, type(y).__name__))
    return out, ys

  def Backward(boundaries, src, dy_out, dtheta_rest):
    """Gradients of the cell's inputs and weights, stage by stage (see the module docstring)."""
    thetas = src[num_x:]
    dthetas = list(dtheta_rest) if pass_theta else [None] * len(thetas)
    final = [y for y in tf.nest.flatten(boundaries[-1]) if y is not None]
    # The cell's outputs pair with dy_out by position (a tensor output twice gets both gradients);
    # a stage's inputs get one gradient per tensor.
    pairs = list(zip(final, dy_out))
    done = {}  # stage -> its weight gradients, summed
    dys = {}
    for j in reversed(range(len(stages))):
      if j < len(stages) - 1:
        outs = {id(y): y for y in tf.nest.flatten(boundaries[j + 1]) if y is not None}
        pairs = [(y, dys.get(i)) for i, y in outs.items()]
      pairs = [(y, d) for y, d in pairs if d is not None and _IsDifferentiable(y)]
      ins = [x for x in tf.nest.flatten(boundaries[j]) if x is not None]
      if not pairs:
        dys = {}
        continue
      with tf.control_dependencies(order.StageBefore(micro_batch, j, done) if order else []):
        grad_ys = [tf.identity(d) for _, d in pairs]
      grads = tf.gradients([y for y, _ in pairs], ins + thetas, grad_ys=grad_ys, stop_gradients=ins)
      dys = dict(zip([id(x) for x in ins], grads[:len(ins)]))
      own = grads[len(ins):]
      read_last = _Dense(grads[:len(ins)])
      sums = map(accumulation.Accumulate, own, dthetas)
      dthetas = [d if g is None or not read_last else _After(d, read_last)
                 for g, d in zip(own, sums)]
      done[j] = _Dense(d for g, d in zip(own, dthetas) if g is not None)
      if order:
        order.RecordStage(micro_batch, j, done[j])
    return [dys.get(id(x)) for x in src[:num_x]], dthetas

  forward_leaves = forward_theta.Flatten() if forward_theta is not None else []
  num_theta = len(theta_leaves)

  @tf.custom_gradient
  def Op(*args):
    xs, thetas = list(args[:num_x]), list(args[num_x:num_x + num_theta])
    if forward_after:
      with tf.control_dependencies(forward_after):
        xs = [tf.identity(x) for x in xs]
    out, ys = Forward(xs, list(args[num_x + num_theta:]) or thetas)
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
        boundaries = []
        with _WithoutNumericChecks():
          _, targets = Forward(src[:num_x], src[num_x:], boundaries)
        if order:
          order.Record(micro_batch, targets, dtheta_rest)
        dxs, dthetas = Backward(boundaries, src, dy_out, dtheta_rest)
        if order:
          order.RecordBackward(micro_batch, dxs + dthetas)
      return dxs + dthetas + [None] * len(forward_leaves), [None] * len(variables or [])

    return ys + passed, Grad

  with tf.device(device), tf.name_scope(name):
    results = Op(*([in_leaves[i] for i in in_index] + theta_leaves + forward_leaves))
  results = list(results) if isinstance(results, (list, tuple)) else [results]
  num_passed = len(theta_leaves) if pass_theta else 0
  ys = iter(results[:len(results) - num_passed])
  out_leaves = [None if y is None else next(ys) for y in tf.nest.flatten(structure['out'])]
  outputs = tf.nest.pack_sequence_as(structure['out'], out_leaves)
  if not pass_theta:
    return outputs, None
  return outputs, theta.Pack(results[len(results) - num_passed:]) if num_passed else theta
