"""Balancing: L per-layer costs cut into K contiguous, non-empty partitions (no TensorFlow).

A pipeline step is paced by its slowest partition, so `OptimalSplit` minimises the largest partition
cost, exactly, and can keep every partition within a per-device memory budget. `MinVarianceSplit` is
the GPipe paper's heuristic (minimise the variance of the partition costs), kept to compare against.

Per-layer costs (or bytes) are `LayerCosts`: a partition's cost is the sum of its layers' values
plus an optional value of the layer it starts at; a stashed partition-boundary activation is such a
start value.

`OptimalSplit` bisects on the bound B of the largest partition: a bound is feasible when some split
into exactly K partitions keeps every partition within B (and the memory budget), which one sweep
per partition count decides, O(K L) with numpy. Bisection runs until the feasible and infeasible
bounds are adjacent floats, so the result is optimal, not approximate. Among the optimal splits it
returns the one whose cuts lie closest to k/K of the total cost.
"""

from typing import List, Optional, Sequence, Union

import numpy as np

from tensorpipe import schedule_builders
from tensorpipe import units

ALGORITHMS = ('optimal', 'min_variance')


class LayerCosts:
  """Per-layer values, and from them the cost of a partition [i, j): sum(per_layer[i:j]) +
  at_start[i]."""

  def __init__(self, per_layer: Sequence[float], at_start: Optional[Sequence[float]] = None,
               what: str = 'cost', where: str = 'balancing'):
    self.per_layer = _Values(per_layer, what, where)
    num_layers = len(self.per_layer)
    if at_start is None:
      self.at_start = np.zeros(num_layers)
    else:
      self.at_start = _Values(at_start, what + ' at a partition start', where)
      if len(self.at_start) != num_layers:
        raise ValueError('%s: %d start values for %d layers' %
                         (where, len(self.at_start), num_layers))
    self.prefix = np.concatenate([[0.0], np.cumsum(self.per_layer)])

  def __len__(self) -> int:
    return len(self.per_layer)

  def Of(self, i: int, j: int) -> float:
    """The cost of the partition holding layers i .. j - 1."""
    return float(self.prefix[j] - self.prefix[i] + self.at_start[i])

  def Partitions(self, sizes: Sequence[int]) -> List[float]:
    """The cost of each partition for the given partition sizes."""
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return [self.Of(bounds[k], bounds[k + 1]) for k in range(len(sizes))]

  def Ends(self, bound: float) -> np.ndarray:
    """For each start i, the largest end j with Of(i, j) <= bound (i when no layer fits)."""
    limit = self.prefix[:-1] - self.at_start + bound
    ends = np.searchsorted(self.prefix, limit, side='right') - 1
    return np.maximum(ends, np.arange(len(self)))


# Per-layer costs: a list of non-negative numbers or LayerCosts.
Costs = Union[Sequence[float], LayerCosts]


def _Values(values, what, where):
  try:
    out = np.asarray(values, dtype=np.float64).reshape(-1)
  except (TypeError, ValueError) as e:
    raise ValueError('%s: layer %ss must be numbers, got %r' % (where, what, values)) from e
  bad = [i for i, v in enumerate(out) if not np.isfinite(v) or v < 0]
  if bad:
    raise ValueError('%s: layer %ss must be finite and non-negative; layer %d has %s %r' %
                     (where, what, bad[0], what, values[bad[0]]))
  return out


def _AsLayerCosts(costs, what, where):
  return costs if isinstance(costs, LayerCosts) else LayerCosts(costs, what=what, where=where)


def CheckLayerCount(num_layers: int, num_partitions: int, where: str = 'balancing') -> None:
  """Raises a ValueError naming the values unless 1 <= num_partitions <= num_layers: every
  partition needs a layer."""
  if isinstance(num_partitions, bool) or not isinstance(num_partitions, (int, np.integer)) or (
      num_partitions < 1):
    raise ValueError('%s: num_partitions must be a positive integer, got %r' %
                     (where, num_partitions))
  if num_layers == 0:
    raise ValueError('%s: there are no layers to partition' % where)
  if num_partitions > num_layers:
    raise ValueError('%s: %d layers cannot fill %d partitions; every partition needs at least one '
                     'layer' % (where, num_layers, num_partitions))


