"""Planner: which data parallelism, K, M, schedule and re-computation to train a pipeline with.

Given a pipeline's layers, its mini-batch and N devices of a `device_profiles.DeviceProfile`,
`PlanPipeline` tries every configuration: S data-parallel replicas of K devices each (S x K <= N), M
micro-batches, schedule (any of schedule_builders.NAMES, with v partitions per device) and
re-computation mode that the schedule runs (`schedule_builders.Check`), and ranks them by predicted
step time (a `ranking.Ranking`), marking those whose fullest device would not fit the device
memory. It combines:
- `cost_model.Profiles`: each layer's forward flops, its ops, parameters and activation sizes for
  the mini-batch; a replica's share of the batch scales flops and activations linearly.
- task times: flops / the device's rate plus a launch cost per op and per partition call, or the
  layers' times measured on this machine's CPU devices (`device_profiles.MeasureLayerTimes`).
- `balancing.OptimalSplit`: K v partitions balanced by predicted time, every device within memory.
- `cost_model.MemoryCost`: per-device bytes, with the micro-batches each device holds at once as
  the schedule's own dry run counts them (`Schedule.InFlight`, `Schedule.AwaitingWeights`).
- `simulator.Simulate`: plays the schedule's action lists with those times; logical CPU devices
  share their cores (`DeviceProfile.cores`), accelerators are independent.
Data-parallel replicas add a ring all-reduce of the fullest device's gradients over the link.
With `exact`, only the configurations that can rank among the first rows are simulated (a lower
bound of the step time, simulator.LowerBound, rules out the rest). The search runs no TensorFlow:
the device profiles and measured times come in as numbers (see `device_profiles`).
"""

import dataclasses
import functools
import heapq
import inspect
import sys
from typing import Any, List, Optional, Sequence, Tuple

from tensorpipe import disk_cache
from tensorpipe.measure import device_profiles
from tensorpipe.measure import ranking
from tensorpipe.measure import simulator
from tensorpipe.partitioner import balancing
from tensorpipe.partitioner import cost_model
from tensorpipe import progress as progress_lib
from tensorpipe import schedule
from tensorpipe import schedule_builders
from tensorpipe import units

RECOMPUTE_MODES = schedule.RECOMPUTE_MODES
MICRO_BATCH_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)


def ScaledProfiles(profiles: Sequence[cost_model.LayerProfile], factor: float
                   ) -> List[cost_model.LayerProfile]:
  """The profiles for `factor` times the batch: flops and activation sizes scale (also what
  recompute='selective' keeps and does not re-compute), variables and op counts not."""
  return [dataclasses.replace(
      p, flops=p.flops * factor, in_elements=p.in_elements * factor,
      out_elements=p.out_elements * factor, activation_elements=p.activation_elements * factor,
      gradient_elements=p.gradient_elements * factor, kept_elements=p.kept_elements * factor,
      kept_flops=p.kept_flops * factor)
          for p in profiles]


def LayerSeconds(profiles: Sequence[cost_model.LayerProfile],
                 device: device_profiles.DeviceProfile, num_micro_batches: int,
                 layer_times: Optional[Sequence[device_profiles.LayerTime]] = None,
                 batch: Optional[float] = None) -> List[Tuple[float, float]]:
  """Per layer, for one micro-batch: (forward, backward) seconds.

  From flops: compute is flops / M / rate and a backward pass computes twice its forward flops (the
  input and the weight gradients), plus op counts x op_overhead, which do not shrink with M. From
  measured `layer_times` (for `batch` examples): fixed + per_example x batch / M, a third of it
  forward and two thirds backward.
  """
  m = num_micro_batches
  if layer_times is not None:
    if len(layer_times) != len(profiles):
      raise ValueError('planner: %d layer times for %d layers' % (len(layer_times), len(profiles)))
    if batch is None:
      raise ValueError('planner: measured layer_times need `batch`, the number of examples they '
                       'are for; got batch=None')
    totals = [t.fixed + t.per_example * batch / m for t in layer_times]
    return [(t / 3, 2 * t / 3) for t in totals]
  return [(p.flops / m / device.rate + p.forward_ops * device.op_overhead,
           2 * p.flops / m / device.rate + p.backward_ops * device.op_overhead) for p in profiles]


