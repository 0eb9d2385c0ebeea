"""Pipeline schedules as plain data (no TensorFlow): per-device lists of actions and their edges.

An action is one task of a training step: forward F(k, t) runs partition k on micro-batch t;
backward B(k, t) re-computes partition k from its saved boundary input (or, without re-computation,
reads what the forward pass kept) and returns the input gradient and the partition's weight
gradients, or, in a schedule that splits backward passes, only the input gradient, leaving the
weight gradients to a later weight-gradient action W(k, t). Each device (partition) has an ordered
list of actions, and each edge says that one action runs after another, by a numbered rule.
TensorPipeLayer builds one op per action and turns every edge into a control dependency (see
`executor`); `simulator` plays the same lists with measured costs; `DryRun` and `Render` play them
with unit costs, one action per device per tick.

Why each rule exists (the memory, determinism and deadlock reasons) is in docs/design.md, "The
ordering rules and why"; `Rule` names each and gives it in one line.

GPipe's fill-drain for K = 2 partitions and M = 3 micro-batches
(`FillDrainSchedule(2, 3).Render()`):

  tick        | 0    1    2    3    4    5    6    7
  partition 0 | F0,0 F0,1 F0,2 .    .    B0,2 B0,1 B0,0
  partition 1 | .    F1,0 F1,1 F1,2 B1,2 B1,1 B1,0 .

The rules (`Rule` holds each, with its name, number and one line; the code cites them by name):
  1. FORWARD_INPUT: F(k, t) after F(k-1, t): its input is that output (data).
  2. FORWARD_ORDER: F(k, t) after F(k, t - lag) on the same device: a device runs its forward passes
     in micro-batch order; lag 2 lets two neighbouring micro-batches of a partition overlap, so a
     device whose neighbour is idle can use a second core (order).
  3. LOSS_OF_EVERY_OUTPUT: B(K-1, M-1) after every F(K-1, u): the loss over the whole mini-batch
     needs every micro-batch's output (data, through the loss).
  4. BACKWARD_INPUT: B(k, t) after B(k+1, t): its output gradient is that input gradient (data).
  5. SUM_IN_REVERSE: B(k, t) after B(k, t+1): it adds its weight gradients to that running sum, so a
     device runs its backward passes in reverse micro-batch order and holds one sum per weight
     (data).
Every device idles a fraction (K - 1) / (M + K - 1) of a step with equal costs (the bubble),
negligible once M >= 4K.

1F1B (`OneFOneBSchedule`, PipeDream-flush) keeps rules 1, 2 and 4 and replaces 3 and 5, for a
pipeline whose last layer returns per-example losses (so micro-batch t's loss gradient needs only
its own output). After a warm-up of K - k forward passes, device k alternates one backward and one
forward pass, so at most K - k micro-batches wait for their backward pass there (the stash is
O(K) micro-batches instead of M); same bubble, same gradients. For K = 2, M = 3:

  tick        | 0    1    2    3    4    5    6    7
  partition 0 | F0,0 F0,1 .    B0,0 F0,2 B0,1 .    B0,2
  partition 1 | .    F1,0 B1,0 F1,1 B1,1 F1,2 B1,2 .

  6. PER_EXAMPLE_LOSS: B(K-1, t) after F(K-1, t): a per-example loss needs only that micro-batch's
     output (data).
  7. SUM_IN_ORDER: B(k, t) after B(k, t-1): it adds to that running weight-gradient sum, so a device
     runs its backward passes in micro-batch order (data).
  8. IN_FLIGHT: F(k, t + K - k) after B(k, t): at most K - k micro-batches in flight on device k
     (order).

Zero-bubble (`ZeroBubbleSchedule`, ZB-H1 of Qi et al., "Zero Bubble Pipeline Parallelism") splits
each backward pass in two: B(k, t) computes only the input gradient, which the device before waits
for, and W(k, t) the weight gradients, which nothing waits for until the step ends. It keeps 1F1B's
forward passes and rules 1, 2, 4, 6 and 8; device k runs W(k, t) k micro-batches late, so the
last devices, which 1F1B leaves idle while the backward passes drain towards device 0, fill that
time with their W passes. With F, B and W of equal cost the bubble is (K - 1) / (3M + K - 1) for
M >= K: a third of 1F1B's. For K = 2, M = 3:

  tick        | 0    1    2    3    4    5    6    7    8    9
  partition 0 | F0,0 F0,1 .    B0,0 F0,2 W0,0 B0,1 W0,1 B0,2 W0,2
  partition 1 | .    F1,0 B1,0 F1,1 B1,1 F1,2 W1,0 B1,2 W1,1 W1,2

  9. INPUT_GRADIENT_ORDER: B(k, t) after B(k, t-1): input gradients in micro-batch order on a device
     (order).
  10. WEIGHT_READS_KEPT: W(k, t) after B(k, t): it reads the layer inputs and output gradients B(k,
      t) kept (data).
  11. WEIGHT_SUM_ORDER: W(k, t) after W(k, t-1): it adds to that running weight-gradient sum (data).
  12. INPUT_GRADIENTS_FIRST: W(k, t) after B(k, t + k): a device's input gradients, on the critical
      path, go first (order).
  13. AWAITING_WEIGHTS: B(k, t + k + 1) after W(k, t): at most k + 1 micro-batches wait for their
      weight gradients on device k, each holding its layers' inputs and output gradients (order).

Virtual stages put several partitions (chunks of the layer list) on each of K devices, so that a
device's idle time at the start and the end of a step shrinks with its partitions. An action still
names its partition, and each partition has its own functions; `Schedule.DeviceOf` maps partitions
to devices, each device has one list of the actions of all its partitions, and the dry run, the
grid, the bubble and the in-flight counts go per device. Rules 1 and 4 join partitions, which may
share a device (only edges between devices cost a transfer). They are in VIRTUAL_SCHEDULES;
`Build` makes any schedule by name (NAMES) for K devices and v partitions per device.

Interleaved 1F1B (`InterleavedOneFOneBSchedule`, Megatron-LM's, Narayanan et al. 2021): K v
partitions, device k holding partitions k, k + K, k + 2K, ...; each device's forward passes go
through its partitions K micro-batches at a time, after a warm-up of 2 (K - 1 - k) + (v - 1) K
forward passes it alternates one forward and one backward pass, and its backward passes go through
its partitions from the last. It keeps 1F1B's per-partition rules 1, 2, 4, 6 and 7 and bounds each
device's micro-batches in flight by rule 14; M must be a multiple of K. With equal costs each device
idles 2 (K - 1) ticks of 2 v M + 2 (K - 1): the bubble is (K - 1) / (v M) of the busy time, 1/v of
1F1B's, for v times as many transfers and more micro-batches in flight on the first devices. For
K = 2, v = 2, M = 2 (`InterleavedOneFOneBSchedule(2, 2, 2).Render()`):

  tick     | 0    1    2    3    4    5    6    7    8    9
  device 0 | F0,0 F0,1 F2,0 F2,1 .    B2,0 .    B2,1 B0,0 B0,1
  device 1 | .    F1,0 F1,1 F3,0 B3,0 F3,1 B3,1 B1,0 B1,1 .

ZB-V (`ZeroBubbleVSchedule`, Qi et al.; torch.distributed.pipelining's ScheduleZBVZeroBubble): 2K
partitions in a V, device k holding partitions k and 2K - 1 - k, so the last partition and its loss
are on device 0 with the first, backward passes split into B and W as in zero-bubble
(recompute='always'). It keeps rules 1, 2, 4, 6 and 9-11 per partition and bounds each device by
rules 14-16. With F, B and W of equal cost and M >= 2K - 1 each device is busy at every tick from
its first action (tick k) to its last: the only idle time is the ramp of one partition's forward
pass per device, and at most 2K micro-batches of a half-size partition are in flight on a device,
1F1B's memory on device 0. For K = 2, M = 2 (`ZeroBubbleVSchedule(2, 2).Render()`; M < 2K - 1 leaves
gaps):

  tick     | 0    1    2    3    4    5    6    7    8    9    10   11   12   13
  device 0 | F0,0 F0,1 .    F3,0 B3,0 W3,0 F3,1 B3,1 W3,1 B0,0 W0,0 .    B0,1 W0,1
  device 1 | .    F1,0 F2,0 F1,1 F2,1 B2,0 W2,0 B1,0 W1,0 B2,1 W2,1 B1,1 W1,1 .

A decode step (`DecodeSchedule`) has forward actions only, each partition k's ExtendStep on
micro-batch t with that micro-batch's states (see TensorPipeLayer.ExtendStep), and keeps rules 1
and 2, so partition k runs micro-batch t while partition k + 1 runs micro-batch t - 1. For K = 2,
M = 3 (`DecodeSchedule(2, 3).Render()`):

  tick        | 0    1    2    3
  partition 0 | F0,0 F0,1 F0,2 .
  partition 1 | .    F1,0 F1,1 F1,2

Rules 14-16 make the executor, which sees only edges, keep the bounds the device's list keeps
whatever order it picks among ready actions; each is read off the list:
  14. IN_FLIGHT_ON_DEVICE: a device's (n + F)-th forward action after its n-th backward action,
      where F is the most (partition, micro-batch) pairs in flight along its list: rule 8 for a
      device of several partitions (order).
  15. INPUT_GRADIENTS_FIRST_ON_DEVICE: W after the B its device lists last before it: input
      gradients are on the critical path (rule 12 for a device of several partitions; order).
  16. AWAITING_WEIGHTS_ON_DEVICE: a device's (n + A)-th B after its n-th W, where A is the most
      pairs awaiting their W along its list: each holds its layers' inputs and output gradients
      (rule 13 for a device of several partitions; order).
"""

