"""Partitioning: cut a pipeline's L layers into K contiguous partitions, and keep the reasons.

Explicit partitions are only checked. A flat list of layers is split by `MakePlan`: per-layer costs
come from `cost_model` (layer count, FPropMeta flops, measured time or memory), partition sizes from
`balancing` (the exact min-max split, optionally within a per-device memory budget, or the paper's
min-variance heuristic). The resulting `Plan` remembers costs and profiles so that
`partition_report` can show per partition what it costs and holds.
"""

import dataclasses
from typing import Any, Callable, List, Optional, Sequence, Tuple

from tensorpipe.partitioner import balancing
from tensorpipe.partitioner import cost_model
from tensorpipe import schedule_builders
from tensorpipe.partitioner import measured_cost
from tensorpipe import units

COST_SOURCES = ('auto',) + cost_model.COST_SOURCES


def CheckPartitions(partitions: Sequence[Sequence[Any]], where: str = 'TensorPipeLayer') -> None:
  """Checks an explicit list of K lists of layer Params; names the offending partition."""
  if not isinstance(partitions, (list, tuple)) or not partitions:
    raise ValueError('%s: partitions must be a non-empty list of lists of layer Params, got %r' %
                     (where, partitions))
  for k, partition in enumerate(partitions):
    if not isinstance(partition, (list, tuple)):
      raise ValueError('%s: partition %d must be a list of layer Params, got %s' %
                       (where, k, type(partition).__name__))
    if not partition:
      raise ValueError('%s: partition %d of %d is empty; every partition needs at least one layer' %
                       (where, k, len(partitions)))


@dataclasses.dataclass
class Plan:
  """A partitioning decision: partition sizes, the costs they balance, and how they were found."""
  layer_params: List[Any]
  sizes: List[int]
  cost_source: str
  algorithm: str
  cost: balancing.LayerCosts
  input_shapes: Optional[List[Any]] = None
  num_micro_batches: int = 1
  recompute: str = 'always'
  bytes_per_param: int = cost_model.DEFAULT_BYTES_PER_PARAM
  memory_budget: Optional[float] = None
  skips: Tuple[Tuple[int, int], ...] = ()  # (source, destination) indices of skip connections.
  # Per partition, its device (None: partition k on device k); a budget bounds each device's sum.
  partition_devices: Optional[Tuple[int, ...]] = None
  _profiles: Optional[List[cost_model.LayerProfile]] = None

  @property
  def num_partitions(self) -> int:
    return len(self.sizes)

  def Partitions(self) -> List[List[Any]]:
    """The layer Params of each partition."""
    partitions, start = [], 0
    for size in self.sizes:
      partitions.append(list(self.layer_params[start:start + size]))
      start += size
    return partitions

  def PartitionCosts(self) -> List[float]:
    return self.cost.Partitions(self.sizes)

  def Imbalance(self) -> float:
    """max / mean of the partition costs."""
    return balancing.Imbalance(self.PartitionCosts())

  def Efficiency(self, num_micro_batches: Optional[int] = None) -> float:
    """Predicted busy fraction of the devices from bubble and imbalance (balancing.Efficiency)."""
    return balancing.Efficiency(self.PartitionCosts(), num_micro_batches or self.num_micro_batches)

  def Profiles(self) -> Optional[List[cost_model.LayerProfile]]:
    """LayerProfiles (flops, parameters, activation sizes); None without input shapes."""
    if self._profiles is None and self.input_shapes is not None:
      self._profiles = cost_model.Profiles(self.layer_params, self.input_shapes, self.skips)
    return self._profiles

  @property
  def devices(self) -> Tuple[int, ...]:
    """Per partition, its device: `partition_devices`, or partition k on device k."""
    return self.partition_devices or tuple(range(len(self.sizes)))

  def DeviceMemory(self, sizes: Optional[Sequence[int]] = None) -> List[float]:
    """Estimated memory per device: the sum over the partitions it holds (for `sizes`, default the
    plan's); needs input shapes."""
    memory = self.Memory()
    if memory is None:
      raise ValueError('per-device memory needs the input shapes')
    per_partition = memory.Partitions(self.sizes if sizes is None else sizes)
    totals = [0.0] * (max(self.devices) + 1)
    for d, need in zip(self.devices, per_partition):
      totals[d] += need
    return totals

  def Memory(self) -> Optional[balancing.LayerCosts]:
    """Estimated per-layer memory as balancing.LayerCosts (see cost_model.MemoryCost)."""
    profiles = self.Profiles()
    if profiles is None:
      return None
    return cost_model.MemoryCost(profiles, self.num_micro_batches, self.recompute,
                                 self.bytes_per_param)