def PartitionTaskTimes(layer_seconds: Sequence[Tuple[float, float]], sizes: Sequence[int],
                       device: device_profiles.DeviceProfile, recompute: str,
                       num_micro_batches: int, splits_backward: bool,
                       backward_parallelism: float = 1.0, micro_batch_overhead: float = 0.0,
                       params: Optional[Sequence[float]] = None,
                       selective_shares: Optional[Sequence[float]] = None
                       ) -> List[simulator.TaskTimes]:
  """simulator.TaskTimes (one micro-batch) of the partitions of `sizes`.

  A forward task is its layers' forward seconds plus one call; a backward task re-computes the
  forward pass (with 'except_last', all but the last micro-batch: its mean share; with 'selective',
  each layer's `selective_shares` of it, cost_model.SelectiveShare: all without them), then takes
  its layers' backward seconds (work) plus a call, its ops `backward_parallelism` at a time. Where
  the schedule splits backward passes, the input-gradient and weight-gradient tasks each take half
  of that, each with its call. Each micro-batch after the first costs the pipeline
  `micro_batch_overhead` more (measured by trainer.model_plan.MeasureMicroBatchSeconds): mostly the
  addition of its weight gradients, so each partition's backward tasks take the share of it that the
  partition's parameters (`params`, per layer) are of all, (M - 1) / M of it per micro-batch.
  """
  out, start = [], 0
  m = num_micro_batches
  total = float(sum(params)) if params else 0.0
  share = {'always': 1.0, 'except_last': (m - 1.0) / m, 'never': 0.0, 'selective': 1.0}[recompute]
  par = backward_parallelism
  for size in sizes:
    layers = layer_seconds[start:start + size]
    start += size
    forward = sum(f for f, _ in layers)
    backward = sum(b for _, b in layers)
    recomputed = share * forward
    if recompute == 'selective' and selective_shares is not None:
      recomputed = sum(f * s for (f, _), s in zip(layers, selective_shares[start - size:start]))
    if micro_batch_overhead and m > 1:
      share_of_params = (sum(params[start - size:start]) / total if params and total else
                         float(size) / len(layer_seconds))
      backward += micro_batch_overhead * share_of_params * (m - 1.0) / m
    if splits_backward:
      half = backward / 2 / par + device.call_overhead
      out.append(simulator.TaskTimes(
          forward + device.call_overhead, half, recomputed, backward_parallelism=par,
          weight=half, weight_parallelism=par))
    else:
      out.append(simulator.TaskTimes(forward + device.call_overhead,
                                     backward / par + device.call_overhead, recomputed,
                                     backward_parallelism=par))
  return out


def _Divisors(n):
  return [d for d in range(1, n + 1) if n % d == 0]


def _Check(num_devices, memory, batch, schedules, recomputes, interleaved_stages):
  if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
    raise ValueError('planner: the number of devices must be a positive integer, got %r' %
                     (num_devices,))
  if not memory or memory <= 0:
    raise ValueError('planner: device memory must be a positive number of bytes, got %r' %
                     (memory,))
  if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
    raise ValueError('planner: the batch must be a positive integer, got %r (give --batch or '
                     'cost_input_shapes)' % (batch,))
  for name in schedules:
    if name not in schedule_builders.NAMES:
      raise ValueError('planner: schedule %r is not one of %s' % (name, schedule_builders.NAMES))
  for mode in recomputes:
    if mode not in RECOMPUTE_MODES:
      raise ValueError('planner: recompute %r is not one of %s' % (mode, RECOMPUTE_MODES))
  for v in interleaved_stages if 'interleaved_1f1b' in schedules else ():
    schedule_builders.CheckVirtualStages('interleaved_1f1b', v)


