"""Simulator: predicts a pipelined training step's time from per-cell task times (plain data).

The tasks are those `schedule.FillDrainSchedule` gives and TensorPipeLayer builds: forward F(k, t)
for t = 0 .. M-1, then for t = M-1 .. 0 the re-computation R(k, t) and the backward pass B(k, t). A
task waits for its inputs:
  F(k, t) needs F(k-1, t) (plus one boundary transfer);
  R(k, t) and B(k, t) need the incoming gradient: B(k+1, t) (plus a transfer), or for the last cell
  the loss, which needs every micro-batch's output, F(K-1, M-1).
Two machine models play them:
  independent devices (cores=None): each device runs its cell's tasks one at a time in that order
    and has its own processor: right for separate accelerators;
  shared cores (cores=C): tasks wait only for what the graph makes them wait for, and all running
    tasks share C cores: right for logical CPU devices of one process (see `_SimulateShared`).
Fed with measured times (see `profiling.CellTimes`) it predicts the step time, the bubble, each
device's idle time and a timeline for any K and M, e.g. K = 128 devices that are not at hand.
"""

import dataclasses
import math
from typing import List

from tensorpipe import schedule

FORWARD, RECOMPUTE, BACKWARD = 'forward', 'recompute', 'backward'
KINDS = (FORWARD, BACKWARD, RECOMPUTE)


@dataclasses.dataclass
class CellCost:
  """One cell's tasks for ONE micro-batch.

  forward, backward, recompute: seconds the task takes given every core it can use (its span), as
    on a device of its own.
  *_parallelism: the mean number of the task's ops that run at once (its work / span, at least 1),
    so its work is seconds x parallelism core-seconds. Only the shared-core model reads them.
  """
  forward: float
  backward: float
  recompute: float = 0.0
  forward_parallelism: float = 1.0
  backward_parallelism: float = 1.0
  recompute_parallelism: float = 1.0

  def Work(self, kind):
    """Core-seconds of task `kind` (FORWARD, BACKWARD or RECOMPUTE)."""
    return getattr(self, kind) * self.Parallelism(kind)

  def Parallelism(self, kind):
    """Ops of task `kind` running at once, on average."""
    return getattr(self, kind + '_parallelism')


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
  busy: List[float]  # Per device: seconds with at least one of its tasks running.
  timeline: List[Interval]

  @property
  def idle(self):
    return [self.step_time - b for b in self.busy]

  @property
  def idle_fraction(self):
    """Mean idle share of the devices (bubble plus imbalance)."""
    return sum(self.idle) / (len(self.busy) * self.step_time) if self.step_time else 0.0


def _IsNumber(value):
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _Check(costs, num_micro_batches, transfer, cores):
  if not costs:
    raise ValueError('simulator: no cells given')
  for k, c in enumerate(costs):
    for kind in KINDS:
      value = getattr(c, kind)
      if not _IsNumber(value) or value < 0:
        raise ValueError('simulator: cell %d has %s time %r; times must be non-negative seconds' %
                         (k, kind, value))
      value = c.Parallelism(kind)
      if not _IsNumber(value) or value < 1:
        raise ValueError('simulator: cell %d has %s_parallelism %r; it must be a number >= 1 (ops '
                         'running at once)' % (k, kind, value))
  if not _IsNumber(transfer) or transfer < 0:
    raise ValueError('simulator: transfer time must be non-negative, got %r' % (transfer,))
  if cores is not None and (not _IsNumber(cores) or cores <= 0):
    raise ValueError('simulator: cores must be a positive number (or None for independent '
                     'devices), got %r' % (cores,))
  schedule.FillDrainSchedule(len(costs), num_micro_batches)  # Checks M.


