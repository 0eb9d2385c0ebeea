"""Pipeline schedules as plain data (no TensorFlow): the actions of a training step, each device's
ordered list of them, the edges between them, and the checks that make a schedule runnable.

An action is a forward pass F(k, t) of partition k on micro-batch t, its backward pass B(k, t), or,
where backward passes are split, its weight-gradient pass W(k, t). An edge says one action runs
after another, by a numbered `Rule`. TensorPipeLayer builds one op per action and turns every edge
into a control dependency (`executor`); `simulator` plays the lists with measured costs; `DryRun`
and `Render` play them with unit costs, one action per device per tick. The builders of the named
schedules are in `schedule_builders`.

docs/design.md, "Schedules as action lists" and "The ordering rules and why", draws each schedule
and gives every rule's reason (memory, determinism, deadlock).
"""

import dataclasses
import enum
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

FORWARD = 'F'
BACKWARD = 'B'
WEIGHT = 'W'

RECOMPUTE_MODES = ('always', 'except_last', 'never', 'selective')


class Rule(enum.IntEnum):
  """An ordering rule: its number (docs/design.md lists them) and `text`,
  its one line. Code that adds or relies on an edge names its rule."""
  text: str

  def __new__(cls, number: int, text: str) -> 'Rule':
    rule = int.__new__(cls, number)
    rule._value_ = number
    rule.text = text
    return rule

  FORWARD_INPUT = 1, 'F(k, t) after F(k-1, t): its input is that output'
  FORWARD_ORDER = 2, 'F(k, t) after F(k, t - lag): forward passes in micro-batch order on a device'
  LOSS_OF_EVERY_OUTPUT = 3, 'B(K-1, M-1) after every F(K-1, u): the loss needs every output'
  BACKWARD_INPUT = 4, 'B(k, t) after B(k+1, t): its output gradient is that input gradient'
  SUM_IN_REVERSE = 5, 'B(k, t) after B(k, t+1): it adds to that running weight-gradient sum'
  PER_EXAMPLE_LOSS = 6, 'B(K-1, t) after F(K-1, t): a per-example loss needs only that output'
  SUM_IN_ORDER = 7, 'B(k, t) after B(k, t-1): it adds to that running weight-gradient sum'
  IN_FLIGHT = 8, ('F(k, t + K - k) after B(k, t): at most K - k micro-batches in flight on '
                  'device k')
  INPUT_GRADIENT_ORDER = 9, ('B(k, t) after B(k, t-1): input gradients in micro-batch order on a '
                            'device')
  WEIGHT_READS_KEPT = 10, ('W(k, t) after B(k, t): it reads the layer inputs and output gradients '
                           'B(k, t) kept')
  WEIGHT_SUM_ORDER = 11, 'W(k, t) after W(k, t-1): it adds to that running weight-gradient sum'
  INPUT_GRADIENTS_FIRST = 12, ("W(k, t) after B(k, t + k): a device's input gradients, on the "
                               'critical path, go first')
  AWAITING_WEIGHTS = 13, ('B(k, t + k + 1) after W(k, t): at most k + 1 micro-batches wait for '
                          'weight gradients')
  IN_FLIGHT_ON_DEVICE = 14, "a device's (n + F)-th F after its n-th B: at most F in flight on it"
  INPUT_GRADIENTS_FIRST_ON_DEVICE = 15, 'W after the B listed last before it: input gradients first'
  AWAITING_WEIGHTS_ON_DEVICE = 16, "a device's (n + A)-th B after its n-th W: at most A await W"

class Task(enum.Enum):
  """What an action computes, and so which of its partition's functions it calls: the forward
  pass; a backward pass that re-computes the partition; a backward pass from the activations its
  forward pass kept (no re-computation); the input-gradient half and the weight-gradient half of a
  split backward pass."""
  FORWARD = 'forward'
  BACKWARD = 'backward'
  BACKWARD_FROM_KEPT = 'backward_from_kept'
  INPUT_GRADIENT = 'input_gradient'
  WEIGHT_GRADIENT = 'weight_gradient'