def MakePlan(layer_params: Sequence[Any], num_partitions: int,
             input_shapes: Optional[Sequence[Any]] = None, cost: str = 'auto',
             algorithm: str = 'optimal', memory_budget: Optional[float] = None,
             num_micro_batches: int = 1, recompute: str = 'always',
             bytes_per_param: int = cost_model.DEFAULT_BYTES_PER_PARAM,
             device: Optional[str] = None, sizes: Optional[Sequence[int]] = None,
             input_fn: Optional[Callable[[], Any]] = None, where: str = 'TensorPipeLayer',
             skips: Sequence[Tuple[int, int]] = (),
             partition_devices: Optional[Sequence[int]] = None) -> Plan:
  """Splits `layer_params` into `num_partitions` partitions (or describes the given `sizes`).

  Args:
    layer_params: the L layer Params, in order.
    num_partitions: how many partitions to cut (K x v with virtual stages).
    input_shapes: mini-batch shapes of the first layer's FProp inputs; needed by every cost source
      but 'count' and by memory budgets.
    cost: 'auto' ('flops' with input shapes, else 'count'), 'count', 'flops', 'measured', 'memory'.
    algorithm: 'optimal' (least max partition cost) or 'min_variance' (the paper's heuristic).
    memory_budget: bytes per device that the estimated memory of its partitions may not exceed
      together (None: no limit).
    num_micro_batches: M (for memory estimates and the predicted efficiency).
    recompute: the TensorPipeLayer's recompute mode (for memory estimates).
    bytes_per_param: bytes per trainable parameter including optimizer slots.
    device: a device of the type 'measured' times layers on.
    sizes: explicit partition sizes: only describe them (and check them against `memory_budget`).
    input_fn: for 'measured': a callable returning the first layer's FProp args (e.g. integer ids)
      instead of uniform random floats of `input_shapes`.
    where: prefix of error messages.
    skips: (source, destination) layer indices of skip connections: each destination's costs are
      taken with its source's output as an extra input.
    partition_devices: per partition, its device, when a device holds several partitions (virtual
      stages; see schedule_builders.PartitionDevices); None: partition k on device k.

  Returns:
    A Plan.
  """
  layer_params = list(layer_params)
  if not layer_params:
    raise ValueError('%s: `layers` is empty; give at least one layer' % where)
  balancing.CheckLayerCount(len(layer_params), num_partitions, where)
  if cost not in COST_SOURCES:
    raise ValueError('%s: partition_cost=%r is not one of %s' % (where, cost, COST_SOURCES))
  if algorithm not in balancing.ALGORITHMS:
    raise ValueError('%s: partition_algorithm=%r is not one of %s' %
                     (where, algorithm, balancing.ALGORITHMS))
  if cost == 'auto':
    cost = 'count' if input_shapes is None else 'flops'
  if input_shapes is None and (cost != 'count' or memory_budget is not None):
    what = 'memory_budget' if cost == 'count' else 'partition_cost=%r' % cost
    raise ValueError('%s: %s needs cost_input_shapes (the first layer\'s input shapes for one '
                     'mini-batch)' % (where, what))
  # The plan starts with the 'count' cost; the other sources replace it below (memory's needs the
  # plan's layer profiles).
  plan = Plan(layer_params, list(sizes or []), cost, algorithm,
              balancing.LayerCosts([1.0] * len(layer_params)),
              None if input_shapes is None else list(input_shapes), num_micro_batches, recompute,
              bytes_per_param, memory_budget, tuple(skips),
              None if partition_devices is None else tuple(partition_devices))
  if cost != 'count':
    assert input_shapes is not None  # Checked above: every other cost source needs them.
    if cost == 'flops':
      plan.cost = balancing.LayerCosts(cost_model.Flops(layer_params, input_shapes, skips),
                                       where=where)
    elif cost == 'measured':
      plan.cost = balancing.LayerCosts(
          measured_cost.MeasureSeconds(layer_params, input_shapes, device, input_fn=input_fn,
                                       skips=skips),
          what='time', where=where)
    else:
      memory = plan.Memory()
      assert memory is not None  # A plan with input shapes has layer profiles.
      plan.cost = memory
  if not sizes:
    plan.sizes = _Split(plan, num_partitions, where)
  elif memory_budget is not None:
    _CheckBudget(plan, where)
  return plan