import dataclasses
import enum
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

FORWARD = 'F'
BACKWARD = 'B'
WEIGHT = 'W'

RECOMPUTE_MODES = ('always', 'except_last', 'never', 'selective')


class Rule(enum.IntEnum):
  """An ordering rule: its number (the module docstring and docs/design.md list them) and `text`,
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


def _CheckSizes(num_partitions, num_micro_batches):
  for name, value in (('num_partitions', num_partitions), ('num_micro_batches', num_micro_batches)):
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
    forward_only: the schedule has forward actions only (a decode step, `DecodeSchedule`): no
      backward action is expected.

  Raises:
    ValueError: if an action is missing, repeated or on the wrong device, if an edge names an action
      not in the lists, if the edges and device orders form a cycle (the step could never end), or
      if the schedule splits backward passes and `recompute` is not 'always'.
  """

  def __init__(self, num_partitions: int, num_micro_batches: int,
               device_actions: Sequence[Sequence[Action]], edges: Sequence[Edge], name: str,
               recompute: str = 'always', partition_devices: Optional[Sequence[int]] = None,
               forward_only: bool = False):
    _CheckSizes(num_partitions, num_micro_batches)
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


def _CheckLag(forward_lag):
  if forward_lag not in (1, 2):
    raise ValueError('forward_lag must be 1 or 2, got %r' % (forward_lag,))


