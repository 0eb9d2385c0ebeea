"""What the planner knows of a device, and of each layer's time on it: public spec-sheet profiles of
accelerators (`PROFILES`), and this machine's CPU devices and a pipeline's layers measured on the
spot in TensorFlow sessions (`MeasureCpu`, `MeasureLayerTimes`), kept in a disk_cache.DiskCache for
the next run on the same machine (`MachineKey`).

The planner's search (`planner.PlanPipeline`) takes these as plain numbers and runs no TensorFlow;
everything here that runs a session imports TensorFlow only when called.
"""

import dataclasses
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from tensorpipe import progress as progress_lib
from tensorpipe.partitioner import cost_model
from tensorpipe.partitioner import measured_cost

GIB = 2.0**30


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
  """What the planner needs to know of one device.

  peak_flops: floating-point operations per second at the precision trained in (dense).
  memory: bytes of device memory.
  link_bandwidth: bytes per second between two neighbouring devices (one direction).
  source: where the figures come from.
  efficiency: the share of peak_flops a training step's ops reach.
  op_overhead: seconds each op costs whatever its size (launch, scheduling).
  call_overhead: seconds each task (one call of a partition's graph function) costs.
  cores: for logical devices sharing a processor (CPU devices of one process), the ops that run at
    once over all of them; None for independent devices (accelerators).
  backward_parallelism: ops of a backward task that run at once (2 where a layer's input and weight
    gradient products run on two threads; 1 on a device with one stream).
  """
  name: str
  peak_flops: float
  memory: float
  link_bandwidth: float
  source: str
  efficiency: float = 0.5
  op_overhead: float = 5e-6
  call_overhead: float = 1e-5
  cores: Optional[float] = None
  backward_parallelism: float = 1.0

  @property
  def rate(self) -> float:
    """Flops per second the planner expects of a training step's ops."""
    return self.peak_flops * self.efficiency


_A100 = DeviceProfile(
    'A100-40GB', 312e12, 40 * GIB, 300e9,
    'https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/'
    'nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (SXM: BF16 312 TFLOPS dense, 40 or 80 GB, '
    'NVLink 600 GB/s both directions)')
# Public figures, per device as TensorPipe uses it (one GPU; one TPU core). Peak: the dense
# tensor-core / matrix-unit rate at the training precision the paper or common practice uses
# (float32 on P100 and V100 without mixed precision, bfloat16 on A100, H100 and TPUs). Efficiency
# 0.5 and 5 us per kernel launch are assumptions, not spec-sheet figures; TPUs run a step compiled
# by XLA as a whole, so no per-op launch cost.
PROFILES: Dict[str, DeviceProfile] = {
    p.name: p for p in [
        DeviceProfile(
            'P100-16GB-PCIe', 9.3e12, 16 * GIB, 15.75e9,
            'https://images.nvidia.com/content/tesla/pdf/nvidia-tesla-p100-PCIe-datasheet.pdf '
            '(FP32 9.3 TFLOPS, 16 GB HBM2, PCIe 3.0 x16; the paper\'s GPUs without NVLink)'),
        DeviceProfile(
            'V100-16GB', 15.7e12, 16 * GIB, 150e9,
            'https://images.nvidia.com/content/technologies/volta/pdf/'
            'volta-v100-datasheet-update-us-1165301-r5.pdf (SXM2: FP32 15.7 TFLOPS, 16 GB, '
            'NVLink 300 GB/s both directions)'),
        _A100,
        dataclasses.replace(_A100, name='A100-80GB', memory=80 * GIB),
        DeviceProfile(
            'H100-80GB-SXM', 989e12, 80 * GIB, 450e9,
            'https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet '
            '(SXM: BF16 1979 TFLOPS with sparsity = 989 dense, 80 GB, NVLink 900 GB/s both '
            'directions)'),
        DeviceProfile(
            'TPUv2-core', 22.5e12, 8 * GIB, 62e9,
            'https://cloud.google.com/tpu/docs/system-architecture-tpu-vm (v2: 45 TFLOPS and '
            '16 GiB HBM per chip of 2 cores); ICI 496 Gbit/s per link: Jouppi et al., ISCA 2021, '
            'https://doi.org/10.1109/ISCA52012.2021.00010 (the paper\'s Table 1 AmoebaNet runs)',
            op_overhead=0.0),
        DeviceProfile(
            'TPUv3-core', 61.5e12, 16 * GIB, 82e9,
            'https://cloud.google.com/tpu/docs/system-architecture-tpu-vm (v3: 123 TFLOPS bf16 '
            'and 32 GiB HBM per chip of 2 cores); ICI 656 Gbit/s per link: Jouppi et al., ISCA '
            '2021, https://doi.org/10.1109/ISCA52012.2021.00010 (the paper\'s Cloud TPUv3)',
            op_overhead=0.0),
    ]
}
CPU = 'cpu'  # The profile name of this machine's CPU devices, measured by `MeasureCpu`.