def Evaluate(profiles: Sequence[cost_model.LayerProfile], device: device_profiles.DeviceProfile,
             memory: float, replicas: int, pipeline_devices: int, micro_batches: int,
             schedule_name: str, recompute: str,
             bytes_per_param: float = cost_model.DEFAULT_BYTES_PER_PARAM,
             bytes_per_activation: float = 4,
             layer_times: Optional[Sequence[device_profiles.LayerTime]] = None,
             batch: Optional[float] = None, micro_batch_overhead: float = 0.0,
             virtual_stages: int = 1) -> ranking.Configuration:
  """The prediction for one configuration; `profiles` are for one replica's share of the batch
  (`batch` examples, which measured `layer_times` need; see LayerSeconds), `micro_batch_overhead`
  the seconds each micro-batch after the first costs (see PartitionTaskTimes); K =
  `pipeline_devices` devices hold `virtual_stages` partitions each.

  The split is the fastest (by predicted task times) that keeps every device within `memory`; if
  none does, the one that needs the least memory, marked as not fitting. A device's memory sums
  its partitions' (see _DeviceMemory).
  """
  workload = _Workload(tuple(profiles), device, memory, bytes_per_param, bytes_per_activation,
                       None if layer_times is None else tuple(layer_times), batch,
                       micro_batch_overhead)
  config = _Prepare(workload, replicas, pipeline_devices, micro_batches, schedule_name,
                    recompute, virtual_stages).Simulate()
  config.examples_per_second = 0.0  # PlanPipeline's: it knows the global batch.
  return config


@dataclasses.dataclass(frozen=True)
class _Workload:
  """What every configuration of a search runs, and on what: the layers' profiles for `batch`
  examples, the devices and their memory, the bytes per parameter and activation element, measured
  layer times (or None: from flops) and what each micro-batch after the first costs (see
  Evaluate)."""
  profiles: Tuple[cost_model.LayerProfile, ...]
  device: device_profiles.DeviceProfile
  memory: float
  bytes_per_param: float
  bytes_per_activation: float
  layer_times: Optional[Tuple[device_profiles.LayerTime, ...]]
  batch: Optional[float]
  micro_batch_overhead: float

  def Share(self, replicas: int) -> '_Workload':
    """The workload of one of `replicas` replicas: its share of the batch."""
    if replicas == 1:
      return self
    return dataclasses.replace(
        self, profiles=tuple(ScaledProfiles(self.profiles, 1.0 / replicas)),
        batch=None if self.batch is None else self.batch / replicas)


@dataclasses.dataclass(frozen=True)
class _Space:
  """The configurations a search tries (see PlanPipeline's arguments of the same names)."""
  batch: int
  num_devices: int
  schedules: Tuple[str, ...]
  recomputes: Tuple[str, ...]
  micro_batches: Tuple[int, ...]
  pipeline_devices: Optional[Tuple[int, ...]]
  replicas: Optional[Tuple[int, ...]]
  interleaved_stages: Tuple[int, ...]


@dataclasses.dataclass
class _Candidate:
  """A configuration split and sized (its memory and whether it fits are known), with what
  simulating its step needs; Simulate fills in its step time and bubble."""
  config: ranking.Configuration
  costs: List[simulator.TaskTimes]
  sched: schedule.Schedule
  transfer: float
  cores: Optional[float]
  all_reduce: float  # Seconds the replicas' gradient all-reduce adds to the step.

  def LowerBound(self) -> float:
    """A step time the simulation cannot come out below (simulator.LowerBound)."""
    return simulator.LowerBound(self.costs, self.sched, self.cores) + self.all_reduce

  def Simulate(self) -> ranking.Configuration:
    result = simulator.Simulate(self.costs, self.sched, transfer=self.transfer, cores=self.cores)
    self.config.step_time = result.step_time + self.all_reduce
    self.config.bubble = result.idle_fraction
    return self.config


