"""Partitioning: cut a sequential list of L layers into K contiguous, non-empty cells.

The cost of each layer comes from its `FPropMeta` flops for given input shapes (or is 1 per layer when no
shapes are given). `BalancedSplit` places each cut where the running cost is closest to k/K of the total.
"""

from lingvo.core import tshape


def CheckPartitions(partitions, where='TensorPipeLayer'):
  """Checks an explicit list of K lists of layer Params; names the offending cell."""
  if not isinstance(partitions, (list, tuple)) or not partitions:
    raise ValueError('%s: partitions must be a non-empty list of lists of layer Params, got %r' %
                     (where, partitions))
  for k, cell in enumerate(partitions):
    if not isinstance(cell, (list, tuple)):
      raise ValueError('%s: partition %d must be a list of layer Params, got %s' %
                       (where, k, type(cell).__name__))
    if not cell:
      raise ValueError('%s: partition %d of %d is empty; every cell needs at least one layer' %
                       (where, k, len(partitions)))


def _ToShape(shape):
  return shape if isinstance(shape, tshape.Shape) else tshape.Shape(list(shape))


def ChainMeta(layer_params, input_shapes):
  """Runs FPropMeta through the layers in order.

  Args:
    layer_params: the L layer Params, in order.
    input_shapes: shapes (lists or tshape.Shape) of the first layer's FProp inputs.

  Returns:
    (costs, out_shapes): the estimated flops of each layer (L non-negative floats) and the last
    layer's output shapes.

  Raises:
    ValueError: when a layer does not implement FPropMeta, naming it.
  """
  shapes = tuple(_ToShape(s) for s in input_shapes)
  costs = []
  for p in layer_params:
    try:
      meta = p.cls.FPropMeta(p, *shapes)
    except NotImplementedError as e:
      raise ValueError('Layer %r (%s) has no FPropMeta, so its cost cannot be estimated; give '
                       'explicit `partitions` or leave `cost_input_shapes` unset to split by layer '
                       'count' % (p.name, p.cls.__name__)) from e
    costs.append(float(meta.flops))
    shapes = tuple(meta.out_shapes)
  return costs, shapes


def LayerCosts(layer_params, input_shapes):
  """Estimated flops of each layer for the given first-layer input shapes (see ChainMeta)."""
  return ChainMeta(layer_params, input_shapes)[0]


def BalancedSplit(costs, num_partitions, where='TensorPipeLayer'):
  """Returns K cell sizes (numbers of layers) that split `costs` into balanced contiguous cells.

  The cut after cell k is placed at the prefix whose cost is closest to (k + 1)/K of the total, moved
  as needed so that every cell keeps at least one layer.
  """
  num_layers = len(costs)
  if not isinstance(num_partitions, int) or num_partitions < 1:
    raise ValueError('%s: num_partitions must be a positive integer, got %r' % (where, num_partitions))
  if num_partitions > num_layers:
    raise ValueError('%s: %d layers cannot fill %d partitions; every partition needs at least one '
                     'layer' % (where, num_layers, num_partitions))
  if any(c < 0 for c in costs):
    raise ValueError('%s: layer costs must be non-negative, got %r' % (where, costs))
  prefix = [0.0]
  for c in costs:
    prefix.append(prefix[-1] + c)
  total = prefix[-1]
  cuts = [0]
  for k in range(1, num_partitions):
    lo = cuts[-1] + 1
    hi = num_layers - (num_partitions - k)
    target = total * k / num_partitions
    best = min(range(lo, hi + 1), key=lambda i: (abs(prefix[i] - target), i))
    cuts.append(best)
  cuts.append(num_layers)
  return [cuts[k + 1] - cuts[k] for k in range(num_partitions)]


def SplitLayers(layer_params, num_partitions, input_shapes=None, where='TensorPipeLayer'):
  """Splits `layer_params` into `num_partitions` lists, balanced by cost (or by count without shapes)."""
  layer_params = list(layer_params)
  if not layer_params:
    raise ValueError('%s: `layers` is empty; give at least one layer' % where)
  if input_shapes is None:
    costs = [1.0] * len(layer_params)
  else:
    if num_partitions > len(layer_params):
      BalancedSplit([1.0] * len(layer_params), num_partitions, where)  # Raises the clear error.
    costs = LayerCosts(layer_params, input_shapes)
  sizes = BalancedSplit(costs, num_partitions, where)
  cells, start = [], 0
  for size in sizes:
    cells.append(layer_params[start:start + size])
    start += size
  return cells


def CellCosts(cells, input_shapes):
  """Total estimated flops per cell for the given first-layer input shapes."""
  costs = LayerCosts([p for cell in cells for p in cell], input_shapes)
  out, start = [], 0
  for cell in cells:
    out.append(sum(costs[start:start + len(cell)]))
    start += len(cell)
  return out
