"""The named pipeline schedules: their builders, `Build` by name through one table, the placement
of partitions on devices, and the bubble each schedule's formula predicts.

Each builder makes a `Schedule` (the action lists and edges, checked) for K partitions or
devices and M micro-batches: 'gpipe' (fill-drain), '1f1b', 'zero_bubble' (ZB-H1), and with several
partitions per device 'interleaved_1f1b' and 'zbv'; `DecodeSchedule` is a decode step's. What each
schedule is and why its edges exist is in docs/design.md, "Schedules as action lists".
"""

from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from tensorpipe.schedule import Action, BACKWARD, CheckCounts, CheckRecompute, Edge, FORWARD
from tensorpipe.schedule import Rule, Schedule, WEIGHT


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
    num_partitions: K, one partition per device.
    num_micro_batches: M.
    forward_lag: rule 2's lag: 1 keeps a device on one forward pass at a time; 2 lets F(k, t) run
      beside F(k, t - 1).
    recompute: which backward passes re-compute (see Schedule).
  """
  CheckCounts(num_partitions=num_partitions, num_micro_batches=num_micro_batches)
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


def _OneFOneB(num_partitions, num_micro_batches, forward_lag, recompute, split):
  """1F1B (rules 1, 2, 4, 6-8) or, with `split`, zero-bubble ZB-H1 (rules 1, 2, 4, 6 and 8-13): the
  same forward passes and warm-up of K - k on device k; `split` turns each backward pass into B and
  a weight-gradient pass W that device k runs k micro-batches late."""
  CheckCounts(num_partitions=num_partitions, num_micro_batches=num_micro_batches)
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
  name = '%s K=%d, M=%d' % ('zero-bubble' if split else '1F1B', k_partitions, m)
  return Schedule(k_partitions, m, device_actions, edges, name, recompute)


def OneFOneBSchedule(num_partitions: int, num_micro_batches: int, forward_lag: int = 1,
                     recompute: str = 'always') -> Schedule:
  """1F1B: a warm-up of K - k forward passes on device k, then one backward, one forward (rules 1,
  2, 4 and 6-8). Needs a pipeline whose output is per-example losses (docs/design.md).

  Args:
    num_partitions: K, one partition per device.
    num_micro_batches: M.
    forward_lag: rule 2's lag, as for FillDrainSchedule.
    recompute: as for FillDrainSchedule.
  """
  return _OneFOneB(num_partitions, num_micro_batches, forward_lag, recompute, split=False)


def ZeroBubbleSchedule(num_partitions: int, num_micro_batches: int, forward_lag: int = 1,
                       recompute: str = 'always') -> Schedule:
  """ZB-H1: 1F1B with each backward pass split into B (input gradient) and W (weight gradient), and
  device k's W passes k micro-batches late (rules 1, 2, 4, 6, 8-13; docs/design.md).

  Args: as for OneFOneBSchedule.
  """
  return _OneFOneB(num_partitions, num_micro_batches, forward_lag, recompute, split=True)


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


def _CheckSizes(num_devices, num_micro_batches):
  CheckCounts(num_devices=num_devices, num_micro_batches=num_micro_batches)


def _CheckInterleavedSizes(num_devices, num_micro_batches):
  """As _CheckSizes, and M a multiple of K: interleaved 1F1B's forward passes go through a
  device's partitions K micro-batches at a time."""
  _CheckSizes(num_devices, num_micro_batches)
  d, m = num_devices, num_micro_batches
  if m % d:
    below = max(m - m % d, d)
    raise ValueError('interleaved 1F1B needs num_micro_batches M a multiple of num_devices K, got '
                     'M=%d, K=%d: use M=%d or M=%d' % (m, d, below, below + d))


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
  _CheckInterleavedSizes(num_devices, num_micro_batches)
  _CheckLag(forward_lag)
  v, d, m = virtual_stages, num_devices, num_micro_batches
  if not isinstance(v, int) or isinstance(v, bool) or v < 2:
    raise ValueError("interleaved 1F1B needs virtual_stages >= 2 (partitions per device), got %r; "
                     "for one partition per device use schedule='1f1b'" % (v,))
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
  CheckCounts(num_devices=num_devices, num_micro_batches=num_micro_batches)
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
  CheckCounts(num_partitions=num_partitions, num_micro_batches=num_micro_batches)
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


def _OnePerDevice(num_devices, virtual_stages):
  del virtual_stages  # 1.
  return list(range(num_devices))


class Kind(NamedTuple):
  """A named schedule: `build` makes it from (K devices, M, v partitions per device, forward_lag,
  recompute); `virtual_stages` is the fewest partitions per device it runs; `check_sizes` raises
  where `build` would refuse (K devices, M); `place` gives each partition's device from (K, v)."""
  build: Callable[[int, int, int, int, str], Schedule]
  virtual_stages: int
  check_sizes: Callable[[int, int], None] = _CheckSizes
  place: Callable[[int, int], List[int]] = _OnePerDevice


