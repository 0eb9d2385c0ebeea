"""Simulator: predicts a pipelined training step's time from per-partition task times (plain data).

It plays a `schedule.Schedule`, the same per-device action lists and edges TensorPipeLayer builds
its ops from: an action starts once every action its edges name has ended (plus `transfer` for an
edge between devices). A forward action F(k, t) takes partition k's forward time; a backward action
B(k, t) first re-computes the partition (its recompute time, 0 without re-computation) and then
back-propagates (its backward time, plus its weight time where the schedule has no W actions); a
weight-gradient action W(k, t) re-computes the partition's layers from the inputs B(k, t) kept and
then takes its weight time. Two machine models play them:
  independent devices (cores=None): each device runs its actions (those of all its partitions)
    one at a time in list order and has its own processor: right for separate accelerators;
  shared cores (cores=C): actions wait only for their edges, and all running actions share C cores:
    right for logical CPU devices of one process (see `_SimulateShared`).
Fed with measured times (see `profiling.PartitionTimes`) it predicts the step time, the bubble, each
device's idle time and a timeline for any K and M, e.g. K = 128 devices that are not at hand.
"""

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

from tensorpipe import schedule
from tensorpipe import schedule_builders

# The kinds of task a partition runs per micro-batch (profiling.CATEGORIES spells them the same);
# not schedule.FORWARD etc., which name the kinds of schedule action (F, B, W).
FORWARD_TASK, RECOMPUTE_TASK = 'forward', 'recompute'
BACKWARD_TASK, WEIGHT_TASK = 'backward', 'weight'
TASK_KINDS = (FORWARD_TASK, BACKWARD_TASK, RECOMPUTE_TASK, WEIGHT_TASK)


@dataclasses.dataclass
class TaskTimes:
  """The times of one partition's tasks (or one layer's, or one group's) for ONE micro-batch.

  forward, backward, recompute, weight: seconds the task takes given every core it can use (its
    span), as on a device of its own. `backward` is the input-gradient part of a backward pass and
    `weight` its weight-gradient part: together one B action, or a B and a W action in a schedule
    that splits them (see `schedule`); leave weight at 0 where backward holds both.
  *_parallelism: the mean number of the task's ops that run at once (its work / span, at least 1),
    so its work is seconds x parallelism core-seconds. Only the shared-core model reads them.
  """
  forward: float
  backward: float
  recompute: float = 0.0
  forward_parallelism: float = 1.0
  backward_parallelism: float = 1.0
  recompute_parallelism: float = 1.0
  weight: float = 0.0
  weight_parallelism: float = 1.0

  def Work(self, kind: str) -> float:
    """Core-seconds of task `kind` (one of TASK_KINDS)."""
    return getattr(self, kind) * self.Parallelism(kind)

  def Parallelism(self, kind: str) -> float:
    """Ops of task `kind` running at once, on average."""
    return getattr(self, kind + '_parallelism')


@dataclasses.dataclass
class Interval:
  """One task on the timeline."""
  partition: int
  kind: str
  micro_batch: int
  start: float
  end: float
  device: int = -1  # The device that runs the partition (schedule.Schedule.DeviceOf).


@dataclasses.dataclass
class SimulatedStep:
  """A simulated step: its time, each device's busy time and the timeline of its tasks."""
  step_time: float
  busy: List[float]  # Per device (not partition): seconds with at least one of its tasks running.
  timeline: List[Interval]

  @property
  def idle(self) -> List[float]:
    return [self.step_time - b for b in self.busy]

  @property
  def idle_fraction(self) -> float:
    """Mean idle share of the devices (bubble plus imbalance)."""
    return sum(self.idle) / (len(self.busy) * self.step_time) if self.step_time else 0.0