def Simulate(costs, num_micro_batches, transfer=0.0, cores=None, recompute_overlap=True):
  """Simulates one fill-drain step of len(costs) cells and M micro-batches.

  Args:
    costs: a CellCost per cell (per micro-batch).
    num_micro_batches: M.
    transfer: seconds to move one micro-batch's boundary activation (or its gradient) between
      neighbouring devices.
    cores: None: independent devices, each running one task at a time. A number C: the devices share
      C cores and run whatever the graph lets run (see `_SimulateShared`).
    recompute_overlap: as TensorPipeLayer's recompute_overlap; read by the shared-core model only
      (independent devices never run two tasks at once).

  Returns:
    A Result.
  """
  _Check(costs, num_micro_batches, transfer, cores)
  if cores is not None:
    return _SimulateShared(costs, num_micro_batches, transfer, cores, recompute_overlap)
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


def Dependencies(num_cells, num_micro_batches, recompute, recompute_overlap=True):
  """{task: [(task it waits for, crosses a device boundary)]} as TensorPipeLayer's graph has them.

  Tasks are (kind, cell, micro_batch). On logical CPU devices TensorFlow runs any op whose inputs
  exist, so a device's tasks are ordered only by these edges:
    F(k, t) waits for F(k-1, t) and for F(k, t-1), whose outputs gate the weights passed on to t
      (accumulation / recomputation pass theta on); with re-computation and `recompute_overlap`,
      F(k, t) reads the weights as they were and waits for F(k, t-2) only, but its outputs still
      come out with the passed-on weights, after F(k, t-1);
    the gradient reaching cell k for micro-batch t comes from B(k+1, t), or for the last cell from
      the loss, i.e. the last outputs of F(K-1, .);
    with re-computation (`recompute[k]`), R(k, t) waits for that gradient, for R(k, t+1) and for
      B(k, t+2) (recomputation.ReplayOrder; B(k, t+1) without `recompute_overlap`), and B(k, t) for
      R(k, t), so R(k, t) may run beside B(k, t+1), and B(k, t) beside the end of B(k, t+1);
    without it, B(k, t) waits for the gradient and for B(k, t+1), whose weight gradient releases it
      (accumulation.PassOn).
  """
  k_cells, m = num_cells, num_micro_batches
  deps = {}
  two_forwards = [r and recompute_overlap for r in recompute]

  def Outputs(k, t, crosses):
    """What the outputs of F(k, t) wait for."""
    return [((FORWARD, k, u), crosses) for u in range(max(t - 1, 0) if two_forwards[k] else t, t + 1)]

  for k in range(k_cells):
    for t in range(m):
      lag = 2 if two_forwards[k] else 1
      deps[(FORWARD, k, t)] = (Outputs(k - 1, t, True) if k else []) + (
          [((FORWARD, k, t - lag), False)] if t >= lag else [])
      incoming = [((BACKWARD, k + 1, t), True)] if k < k_cells - 1 else Outputs(
          k_cells - 1, m - 1, False)
      if recompute[k]:
        wait = t + (2 if recompute_overlap else 1)
        deps[(RECOMPUTE, k, t)] = (incoming +
                                   ([((RECOMPUTE, k, t + 1), False)] if t + 1 < m else []) +
                                   ([((BACKWARD, k, wait), False)] if wait < m else []))
        deps[(BACKWARD, k, t)] = [((RECOMPUTE, k, t), False)] + incoming
      else:
        deps[(BACKWARD, k, t)] = incoming + ([((BACKWARD, k, t + 1), False)] if t + 1 < m else [])
  return deps