def _DataAndOrderEdges(k, t, num_partitions, forward_lag):
  """The edges into F(k, t) and B(k, t) that every schedule has: rules 1, 2 and 4."""
  edges = []
  if k:
    edges.append(Edge(Action(FORWARD, k - 1, t), Action(FORWARD, k, t), Rule.FORWARD_INPUT))
  if t >= forward_lag:
    edges.append(Edge(Action(FORWARD, k, t - forward_lag), Action(FORWARD, k, t),
                      Rule.FORWARD_ORDER))
  if k < num_partitions - 1:
    edges.append(Edge(Action(BACKWARD, k + 1, t), Action(BACKWARD, k, t), Rule.BACKWARD_INPUT))
  return edges


def FillDrainSchedule(num_partitions: int, num_micro_batches: int, forward_lag: int = 1,
                      recompute: str = 'always') -> Schedule:
  """GPipe's schedule: every forward pass, then every backward pass in reverse (rules 1-5).

  Args:
    num_partitions: K.
    num_micro_batches: M.
    forward_lag: rule 2's lag: 1 keeps a device on one forward pass at a time; 2 lets F(k, t) run
      beside F(k, t - 1).
    recompute: which backward passes re-compute (see Schedule).
  """
  _CheckSizes(num_partitions, num_micro_batches)
  _CheckLag(forward_lag)
  k_partitions, m = num_partitions, num_micro_batches
  f = lambda k, t: Action(FORWARD, k, t)
  b = lambda k, t: Action(BACKWARD, k, t)
  edges = []
  for k in range(k_partitions):
    for t in range(m):
      edges.extend(_DataAndOrderEdges(k, t, k_partitions, forward_lag))
      if t < m - 1:
        edges.append(Edge(b(k, t + 1), b(k, t), Rule.SUM_IN_REVERSE))
  edges.extend(Edge(f(k_partitions - 1, u), b(k_partitions - 1, m - 1), Rule.LOSS_OF_EVERY_OUTPUT)
               for u in range(m))
  device_actions = [[f(k, t) for t in range(m)] + [b(k, t) for t in reversed(range(m))]
                    for k in range(k_partitions)]
  return Schedule(k_partitions, m, device_actions, edges,
                  'fill-drain K=%d, M=%d' % (k_partitions, m), recompute)


