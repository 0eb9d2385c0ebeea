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

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class KeptLayout:
  """Where the tensors an input-gradient pass keeps come from: per layer that reads weights (in
  order), (its index j, its inputs structure with None leaves (None for j = 0, whose inputs are
  the partition's), which of its input leaves are kept (None for j = 0), the positions of its
  output leaves that have gradients (kept unless it is the last layer, whose are the partition's
  output gradients))."""
  layers: tuple


def Keep(boundaries: Sequence[Any], grads: Sequence[PerLeaf],
         layer_ops: Sequence[Tuple[str, Sequence[tf.Operation]]],
         theta_leaves: Sequence[tf.Tensor]) -> Tuple[List[tf.Tensor], KeptLayout]:
  """What a weight-gradient pass needs of an input-gradient pass: per layer that reads weights,
  its inputs (but the first layer's) and its output gradients (but the last layer's), flat.

  Args:
    boundaries, grads: LayerGradients' arguments and per-boundary results.
    layer_ops: per layer, (its name, the ops its run made).
    theta_leaves: the partition's weights.
  """
  weights = {t.ref() for t in theta_leaves}
  last = len(layer_ops) - 1
  layers, kept = [], []
  for j, (_, ops) in enumerate(layer_ops):
    if not any(x.ref() in weights for op in ops for x in op.inputs):
      continue  # No weights, nothing for a weight-gradient pass to do.
    template, mask = None, None
    if j:
      template = tf.nest.map_structure(lambda _: None, boundaries[j])
      mask = tuple(x is not None for x in tf.nest.flatten(boundaries[j]))
      kept.extend(x for x in tf.nest.flatten(boundaries[j]) if x is not None)
    grad_index = tuple(i for i, g in enumerate(grads[j + 1]) if g is not None)
    if j < last:
      kept.extend(grads[j + 1][i] for i in grad_index)
    layers.append((j, template, mask, grad_index))
  return kept, KeptLayout(tuple(layers))


def Unkeep(layout: KeptLayout, kept: Sequence[tf.Tensor], first_inputs: Sequence[Any],
           out_grads: Sequence[Optional[tf.Tensor]], num_layers: int) -> List[KeptLayer]:
  """`Keep`'s tensors back per layer, for `WeightGradients`; `first_inputs` are the partition's
  input leaves (flattened), `out_grads` its output gradients (flattened)."""
  it = iter(kept)
  out = []
  for j, _, mask, grad_index in layout.layers:
    xs = [next(it) if has else None for has in mask] if j else list(first_inputs)
    grads = ([next(it) for _ in grad_index] if j < num_layers - 1 else
             [out_grads[i] for i in grad_index])
    out.append((j, xs, grad_index, grads))
  return out


def WeightGradients(kept: Sequence[KeptLayer],
                    run_layer: Callable[[int, List[Optional[tf.Tensor]]], Any],
                    theta_leaves: Sequence[tf.Tensor], sums: PerLeaf) -> PerLeaf:
  """The weight-gradient pass: `sums` plus every kept layer's weight gradients, last layer first.

  Args:
    kept: per layer that reads weights, in layer order: (its index j, its input leaves (flattened,
      None where absent), the positions of its output leaves that have gradients, those
      gradients). The input leaves must not depend on the weights (in a weight-gradient function
      they are its arguments): each layer is differentiated with respect to every weight.
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