# Most partial splits `_DeviceBudgetSplit` tries for one cost bound before it gives up.
_SEARCH_LIMIT = 200000


def _Split(plan, num_partitions, where):
  """The balanced sizes; within a memory budget, every device's partitions within it together."""
  budget = plan.memory_budget
  if budget is None:
    return balancing.Split(plan.cost, num_partitions, plan.algorithm, None, None, where)
  devices = plan.partition_devices
  if devices is None or len(set(devices)) == len(devices):
    return balancing.Split(plan.cost, num_partitions, plan.algorithm, plan.Memory(), budget, where)
  if plan.algorithm != 'optimal':
    raise ValueError("%s: memory_budget needs partition_algorithm='optimal', got %r" %
                     (where, plan.algorithm))
  return _DeviceBudgetSplit(plan, num_partitions, devices, where)


def _DeviceBudgetSplit(plan, num_partitions, devices, where):
  """The split of least max partition cost whose devices each hold at most the budget, summed over
  their partitions (several partitions per device couple partitions that are not neighbours, so
  balancing's exact sweep does not apply): a bisection over the partition costs that can be the
  max, each step a depth-first search for a split within that cost and every device's budget."""
  num_layers, cost, memory = len(plan.layer_params), plan.cost, plan.Memory()
  budget = plan.memory_budget

  def Search(bound):  # Sizes with every partition's cost <= bound, or None; raises if too long.
    sums = [0.0] * (max(devices) + 1)
    ends, tried = [], [0]

    def From(c, start):
      if c == num_partitions:
        return start == num_layers
      tried[0] += 1
      if tried[0] > _SEARCH_LIMIT:
        raise _SearchTooLong()
      last = num_layers if c == num_partitions - 1 else num_layers - (num_partitions - c - 1)
      first = last if c == num_partitions - 1 else start + 1
      for end in range(last, first - 1, -1):  # Fullest partitions first.
        need = memory.Of(start, end)
        if cost.Of(start, end) > bound or sums[devices[c]] + need > budget:
          continue
        sums[devices[c]] += need
        ends.append(end)
        if From(c + 1, end):
          return True
        sums[devices[c]] -= need
        ends.pop()
      return False

    if not From(0, 0):
      return None
    return [b - a for a, b in zip([0] + ends[:-1], ends)]

  what = '%d layers into %d partitions (%d on a device)' % (
      num_layers, num_partitions, max(devices.count(d) for d in devices))
  try:
    best = Search(float('inf'))
  except _SearchTooLong:
    best = None
  if best is None:
    raise ValueError('%s: found no split of %s that keeps every device within memory_budget=%s '
                     '(a device holds the sum of its partitions); raise the budget, or use more '
                     'devices' % (where, what, units.FormatBytes(budget)))
  bounds = sorted({cost.Of(i, j) for i in range(num_layers) for j in range(i + 1, num_layers + 1)
                   if cost.Of(i, j) < max(cost.Partitions(best))})
  low, high = 0, len(bounds) - 1
  while low <= high:  # The least bound that still has a split.
    middle = (low + high) // 2
    try:
      sizes = Search(bounds[middle])
    except _SearchTooLong:
      sizes = None  # Taken as none: the split found so far stands.
    if sizes is None:
      low = middle + 1
    else:
      best, high = sizes, middle - 1
  return best


class _SearchTooLong(Exception):
  pass