def _Interleaved(num_partitions, num_micro_batches, forward_lag, split):
  """Device lists and edges of 1F1B (rules 1, 2, 4, 6-8) or, with `split`, of zero-bubble (rules 1,
  2, 4, 6 and 8-13)."""
  _CheckSizes(num_partitions, num_micro_batches)
  _CheckLag(forward_lag)
  k_partitions, m = num_partitions, num_micro_batches
  f = lambda k, t: Action(FORWARD, k, t)
  b = lambda k, t: Action(BACKWARD, k, t)
  w = lambda k, t: Action(WEIGHT, k, t)
  edges, device_actions = _PartitionEdges(k_partitions, m, forward_lag, split), []
  for k in range(k_partitions):
    in_flight = min(k_partitions - k, m)
    for t in range(m):
      if t + in_flight < m:
        edges.append(Edge(b(k, t), f(k, t + in_flight), Rule.IN_FLIGHT))
      if not split:
        continue
      if k and t + k < m:
        edges.append(Edge(b(k, t + k), w(k, t), Rule.INPUT_GRADIENTS_FIRST))
      if t + k + 1 < m:
        edges.append(Edge(w(k, t), b(k, t + k + 1), Rule.AWAITING_WEIGHTS))
    actions = [f(k, t) for t in range(in_flight)]
    for t in range(m):
      actions.append(b(k, t))
      if t + in_flight < m:
        actions.append(f(k, t + in_flight))
      if split and t >= k:
        actions.append(w(k, t - k))
    if split:
      actions.extend(w(k, t) for t in range(max(m - k, 0), m))
    device_actions.append(actions)
  return device_actions, edges


def OneFOneBSchedule(num_partitions: int, num_micro_batches: int, forward_lag: int = 1,
                     recompute: str = 'always') -> Schedule:
  """1F1B: a warm-up of K - k forward passes on device k, then one backward, one forward (rules 1,
  2, 4 and 6-8). Needs a pipeline whose output is per-example losses (see the module docstring).

  Args:
    num_partitions: K.
    num_micro_batches: M.
    forward_lag: rule 2's lag, as for FillDrainSchedule.
    recompute: as for FillDrainSchedule.
  """
  device_actions, edges = _Interleaved(num_partitions, num_micro_batches, forward_lag, split=False)
  return Schedule(num_partitions, num_micro_batches, device_actions, edges,
                  '1F1B K=%d, M=%d' % (num_partitions, num_micro_batches), recompute)


def ZeroBubbleSchedule(num_partitions: int, num_micro_batches: int, forward_lag: int = 1,
                       recompute: str = 'always') -> Schedule:
  """ZB-H1: 1F1B with each backward pass split into B (input gradient) and W (weight gradient), and
  device k's W passes k micro-batches late (rules 1, 2, 4, 6, 8-13; see the module docstring).

  Args:
    num_partitions: K.
    num_micro_batches: M.
    forward_lag: rule 2's lag, as for FillDrainSchedule.
    recompute: as for FillDrainSchedule.
  """
  device_actions, edges = _Interleaved(num_partitions, num_micro_batches, forward_lag, split=True)
  return Schedule(num_partitions, num_micro_batches, device_actions, edges,
                  'zero-bubble K=%d, M=%d' % (num_partitions, num_micro_batches), recompute)


def _CheckDevicesAndMicroBatches(num_devices, num_micro_batches):
  for name, value in (('num_devices', num_devices), ('num_micro_batches', num_micro_batches)):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError('%s must be a positive integer, got %r' % (name, value))


def _DeviceBoundEdges(actions):
  """Edges that hold a device to the bounds its list `actions` keeps, whatever order the executor
  picks among ready actions (rules 14-16): the n-th forward action after the (n - F)-th backward
  action, where F is the most micro-batches in flight along the list; each W after the B listed
  last before it; the n-th B after the (n - A)-th W, where A is the most awaiting weight gradients
  along the list."""
  position = {a: i for i, a in enumerate(actions)}
  of = {kind: [a for a in actions if a.kind == kind] for kind in (FORWARD, BACKWARD, WEIGHT)}

  def Peak(up, down):
    count = peak = 0
    for a in actions:
      count += (a.kind == up) - (a.kind == down)
      peak = max(peak, count)
    return peak

  edges: List[Edge] = []
  in_flight = Peak(FORWARD, BACKWARD)
  edges.extend(Edge(of[BACKWARD][n - in_flight], a, Rule.IN_FLIGHT_ON_DEVICE)
               for n, a in enumerate(of[FORWARD]) if n >= in_flight)
  if not of[WEIGHT]:
    return edges
  for w in of[WEIGHT]:
    last = max((b for b in of[BACKWARD] if position[b] < position[w]), key=lambda b: position[b])
    if last != Action(BACKWARD, w.partition, w.micro_batch):
      edges.append(Edge(last, w, Rule.INPUT_GRADIENTS_FIRST_ON_DEVICE))
  awaiting = Peak(BACKWARD, WEIGHT)
  edges.extend(Edge(of[WEIGHT][n - awaiting], b, Rule.AWAITING_WEIGHTS_ON_DEVICE)
               for n, b in enumerate(of[BACKWARD]) if n >= awaiting)
  return edges


