"""The GPipe fill-drain schedule as plain data (no TensorFlow).

A schedule is a list of clock ticks; each tick holds the tasks that run concurrently, at most one per
cell. Forward task F(k, t) runs cell k on micro-batch t at tick k + t, so cell k + 1 starts micro-batch t
as soon as cell k has finished it. All backward tasks follow all forward tasks and run in reverse:
B(k, t) runs at tick (M + K - 1) + (K - 1 - k) + (M - 1 - t). `TensorPipeLayer` builds its graph in this
order and its data dependencies keep each device on this order (with `recompute_overlap`, a device
may run two neighbouring micro-batches at once).
"""

import dataclasses
from typing import List

FORWARD = 'F'
BACKWARD = 'B'


@dataclasses.dataclass(frozen=True, order=True)
class Task:
  """One unit of work: `kind` (FORWARD or BACKWARD) of cell `cell` on micro-batch `micro_batch`."""
  kind: str
  cell: int
  micro_batch: int

  def __str__(self):
    return '%s%d,%d' % (self.kind, self.cell, self.micro_batch)


def _CheckSizes(num_cells, num_micro_batches):
  for name, value in (('num_cells', num_cells), ('num_micro_batches', num_micro_batches)):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError('%s must be a positive integer, got %r' % (name, value))


class FillDrainSchedule:
  """GPipe's schedule for `num_cells` (K) cells and `num_micro_batches` (M) micro-batches."""

  def __init__(self, num_cells, num_micro_batches):
    _CheckSizes(num_cells, num_micro_batches)
    self.num_cells = num_cells
    self.num_micro_batches = num_micro_batches

  @property
  def num_forward_ticks(self):
    return self.num_micro_batches + self.num_cells - 1

  def ForwardTicks(self) -> List[List[Task]]:
    """Forward ticks: tick c holds F(k, c - k) for every cell k with 0 <= c - k < M."""
    k_cells, m = self.num_cells, self.num_micro_batches
    return [[Task(FORWARD, k, c - k) for k in range(k_cells) if 0 <= c - k < m]
            for c in range(self.num_forward_ticks)]

  def BackwardTicks(self) -> List[List[Task]]:
    """Backward ticks: the forward ticks mirrored, last cell and last micro-batch first."""
    return [[Task(BACKWARD, task.cell, task.micro_batch) for task in reversed(tick)]
            for tick in reversed(self.ForwardTicks())]

  def Ticks(self) -> List[List[Task]]:
    """All ticks of one training step: forward, then backward."""
    return self.ForwardTicks() + self.BackwardTicks()

  def ForwardOrder(self) -> List[Task]:
    """Forward tasks flattened in tick order: the order in which the graph is built."""
    return [task for tick in self.ForwardTicks() for task in tick]

  def DeviceOrder(self, cell) -> List[Task]:
    """The tasks cell `cell` runs in one training step, in order."""
    if not 0 <= cell < self.num_cells:
      raise ValueError('cell %r is not in [0, %d)' % (cell, self.num_cells))
    return [task for tick in self.Ticks() for task in tick if task.cell == cell]

  def BubbleFraction(self):
    """Idle share of each device with equal task costs: (K - 1) / (M + K - 1)."""
    return (self.num_cells - 1) / self.num_forward_ticks

  def Render(self):
    """A text chart: one row per cell, one column per tick, '.' where the cell is idle."""
    ticks = self.Ticks()
    width = max(len(str(task)) for tick in ticks for task in tick)
    rows = []
    for k in range(self.num_cells):
      cells = []
      for tick in ticks:
        mine = [str(task) for task in tick if task.cell == k]
        cells.append((mine[0] if mine else '.').ljust(width))
      rows.append('cell %d | %s' % (k, ' '.join(cells)))
    return '\n'.join(rows)


def BubbleFraction(num_cells, num_micro_batches):
  """(K - 1) / (M + K - 1): the idle share of each device in a fill-drain step with equal costs."""
  return FillDrainSchedule(num_cells, num_micro_batches).BubbleFraction()