def _Prepare(workload: _Workload, replicas: int, pipeline_devices: int, micro_batches: int,
             schedule_name: str, recompute: str, virtual_stages: int) -> _Candidate:
  """Evaluate's split, memory and task times: all but the simulation (`workload` is one
  replica's)."""
  k, m, v = pipeline_devices, micro_batches, virtual_stages
  profiles, device, memory = workload.profiles, workload.device, workload.memory
  bytes_per_activation = workload.bytes_per_activation
  sched, in_flight, awaiting = _Schedule(schedule_name, k, m, v)
  num_partitions = k * v

  def Memory(stashed, waiting):
    return cost_model.MemoryCost(profiles, m, recompute, workload.bytes_per_param,
                                 bytes_per_activation, stashed=stashed, waiting=waiting, running=1)

  layer_seconds = LayerSeconds(profiles, device, m, workload.layer_times, workload.batch)
  times = balancing.LayerCosts([f + b for f, b in layer_seconds], where='planner')
  # The split holds every partition to the most any device of the schedule holds (one fewer
  # awaiting its weight-gradient task, see _DeviceMemory), and to its share of the device: safe
  # for all.
  safe = Memory(in_flight, max(0, awaiting - 1))
  if balancing.Fits(safe, num_partitions, memory / v, where='planner'):
    sizes = balancing.OptimalSplit(times, num_partitions, safe, memory / v, where='planner')
  else:  # The split that needs the least memory.
    sizes = balancing.OptimalSplit(safe, num_partitions, where='planner')
  bounds = [0] + [sum(sizes[:i + 1]) for i in range(num_partitions)]
  device_memory = _DeviceMemory(sched, Memory, profiles, bounds, bytes_per_activation / m)
  fits = max(device_memory) <= memory
  why = '' if fits else 'needs %s > %s' % (units.FormatBytes(max(device_memory)),
                                          units.FormatBytes(memory))
  task_times = PartitionTaskTimes(
      layer_seconds, sizes, device, recompute, m, sched.splits_backward,
      device.backward_parallelism, workload.micro_batch_overhead, [p.params for p in profiles],
      [cost_model.SelectiveShare(p) for p in profiles])
  boundary = max((profiles[b].in_elements * bytes_per_activation / m for b in bounds[1:-1]),
                 default=0.0)  # Transfers between partitions of one device are counted too.
  cores = None if device.cores is None else device.cores / replicas
  all_reduce = 0.0
  if replicas > 1:  # Ring all-reduce of the fullest device's float32 gradients.
    grads = max(sum(sum(p.params for p in profiles[bounds[c]:bounds[c + 1]])
                    for c in sched.DevicePartitions(d)) for d in range(k)) * 4
    all_reduce = 2.0 * (replicas - 1) / replicas * grads / device.link_bandwidth
  config = ranking.Configuration(replicas, k, m, schedule_name, recompute, list(sizes), None, None,
                                 None, device_memory, fits, why, v)
  return _Candidate(config, task_times, sched, boundary / device.link_bandwidth, cores, all_reduce)


@functools.lru_cache(maxsize=1024)
def _Schedule(name, k, m, v):
  """(schedule, most micro-batches in flight on a device, most awaiting weight-gradient tasks):
  built once per process for each (schedule, K, M, v), which every S and recompute mode shares (a
  search builds each schedule up to 6 times otherwise; they are only read)."""
  sched = schedule_builders.Build(name, k, m, v, 2)
  return sched, max(sched.InFlight()), max(sched.AwaitingWeights())


