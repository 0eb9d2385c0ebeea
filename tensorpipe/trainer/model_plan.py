"""The planner for a registered model: its TensorPipeLayers' layers, shapes and batch, planned.

Used by `tools.plan` and by the trainer's --tensorpipe_plan flag (see `measure.planner`).
"""

import hashlib
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from lingvo.core import hyperparams

from tensorpipe import disk_cache
from tensorpipe import layer as layer_lib
from tensorpipe.measure import training_step
from tensorpipe.partitioner import cost_model
from tensorpipe.partitioner import measured_cost
from tensorpipe.measure import device_profiles
from tensorpipe.measure import planner
from tensorpipe.measure import ranking
from tensorpipe import progress as progress_lib
from tensorpipe import schedule_builders
from tensorpipe import units


def _Skips(layers, skip_connections):
  index = {p.name: i for i, p in enumerate(layers)}
  return [(index[a], index[b]) for a, b in skip_connections or []
          if a in index and b in index and index[a] < index[b]]


def MeasureMicroBatchSeconds(layer_params: Sequence[Any], input_shapes: Sequence[Sequence[int]],
                             layer_times: Sequence[device_profiles.LayerTime], call_overhead: float,
                             batch_dim: int = 0, rounds: int = 5, steps: int = 3) -> float:
  """Seconds each micro-batch after the first costs a pipeline beyond its layers' and calls' times:
  splitting the inputs, joining the outputs and adding its weight gradients to the others'.

  Measured now: the layers as one partition (a measure.training_step.TrainingStep, one op at a
  time as device_profiles.MeasureLayerTimes) at M = 1 and M = 2, timed interleaved for `rounds`
  rounds of `steps` steps; the difference of the medians less what the planner already counts for
  the second micro-batch (its layers' fixed seconds and two more task calls). At least 0.
  """
  if len(layer_times) != len(layer_params):
    raise ValueError('model_plan: %d layer times for %d layers' %
                     (len(layer_times), len(layer_params)))
  if cost_model.BatchOf(input_shapes, batch_dim) < 2:
    return 0.0

  def Inputs():
    return measured_cost.RandomInputs(input_shapes)

  built = [training_step.TrainingStep('M=%d' % m, layer_params, [len(layer_params)], Inputs, m,
                                      batch_dim, devices=1, intra_op_threads=1,
                                      inter_op_threads=1, warmup=1) for m in (1, 2)]
  try:
    for r in range(rounds):
      for step in (built if r % 2 == 0 else built[::-1]):
        step.Time(steps)
    extra = built[1].Median() - built[0].Median()
  finally:
    for step in built:
      step.Close()
  return max(0.0, extra - sum(t.fixed for t in layer_times) - 2 * call_overhead)


def PipelineInputs(cfg: hyperparams.Params, batch: Optional[int] = None,
                   cache: Optional[disk_cache.DiskCache] = None,
                   progress: progress_lib.Progress = progress_lib.QUIET
                   ) -> List[Tuple[str, hyperparams.Params, list, int, list]]:
  """[(path, pipeline Params, layers, batch, profiles)] for each TensorPipeLayer of model `cfg`.

  The profiles are for the pipeline's cost_input_shapes, with the batch dimension set to `batch`
  if given (cost_model.Profiles, with `cache` and `progress`).

  Raises:
    ValueError: no TensorPipeLayer, or one without cost_input_shapes (naming it and the fix).
  """
  pipelines = layer_lib.Pipelines(cfg)
  if not pipelines:
    raise ValueError('the model has no TensorPipeLayer to plan')
  out = []
  for path, p in pipelines:
    if p.cost_input_shapes is None:
      raise ValueError('TensorPipeLayer %r at %s has no cost_input_shapes; the planner needs the '
                       'first layer\'s input shapes for one mini-batch: set %s.cost_input_shapes' %
                       (p.name, path, path))
    layers = list(p.layers) if p.layers is not None else [
        layer for partition in p.partitions for layer in partition]
    shapes = _Shapes(p, batch)
    profiles = cost_model.Profiles(layers, shapes, _Skips(layers, p.skip_connections), cache,
                                   progress)
    out.append((path, p, layers, cost_model.BatchOf(shapes, p.batch_dim), profiles))
  return out


def _Shapes(p, batch):
  """The pipeline's cost_input_shapes with the batch dimension set to `batch` if given."""
  if batch is None:
    return list(p.cost_input_shapes)
  return cost_model.WithBatch(p.cost_input_shapes, p.batch_dim, batch)