def _CheckBudget(plan, where):
  """Raises ValueError naming the first device whose partitions' memory exceeds the budget."""
  for d, need in enumerate(plan.DeviceMemory()):
    if need > plan.memory_budget:
      held = [k for k, dk in enumerate(plan.devices) if dk == d]
      what = ('partition %d needs' % held[0] if len(held) == 1 else
              'device %d holds partitions %s, which need together' %
              (d, ', '.join(map(str, held))))
      raise ValueError('%s: %s an estimated %s, more than memory_budget=%s; move layers out of '
                       'it, or cut `layers` automatically within the budget' %
                       (where, what, units.FormatBytes(need),
                        units.FormatBytes(plan.memory_budget)))


def SplitLayers(layer_params: Sequence[Any], num_partitions: int,
                input_shapes: Optional[Sequence[Any]] = None,
                where: str = 'TensorPipeLayer') -> List[List[Any]]:
  """`layer_params` in `num_partitions` partitions, balanced by flops (by count without shapes)."""
  return MakePlan(layer_params, num_partitions, input_shapes, where=where).Partitions()


def SkipIndices(layer_params: Sequence[Any], skip_connections: Any) -> List[Tuple[int, int]]:
  """(source, destination) indices in `layer_params` of the skip connections between its layers
  (the cost model feeds each destination its source's output); the rest are checked later."""
  index = {layer.name: i for i, layer in enumerate(layer_params)}
  pairs = []
  for pair in skip_connections or []:
    if isinstance(pair, (list, tuple)) and len(pair) == 2 and all(n in index for n in pair):
      if index[pair[0]] < index[pair[1]]:
        pairs.append((index[pair[0]], index[pair[1]]))
  return pairs


def CheckNames(layer_params: Sequence[Any], where: str) -> None:
  """Refuses a layer without a name and two layers of one name."""
  seen = set()
  for i, params in enumerate(layer_params):
    if not params.name:
      raise ValueError('%s: layer %d (%s) has no name; every layer needs a unique name' %
                       (where, i, params.cls.__name__))
    if params.name in seen:
      raise ValueError('%s: layer name %r appears twice; layer names must be unique' %
                       (where, params.name))
    seen.add(params.name)


def PipelinePlan(p: Any, num_devices: Optional[int], num_micro_batches: int,
                 device: Optional[str], where: str) -> Plan:
  """The Plan of a TensorPipeLayer's Params `p`: its explicit `partitions`, checked, or its
  `layers` split into K x virtual_stages partitions.

  Args:
    p: the TensorPipeLayer's Params (partitions or layers, virtual_stages, schedule, skip
      connections and the partition_* and memory settings).
    num_devices: K, the number of devices, as the Params give it (None: not given).
    num_micro_batches: M, for memory estimates and the predicted efficiency.
    device: a device of the type 'measured' times layers on.
    where: prefix of error messages.
  """
  if (p.partitions is None) == (p.layers is None):
    raise ValueError('%s: set exactly one of `partitions` (explicit partitions) and `layers` '
                     '(cut into num_devices x virtual_stages partitions)' % where)
  sizes = None
  v = p.virtual_stages
  if p.partitions is not None:
    CheckPartitions(p.partitions, where)
    if len(p.partitions) % v:
      raise ValueError('%s: `partitions` lists %d partitions, not a multiple of '
                       'virtual_stages=%d (K devices hold K x virtual_stages partitions)' %
                       (where, len(p.partitions), v))
    k = num_devices
    if k is not None and k * v != len(p.partitions):
      raise ValueError('%s: num_devices=%r with virtual_stages=%d needs %d partitions, but '
                       '`partitions` lists %d' % (where, k, v, k * v, len(p.partitions)))
    sizes = [len(partition) for partition in p.partitions]
    layers = [layer_params for partition in p.partitions for layer_params in partition]
    num_partitions = len(sizes)
  else:
    if num_devices is None:
      raise ValueError('%s: `layers` needs num_devices (the number of devices K)' % where)
    layers, num_partitions = list(p.layers), num_devices * v
  CheckNames(layers, where)
  return MakePlan(
      layers, num_partitions, p.cost_input_shapes, p.partition_cost, p.partition_algorithm,
      p.memory_budget, num_micro_batches, p.recompute, p.bytes_per_param, device, sizes,
      where=where, skips=SkipIndices(layers, p.skip_connections),
      partition_devices=schedule_builders.PartitionDevices(p.schedule, num_partitions // v, v))