@dataclasses.dataclass(frozen=True, order=True)
class Action:
  """One task: `kind` (FORWARD, BACKWARD or WEIGHT) of `partition` on micro-batch `micro_batch`."""
  kind: str
  partition: int
  micro_batch: int
  # The hash of the fields, computed once: actions key the dicts of the dry run and the simulator,
  # which look them up millions of times in a planner's search.
  _hash: int = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    object.__setattr__(self, '_hash', hash((self.kind, self.partition, self.micro_batch)))

  def __hash__(self):
    return self._hash

  def __str__(self):
    return '%s%d,%d' % (self.kind, self.partition, self.micro_batch)


@dataclasses.dataclass(frozen=True)
class Edge:
  """`after` runs once `before` is done, by rule `rule`.

  `devices` is (the device of `before`, the device of `after`); a Schedule fills it in from its
  placement (`Schedule.DeviceOf`). Without it each partition is taken to have a device of its own.
  """
  before: Action
  after: Action
  rule: Rule
  devices: Optional[Tuple[int, int]] = dataclasses.field(default=None, compare=False)

  @property
  def crosses_devices(self) -> bool:
    """Whether the edge joins two devices (rules 1 and 4 where the two partitions are on different
    devices): a transfer, for the simulator."""
    if self.devices is None:
      return self.before.partition != self.after.partition
    return self.devices[0] != self.devices[1]


def CheckRecompute(what: str, recompute: str, splits_backward: bool) -> None:
  """Refuses a re-computation mode the schedule `what` names cannot run.

  A schedule that splits backward passes needs 'always': its weight-gradient tasks work from what
  its input-gradient task kept of a re-computation (the inputs of the ops that read weights, or of
  layers re-run).
  """
  if recompute not in RECOMPUTE_MODES:
    raise ValueError('recompute=%r is not one of %s' % (recompute, RECOMPUTE_MODES))
  if splits_backward and recompute != 'always':
    raise ValueError(
        "%s needs recompute='always', got recompute=%r: its weight-gradient tasks work from "
        "what its input-gradient task kept of a re-computation. Use recompute='always', or "
        "schedule='1f1b' to keep activations" % (what, recompute))


def CheckCounts(**counts: Any) -> None:
  """Raises ValueError, naming it, for the first of `counts` (name=value, in order) that is not a
  positive integer: the sizes every builder and formula takes (partitions, devices, micro-batches).
  """
  for name, value in counts.items():
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError('%s must be a positive integer, got %r' % (name, value))