def Schedules(p: hyperparams.Params) -> Sequence[str]:
  """The schedules a pipeline can run: all but 'gpipe' need per-example losses, which a pipeline
  has when it sets a loss_layer or already runs one of them."""
  if p.loss_layer is not None or p.schedule != 'gpipe':
    return schedule_builders.NAMES
  return ('gpipe',)


# Seconds the measurements of a model's pipelines may take on CPU devices by default, all together
# (estimated; see device_profiles.ChooseMeasuring): the paper's AmoebaNet-D (18, 256) and
# T(64, 16384, 32) then plan in under a minute on 2 cores.
MEASURE_BUDGET = 30.0
_MEASURING_KIND = 'measuring'
_MICRO_BATCH_KIND = 'micro_batch_seconds'
# A measured step runs the layers as one partition, 5 rounds of 3 steps at M = 1 and M = 2, each
# after a warm-up step (MeasureMicroBatchSeconds' defaults).
_STEPS_PER_MEASUREMENT = 2 * (1 + 5 * 3)


def MicroBatchMeasuringSeconds(profiles: Sequence[cost_model.LayerProfile],
                               device: device_profiles.DeviceProfile, batch: int,
                               examples: int) -> float:
  """About how long MeasureMicroBatchSeconds takes on `examples` examples (`profiles` are for
  `batch`): setting up the layers' passes twice, then its steps (device_profiles.RunSeconds)."""
  return sum(2 * (p.forward_ops + p.backward_ops) * device_profiles.SETUP_SECONDS_PER_OP +
             _STEPS_PER_MEASUREMENT * device_profiles.RunSeconds(p, device, batch, examples)
             for p in profiles)


