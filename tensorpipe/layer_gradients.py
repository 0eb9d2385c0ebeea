"""A partition's gradients taken layer by layer, last layer first, inside a backward function.

A backward function re-computes its partition and keeps each layer's inputs (its boundaries); it
differentiates one layer at a time from its output gradients to its inputs and weights
(`LayerGradients`), so only one layer's gradient ops are alive at a time, and adds each layer's
weight gradients into the running sums as soon as they exist (see `accumulation`). A
weight-gradient function (`WeightGradients`) re-runs only the layers that read weights, each from
the inputs and output gradients an input-gradient pass kept, and differentiates it with respect
to its weights only.

Each layer's pass waits until the weight gradients of the layer after it have been added to their
sums. Left alone, the executor may run the chain of input gradients far ahead of the cheap
weight-gradient ops beside it (a bias gradient's reduction, the additions), and every layer's
output gradient and weight gradient would stay alive until they run.
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple

from lingvo import compat as tf

from tensorpipe import accumulation

# One entry per leaf (or per weight), None where it has none.
PerLeaf = List[Optional[tf.Tensor]]


def IsDifferentiable(t: tf.Tensor) -> bool:
  return t.dtype.is_floating or t.dtype.is_complex


def AddWeightGradients(total: PerLeaf, grads: Sequence[Any], theta_leaves: Sequence[tf.Tensor]
                       ) -> List[tf.Tensor]:
  """Adds `grads` (one per differentiable weight, None allowed) into the running sums `total` in
  place; returns the sums added to."""
  own = iter(grads)
  added = []
  for i, t in enumerate(theta_leaves):
    g = accumulation.Dense(next(own)) if IsDifferentiable(t) else None
    if g is None:
      continue
    if total[i] is None:
      raise AssertionError('no running sum for weight %d (%s)' % (i, t.name))
    total[i] = accumulation.AddInPlace(total[i], g)
    added.append(total[i])
  return added


def LayerGradients(boundaries: Sequence[Any], out_grads: Sequence[Optional[tf.Tensor]],
                   theta_leaves: Sequence[tf.Tensor], sums: Optional[PerLeaf] = None
                   ) -> Tuple[List[PerLeaf], Optional[PerLeaf]]:
  """Gradients of a partition, differentiated layer by layer, last layer first.

  Args:
    boundaries: every layer's inputs, then the partition's outputs (structures).
    out_grads: the gradient of each leaf of the partition's outputs (flattened), None where none.
    theta_leaves: the partition's weights.
    sums: running sums per weight (None where a weight has no gradient), added to in place; None:
      input gradients only (a weight-gradient pass adds the weights' later, `WeightGradients`).

  Returns:
    (per boundary, the gradient of each of its leaves (flattened) or None; the sums or None).
  """
  num_layers = len(boundaries) - 1
  targets = [t for t in theta_leaves if IsDifferentiable(t)] if sums is not None else []
  total = None if sums is None else list(sums)
  done = []
  grads = [None] * num_layers + [list(out_grads)]
  for j in reversed(range(num_layers)):
    ins = tf.nest.flatten(boundaries[j])
    grads[j] = [None] * len(ins)
    pairs = [(y, d) for y, d in zip(tf.nest.flatten(boundaries[j + 1]), grads[j + 1])
             if y is not None and d is not None and IsDifferentiable(y)]
    if not pairs:
      continue
    with tf.control_dependencies(done):
      grad_ys = [tf.identity(d) for _, d in pairs]
    diff = [i for i, x in enumerate(ins) if x is not None and IsDifferentiable(x)]
    results = tf.gradients([y for y, _ in pairs], [ins[i] for i in diff] + targets,
                           grad_ys=grad_ys, stop_gradients=[ins[i] for i in diff])
    for i, g in zip(diff, results):
      grads[j][i] = accumulation.Dense(g)
    if total is not None:
      done = AddWeightGradients(total, results[len(diff):], theta_leaves) or done
  return grads, total


# Per layer that reads weights: (its index, its input leaves, positions of its output leaves that
# have gradients, those gradients).
KeptLayer = Tuple[int, PerLeaf, Sequence[int], Sequence[tf.Tensor]]


def WeightGradients(kept: Sequence[KeptLayer],
                    run_layer: Callable[[int, List[Optional[tf.Tensor]]], Any],
                    theta_leaves: Sequence[tf.Tensor], sums: PerLeaf) -> PerLeaf:
  """The weight-gradient pass: `sums` plus every kept layer's weight gradients, last layer first.

  Args:
    kept: per layer that reads weights, in layer order: (its index j, its input leaves (flattened,
      None where absent), the positions of its output leaves that have gradients, those
      gradients).
    run_layer: (j, input leaves) -> layer j's outputs structure, re-run in the caller's trace
      context.
    theta_leaves: the partition's weights.
    sums: the running sums, added to in place.
  """
  total = list(sums)
  targets = [t for t in theta_leaves if IsDifferentiable(t)]
  done = []
  for j, xs, grad_index, grads in reversed(kept):  # One layer's activations at a time.
    with tf.control_dependencies(done):
      xs = [None if x is None else tf.identity(x) for x in xs]
    outs = tf.nest.flatten(run_layer(j, xs))
    pairs = [(outs[i], g) for i, g in zip(grad_index, grads) if IsDifferentiable(outs[i])]
    if not pairs:
      continue
    results = tf.gradients([y for y, _ in pairs], targets, grad_ys=[g for _, g in pairs])
    done = AddWeightGradients(total, results, theta_leaves) or done
  return total