# Every schedule TensorPipeLayer runs, by name: the one table `Build` dispatches through.
KINDS: Dict[str, Kind] = {
    'gpipe': Kind(lambda d, m, v, lag, recompute: FillDrainSchedule(d, m, lag, recompute), 1),
    '1f1b': Kind(lambda d, m, v, lag, recompute: OneFOneBSchedule(d, m, lag, recompute), 1),
    'zero_bubble': Kind(lambda d, m, v, lag, recompute: ZeroBubbleSchedule(d, m, lag, recompute),
                        1),
    'interleaved_1f1b': Kind(InterleavedOneFOneBSchedule, 2, _CheckInterleavedSizes,
                             InterleavedPartitionDevices),
    'zbv': Kind(lambda d, m, v, lag, recompute: ZeroBubbleVSchedule(d, m, lag, recompute), 2,
                place=lambda d, v: VPartitionDevices(d)),
}

NAMES = tuple(KINDS)
# The schedules with one partition per device, and those with several (virtual_stages >= 2), each
# placing partition c on device `PartitionDevices(...)[c]`.
SCHEDULES = tuple(n for n in NAMES if KINDS[n].virtual_stages == 1)
VIRTUAL_SCHEDULES = tuple(n for n in NAMES if KINDS[n].virtual_stages > 1)


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
  if name not in NAMES:
    raise ValueError('schedule=%r is not one of %s' % (name, NAMES))
  return KINDS[name].virtual_stages


def SplitsBackward(name: str, virtual_stages: int = 1) -> bool:
  """Whether schedule `name` splits backward passes into B and W (then it needs recompute='always'),
  as its smallest schedule says."""
  return Build(name, 1, 1, virtual_stages).splits_backward


def PartitionDevices(name: str, num_devices: int, virtual_stages: int = 1) -> List[int]:
  """Per partition, its device under schedule `name` on `num_devices` devices: partition k on
  device k, or the interleaved or V placement of the virtual schedules."""
  CheckVirtualStages(name, virtual_stages)
  CheckCounts(num_devices=num_devices)
  return KINDS[name].place(num_devices, virtual_stages)


def Check(name: str, num_devices: int, num_micro_batches: int, virtual_stages: int = 1,
          recompute: str = 'always') -> None:
  """Raises ValueError, naming the fix, where `Build` would refuse these arguments, without
  building the schedule: a planner asks it of every configuration it might try."""
  CheckVirtualStages(name, virtual_stages)
  KINDS[name].check_sizes(num_devices, num_micro_batches)
  CheckRecompute('the %r schedule' % name, recompute, SplitsBackward(name, virtual_stages))


def Build(name: str, num_devices: int, num_micro_batches: int, virtual_stages: int = 1,
          forward_lag: int = 1, recompute: str = 'always') -> Schedule:
  """Schedule `name` for K = `num_devices` devices holding `virtual_stages` partitions each (K v
  partitions, placed as `PartitionDevices` says) and M micro-batches; errors name the fix."""
  CheckVirtualStages(name, virtual_stages)
  return KINDS[name].build(num_devices, num_micro_batches, virtual_stages, forward_lag, recompute)


def FillDrainBubbleFraction(num_partitions: int, num_micro_batches: int) -> float:
  """(K - 1) / (M + K - 1): the idle share of each device in a fill-drain step with equal costs."""
  CheckCounts(num_partitions=num_partitions, num_micro_batches=num_micro_batches)
  return (num_partitions - 1) / float(num_micro_batches + num_partitions - 1)


def ZeroBubbleFraction(num_partitions: int, num_micro_batches: int) -> float:
  """(K - 1) / (3M + K - 1): the idle share of each device in a ZB-H1 step with equal F, B and W.

  The formula holds for M >= K only: with fewer micro-batches the W passes cannot fill the warm-up.
  """
  CheckCounts(num_partitions=num_partitions, num_micro_batches=num_micro_batches)
  if num_micro_batches < num_partitions:
    raise ValueError('ZeroBubbleFraction: the ZB-H1 formula needs M >= K, got M=%d, K=%d' %
                     (num_micro_batches, num_partitions))
  return (num_partitions - 1) / float(3 * num_micro_batches + num_partitions - 1)


def InterleavedBubbleFraction(num_devices: int, num_micro_batches: int,
                              virtual_stages: int) -> float:
  """(K - 1) / (v M + K - 1): the idle share of each device in an interleaved 1F1B step with equal
  costs (Narayanan et al.: a bubble of (K - 1) / (v M) of the busy time, 1/v of 1F1B's)."""
  CheckCounts(num_devices=num_devices, num_micro_batches=num_micro_batches)
  return (num_devices - 1) / float(virtual_stages * num_micro_batches + num_devices - 1)


def ZeroBubbleVFraction(num_devices: int, num_micro_batches: int) -> float:
  """(K - 1) / (6M + K - 1): the idle share of each device in a ZB-V step with equal F, B and W
  (each device runs 6M tasks of a half-size partition; only the ramp of one forward pass per
  device idles). Holds for M >= 2K - 1; with fewer micro-batches the V cannot fill."""
  CheckCounts(num_devices=num_devices, num_micro_batches=num_micro_batches)
  if num_micro_batches < 2 * num_devices - 1:
    raise ValueError('ZeroBubbleVFraction: the ZB-V formula needs M >= 2K - 1, got M=%d, K=%d' %
                     (num_micro_batches, num_devices))
  return (num_devices - 1) / float(6 * num_micro_batches + num_devices - 1)