class _Reach:
  """Which positions a split into exactly k partitions can reach, given each start's largest end."""

  def __init__(self, ends, num_partitions):
    self.ends = ends
    self.num_layers = len(ends)
    self.num_partitions = num_partitions

  def Forward(self):
    """reach[k][j]: layers 0 .. j - 1 can form exactly k partitions."""
    num_layers = self.num_layers
    starts = np.arange(num_layers)
    reach = [np.zeros(num_layers + 1, dtype=bool)]
    reach[0][0] = True
    for _ in range(self.num_partitions):
      live = reach[-1][:-1] & (self.ends > starts)
      # +1 where a reachable span starts, -1 past its end (bincount: np.add.at, many times faster).
      diff = (np.bincount(starts[live] + 1, minlength=num_layers + 2) -
              np.bincount(self.ends[live] + 1, minlength=num_layers + 2))
      reach.append(np.cumsum(diff)[:num_layers + 1] > 0)
    return reach

  def Feasible(self):
    return bool(self.Forward()[self.num_partitions][self.num_layers])

  def Backward(self):
    """back[r][i]: layers i .. L - 1 can form exactly r partitions."""
    num_layers = self.num_layers
    starts = np.arange(num_layers)
    back = [np.zeros(num_layers + 1, dtype=bool)]
    back[0][num_layers] = True
    for _ in range(self.num_partitions):
      count = np.concatenate([[0], np.cumsum(back[-1])])
      has = np.zeros(num_layers + 1, dtype=bool)
      has[:num_layers] = count[self.ends + 1] - count[starts + 1] > 0
      back.append(has)
    return back


def Fits(memory: Costs, num_partitions: int, memory_budget: float,
         where: str = 'balancing') -> bool:
  """Whether some split into `num_partitions` partitions keeps each within `memory_budget`: when
  it does not, OptimalSplit with that budget raises."""
  mem = _AsLayerCosts(memory, 'memory', where)
  CheckLayerCount(len(mem), num_partitions, where)
  return _Reach(mem.Ends(float(memory_budget)), num_partitions).Feasible()


def _SmallestFeasible(lower, upper, feasible):
  """The smallest bound in [lower, upper] for which `feasible(bound)` holds (upper must hold)."""
  if feasible(lower):
    return lower
  lo, hi = lower, upper
  while True:
    mid = lo + (hi - lo) / 2
    if mid <= lo or mid >= hi:
      return hi
    if feasible(mid):
      hi = mid
    else:
      lo = mid


def _Bounds(cost, num_partitions):
  """A lower bound (maybe feasible) and an always-feasible upper bound on the largest partition."""
  lower = max(float(cost.per_layer.max()), cost.Of(0, 1), float(cost.prefix[-1]) / num_partitions)
  upper = float(cost.prefix[-1] + cost.at_start.max())
  return lower, upper


def _Pick(cost, ends, num_partitions):
  """The split within `ends` whose k-th cut lies closest to k/K of the total cost."""
  back = _Reach(ends, num_partitions).Backward()
  total = cost.prefix[-1]
  cuts = [0]
  for k in range(1, num_partitions):
    start = cuts[-1]
    candidates = np.arange(start + 1, ends[start] + 1)
    candidates = candidates[back[num_partitions - k][candidates]]
    target = total * k / num_partitions
    cuts.append(int(candidates[np.argmin(np.abs(cost.prefix[candidates] - target))]))
  cuts.append(len(cost))
  return [cuts[k + 1] - cuts[k] for k in range(num_partitions)]