def _PartitionEdges(num_partitions, num_micro_batches, forward_lag, split):
  """The edges of a 1F1B-like schedule that join partitions or order one partition's actions:
  rules 1, 2, 4 and 6, with 7 for joined backward passes or 9-11 for split ones. The bounds of a
  device (rule 8, 12, 13 or 14-16) are the schedule's own."""
  last, m = num_partitions - 1, num_micro_batches
  edges = [e for k in range(num_partitions) for t in range(m)
           for e in _DataAndOrderEdges(k, t, num_partitions, forward_lag)]
  edges.extend(Edge(Action(FORWARD, last, t), Action(BACKWARD, last, t), Rule.PER_EXAMPLE_LOSS)
               for t in range(m))
  kinds = ((BACKWARD, Rule.INPUT_GRADIENT_ORDER), (WEIGHT, Rule.WEIGHT_SUM_ORDER)) if split else (
      (BACKWARD, Rule.SUM_IN_ORDER),)
  for k in range(num_partitions):
    edges.extend(Edge(Action(kind, k, t - 1), Action(kind, k, t), rule)
                 for kind, rule in kinds for t in range(1, m))
    if split:
      edges.extend(Edge(Action(BACKWARD, k, t), Action(WEIGHT, k, t), Rule.WEIGHT_READS_KEPT)
                   for t in range(m))
  return edges


def InterleavedPartitionDevices(num_devices: int, virtual_stages: int) -> List[int]:
  """Interleaved placement: partition c on device c mod D (device k holds k, k + D, k + 2D, ...)."""
  return [c % num_devices for c in range(num_devices * virtual_stages)]


def VPartitionDevices(num_devices: int) -> List[int]:
  """V placement: device k holds partitions k and 2D - 1 - k (the layer list goes down the devices
  and back up, so the last partition, with the loss, is on device 0 with the first)."""
  return [min(c, 2 * num_devices - 1 - c) for c in range(2 * num_devices)]


def _InterleavedDeviceOrder(num_devices, num_micro_batches, virtual_stages, device):
  """Device `device`'s list in Megatron-LM's interleaved 1F1B: its forward passes go through its
  partitions D micro-batches at a time (partition j's micro-batches g D .. g D + D - 1, then
  partition j + 1's, ...), its backward passes the same way from its last partition; a warm-up of
  2 (D - 1 - device) + (v - 1) D forward passes, then one forward and one backward pass, then the
  remaining backward passes."""
  d, v = num_devices, virtual_stages
  total = v * num_micro_batches

  def Nth(n, kind):
    group, within = divmod(n, d * v)
    local = within // d if kind == FORWARD else v - 1 - within // d
    return Action(kind, device + local * d, group * d + within % d)

  warm_up = min(2 * (d - 1 - device) + (v - 1) * d, total)
  actions = [Nth(n, FORWARD) for n in range(warm_up)]
  for n in range(total - warm_up):
    actions.extend((Nth(warm_up + n, FORWARD), Nth(n, BACKWARD)))
  actions.extend(Nth(n, BACKWARD) for n in range(total - warm_up, total))
  return actions