def _IsNumber(value):
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _Check(costs, sched, transfer, cores):
  if not costs:
    raise ValueError('simulator: no partitions given')
  for k, c in enumerate(costs):
    for kind in TASK_KINDS:
      value = getattr(c, kind)
      if not _IsNumber(value) or value < 0:
        raise ValueError('simulator: partition %d has %s time %r; times must be non-negative '
                         'seconds' % (k, kind, value))
      value = c.Parallelism(kind)
      if not _IsNumber(value) or value < 1:
        raise ValueError('simulator: partition %d has %s_parallelism %r; it must be a number >= 1 '
                         '(ops running at once)' % (k, kind, value))
  if not _IsNumber(transfer) or transfer < 0:
    raise ValueError('simulator: transfer time must be non-negative, got %r' % (transfer,))
  if cores is not None and (not _IsNumber(cores) or cores <= 0):
    raise ValueError('simulator: cores must be a positive number (or None for independent '
                     'devices), got %r' % (cores,))
  if not isinstance(sched, schedule.Schedule):
    raise ValueError('simulator: expected a schedule.Schedule, got %r' % (sched,))
  if sched.num_partitions != len(costs):
    raise ValueError('simulator: %d partition costs for a schedule of %d partitions' %
                     (len(costs), sched.num_partitions))


# The phases of each task (schedule.Task), in order, as (kind, whether it is left out when its time
# is 0): a backward pass re-computes where the costs give a re-computation, and adds the weight
# gradients where the costs give them apart from the input gradient.
_PHASES = {
    schedule.Task.FORWARD: ((FORWARD_TASK, False),),
    schedule.Task.BACKWARD: ((RECOMPUTE_TASK, True), (BACKWARD_TASK, False), (WEIGHT_TASK, True)),
    schedule.Task.BACKWARD_FROM_KEPT: ((BACKWARD_TASK, False), (WEIGHT_TASK, True)),
    schedule.Task.INPUT_GRADIENT: ((RECOMPUTE_TASK, True), (BACKWARD_TASK, False)),
    schedule.Task.WEIGHT_GRADIENT: ((RECOMPUTE_TASK, True), (WEIGHT_TASK, False)),
}


def _Phases(action, cost, sched):
  """[(kind, seconds)] of one action, from its task's phases."""
  return [(kind, getattr(cost, kind)) for kind, optional in _PHASES[sched.Task(action)]
          if not optional or getattr(cost, kind)]


def Simulate(costs: Sequence[TaskTimes], sched: schedule.Schedule, transfer: float = 0.0,
             cores: Optional[float] = None) -> SimulatedStep:
  """Simulates one step of `sched` with the given per-partition costs.

  Args:
    costs: a TaskTimes per partition (per micro-batch); with several partitions per device (see
      `schedule.Schedule.DeviceOf`), one per partition, not per device.
    sched: a schedule.Schedule of len(costs) partitions, e.g.
      schedule_builders.FillDrainSchedule(K, M, lag).
    transfer: seconds to move one micro-batch's boundary activation (or its gradient) between two
      devices: added on the edges that cross devices only (`schedule.Edge.crosses_devices`), not
      between two partitions of one device.
    cores: None: independent devices, each running one action at a time. A number C: the devices
      share C cores and run whatever the edges let run (see `_SimulateShared`).

  Returns:
    A SimulatedStep, its `busy` per device; its timeline has one interval per forward action and one
    per phase of a backward or weight-gradient action (RECOMPUTE_TASK, then BACKWARD_TASK and/or
    WEIGHT_TASK), each naming the action's partition.
  """
  _Check(costs, sched, transfer, cores)
  if cores is not None:
    return _SimulateShared(costs, sched, transfer, cores)
  free = [0.0] * sched.num_devices
  busy = [0.0] * sched.num_devices
  end: Dict[schedule.Action, float] = {}
  timeline = []
  for action in sched.BuildOrder():
    k = action.partition
    d = sched.DeviceOf(k)
    start = max([free[d]] + [end[e.before] + (transfer if e.crosses_devices else 0.0)
                             for e in sched.Waits(action)])
    for kind, seconds in _Phases(action, costs[k], sched):
      timeline.append(Interval(k, kind, action.micro_batch, start, start + seconds, d))
      start += seconds
      busy[d] += seconds
    end[action] = free[d] = start
  return SimulatedStep(max(i.end for i in timeline), busy, timeline)


