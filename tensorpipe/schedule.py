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
"""

import dataclasses
import enum
from typing import Callable, Dict, List, Optional, Sequence

FORWARD = 'F'
BACKWARD = 'B'
WEIGHT = 'W'

RECOMPUTE_MODES = ('always', 'except_last', 'never')


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

  def __str__(self):
    return '%s%d,%d' % (self.kind, self.partition, self.micro_batch)


@dataclasses.dataclass(frozen=True)
class Edge:
  """`after` runs once `before` is done, by rule `rule`."""
  before: Action
  after: Action
  rule: Rule

  @property
  def crosses_devices(self) -> bool:
    """Whether the edge joins two devices (rules 1 and 4): a transfer, for the simulator."""
    return self.before.partition != self.after.partition


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

  Args:
    num_partitions: K, one device per partition.
    num_micro_batches: M.
    device_actions: K lists; list k holds the actions partition k runs, in order.
    edges: Edges between those actions.
    name: a short name for messages.
    recompute: which backward passes re-compute their partition, one of RECOMPUTE_MODES: 'always',
      'except_last' (not the last micro-batch's) or 'never'.

  Raises:
    ValueError: if an action is missing, repeated or on the wrong device, if an edge names an action
      not in the lists, if the edges and device orders form a cycle (the step could never end), or
      if the schedule splits backward passes and `recompute` is not 'always'.
  """

  def __init__(self, num_partitions: int, num_micro_batches: int,
               device_actions: Sequence[Sequence[Action]], edges: Sequence[Edge], name: str,
               recompute: str = 'always'):
    _CheckSizes(num_partitions, num_micro_batches)
    self.num_partitions = num_partitions
    self.num_micro_batches = num_micro_batches
    self.name = name
    self.recompute = recompute
    self._device_actions = [list(actions) for actions in device_actions]
    self._edges = list(edges)
    self._waits: Dict[Action, List[Edge]] = {}
    self._Check()

  def _Check(self):
    if len(self._device_actions) != self.num_partitions:
      raise ValueError('%s: %d device lists for %d partitions' %
                       (self.name, len(self._device_actions), self.num_partitions))
    seen = set()
    for k, actions in enumerate(self._device_actions):
      for action in actions:
        if action.partition != k:
          raise ValueError('%s: %s is in the list of device %d' % (self.name, action, k))
        if action in seen:
          raise ValueError('%s: %s appears twice' % (self.name, action))
        seen.add(action)
    kinds = (FORWARD, BACKWARD) + ((WEIGHT,) if any(a.kind == WEIGHT for a in seen) else ())
    expected = {Action(kind, k, t) for kind in kinds
                for k in range(self.num_partitions) for t in range(self.num_micro_batches)}
    if seen != expected:
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
    return self.recompute == 'always' or (self.recompute == 'except_last' and
                                          micro_batch < self.num_micro_batches - 1)

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
    return any(a.kind == WEIGHT for actions in self._device_actions for a in actions)

  @property
  def device_actions(self) -> List[List[Action]]:
    """K lists: the actions each device runs, in order."""
    return [list(actions) for actions in self._device_actions]

  def DeviceActions(self, partition: int) -> List[Action]:
    """The actions partition `partition` runs in one training step, in order."""
    if not isinstance(partition, int) or not 0 <= partition < self.num_partitions:
      raise ValueError('partition %r is not in [0, %d)' % (partition, self.num_partitions))
    return list(self._device_actions[partition])

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
    free, nxt = [0] * self.num_partitions, [0] * self.num_partitions
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
    """The dry run as ticks: tick c holds the actions that start at c (at most one per device)."""
    ticks = self.DryRun()
    out: List[List[Action]] = [[] for _ in range(max(ticks.values()) + 1)]
    for action in sorted(ticks, key=lambda a: a.partition):
      out[ticks[action]].append(action)
    return out

  def BubbleFraction(self):
    """Idle share of the devices in the dry run (equal action costs)."""
    ticks = self.Ticks()
    return 1.0 - sum(len(tick) for tick in ticks) / float(self.num_partitions * len(ticks))

  def _MostAtOnce(self, first_kind, last_kind):
    """Per device: the most micro-batches at one tick of the dry run between their `first_kind`
    action's tick and their `last_kind` action's tick, both included."""
    ticks = self.DryRun()
    out = []
    for k in range(self.num_partitions):
      spans = [(ticks[Action(first_kind, k, t)], ticks[Action(last_kind, k, t)])
               for t in range(self.num_micro_batches) if Action(last_kind, k, t) in ticks]
      out.append(max((sum(1 for a, b in spans if a <= c <= b) for c in {a for a, _ in spans}),
                     default=0))
    return out

  def InFlight(self) -> List[int]:
    """Per device: the most micro-batches whose forward pass has run and whose backward pass has
    not ended, at once in the dry run; each holds its stashed boundary input (and, without
    re-computation, its activations). M on every device for fill-drain, K - k for 1F1B."""
    return self._MostAtOnce(FORWARD, BACKWARD)

  def AwaitingWeights(self) -> List[int]:
    """Per device: the most micro-batches between their input-gradient task B and their
    weight-gradient task W at once in the dry run (each holds what W reads); 0 without W tasks."""
    if not self.splits_backward:
      return [0] * self.num_partitions
    return self._MostAtOnce(BACKWARD, WEIGHT)

  def Render(self) -> str:
    """The dry run as a grid: a row per partition, a column per tick, '.' where it idles."""
    ticks = self.Ticks()
    width = max(len(str(a)) for tick in ticks for a in tick)
    rows = []
    for k in range(self.num_partitions):
      partitions = []
      for tick in ticks:
        mine = [str(a) for a in tick if a.partition == k]
        partitions.append((mine[0] if mine else '.').ljust(width))
      rows.append('partition %d | %s' % (k, ' '.join(partitions)))
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
  edges, device_actions = [], []
  for k in range(k_partitions):
    in_flight = min(k_partitions - k, m)
    for t in range(m):
      edges.extend(_DataAndOrderEdges(k, t, k_partitions, forward_lag))
      if k == k_partitions - 1:
        edges.append(Edge(f(k, t), b(k, t), Rule.PER_EXAMPLE_LOSS))
      if t + in_flight < m:
        edges.append(Edge(b(k, t), f(k, t + in_flight), Rule.IN_FLIGHT))
      if t:
        edges.append(Edge(b(k, t - 1), b(k, t),
                          Rule.INPUT_GRADIENT_ORDER if split else Rule.SUM_IN_ORDER))
      if not split:
        continue
      edges.append(Edge(b(k, t), w(k, t), Rule.WEIGHT_READS_KEPT))
      if t:
        edges.append(Edge(w(k, t - 1), w(k, t), Rule.WEIGHT_SUM_ORDER))
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


SCHEDULES: Dict[str, Callable[..., Schedule]] = {
    'gpipe': FillDrainSchedule, '1f1b': OneFOneBSchedule, 'zero_bubble': ZeroBubbleSchedule}


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