def InterleavedOneFOneBSchedule(num_devices: int, num_micro_batches: int, virtual_stages: int,
                                forward_lag: int = 1, recompute: str = 'always') -> Schedule:
  """Megatron-LM's interleaved 1F1B (Narayanan et al. 2021): D x v partitions, device k holding
  partitions k, k + D, ...; rules 1, 2, 4, 6, 7 (per partition) and 14. Needs per-example losses,
  as 1F1B. With equal costs the bubble is (D - 1) / (v M) of the busy time, 1/v of 1F1B's.

  Args:
    num_devices: D.
    num_micro_batches: M, a multiple of D (the forward passes go through a device's partitions D
      micro-batches at a time).
    virtual_stages: v >= 2, the partitions per device.
    forward_lag: rule 2's lag, as for FillDrainSchedule.
    recompute: as for FillDrainSchedule.
  """
  _CheckDevicesAndMicroBatches(num_devices, num_micro_batches)
  _CheckLag(forward_lag)
  v, d, m = virtual_stages, num_devices, num_micro_batches
  if not isinstance(v, int) or isinstance(v, bool) or v < 2:
    raise ValueError("interleaved 1F1B needs virtual_stages >= 2 (partitions per device), got %r; "
                     "for one partition per device use schedule='1f1b'" % (v,))
  if m % d:
    below = max(m - m % d, d)
    raise ValueError('interleaved 1F1B needs num_micro_batches M a multiple of num_devices K, got '
                     'M=%d, K=%d: use M=%d or M=%d' % (m, d, below, below + d))
  CheckRecompute('interleaved 1F1B', recompute, splits_backward=False)
  device_actions = [_InterleavedDeviceOrder(d, m, v, k) for k in range(d)]
  edges = _PartitionEdges(d * v, m, forward_lag, split=False)
  for actions in device_actions:
    edges.extend(_DeviceBoundEdges(actions))
  return Schedule(d * v, m, device_actions, edges,
                  'interleaved 1F1B K=%d, v=%d, M=%d' % (d, v, m), recompute,
                  InterleavedPartitionDevices(d, v))


def _VDeviceOrder(num_devices, num_micro_batches, device):
  """Device `device`'s list in ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", section 6;
  as torch.distributed.pipelining's ScheduleZBVZeroBubble). With `down` = partition `device` and
  `up` = partition 2D - 1 - device:
    warm-up: 2 (D - device) - 1 forward passes of `down`, then `device` times F up, F down, then
      D - device times F up, B up, W up;
    steady state: F down (while micro-batches are left), B down, W down, F up, B up, W up, until
      every forward pass has run;
    cool-down: `device` times B down, B up; D - device times B down and the oldest W down; the
      remaining W up, then W down.
  The list is made for max(M, 2D - 1) micro-batches and keeps those below M.
  """
  d, m = num_devices, num_micro_batches
  down, up = device, 2 * d - 1 - device
  made = max(m, 2 * d - 1)
  nxt: Dict[Tuple[str, int], int] = {}  # (kind, partition) -> its next micro-batch
  actions = []

  def Add(kind, partition):
    t = nxt.get((kind, partition), 0)
    nxt[(kind, partition)] = t + 1
    actions.append(Action(kind, partition, t))

  def Count(kind, partition):
    return nxt.get((kind, partition), 0)

  for _ in range(2 * (d - device) - 1):
    Add(FORWARD, down)
  for _ in range(device):
    Add(FORWARD, up)
    Add(FORWARD, down)
  for _ in range(d - device):
    for kind in (FORWARD, BACKWARD, WEIGHT):
      Add(kind, up)
  while Count(FORWARD, down) < made or Count(FORWARD, up) < Count(FORWARD, down):
    if Count(FORWARD, down) < made:
      Add(FORWARD, down)
    for partition in (down, up):
      for kind in ((BACKWARD, WEIGHT) if partition == down else (FORWARD, BACKWARD, WEIGHT)):
        Add(kind, partition)
  for _ in range(device):
    Add(BACKWARD, down)
    Add(BACKWARD, up)
  for _ in range(d - device):
    Add(BACKWARD, down)
    Add(WEIGHT, down)
  for partition in (up, down):
    while Count(WEIGHT, partition) < made:
      Add(WEIGHT, partition)
  return [a for a in actions if a.micro_batch < m]


def ZeroBubbleVSchedule(num_devices: int, num_micro_batches: int, forward_lag: int = 1,
                        recompute: str = 'always') -> Schedule:
  """ZB-V (Qi et al.): 2D partitions in a V, device k holding partitions k and 2D - 1 - k, each
  backward pass split into B (input gradient) and W (weight gradients); rules 1, 2, 4, 6, 9-11 (per
  partition) and 14-16. Needs per-example losses and recompute='always' (W works from what B kept
  of a re-computation). With F, B and W of equal cost and M >= 2D - 1 every device is busy from its
  first action to its last.

  Args:
    num_devices: D.
    num_micro_batches: M.
    forward_lag: rule 2's lag, as for FillDrainSchedule.
    recompute: must be 'always'.
  """
  _CheckDevicesAndMicroBatches(num_devices, num_micro_batches)
  _CheckLag(forward_lag)
  d, m = num_devices, num_micro_batches
  CheckRecompute("the 'zbv' schedule", recompute, splits_backward=True)
  device_actions = [_VDeviceOrder(d, m, k) for k in range(d)]
  edges = _PartitionEdges(2 * d, m, forward_lag, split=True)
  for actions in device_actions:
    edges.extend(_DeviceBoundEdges(actions))
  return Schedule(2 * d, m, device_actions, edges, 'ZB-V K=%d, M=%d' % (d, m), recompute,
                  VPartitionDevices(d))