def LowerBound(costs: Sequence[TaskTimes], sched: schedule.Schedule,
               cores: Optional[float] = None) -> float:
  """A time that Simulate(costs, sched, transfer, cores) never returns less than, for any transfer,
  found without playing the schedule (what a search needs to skip configurations that cannot win).

  Independent devices run their actions one at a time, so the step lasts at least the busiest
  device's summed action phases. Shared cores run at most `cores` ops at once and no phase faster
  than its span, so the step lasts at least all phases' work over the cores, and at least the
  longest action's span.
  """
  _Check(costs, sched, 0.0, cores)
  busy = [0.0] * sched.num_devices
  work = longest = 0.0
  for d, actions in enumerate(sched.device_actions):
    for action in actions:
      cost = costs[action.partition]
      phases = _Phases(action, cost, sched)
      span = sum(seconds for _, seconds in phases)
      busy[d] += span
      work += sum(seconds * cost.Parallelism(kind) for kind, seconds in phases)
      longest = max(longest, span)
  if cores is None:
    return max(busy)
  return max(work / cores, longest)


def SimulateFillDrain(costs: Sequence[TaskTimes], num_micro_batches: int,
                      cores: Optional[float] = None, forward_overlap: bool = True) -> SimulatedStep:
  """Simulate of TensorPipeLayer's default schedule: fill-drain, with forward_overlap (lag 2)."""
  sched = schedule_builders.FillDrainSchedule(len(costs), num_micro_batches,
                                              2 if forward_overlap else 1)
  return Simulate(costs, sched, cores=cores)


def _SimulateShared(costs, sched, transfer, cores):
  """The shared-core model: event-driven processor sharing of `cores` among the running actions.

  An action starts once the actions its edges name have ended, plus `transfer` for an edge between
  devices. A phase of parallelism p counts as p ops: the cores are shared equally among the ops of
  all running phases, at most one core each, so with n ops running each gets min(1, C / n) of a
  core and a phase progresses at p x that. That is how a thread pool serves ready ops (each op uses
  one thread with intra_op_parallelism_threads=1). With C >= K, parallelism 1 and a schedule whose
  edges keep each device on one action at a time, it is the independent model.
  """
  waits = {a: sched.Waits(a) for a in sched.BuildOrder()}
  waiting_on = {a: len(w) for a, w in waits.items()}
  successors: Dict[schedule.Action, List[schedule.Action]] = {a: [] for a in waits}
  for a, w in waits.items():
    for edge in w:
      successors[edge.before].append(a)
  ready_at = {a: 0.0 for a, n in waiting_on.items() if n == 0}
  phases: Dict[schedule.Action, List[Tuple[str, float]]] = {}  # Its (kind, seconds) still to run.
  remaining: Dict[schedule.Action, float] = {}
  phase_start: Dict[schedule.Action, float] = {}
  end: Dict[schedule.Action, float] = {}
  timeline: List[Interval] = []
  parallelism: Dict[schedule.Action, float] = {}  # Of each running action's current phase.
  now = 0.0

  def Parallelism(action):
    return parallelism[action]

  def Begin(action):
    while phases[action] and phases[action][0][1] <= 0.0:
      kind, _ = phases[action].pop(0)
      timeline.append(Interval(action.partition, kind, action.micro_batch, now, now,
                               sched.DeviceOf(action.partition)))
    if phases[action]:
      kind, seconds = phases[action][0]
      parallelism[action] = costs[action.partition].Parallelism(kind)
      remaining[action] = seconds * parallelism[action]
      phase_start[action] = now
    else:
      Finish(action)

  def Finish(action):
    end[action] = now
    for after in successors[action]:
      waiting_on[after] -= 1
      if not waiting_on[after]:
        ready_at[after] = max(end[e.before] + (transfer if e.crosses_devices else 0.0)
                              for e in waits[after])

  def EndPhase(action):
    kind, _ = phases[action].pop(0)
    timeline.append(Interval(action.partition, kind, action.micro_batch, phase_start[action], now,
                             sched.DeviceOf(action.partition)))
    del remaining[action]
    Begin(action)

  while ready_at or remaining:
    for action in [a for a, at in ready_at.items() if at <= now]:
      del ready_at[action]
      phases[action] = list(_Phases(action, costs[action.partition], sched))
      Begin(action)
    for action in [a for a, w in remaining.items() if w <= 0.0]:
      EndPhase(action)
    if any(at <= now for at in ready_at.values()):
      continue  # Zero-work actions released others at this instant.
    if not remaining:
      if ready_at:
        now = min(ready_at.values())
      continue
    ops = sum(Parallelism(a) for a in remaining)
    share = min(1.0, cores / ops)
    rate = {a: Parallelism(a) * share for a in remaining}
    finish_in = {a: remaining[a] / rate[a] for a in remaining}
    step = min(finish_in.values())
    if ready_at:
      step = min(step, min(ready_at.values()) - now)
    now += step
    for a in list(remaining):
      if finish_in[a] <= step * (1 + 1e-9):
        remaining[a] = 0.0
        EndPhase(a)
      else:
        remaining[a] -= rate[a] * step
  timeline.sort(key=lambda i: (i.start, i.partition))
  busy = [UnionLength([(i.start, i.end) for i in timeline if sched.DeviceOf(i.partition) == d])
          for d in range(sched.num_devices)]
  return SimulatedStep(max(end.values()), busy, timeline)