def _DeviceMemory(sched, memory_cost, profiles, bounds, bytes_per_element):
  """Per device, the predicted peak bytes of its partitions (`bounds`: their layer ranges).

  `memory_cost(stashed, waiting)` is the MemoryCost for those counts, linear in both: each
  partition's fixed part, plus at the device's fullest tick the stashed micro-batches of its
  partitions (each holding what one of that partition holds) and, separately, those waiting for a
  weight-gradient task. A backward pass holds its micro-batch's activations before that micro-batch
  waits for its weight-gradient task, so at a device's peak (a backward pass running) one fewer
  waits than the most that ever do. Besides, a backward pass holds the gradients of the input and
  the output of the layer it differentiates, or more inside it (its largest backward op's), for one
  micro-batch.
  """
  fixed, one_stashed, one_waiting = (memory_cost(0, 0), memory_cost(1, 0), memory_cost(0, 1))
  ranges = list(zip(bounds[:-1], bounds[1:]))
  stash = [one_stashed.Of(i, j) - fixed.Of(i, j) for i, j in ranges]
  wait = [one_waiting.Of(i, j) - fixed.Of(i, j) for i, j in ranges]
  stashed, waiting = sched.InFlight(stash), sched.AwaitingWeights(wait)
  out = []
  for d in range(sched.num_devices):
    held = sched.DevicePartitions(d)
    gradients = max(max(p.in_elements + p.out_elements, p.gradient_elements) * bytes_per_element
                    for c in held for p in profiles[ranges[c][0]:ranges[c][1]])
    out.append(sum(fixed.Of(*ranges[c]) for c in held) + stashed[d] +
               max(0.0, waiting[d] - max(wait[c] for c in held)) + gradients)
  return out


def PlanPipeline(profiles: Sequence[cost_model.LayerProfile], batch: int, num_devices: int,
                 device: device_profiles.DeviceProfile, memory: Optional[float] = None,
                 schedules: Sequence[str] = ('gpipe',),
                 recomputes: Sequence[str] = RECOMPUTE_MODES,
                 micro_batches: Sequence[int] = MICRO_BATCH_CHOICES,
                 bytes_per_param: float = cost_model.DEFAULT_BYTES_PER_PARAM,
                 bytes_per_activation: float = 4, title: str = 'pipeline',
                 layer_times: Optional[Sequence[device_profiles.LayerTime]] = None,
                 pipeline_devices: Optional[Sequence[int]] = None,
                 replicas: Optional[Sequence[int]] = None,
                 micro_batch_overhead: float = 0.0,
                 interleaved_stages: Sequence[int] = (2,), exact: Optional[int] = None,
                 progress: progress_lib.Progress = progress_lib.QUIET,
                 cache: Optional[Any] = None) -> ranking.Ranking:
  """Ranks every configuration of the layers of `profiles` on `num_devices` devices.

  Args:
    profiles: cost_model.Profiles of the layers for a mini-batch of `batch` examples.
    batch: the global mini-batch; S replicas each get batch / S (S must divide it).
    num_devices: N; configurations use S x K <= N devices.
    device: the devices' device_profiles.DeviceProfile.
    memory: bytes per device (default: the profile's).
    schedules: the schedules to try (all but 'gpipe' need per-example losses).
    recomputes: the re-computation modes to try ('zero_bubble' and 'zbv' take 'always' only).
    micro_batches: the M to try (at most a replica's batch).
    bytes_per_param: bytes per trainable parameter with its optimizer slots.
    bytes_per_activation: bytes per activation element.
    title: names the model in the table.
    layer_times: measured per-layer times (device_profiles.MeasureLayerTimes) to use instead of
      flops.
    pipeline_devices: the K (devices of one replica) to try (default: every K that fits the
      devices and the layers).
    replicas: the S to try (default: every divisor of the batch up to the devices).
    micro_batch_overhead: seconds each micro-batch after the first costs a pipeline beyond its
      layers (model_plan.MeasureMicroBatchSeconds; see PartitionTaskTimes).
    interleaved_stages: the partitions per device v to try with 'interleaved_1f1b' ('zbv' takes 2,
      the others 1).
    exact: None: simulate every configuration. N: only the first N ranks (and the first N + 3 of
      those that do not fit, which a table of N rows shows) must be exact: the fitting
      configurations are simulated in order of a lower bound of their step time
      (simulator.LowerBound), and once that bound exceeds the N-th best step found, the rest cannot
      rank among the first N and are not simulated. Their step_time is None and they follow the
      simulated ones; the first N ranks are those of exact=None.
    progress: where the search reports its phases.
    cache: a disk_cache.DiskCache: a search with the same arguments (and the same code of the
      planner, simulator, schedules, splits and cost model) that a run made is read from it.

  Returns:
    A Ranking: fitting configurations by predicted step time (ties: fewer devices, then less
    memory), then the others by the memory they need.

  Raises:
    ValueError: bad arguments, or no configuration fits: the message names the least memory per
      device that one would fit in.
  """
  memory = device.memory if memory is None else float(memory)
  _Check(num_devices, memory, batch, schedules, recomputes, interleaved_stages)
  if exact is not None and exact < 1:
    raise ValueError('planner: exact must be None or a positive number of ranks, got %r' %
                     (exact,))
  workload = _Workload(tuple(profiles), device, memory, bytes_per_param, bytes_per_activation,
                       None if layer_times is None else tuple(layer_times), float(batch),
                       micro_batch_overhead)
  space = _Space(batch, num_devices, tuple(schedules), tuple(recomputes), tuple(micro_batches),
                 None if pipeline_devices is None else tuple(pipeline_devices),
                 None if replicas is None else tuple(replicas), tuple(interleaved_stages))
  key = None
  if cache is not None:
    key = _SearchKey(workload, space, title, exact)
    configurations = _ConfigurationsFromCache(cache.Get(_SEARCH_KIND, key))
    if configurations is not None:
      progress.Say('search: %d configurations read from the cache (a run with the same inputs '
                   'ranked them)' % len(configurations))
      return ranking.Ranking(title, device, memory, batch, configurations)
  ranked = _Search(workload, space, title, exact, progress)
  if cache is not None:
    cache.Put(_SEARCH_KIND, key, [dataclasses.asdict(c) for c in ranked.configurations])
  return ranked