def _SimulateShared(costs, num_micro_batches, transfer, cores, recompute_overlap):
  """The shared-core model: event-driven processor sharing of `cores` among the running tasks.

  A task starts once the tasks it waits for (`Dependencies`) have ended, plus `transfer` for a
  boundary crossing. A task of parallelism p counts as p ops: the cores are shared equally among
  the ops of all running tasks, at most one core each, so with n ops running each gets min(1, C / n)
  of a core and a task progresses at p x that. That is how a thread pool serves ready ops (each op
  uses one thread with intra_op_parallelism_threads=1). With C >= K, parallelism 1 and a graph that
  keeps each device on one task at a time (no re-computation, or no overlap), it is the independent
  model.
  """
  recompute = [c.recompute > 0 for c in costs]
  deps = Dependencies(len(costs), num_micro_batches, recompute, recompute_overlap)
  waiting_on = {task: len(d) for task, d in deps.items()}
  successors = {task: [] for task in deps}
  for task, d in deps.items():
    for before, _ in d:
      successors[before].append(task)
  ready_at = {task: 0.0 for task, n in waiting_on.items() if n == 0}
  remaining, start, end = {}, {}, {}
  now = 0.0

  def Finish(task):
    end[task] = now
    del remaining[task]
    for after in successors[task]:
      waiting_on[after] -= 1
      if not waiting_on[after]:
        ready_at[after] = max(end[b] + (transfer if crossing else 0.0)
                              for b, crossing in deps[after])

  while ready_at or remaining:
    for task in [x for x, at in ready_at.items() if at <= now]:
      del ready_at[task]
      start[task] = now
      remaining[task] = costs[task[1]].Work(task[0])
    for task in [x for x, w in remaining.items() if w <= 0.0]:
      Finish(task)
    if any(at <= now for at in ready_at.values()):
      continue  # Zero-work tasks released others at this instant.
    if not remaining:
      if ready_at:
        now = min(ready_at.values())
      continue
    ops = sum(costs[x[1]].Parallelism(x[0]) for x in remaining)
    share = min(1.0, cores / ops)
    rate = {x: costs[x[1]].Parallelism(x[0]) * share for x in remaining}
    finish_in = {x: remaining[x] / rate[x] for x in remaining}
    step = min(finish_in.values())
    if ready_at:
      step = min(step, min(ready_at.values()) - now)
    now += step
    for x in list(remaining):
      if finish_in[x] <= step * (1 + 1e-9):
        Finish(x)
      else:
        remaining[x] -= rate[x] * step
  timeline = sorted((Interval(k, kind, t, start[(kind, k, t)], end[(kind, k, t)])
                     for kind, k, t in end), key=lambda i: (i.start, i.cell))
  busy = [UnionLength([(i.start, i.end) for i in timeline if i.cell == k]) for k in range(len(costs))]
  return Result(max(end.values()), busy, timeline)


def SplitCosts(layer_costs, sizes, num_micro_batches, overhead=0.0):
  """Per-cell CellCosts for M micro-batches from per-layer costs of the whole mini-batch.

  Each layer's time and work are taken to scale with its share of the batch, plus a fixed `overhead`
  seconds per task (op launch costs that do not shrink with the micro-batch; one core's worth). A
  cell's layers run one after another, so its span is the sum of theirs and its parallelism is its
  summed work over its summed span.

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
    fields = {}
    for kind in KINDS:
      if kind == RECOMPUTE and not any(c.recompute for c in cell):
        continue
      span = sum(getattr(c, kind) for c in cell) / num_micro_batches + overhead
      work = sum(c.Work(kind) for c in cell) / num_micro_batches + overhead
      fields[kind] = span
      fields[kind + '_parallelism'] = max(1.0, work / span) if span else 1.0
    out.append(CellCost(fields[FORWARD], fields[BACKWARD], **{
        name: value for name, value in fields.items() if name not in (FORWARD, BACKWARD)}))
  return out


def UnionLength(spans):
  """Total length of the union of (start, end) spans (busy time of overlapping tasks or ops)."""
  total, cur_start, cur_end = 0.0, None, None
  for s, e in sorted(spans):
    if cur_end is None or s > cur_end:
      if cur_end is not None:
        total += cur_end - cur_start
      cur_start, cur_end = s, e
    else:
      cur_end = max(cur_end, e)
  return total + (cur_end - cur_start if cur_end is not None else 0.0)