def SplitCosts(layer_costs: Sequence[TaskTimes], sizes: Sequence[int], num_micro_batches: int,
               overhead: float = 0.0) -> List[TaskTimes]:
  """Per-partition TaskTimes for M micro-batches from per-layer costs of the whole mini-batch.

  Each layer's time and work are taken to scale with its share of the batch, plus a fixed `overhead`
  seconds per task (op launch costs that do not shrink with the micro-batch; one core's worth). A
  partition's layers run one after another, so its span is the sum of theirs and its parallelism is
  its summed work over its summed span.

  Args:
    layer_costs: a TaskTimes per layer, for the whole mini-batch.
    sizes: the partition sizes (layers per partition).
    num_micro_batches: M.
    overhead: seconds added to every task.
  """
  if sum(sizes) != len(layer_costs):
    raise ValueError('simulator: partition sizes %s do not add up to %d layers' %
                     (sizes, len(layer_costs)))
  out, start = [], 0
  for size in sizes:
    partition = layer_costs[start:start + size]
    start += size
    fields = {}
    for kind in TASK_KINDS:
      if kind in (RECOMPUTE_TASK, WEIGHT_TASK) and not any(getattr(c, kind) for c in partition):
        continue
      span = sum(getattr(c, kind) for c in partition) / num_micro_batches + overhead
      work = sum(c.Work(kind) for c in partition) / num_micro_batches + overhead
      fields[kind] = span
      fields[kind + '_parallelism'] = max(1.0, work / span) if span else 1.0
    out.append(TaskTimes(fields[FORWARD_TASK], fields[BACKWARD_TASK], **{
        name: value for name, value in fields.items()
        if name not in (FORWARD_TASK, BACKWARD_TASK)}))
  return out


def MergeSpans(spans: Sequence[Tuple[float, float]]) -> List[Tuple[float, float]]:
  """The union of (start, end) spans as disjoint spans in time order (touching spans join)."""
  merged: List[List[float]] = []
  for start, end in sorted(spans):
    if merged and start <= merged[-1][1]:
      merged[-1][1] = max(merged[-1][1], end)
    else:
      merged.append([start, end])
  return [(start, end) for start, end in merged]


def UnionLength(spans: Sequence[Tuple[float, float]]) -> float:
  """Total length of the union of (start, end) spans (busy time of overlapping tasks or ops)."""
  return float(sum(end - start for start, end in MergeSpans(spans)))
