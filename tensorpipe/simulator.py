"""Simulator: predicts a pipelined training step's time from per-cell task times (plain data).

Each device runs its cell's tasks one at a time, in the order `schedule.FillDrainSchedule` gives and
TensorPipeLayer builds: forward F(k, t) for t = 0 .. M-1, then for t = M-1 .. 0 the re-computation
R(k, t) and the backward pass B(k, t). A task starts when its device is free and its inputs exist:
  F(k, t) needs F(k-1, t) (plus one boundary transfer);
  R(k, t) and B(k, t) need the incoming gradient: B(k+1, t) (plus a transfer), or for the last cell
  the loss, which needs every micro-batch's output, F(K-1, M-1).
Fed with measured times (see `profiling.CellTimes`) it predicts the step time, the bubble, each
device's idle time and a timeline for any K and M, e.g. K = 128 devices that are not at hand.
"""

import dataclasses
from typing import List

from tensorpipe import schedule

FORWARD, RECOMPUTE, BACKWARD = 'forward', 'recompute', 'backward'


@dataclasses.dataclass
class CellCost:
  """Seconds of one cell's tasks for ONE micro-batch."""
  forward: float
  backward: float
  recompute: float = 0.0


@dataclasses.dataclass
class Interval:
  """One task on the timeline."""
  cell: int
  kind: str
  micro_batch: int
  start: float
  end: float


@dataclasses.dataclass
class Result:
  """A simulated step."""
  step_time: float
  busy: List[float]  # Per device.
  timeline: List[Interval]

  @property
  def idle(self):
    return [self.step_time - b for b in self.busy]

  @property
  def idle_fraction(self):
    """Mean idle share of the devices (bubble plus imbalance)."""
    return sum(self.idle) / (len(self.busy) * self.step_time) if self.step_time else 0.0


def _Check(costs, num_micro_batches, transfer):
  if not costs:
    raise ValueError('simulator: no cells given')
  for k, c in enumerate(costs):
    for field in ('forward', 'backward', 'recompute'):
      value = getattr(c, field)
      if not isinstance(value, (int, float)) or value < 0:
        raise ValueError('simulator: cell %d has %s time %r; times must be non-negative seconds' %
                         (k, field, value))
  if transfer < 0:
    raise ValueError('simulator: transfer time must be non-negative, got %r' % transfer)
  schedule.FillDrainSchedule(len(costs), num_micro_batches)  # Checks M.


def Simulate(costs, num_micro_batches, transfer=0.0):
  """Simulates one fill-drain step of len(costs) cells and M micro-batches.

  Args:
    costs: a CellCost per cell (seconds per micro-batch).
    num_micro_batches: M.
    transfer: seconds to move one micro-batch's boundary activation (or its gradient) between
      neighbouring devices.

  Returns:
    A Result.
  """
  _Check(costs, num_micro_batches, transfer)
  num_cells, m = len(costs), num_micro_batches
  free = [0.0] * num_cells
  busy = [0.0] * num_cells
  done = {}
  timeline = []

  def Run(k, kind, t, ready, seconds):
    start = max(free[k], ready)
    end = start + seconds
    free[k] = end
    busy[k] += seconds
    done[(kind, k, t)] = end
    timeline.append(Interval(k, kind, t, start, end))

  for task in schedule.FillDrainSchedule(num_cells, m).ForwardOrder():
    k, t = task.cell, task.micro_batch
    ready = 0.0 if k == 0 else done[(FORWARD, k - 1, t)] + transfer
    Run(k, FORWARD, t, ready, costs[k].forward)
  loss_ready = done[(FORWARD, num_cells - 1, m - 1)]
  for k in reversed(range(num_cells)):
    for t in reversed(range(m)):
      ready = loss_ready if k == num_cells - 1 else done[(BACKWARD, k + 1, t)] + transfer
      if costs[k].recompute:
        Run(k, RECOMPUTE, t, ready, costs[k].recompute)
        ready = done[(RECOMPUTE, k, t)]
      Run(k, BACKWARD, t, ready, costs[k].backward)
  step = max(i.end for i in timeline)
  return Result(step, busy, timeline)


def SplitCosts(layer_costs, sizes, num_micro_batches, overhead=0.0):
  """Per-cell CellCosts for M micro-batches from per-layer costs of the whole mini-batch.

  Each layer's time is taken to scale with its share of the batch, plus a fixed `overhead` seconds
  per task (op launch costs that do not shrink with the micro-batch).

  Args:
    layer_costs: a CellCost per layer, for the whole mini-batch.
    sizes: the cell sizes (layers per cell).
    num_micro_batches: M.
    overhead: seconds added to every task.
  """
  if sum(sizes) != len(layer_costs):
    raise ValueError('simulator: cell sizes %s do not add up to %d layers' %
                     (sizes, len(layer_costs)))
  out, start = [], 0
  for size in sizes:
    cell = layer_costs[start:start + size]
    start += size
    out.append(CellCost(
        forward=sum(c.forward for c in cell) / num_micro_batches + overhead,
        backward=sum(c.backward for c in cell) / num_micro_batches + overhead,
        recompute=(sum(c.recompute for c in cell) / num_micro_batches + overhead
                   if any(c.recompute for c in cell) else 0.0)))
  return out