_SEARCH_KIND = 'search'


def _SearchKey(*args):
  """The disk_cache key of a search: a digest of the code it runs, and its arguments."""
  def Plain(value):
    if dataclasses.is_dataclass(value):
      return dataclasses.astuple(value)
    if isinstance(value, (list, tuple)):
      return tuple(Plain(v) for v in value)
    return value

  code = disk_cache.FilesDigest(inspect.getfile(m) for m in (sys.modules[__name__], simulator,
                                                             schedule, schedule_builders,
                                                             balancing, cost_model))
  return 'code %s; %r' % (code, Plain(args))


def _ConfigurationsFromCache(value):
  """The configurations a disk_cache entry holds (PlanPipeline's), or None if it holds none."""
  def Int(v):
    return isinstance(v, int) and not isinstance(v, bool)

  def Number(v):
    return Int(v) or isinstance(v, float)

  fields = {f.name for f in dataclasses.fields(ranking.Configuration)}
  if not isinstance(value, list) or not value:
    return None
  for entry in value:
    if not (isinstance(entry, dict) and set(entry) == fields and
            all(Int(entry[k]) for k in ('replicas', 'pipeline_devices', 'micro_batches',
                                          'virtual_stages')) and
            all(isinstance(entry[k], str) for k in ('schedule', 'recompute', 'why')) and
            isinstance(entry['fits'], bool) and
            isinstance(entry['sizes'], list) and all(Int(v) for v in entry['sizes']) and
            isinstance(entry['device_memory'], list) and entry['device_memory'] and
            all(Number(v) for v in entry['device_memory']) and
            all(entry[k] is None or Number(entry[k])
                for k in ('step_time', 'examples_per_second', 'bubble'))):
      return None
  return [ranking.Configuration(**entry) for entry in value]