def DecodeSchedule(num_partitions: int, num_micro_batches: int, forward_lag: int = 1,
                   partition_devices: Optional[Sequence[int]] = None) -> Schedule:
  """One decode step: forward actions only, F(k, t) after F(k-1, t) and F(k, t - lag) (rules 1
  and 2), so partition k runs micro-batch t while partition k + 1 runs micro-batch t - 1.

  Each F(k, t) of a decode step is partition k's ExtendStep on micro-batch t, with that
  micro-batch's states (see TensorPipeLayer.ExtendStep). A device's list is in the order of the
  earliest tick each action can start at (k + t), so a device that holds several partitions
  (`partition_devices`, as the training schedule places them) goes down the pipeline's wave.

  Args:
    num_partitions: the partitions (K x virtual stages).
    num_micro_batches: M.
    forward_lag: rule 2's lag, as for FillDrainSchedule.
    partition_devices: per partition, its device (default: partition k on device k).
  """
  _CheckSizes(num_partitions, num_micro_batches)
  _CheckLag(forward_lag)
  edges = [e for k in range(num_partitions) for t in range(num_micro_batches)
           for e in _DataAndOrderEdges(k, t, num_partitions, forward_lag)
           if e.after.kind == FORWARD]
  devices = list(range(num_partitions)) if partition_devices is None else list(partition_devices)
  if len(devices) != num_partitions:
    raise ValueError('DecodeSchedule: partition_devices must give a device for each of the %d '
                     'partitions, got %r' % (num_partitions, partition_devices))
  actions = sorted((Action(FORWARD, k, t) for k in range(num_partitions)
                    for t in range(num_micro_batches)), key=lambda a: (a.partition + a.micro_batch,
                                                                       a.partition))
  device_actions = [[a for a in actions if devices[a.partition] == d]
                    for d in range(max(devices) + 1)]
  return Schedule(num_partitions, num_micro_batches, device_actions, edges,
                  'decode step K=%d, M=%d' % (num_partitions, num_micro_batches),
                  partition_devices=partition_devices, forward_only=True)


SCHEDULES: Dict[str, Callable[..., Schedule]] = {
    'gpipe': FillDrainSchedule, '1f1b': OneFOneBSchedule, 'zero_bubble': ZeroBubbleSchedule}

# Schedules with several partitions per device (virtual_stages >= 2), each built from (K devices,
# M, ...) and placing partition c on device `partition_devices[c]`.
VIRTUAL_SCHEDULES: Dict[str, Callable[..., Schedule]] = {
    'interleaved_1f1b': InterleavedOneFOneBSchedule, 'zbv': ZeroBubbleVSchedule}

# Every schedule TensorPipeLayer runs, by name.
NAMES = tuple(SCHEDULES) + tuple(VIRTUAL_SCHEDULES)


def CheckVirtualStages(name: str, virtual_stages: int) -> None:
  """Raises ValueError, naming the fix, unless schedule `name` runs `virtual_stages` partitions
  per device: one for SCHEDULES, two or more for 'interleaved_1f1b', exactly two for 'zbv'."""
  if name not in NAMES:
    raise ValueError('schedule=%r is not one of %s' % (name, NAMES))
  v = virtual_stages
  if not isinstance(v, int) or isinstance(v, bool) or v < 1:
    raise ValueError('virtual_stages must be a positive integer (partitions per device), got %r'
                     % (v,))
  if name in SCHEDULES and v != 1:
    raise ValueError("schedule=%r runs one partition per device, but virtual_stages=%d: use "
                     "schedule='interleaved_1f1b' (virtual_stages >= 2) or 'zbv' "
                     "(virtual_stages=2), or virtual_stages=1" % (name, v))
  if name == 'interleaved_1f1b' and v < 2:
    raise ValueError("schedule='interleaved_1f1b' needs virtual_stages >= 2 (partitions per "
                     "device), got %d; for one partition per device use schedule='1f1b'" % v)
  if name == 'zbv' and v != 2:
    raise ValueError("schedule='zbv' places two partitions per device in a V: set "
                     "virtual_stages=2, got %d" % v)