class Schedule:
  """Per-device ordered action lists and the edges between actions, checked to be consistent.

  Each partition (a chunk of the layer list, with its own functions) runs on one device; by
  default partition k on device k. With virtual stages a device holds several partitions, e.g.
  device k the partitions k, k + D, k + 2D, ... of interleaved 1F1B on D devices.

  Args:
    num_partitions: the number of partitions (chunks) the actions index.
    num_micro_batches: M.
    device_actions: a list per device; list d holds the actions of device d's partitions, in the
      order device d runs them.
    edges: Edges between those actions.
    name: a short name for messages.
    recompute: which backward passes re-compute their partition, one of RECOMPUTE_MODES: 'always',
      'except_last' (not the last micro-batch's), 'never', or 'selective' (every one, re-running
      only the ops whose outputs the forward pass did not keep; see `selective_recompute`).
    partition_devices: per partition, the index of its device (default: partition k on device k);
      every device in [0, max + 1) holds at least one partition.
    forward_only: the schedule has forward actions only (a decode step,
      `schedule_builders.DecodeSchedule`): no backward action is expected.

  Raises:
    ValueError: if an action is missing, repeated or on the wrong device, if an edge names an action
      not in the lists, if the edges and device orders form a cycle (the step could never end), or
      if the schedule splits backward passes and `recompute` is not 'always'.
  """

  def __init__(self, num_partitions: int, num_micro_batches: int,
               device_actions: Sequence[Sequence[Action]], edges: Sequence[Edge], name: str,
               recompute: str = 'always', partition_devices: Optional[Sequence[int]] = None,
               forward_only: bool = False):
    CheckCounts(num_partitions=num_partitions, num_micro_batches=num_micro_batches)
    self.num_partitions = num_partitions
    self.num_micro_batches = num_micro_batches
    self.name = name
    self.recompute = recompute
    self.forward_only = forward_only
    self._devices = self._Placement(partition_devices)
    self.num_devices = max(self._devices) + 1
    self._device_actions = [list(actions) for actions in device_actions]
    # Read for every action by Task (the simulator asks per action): computed once.
    self._splits_backward = any(a.kind == WEIGHT for actions in self._device_actions
                                for a in actions)
    self._edges = [dataclasses.replace(e, devices=(self._DeviceOfAction(e.before),
                                                   self._DeviceOfAction(e.after))) for e in edges]
    self._waits: Dict[Action, List[Edge]] = {}
    self._Check()

  def _Placement(self, partition_devices):
    if partition_devices is None:
      return list(range(self.num_partitions))
    devices = list(partition_devices)
    if len(devices) != self.num_partitions or any(
        not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in devices):
      raise ValueError('%s: partition_devices must give a device index >= 0 for each of the %d '
                       'partitions, got %r' % (self.name, self.num_partitions, partition_devices))
    idle = sorted(set(range(max(devices) + 1)) - set(devices))
    if idle:
      raise ValueError('%s: partition_devices %r leaves device(s) %s without a partition' %
                       (self.name, devices, idle))
    return devices

  def _DeviceOfAction(self, action):
    # An unknown partition is reported by _Check, which names the edge.
    if 0 <= action.partition < self.num_partitions:
      return self._devices[action.partition]
    return -1

  def DeviceOf(self, partition: int) -> int:
    """The device that runs partition `partition`."""
    if not isinstance(partition, int) or not 0 <= partition < self.num_partitions:
      raise ValueError('partition %r is not in [0, %d)' % (partition, self.num_partitions))
    return self._devices[partition]

  @property
  def partition_devices(self) -> List[int]:
    """Per partition, its device: what TensorPipeLayer places partition k's calls on."""
    return list(self._devices)

  def DevicePartitions(self, device: int) -> List[int]:
    """The partitions device `device` holds, in increasing order."""
    return [k for k, d in enumerate(self._devices) if d == device]

  def _Check(self):
    if len(self._device_actions) != self.num_devices:
      raise ValueError('%s: %d device lists for %d devices' %
                       (self.name, len(self._device_actions), self.num_devices))
    seen = set()
    for d, actions in enumerate(self._device_actions):
      for action in actions:
        if self._DeviceOfAction(action) != d:
          raise ValueError('%s: %s is in the list of device %d' % (self.name, action, d))
        if action in seen:
          raise ValueError('%s: %s appears twice' % (self.name, action))
        seen.add(action)
    if self.forward_only:
      kinds: Tuple[str, ...] = (FORWARD,)
    else:
      kinds = (FORWARD, BACKWARD) + ((WEIGHT,) if any(a.kind == WEIGHT for a in seen) else ())
    expected = {Action(kind, k, t) for kind in kinds
                for k in range(self.num_partitions) for t in range(self.num_micro_batches)}
    if seen != expected:
      if seen - expected:
        raise ValueError('%s: a forward-only schedule has other actions: %s' %
                         (self.name, ', '.join(str(a) for a in sorted(seen - expected))))
      raise ValueError('%s: actions missing: %s' %
                       (self.name, ', '.join(str(a) for a in sorted(expected - seen))))
    for edge in self._edges:
      for action in (edge.before, edge.after):
        if action not in seen:
          raise ValueError('%s: edge %s -> %s names an unknown action' %
                           (self.name, edge.before, edge.after))
      self._waits.setdefault(edge.after, []).append(edge)
    CheckRecompute('the %s schedule' % self.name, self.recompute, self.splits_backward)
    self._ticks = None
    self.DryRun()  # Raises on a cycle.

  def Recomputes(self, micro_batch: int) -> bool:
    """Whether micro-batch `micro_batch`'s backward passes re-compute their partitions."""
    return self.recompute in ('always', 'selective') or (
        self.recompute == 'except_last' and micro_batch < self.num_micro_batches - 1)

  def Task(self, action: Action) -> 'Task':
    """What `action` computes (see `Task`): one per action, the executor's dispatch key."""
    if action.kind == FORWARD:
      return Task.FORWARD
    if action.kind == WEIGHT:
      return Task.WEIGHT_GRADIENT
    if self.splits_backward:
      return Task.INPUT_GRADIENT
    return Task.BACKWARD if self.Recomputes(action.micro_batch) else Task.BACKWARD_FROM_KEPT

  @property
  def splits_backward(self) -> bool:
    """Whether backward passes are split into input-gradient (B) and weight-gradient (W) actions."""
    return self._splits_backward

  @property
  def device_actions(self) -> List[List[Action]]:
    """A list per device: the actions each device runs, in order."""
    return [list(actions) for actions in self._device_actions]

  def DeviceActions(self, partition: int) -> List[Action]:
    """The actions partition `partition` runs in one training step, in its device's order."""
    device = self.DeviceOf(partition)
    return [a for a in self._device_actions[device] if a.partition == partition]

  @property
  def edges(self) -> List[Edge]:
    """Every edge, each tagged with its rule."""
    return list(self._edges)

  def Waits(self, action: Action) -> List[Edge]:
    """The edges into `action`: what it runs after."""
    return list(self._waits.get(action, []))

  def DryRun(self) -> Dict[Action, int]:
    """{action: tick} with every action one tick long and one action per device at a time.

    A device takes its actions in list order; each starts once its device is free and every
    action it waits for has ended.

    Raises:
      ValueError: if no action can start (a cycle between edges and device orders).
    """
    if self._ticks is None:
      self._ticks = self._DryRun()
    return dict(self._ticks)

  def _DryRun(self) -> Dict[Action, int]:
    start: Dict[Action, int] = {}
    free, nxt = [0] * self.num_devices, [0] * self.num_devices
    remaining = sum(len(actions) for actions in self._device_actions)
    while remaining:
      progressed = False
      for k, actions in enumerate(self._device_actions):
        if nxt[k] == len(actions):
          continue
        action = actions[nxt[k]]
        befores = [e.before for e in self._waits.get(action, [])]
        if any(b not in start for b in befores):
          continue
        start[action] = max([free[k]] + [start[b] + 1 for b in befores])
        free[k] = start[action] + 1
        nxt[k] += 1
        remaining -= 1
        progressed = True
      if not progressed:
        stuck = [str(actions[nxt[k]]) for k, actions in enumerate(self._device_actions)
                 if nxt[k] < len(actions)]
        raise ValueError('%s: the schedule deadlocks; waiting: %s' % (self.name, ', '.join(stuck)))
    return start

  def BuildOrder(self, kinds: Optional[Sequence[str]] = None) -> List[Action]:
    """Every action (whose kind is in `kinds`, if given), each after the actions it waits for.

    The executor builds ops in this order, one kind at a time, so an edge's `before` op exists
    when its `after` op is built, except for an edge from a kind built later (rule 8: a backward
    action into a forward one), which the executor adds once that action is built.
    """
    ticks = self.DryRun()
    actions = sorted(ticks, key=lambda a: (ticks[a], a.partition))
    return [a for a in actions if kinds is None or a.kind in kinds]

  def Ticks(self) -> List[List[Action]]:
    """The dry run as ticks: tick c holds the actions that start at c (at most one per device), in
    device order."""
    ticks = self.DryRun()
    out: List[List[Action]] = [[] for _ in range(max(ticks.values()) + 1)]
    for action in sorted(ticks, key=lambda a: self._devices[a.partition]):
      out[ticks[action]].append(action)
    return out

  def BubbleFraction(self):
    """Idle share of the devices in the dry run (equal action costs)."""
    ticks = self.Ticks()
    return 1.0 - sum(len(tick) for tick in ticks) / float(self.num_devices * len(ticks))

  def _MostAtOnce(self, first_kind, last_kind, weights=None):
    """Per device: the most (partition, micro-batch) pairs of its partitions at one tick of the dry
    run between their `first_kind` action's tick and their `last_kind` action's tick, both
    included; with `weights` (per partition), the largest sum of their partitions' weights."""
    ticks = self.DryRun()
    weights = [1] * self.num_partitions if weights is None else list(weights)
    if len(weights) != self.num_partitions:
      raise ValueError('%s: %d weights for %d partitions' % (self.name, len(weights),
                                                             self.num_partitions))
    exact = all(isinstance(w, int) for w in weights)
    out: List[Any] = []
    for d in range(self.num_devices):
      spans = [(ticks[Action(first_kind, k, t)], ticks[Action(last_kind, k, t)], weights[k])
               for k in self.DevicePartitions(d) for t in range(self.num_micro_batches)
               if Action(last_kind, k, t) in ticks]
      if not spans:
        out.append(0)
        continue
      # At each tick a span starts at, the sum of the weights of the spans holding it, added in
      # the spans' order (a cumulative sum adds as Python's sum does: the same floats); numpy
      # rather than a loop over ticks x spans (the planner asks this for every configuration).
      first = np.array([a for a, _, _ in spans])
      last = np.array([b for _, b, _ in spans])
      values = np.array([w for _, _, w in spans], dtype=np.int64 if exact else np.float64)
      ticks_at = np.unique(first)[:, None]
      held = (first[None, :] <= ticks_at) & (ticks_at <= last[None, :])
      most = np.cumsum(np.where(held, values, 0), axis=1)[:, -1].max()
      out.append(int(most) if exact else float(most))
    return out

  def InFlight(self, weights: Optional[Sequence[float]] = None) -> List[float]:
    """Per device: the most micro-batches whose forward pass has run and whose backward pass has
    not ended, at once in the dry run; each holds its stashed boundary input (and, without
    re-computation, its activations). M on every device for fill-drain, K - k for 1F1B; with
    several partitions on a device, each of their micro-batches counts (a partition's share of the
    device's layers). With `weights` (per partition, e.g. the bytes a micro-batch of it holds):
    the largest weighted sum instead of the count."""
    return self._MostAtOnce(FORWARD, BACKWARD, weights)

  def AwaitingWeights(self, weights: Optional[Sequence[float]] = None) -> List[float]:
    """Per device: the most micro-batches between their input-gradient task B and their
    weight-gradient task W at once in the dry run (each holds what W reads); 0 without W tasks.
    `weights`: as for InFlight."""
    if not self.splits_backward:
      return [0] * self.num_devices
    return self._MostAtOnce(BACKWARD, WEIGHT, weights)

  def Render(self) -> str:
    """The dry run as a grid: a row per device, a column per tick, '.' where it idles.

    Each action reads kind, partition, micro-batch (F3,1: partition 3's forward pass of micro-batch
    1). Rows are labelled 'partition k' where each device holds one partition (partition k on
    device k), else 'device k'.
    """
    ticks = self.Ticks()
    width = max(len(str(a)) for tick in ticks for a in tick)
    label = 'partition' if self._devices == list(range(self.num_partitions)) else 'device'
    rows = []
    for d in range(self.num_devices):
      cells = []
      for tick in ticks:
        mine = [str(a) for a in tick if self._devices[a.partition] == d]
        cells.append((mine[0] if mine else '.').ljust(width))
      rows.append('%s %d | %s' % (label, d, ' '.join(cells)))
    return '\n'.join(rows)