def KnownProfiles() -> List[str]:
  return [CPU] + sorted(PROFILES)


def Profile(name: str, cache: Optional[Any] = None,
            progress: progress_lib.Progress = progress_lib.QUIET) -> DeviceProfile:
  """The named profile of PROFILES, or this machine's CPU devices for 'cpu': measured now
  (MeasureCpu), or read from `cache` (a disk_cache.DiskCache) where a run on this machine
  (MachineKey) measured them, so that its layers' times and the profile come from one run.

  Raises:
    ValueError: for an unknown name, listing the known ones.
  """
  if name == CPU:
    key = MachineKey()
    profile = _ProfileFromCache(None if cache is None else cache.Get(_PROFILE_KIND, key))
    if profile is not None:
      return profile
    progress.Say('measuring this machine\'s CPU devices')
    profile = MeasureCpu()
    if cache is not None:
      cache.Put(_PROFILE_KIND, key, dataclasses.asdict(profile))
    return profile
  if name not in PROFILES:
    raise ValueError('unknown device profile %r; known profiles: %s' %
                     (name, ', '.join(KnownProfiles())))
  return PROFILES[name]


_PROFILE_KIND = 'cpu_profile'


def _ProfileFromCache(value):
  """The DeviceProfile a disk_cache entry holds, or None if it holds none."""
  fields = {f.name for f in dataclasses.fields(DeviceProfile)}
  if not isinstance(value, dict) or set(value) != fields:
    return None
  numbers = [v for k, v in value.items() if k not in ('name', 'source', 'cores')]
  if (not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers) or
      not isinstance(value['name'], str) or not isinstance(value['source'], str) or
      not (value['cores'] is None or isinstance(value['cores'], (int, float)))):
    return None
  return DeviceProfile(**value)


def _SessionConfig(intra_op_threads, inter_op_threads):
  """A one-device session's ConfigProto with these thread pools (as placement.SessionConfig)."""
  from lingvo import compat as tf  # pylint: disable=g-import-not-at-top
  config = tf.compat.v1.ConfigProto(allow_soft_placement=False)
  config.intra_op_parallelism_threads = intra_op_threads
  config.inter_op_parallelism_threads = inter_op_threads
  return config


def _Seconds(fn, repeats):
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return sorted(times)[len(times) // 2]


def MeasureCpu(intra_op_threads: int = 1, inter_op_threads: int = 2, repeats: int = 5,
               memory: Optional[float] = None) -> DeviceProfile:
  """This machine's logical CPU devices as TensorPipe's CPU sessions run them, measured now.

  Sessions with `intra_op_threads` threads per op and `inter_op_threads` ops at once (as the
  benchmarks' and the trainer's CPU runs); peak_flops: a 256^3 float32 matmul's rate (efficiency
  1: the ops of a step are taken to run as fast); op_overhead: a chain of 200 tiny ops per op;
  call_overhead: a chain of 50 graph-function calls per call, less the op inside; link bandwidth:
  a 16 MiB copy's rate; memory: `memory` or the machine's RAM. A few seconds; the result varies
  with the machine's load.
  """
  from lingvo import compat as tf  # pylint: disable=g-import-not-at-top
  from tensorpipe import tf_internals  # pylint: disable=g-import-not-at-top
  config = _SessionConfig(intra_op_threads, inter_op_threads)
  with tf.Graph().as_default() as graph:
    a = tf.Variable(tf.random.uniform([256, 256], -0.1, 0.1), name='a')
    chain = a
    for _ in range(8):  # Dependent matmuls: one at a time, each on one thread.
      chain = tf.matmul(chain, a)
    matmuls = tf.reduce_sum(chain)
    x = tf.Variable(1.0, name='x')
    y = x
    for _ in range(200):
      y = y * 1.0001
    big = tf.Variable(tf.zeros([4 << 20]), name='big')
    copy = tf.reduce_sum(tf.identity(big) + 1.0)

    # A call of a graph function that is never inlined, as TensorPipeLayer's tasks are.
    tiny = tf_internals.TraceNotInlined(lambda v: v * 1.0001, [tf.TensorSpec([], tf.float32)])
    z = x
    for _ in range(50):
      z = tiny(z)
    init = tf.global_variables_initializer()
  with tf.Session(graph=graph, config=config) as sess:
    sess.run(init)
    matmul_s = _Seconds(lambda: sess.run(matmuls), repeats)
    chain_s = _Seconds(lambda: sess.run(y), repeats)
    calls_s = _Seconds(lambda: sess.run(z), repeats)
    copy_s = _Seconds(lambda: sess.run(copy), repeats)
  op_overhead = chain_s / 200
  if memory is None:
    memory = float(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))
  return DeviceProfile(
      CPU, peak_flops=8 * 2 * 256**3 / max(matmul_s - 9 * op_overhead, 1e-9), memory=memory,
      link_bandwidth=3 * 16 * 2**20 / max(copy_s, 1e-9),
      source='measured on this machine (%d cores, %d inter-op threads)' %
      (os.cpu_count() or 1, inter_op_threads),
      efficiency=1.0, op_overhead=op_overhead,
      call_overhead=max(0.0, calls_s / 50 - op_overhead),
      cores=float(min(os.cpu_count() or 1, inter_op_threads)), backward_parallelism=2.0)