def _Search(workload: _Workload, space: _Space, title: str, exact: Optional[int],
            progress: progress_lib.Progress) -> ranking.Ranking:
  """PlanPipeline's search (its arguments checked)."""
  batch, num_devices, layers = space.batch, space.num_devices, len(workload.profiles)
  shapes = [(s, k, m) for s in _Divisors(batch)
            if s <= num_devices and (space.replicas is None or s in space.replicas)
            for k in range(1, min(num_devices // s, layers) + 1)
            if space.pipeline_devices is None or k in space.pipeline_devices
            for m in space.micro_batches if m <= batch // s]
  tries: List[Tuple[int, int, int, str, int, str]] = []  # (S, K, M, schedule, v, recompute)
  for s, k, m in shapes:
    for name in space.schedules:
      stages = (space.interleaved_stages if name == 'interleaved_1f1b' else
                (schedule_builders.LeastVirtualStages(name),))
      for v in stages:
        if k * v <= layers:  # Else too few layers.
          tries.extend((s, k, m, name, v, mode) for mode in space.recomputes
                       if _Runs(name, k, m, v, mode))
  sizing = progress.Phase('splitting and sizing configurations (S x K x M x schedule x '
                          'recompute)', len(tries))
  shares = {}
  candidates = []
  for s, k, m, name, v, mode in tries:
    if s not in shares:
      shares[s] = workload.Share(s)
    candidates.append(_Prepare(shares[s], s, k, m, name, mode, v))
    sizing.Step()
  configurations = [c.config for c in candidates]
  fitting = sum(c.fits for c in configurations)
  sizing.End('%d fit the memory' % fitting)
  if not configurations:
    raise ValueError('planner: no configuration to try with %d devices, batch %d and M in %s' %
                     (num_devices, batch, list(space.micro_batches)))
  if not fitting:
    least = min(configurations, key=lambda c: c.peak_memory)
    raise ValueError(
        '%s fits no configuration on %d devices of %s: the least memory one needs is %s per '
        'device (%s); give devices of at least that much memory, more devices, or a smaller '
        'batch' % (title, num_devices, units.FormatBytes(workload.memory),
                   units.FormatBytes(least.peak_memory), least.Label()))
  _SimulateRanked(candidates, exact, progress)
  for c in configurations:
    if c.simulated:
      c.examples_per_second = batch / c.step_time if c.step_time else float('inf')
  configurations.sort(key=_RankKey)
  return ranking.Ranking(title, workload.device, workload.memory, batch, configurations)


def _Runs(name, k, m, v, recompute):
  """Whether schedule `name` runs K = `k` devices of `v` partitions, M = `m` and `recompute`."""
  try:
    schedule_builders.Check(name, k, m, v, recompute)
  except ValueError:
    return False
  return True


def _RankKey(c):
  """Fitting configurations by step time (those not simulated after them), then fewer devices,
  then less memory; then the others by memory, then fewer devices."""
  if c.fits:
    return (0, not c.simulated, c.step_time or 0.0, c.devices, c.peak_memory)
  return (1, False, c.peak_memory, c.devices, c.peak_memory)


def _SimulateRanked(candidates, exact, progress):
  """Simulates every candidate, or with `exact` those that can rank among the first (see
  PlanPipeline)."""
  shown = []
  if exact is None:
    chosen = [(0.0, c) for c in candidates]
  else:
    fitting = [(c.LowerBound(), c) for c in candidates if c.config.fits]
    chosen = sorted(fitting, key=lambda pair: pair[0])
    others = sorted((c for c in candidates if not c.config.fits), key=lambda c: _RankKey(c.config))
    # Those that do not fit rank by memory, known now: a table shows the first few.
    shown = others[:exact + 3]
  phase = progress.Phase('simulating steps' + ('' if exact is None else ', best first by a lower '
                                              'bound'), len(chosen) + len(shown))
  # With `exact`: minus the step times of the best `exact` so far (a max-heap).
  best: List[float] = []
  simulated = 0
  for bound, c in chosen:
    # Sorted by bound: once one cannot beat the exact-th best, none of the rest can (the margin
    # covers rounding: the bound sums the same times in another order).
    if exact is not None and len(best) == exact and bound * (1 - 1e-9) > -best[0]:
      break
    step = c.Simulate().step_time
    simulated += 1
    phase.Step()
    if exact is not None:
      (heapq.heappush if len(best) < exact else heapq.heappushpop)(best, -step)
  if exact is not None:
    for c in shown:
      c.Simulate()
      phase.Step()
    phase.End('%d simulated; %d skipped: a lower bound of their step time shows they rank '
              'below the first %d' % (simulated + len(shown), len(chosen) - simulated, exact))
  else:
    phase.End()