def _PackageDigest():
  """A digest of TensorPipe's sources: a measured pipeline step depends on all of them."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return disk_cache.FilesDigest(os.path.join(d, f) for d, _, files in os.walk(root)
                                for f in files if f.endswith('.py'))


def _Measure(path, p, layers, batch, profiles, device, budget, cache, progress):
  """(layer times, micro-batch overhead) of one pipeline on this machine's CPU devices, measured
  within about `budget` seconds; (None, estimated overhead) where even the least measuring does
  not fit it."""
  shapes = _Shapes(p, batch)
  skips = _Skips(layers, p.skip_connections)
  keys = [cost_model.DistinctKey(layer, in_shapes) for layer, (_, in_shapes) in
          zip(layers, cost_model.ChainMeta(layers, shapes, skips)[0])]
  first: Dict[Any, int] = {}
  for i, key in enumerate(keys):
    first.setdefault(key, i)
  distinct = sorted(first.values())
  # The measured step runs the layers in a plain chain: no skip connections.
  estimate = (0.0 if p.skip_connections else
              device_profiles.MicroBatchSecondsEstimate(profiles, device))
  where = '%s; budget %g s; batch %d; layers %s' % (
      device_profiles.MachineKey(), budget, batch,
      hashlib.sha256('\n'.join(keys).encode()).hexdigest())
  chosen = None if cache is None else cache.Get(_MEASURING_KIND, where)
  measuring: Optional[device_profiles.Measuring]
  if (isinstance(chosen, list) and len(chosen) == 4 and
      all(isinstance(v, int) and not isinstance(v, bool) for v in chosen[:3])):
    measuring, micro_batches = device_profiles.Measuring(*chosen[:3]), chosen[3] is True
  else:
    measuring, seconds = device_profiles.ChooseMeasuring(profiles, distinct, device, batch, budget)
    if measuring is None:
      progress.Say('%s: measuring the layers would take about %s, more than the budget of %g s: '
                   'planning from flops (a larger budget measures them)' %
                   (path, progress_lib.Seconds(seconds), budget))
      return None, estimate
    micro_seconds = MicroBatchMeasuringSeconds(profiles, device, batch, measuring.high)
    micro_batches = not p.skip_connections and seconds + micro_seconds <= budget
    if cache is not None:
      cache.Put(_MEASURING_KIND, where, [measuring.high, measuring.low, measuring.repeats,
                                         micro_batches])
  layer_times = device_profiles.MeasureLayerTimes(
      layers, shapes, p.batch_dim, skips=skips, measuring=measuring, cache=cache,
      progress=progress,
      estimate=device_profiles.MeasuringSeconds(profiles, distinct, device, batch, measuring))
  if p.skip_connections:
    return layer_times, 0.0
  if not micro_batches:
    progress.Say('what a micro-batch adds beyond its layers: estimated (its weight gradients\' '
                 'addition, %s), measuring it does not fit the budget' %
                 progress_lib.Seconds(estimate))
    return layer_times, estimate
  key = '%s; code %s; examples %d' % (where, _PackageDigest(), measuring.high)
  overhead = None if cache is None else cache.Get(_MICRO_BATCH_KIND, key)
  if not isinstance(overhead, float):
    seconds = MicroBatchMeasuringSeconds(profiles, device, batch, measuring.high)
    with progress.Phase('measuring what a micro-batch adds beyond its layers (one-partition '
                        'steps at M = 1 and 2, %d examples)' % measuring.high, estimate=seconds):
      overhead = MeasureMicroBatchSeconds(layers, _Shapes(p, measuring.high), layer_times,
                                          device.call_overhead, p.batch_dim)
    if cache is not None:
      cache.Put(_MICRO_BATCH_KIND, key, overhead)
  return layer_times, overhead


def PlanModel(cfg: hyperparams.Params, num_devices: int, device: device_profiles.DeviceProfile,
              memory: Optional[float] = None, batch: Optional[int] = None, title: str = 'model',
              quick: bool = False, budget: float = MEASURE_BUDGET,
              cache: Optional[disk_cache.DiskCache] = None,
              progress: progress_lib.Progress = progress_lib.QUIET, exact: Optional[int] = None
              ) -> List[Tuple[str, ranking.Ranking]]:
  """[(pipeline path, ranking.Ranking)] for each TensorPipeLayer of model params `cfg`.

  On this machine's CPU devices (a profile with shared `cores`) the layers' times, and what a
  micro-batch costs beyond them, are measured (device_profiles.MeasureLayerTimes,
  MeasureMicroBatchSeconds) within about `budget` seconds (shared equally by the pipelines): at the
  largest batches that fit (device_profiles.ChooseMeasuring), and the micro-batch only if it fits
  too (else device_profiles.MicroBatchSecondsEstimate). With `quick`, or a budget below the least
  measuring, the layers' times come from flops and the profile, as on the accelerators. A `cache` (a
  disk_cache.DiskCache) keeps the cost-model facts, the measurements, what was chosen and the
  search's ranking for the next run; `progress` hears of every phase; `exact`: the ranks to
  simulate exactly (planner.PlanPipeline; None: all).
  """
  out = []
  pipelines = PipelineInputs(cfg, batch, cache, progress)
  for path, p, layers, pipeline_batch, profiles in pipelines:
    layer_times, overhead = None, 0.0
    if device.cores is not None:
      if quick:
        overhead = (0.0 if p.skip_connections else
                    device_profiles.MicroBatchSecondsEstimate(profiles, device))
      else:
        layer_times, overhead = _Measure(path, p, layers, pipeline_batch, profiles, device,
                                         budget / len(pipelines), cache, progress)
    ranked = planner.PlanPipeline(profiles, pipeline_batch, num_devices, device, memory,
                                  schedules=Schedules(p), bytes_per_param=p.bytes_per_param,
                                  title='%s %s' % (title, path), layer_times=layer_times,
                                  micro_batch_overhead=overhead, exact=exact, progress=progress,
                                  cache=cache)
    out.append((path, ranked))
  return out


def PlanText(cfg: hyperparams.Params, num_devices: int, device_name: str = device_profiles.CPU,
             memory: Optional[str] = None, title: str = 'model', limit: Optional[int] = 10,
             quick: bool = False, budget: float = MEASURE_BUDGET,
             cache: Optional[disk_cache.DiskCache] = None,
             progress: progress_lib.Progress = progress_lib.QUIET) -> str:
  """The plan of model params `cfg` as text (what --tensorpipe_plan logs): `device_name` is a
  profile (device_profiles.Profile), `memory` a size such as '16GiB' (default: the profile's); the
  first `limit` ranks are exact (see PlanModel for the rest)."""
  device = device_profiles.Profile(device_name, cache, progress)
  budget_bytes = None if not memory else units.ParseBytes(memory)
  return Text(PlanModel(cfg, num_devices, device, budget_bytes, title=title, quick=quick,
                        budget=budget, cache=cache, progress=progress, exact=limit), limit)


def Text(plans: Sequence[Tuple[str, ranking.Ranking]], limit: Optional[int] = 20) -> str:
  """The tables and, for each pipeline, the flags that apply its best configuration."""
  lines = []
  for path, ranked in plans:
    lines.append(ranking.Format(ranked, limit))
    lines.append('best: %s; train it with: %s' % (
        ranked.best.Label(), ranking.TrainerFlags(ranked.best, ranked.profile, path)))
  return '\n'.join(lines)