def OptimalSplit(costs: Costs, num_partitions: int, memory: Optional[Costs] = None,
                 memory_budget: Optional[float] = None, where: str = 'balancing') -> List[int]:
  """K partition sizes minimising the largest partition cost, every partition's memory in budget.

  Args:
    costs: per-layer costs (list of non-negative numbers) or LayerCosts.
    num_partitions: how many partitions (K x v with virtual stages).
    memory: per-layer memory bytes or LayerCosts (start values: stashed boundary activations).
    memory_budget: bytes each device may hold; None for no limit.
    where: prefix of error messages.

  Returns:
    K positive ints summing to L.

  Raises:
    ValueError: bad costs or K, or no split keeps every partition within `memory_budget` (the
      message gives the smallest budget that would fit).
  """
  cost = _AsLayerCosts(costs, 'cost', where)
  CheckLayerCount(len(cost), num_partitions, where)
  mem_ends = None
  if memory_budget is not None:
    if memory is None:
      raise ValueError('%s: memory_budget=%r needs per-layer memory' % (where, memory_budget))
    mem = _AsLayerCosts(memory, 'memory', where)
    if len(mem) != len(cost):
      raise ValueError('%s: memory for %d layers but costs for %d' % (where, len(mem), len(cost)))
    mem_ends = mem.Ends(float(memory_budget))
    if not _Reach(mem_ends, num_partitions).Feasible():
      lower, upper = _Bounds(mem, num_partitions)
      need = _SmallestFeasible(
          lower, upper, lambda b: _Reach(mem.Ends(b), num_partitions).Feasible())
      sizes = _Pick(mem, mem.Ends(need), num_partitions)
      raise ValueError(
          '%s: no split of %d layers into %d partitions fits a memory budget of %s per device; '
          'the best '
          'split needs %s on its fullest device (partition sizes %s)' %
          (where, len(cost), num_partitions, units.FormatBytes(memory_budget),
           units.FormatBytes(max(mem.Partitions(sizes))), sizes))

  def Ends(bound):
    ends = cost.Ends(bound)
    return ends if mem_ends is None else np.minimum(ends, mem_ends)

  lower, upper = _Bounds(cost, num_partitions)
  best = _SmallestFeasible(lower, upper, lambda b: _Reach(Ends(b), num_partitions).Feasible())
  return _Pick(cost, Ends(best), num_partitions)


def MinVarianceSplit(costs: Costs, num_partitions: int, where: str = 'balancing') -> List[int]:
  """K partition sizes minimising the variance of the partition costs (the GPipe paper's heuristic).

  With the total fixed, the variance is least when the sum of squared partition costs is; dynamic
  programming finds that exactly in O(K L^2). It can leave the slowest partition slower than
  `OptimalSplit` does, which is what a pipeline's step time depends on.
  """
  cost = _AsLayerCosts(costs, 'cost', where)
  num_layers = len(cost)
  CheckLayerCount(num_layers, num_partitions, where)
  prefix, at_start = cost.prefix, cost.at_start
  best = np.full(num_layers + 1, np.inf)
  best[0] = 0.0
  choice = []
  for k in range(1, num_partitions + 1):
    nxt = np.full(num_layers + 1, np.inf)
    arg = np.zeros(num_layers + 1, dtype=int)
    for j in range(k, num_layers - (num_partitions - k) + 1):
      starts = np.arange(k - 1, j)
      partitions = prefix[j] - prefix[starts] + at_start[starts]
      total = best[starts] + partitions * partitions
      i = int(np.argmin(total))
      nxt[j], arg[j] = total[i], starts[i]
    best = nxt
    choice.append(arg)
  cuts = [num_layers]
  for k in range(num_partitions, 0, -1):
    cuts.append(int(choice[k - 1][cuts[-1]]))
  cuts.reverse()
  return [cuts[k + 1] - cuts[k] for k in range(num_partitions)]


def Split(costs: Costs, num_partitions: int, algorithm: str = 'optimal',
          memory: Optional[Costs] = None, memory_budget: Optional[float] = None,
          where: str = 'balancing') -> List[int]:
  """Partition sizes by `algorithm` ('optimal', or 'min_variance', which takes no memory budget)."""
  if algorithm == 'optimal':
    return OptimalSplit(costs, num_partitions, memory, memory_budget, where)
  if algorithm == 'min_variance':
    if memory_budget is not None:
      raise ValueError("%s: memory_budget needs partition_algorithm='optimal', got %r" %
                       (where, algorithm))
    return MinVarianceSplit(costs, num_partitions, where)
  raise ValueError('%s: partition algorithm %r is not one of %s' % (where, algorithm, ALGORITHMS))


def Imbalance(partition_costs: Sequence[float]) -> float:
  """max / mean of the partition costs: 1.0 is perfect balance."""
  mean = sum(partition_costs) / len(partition_costs)
  return max(partition_costs) / mean if mean > 0 else 1.0


def Efficiency(partition_costs: Sequence[float], num_micro_batches: int) -> float:
  """Predicted fraction of the devices' time spent working, from bubble and imbalance.

  A fill-drain step takes (M + K - 1) slots of the slowest partition's per-micro-batch time, while
  perfectly balanced, bubble-free work would take M slots of the mean partition's: the busy share
  1 - schedule_builders.FillDrainBubbleFraction(K, M) divided by the imbalance.
  """
  busy = 1.0 - schedule_builders.FillDrainBubbleFraction(len(partition_costs), num_micro_batches)
  return busy / Imbalance(partition_costs)