def LeastVirtualStages(name: str) -> int:
  """The fewest partitions per device schedule `name` runs: 1, or 2 for VIRTUAL_SCHEDULES."""
  CheckVirtualStages(name, 1 if name in SCHEDULES else 2)
  return 1 if name in SCHEDULES else 2


def SplitsBackward(name: str, virtual_stages: int = 1) -> bool:
  """Whether schedule `name` splits backward passes into B and W (then it needs recompute='always'),
  as its smallest schedule says."""
  return Build(name, 1, 1, virtual_stages).splits_backward


def PartitionDevices(name: str, num_devices: int, virtual_stages: int = 1) -> List[int]:
  """Per partition, its device under schedule `name` on `num_devices` devices: partition k on
  device k, or the interleaved or V placement of the virtual schedules."""
  CheckVirtualStages(name, virtual_stages)
  _CheckDevicesAndMicroBatches(num_devices, 1)
  if name == 'interleaved_1f1b':
    return InterleavedPartitionDevices(num_devices, virtual_stages)
  if name == 'zbv':
    return VPartitionDevices(num_devices)
  return list(range(num_devices))


def Build(name: str, num_devices: int, num_micro_batches: int, virtual_stages: int = 1,
          forward_lag: int = 1, recompute: str = 'always') -> Schedule:
  """Schedule `name` for K = `num_devices` devices holding `virtual_stages` partitions each (K v
  partitions, placed as `PartitionDevices` says) and M micro-batches; errors name the fix."""
  CheckVirtualStages(name, virtual_stages)
  if name in SCHEDULES:
    return SCHEDULES[name](num_devices, num_micro_batches, forward_lag, recompute)
  if name == 'zbv':
    return ZeroBubbleVSchedule(num_devices, num_micro_batches, forward_lag, recompute)
  return InterleavedOneFOneBSchedule(num_devices, num_micro_batches, virtual_stages, forward_lag,
                                     recompute)


def BubbleFraction(num_partitions, num_micro_batches):
  """(K - 1) / (M + K - 1): the idle share of each device in a fill-drain step with equal costs."""
  _CheckSizes(num_partitions, num_micro_batches)
  return (num_partitions - 1) / float(num_micro_batches + num_partitions - 1)


def ZeroBubbleFraction(num_partitions: int, num_micro_batches: int) -> float:
  """(K - 1) / (3M + K - 1): the idle share of each device in a ZB-H1 step with equal F, B and W.

  The formula holds for M >= K only: with fewer micro-batches the W passes cannot fill the warm-up.
  """
  _CheckSizes(num_partitions, num_micro_batches)
  if num_micro_batches < num_partitions:
    raise ValueError('ZeroBubbleFraction: the ZB-H1 formula needs M >= K, got M=%d, K=%d' %
                     (num_micro_batches, num_partitions))
  return (num_partitions - 1) / float(3 * num_micro_batches + num_partitions - 1)


def InterleavedBubbleFraction(num_devices: int, num_micro_batches: int,
                              virtual_stages: int) -> float:
  """(K - 1) / (v M + K - 1): the idle share of each device in an interleaved 1F1B step with equal
  costs (Narayanan et al.: a bubble of (K - 1) / (v M) of the busy time, 1/v of 1F1B's)."""
  _CheckSizes(num_devices, num_micro_batches)
  return (num_devices - 1) / float(virtual_stages * num_micro_batches + num_devices - 1)


def ZeroBubbleVFraction(num_devices: int, num_micro_batches: int) -> float:
  """(K - 1) / (6M + K - 1): the idle share of each device in a ZB-V step with equal F, B and W
  (each device runs 6M tasks of a half-size partition; only the ramp of one forward pass per
  device idles). Holds for M >= 2K - 1; with fewer micro-batches the V cannot fill."""
  _CheckSizes(num_devices, num_micro_batches)
  if num_micro_batches < 2 * num_devices - 1:
    raise ValueError('ZeroBubbleVFraction: the ZB-V formula needs M >= 2K - 1, got M=%d, K=%d' %
                     (num_micro_batches, num_devices))
  return (num_devices - 1) / float(6 * num_micro_batches + num_devices - 1)