@dataclasses.dataclass(frozen=True)
class LayerTime:
  """A layer's measured forward + backward seconds as fixed + per_example x examples."""
  fixed: float
  per_example: float


@dataclasses.dataclass(frozen=True)
class Measuring:
  """How MeasureLayerTimes measures: each distinct layer at `high` and at `low` examples, each with
  one warm-up run and `repeats` timed runs (their median counts)."""
  high: int
  low: int
  repeats: int = 5

  @classmethod
  def Full(cls, batch: int, small: int = 8) -> 'Measuring':
    """The mini-batch and 1/`small` of it: the most faithful, and for big models the slowest."""
    return cls(batch, max(1, batch // small))


# Seconds to set up a layer's measurement, per op the cost model counts of it (forward_ops +
# backward_ops): building its forward and backward pass (Lingvo's layer construction, TensorFlow's
# graph) and its first run (grappler, kernel set-up), as on the benchmarks' machine (AmoebaNet-D
# cells: about 1.25 s for 450 ops). For estimates only.
SETUP_SECONDS_PER_OP = 2.8e-3


def RunSeconds(profile: cost_model.LayerProfile, device: DeviceProfile, batch: int,
               examples: int) -> float:
  """About how long one forward + backward run of a layer takes on `examples` examples (its
  `profile` is for `batch`), for estimates: three times its flops at half the device's rate (the
  matmul rate of MeasureCpu; convolutions and element-wise ops on one thread run at about half of
  it, as AmoebaNet-D's cells do), plus its ops' launches."""
  return (6 * profile.flops * examples / batch / device.rate +
          (profile.forward_ops + profile.backward_ops) * device.op_overhead)


def MeasuringSeconds(profiles: Sequence[cost_model.LayerProfile], distinct: Sequence[int],
                     device: DeviceProfile, batch: int, measuring: Measuring) -> float:
  """About how long MeasureLayerTimes takes to measure the layers of `profiles` (for `batch`
  examples) at the indices `distinct` with `measuring` on `device`: setting each one up
  (SETUP_SECONDS_PER_OP), then its runs (RunSeconds) at both sizes."""
  sizes = sorted({measuring.high, measuring.low})
  total = 0.0
  for i in distinct:
    p = profiles[i]
    total += ((p.forward_ops + p.backward_ops) * SETUP_SECONDS_PER_OP +
              (1 + measuring.repeats) * sum(RunSeconds(p, device, batch, n) for n in sizes))
  return total


def ChooseMeasuring(profiles: Sequence[cost_model.LayerProfile], distinct: Sequence[int],
                    device: DeviceProfile, batch: int, budget: float, small: int = 8
                    ) -> Tuple[Optional[Measuring], float]:
  """The most faithful Measuring whose estimated time (MeasuringSeconds) fits `budget` seconds:
  the largest `high` first (the mini-batch, then halving it down to 2; low = high / `small`, at
  least 1), then at the least high fewer repeats (3, 1). Returns (measuring, its estimate), or
  (None, the estimate of the least) when none fits."""
  highs = [batch]
  while highs[-1] // 2 >= 2:
    highs.append(highs[-1] // 2)
  least = highs[-1]
  choices = [Measuring.Full(h, small) for h in highs] + [
      Measuring(least, max(1, least // small), repeats) for repeats in (3, 1)]
  for measuring in choices:
    seconds = MeasuringSeconds(profiles, distinct, device, batch, measuring)
    if seconds <= budget:
      return measuring, seconds
  return None, seconds


def MachineKey() -> str:
  """This machine as measured times depend on it (a part of their disk_cache keys): the CPU model,
  its cores, TensorFlow's version and whether it runs its oneDNN kernels (measure.machine.Key)."""
  from tensorpipe.measure import machine  # pylint: disable=g-import-not-at-top  # TensorFlow.
  return machine.Key()


_SECONDS_KIND = 'layer_seconds'


def MeasureLayerTimes(layer_params: Sequence[Any], input_shapes: Sequence[Sequence[int]],
                      batch_dim: int = 0, device: Optional[str] = None, small: int = 8,
                      skips: Sequence[Tuple[int, int]] = (),
                      measuring: Optional[Measuring] = None, cache: Optional[Any] = None,
                      progress: progress_lib.Progress = progress_lib.QUIET,
                      timer: Optional[Callable[[Any, Any, int], float]] = None,
                      estimate: Optional[float] = None) -> List[LayerTime]:
  """Each layer's forward + backward time, measured alone at `measuring`'s two batch sizes (default
  Measuring.Full: the batch of `input_shapes` and 1/`small` of it) and fitted as fixed +
  per-example seconds.

  Measured one op at a time (one thread), so the times are work (core-seconds), as flops give;
  the simulator spreads a backward task over the device's backward_parallelism. The fixed part is
  what a micro-batch costs however small (op launches, kernel set-up), which flops alone miss on
  CPUs; the fit holds between the two batch sizes measured.

  A layer runs on uniform random inputs of the shapes FPropMeta gives it in the pipeline
  (measured_cost.MeasureLayerSeconds), so each distinct layer (equal cost_model.DistinctKey) is
  measured once; with a `cache` (a disk_cache.DiskCache), once per machine (MachineKey): later runs
  read its seconds. `progress` hears of each layer measured (and of `estimate`, the seconds it is
  expected to take); `timer` replaces the wall clock (measured_cost.MeasureSeconds').
  """
  batch = cost_model.BatchOf(input_shapes, batch_dim)
  measuring = measuring or Measuring.Full(batch, small)

  def Shapes(b):
    shapes = cost_model.WithBatch(input_shapes, batch_dim, b)
    return [in_shapes for _, in_shapes in cost_model.ChainMeta(layer_params, shapes, skips)[0]]

  keys = [cost_model.DistinctKey(p, shapes) for p, shapes in zip(layer_params, Shapes(batch))]
  first: Dict[str, int] = {}
  for i, key in enumerate(keys):
    first.setdefault(key, i)
  examples = sorted({measuring.high, measuring.low}, reverse=True)
  where = '%s; device %s; 1 intra-op and 1 inter-op thread; examples %s; repeats %d' % (
      MachineKey(), device or 'CPU', examples, measuring.repeats)
  seconds = {}
  for key in first:
    value = None if cache is None else cache.Get(_SECONDS_KIND, '%s; %s' % (key, where))
    if (isinstance(value, list) and len(value) == len(examples) and
        all(isinstance(v, float) for v in value)):
      seconds[key] = value
  todo = [(key, i) for key, i in first.items() if key not in seconds]
  what = 'the distinct layers of %d at %s examples' % (
      len(layer_params), ' and '.join(str(e) for e in examples))
  if todo:
    shapes = Shapes(examples[0])
    phases = [progress.Phase('measuring %s: building' % what, len(todo), estimate)]

    def Built():
      phases[-1].Step()
      if phases[-1].done == len(todo):
        phases[-1].End()
        phases.append(progress.Phase('measuring %s: timing, %d runs each' % (
            what, measuring.repeats), len(todo)))

    def Timed(j, values):
      key = todo[j][0]
      seconds[key] = values
      if cache is not None:
        cache.Put(_SECONDS_KIND, '%s; %s' % (key, where), values)
      phases[-1].Step()

    measured_cost.MeasureLayerSeconds(
        [layer_params[i] for _, i in todo], [shapes[i] for _, i in todo], examples, batch_dim,
        device, measuring.repeats, timer, _SessionConfig(1, 1), Built, Timed)
    phases[-1].End()
  if cache is not None:
    progress.Say('measuring %s: %d of %d read from the cache' % (what, len(first) - len(todo),
                                                                 len(first)))
  out = []
  for key in keys:
    t_high, t_low = seconds[key][0], seconds[key][-1]
    high, low = examples[0], examples[-1]
    per_example = max(0.0, (t_high - t_low) / (high - low)) if high > low else 0.0
    out.append(LayerTime(max(0.0, t_low - per_example * low), per_example))
  return out


def MicroBatchSecondsEstimate(profiles: Sequence[cost_model.LayerProfile],
                              device: DeviceProfile) -> float:
  """What each micro-batch after the first costs beyond its layers, estimated instead of measured
  (see trainer.model_plan.MeasureMicroBatchSeconds): adding its float32 weight gradients to the
  others' (two read, one written per parameter) at the device's copy rate (link_bandwidth)."""
  return 3 * 4 * sum(p.params for p in profiles) / device.link_bandwidth
