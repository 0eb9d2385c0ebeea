"""The planner for a registered model: its TensorPipeLayers' layers, shapes and batch, planned.

Used by `tools.plan` and by the trainer's --tensorpipe_plan flag (see `measure.planner`).
"""

from typing import Any, List, Optional, Sequence, Tuple

from lingvo import compat as tf
from lingvo.core import hyperparams

from tensorpipe import layer as layer_lib
from tensorpipe.measure import training_step
from tensorpipe.partition import cost_model
from tensorpipe.measure import planner
from tensorpipe import schedule
from tensorpipe import units


def _Skips(layers, skip_connections):
  index = {p.name: i for i, p in enumerate(layers)}
  return [(index[a], index[b]) for a, b in skip_connections or []
          if a in index and b in index and index[a] < index[b]]


def MeasureMicroBatchSeconds(layer_params: Sequence[Any], input_shapes: Sequence[Sequence[int]],
                             layer_times: Sequence[planner.LayerTime], call_overhead: float,
                             batch_dim: int = 0, rounds: int = 5, steps: int = 3) -> float:
  """Seconds each micro-batch after the first costs a pipeline beyond its layers' and calls' times:
  splitting the inputs, joining the outputs and adding its weight gradients to the others'.

  Measured now: the layers as one partition (a measure.training_step.TrainingStep, one op at a
  time as planner.MeasureLayerTimes) at M = 1 and M = 2, timed interleaved for `rounds` rounds of
  `steps` steps; the difference of the medians less what the planner already counts for the
  second micro-batch (its layers' fixed seconds and two more task calls). At least 0.
  """
  if len(layer_times) != len(layer_params):
    raise ValueError('model_plan: %d layer times for %d layers' %
                     (len(layer_times), len(layer_params)))
  if int(input_shapes[0][batch_dim]) < 2:
    return 0.0

  def Inputs():
    return tuple(tf.random.uniform(list(s), seed=i) for i, s in enumerate(input_shapes))

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


def PipelineInputs(cfg: hyperparams.Params, batch: Optional[int] = None
                   ) -> List[Tuple[str, hyperparams.Params, list, int, list]]:
  """[(path, pipeline Params, layers, batch, profiles)] for each TensorPipeLayer of model `cfg`.

  The profiles are for the pipeline's cost_input_shapes, with the batch dimension set to `batch`
  if given.

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
    shapes = [list(s) for s in p.cost_input_shapes]
    if batch is not None:
      for s in shapes:
        if len(s) > p.batch_dim:
          s[p.batch_dim] = batch
    profiles = cost_model.Profiles(layers, shapes, _Skips(layers, p.skip_connections))
    out.append((path, p, layers, int(shapes[0][p.batch_dim]), profiles))
  return out


def Schedules(p: hyperparams.Params) -> Sequence[str]:
  """The schedules a pipeline can run: all but 'gpipe' need per-example losses, which a pipeline
  has when it sets a loss_layer or already runs one of them."""
  if p.loss_layer is not None or p.schedule != 'gpipe':
    return schedule.NAMES
  return ('gpipe',)


def PlanModel(cfg: hyperparams.Params, num_devices: int, device: planner.DeviceProfile,
              memory: Optional[float] = None, batch: Optional[int] = None, title: str = 'model'
              ) -> List[Tuple[str, planner.Ranking]]:
  """[(pipeline path, planner.Ranking)] for each TensorPipeLayer of model params `cfg`.

  On this machine's CPU devices (a profile with shared `cores`) the layers' times and the cost of
  a micro-batch beyond them are measured (planner.MeasureLayerTimes, MeasureMicroBatchSeconds);
  elsewhere they come from flops and the profile.
  """
  out = []
  for path, p, layers, pipeline_batch, profiles in PipelineInputs(cfg, batch):
    layer_times, overhead = None, 0.0
    if device.cores is not None:
      shapes = [list(s) for s in p.cost_input_shapes]
      for s in shapes:
        if len(s) > p.batch_dim:
          s[p.batch_dim] = pipeline_batch
      layer_times = planner.MeasureLayerTimes(layers, shapes, p.batch_dim,
                                              skips=_Skips(layers, p.skip_connections))
      if not p.skip_connections:  # The measured step runs the layers in a plain chain.
        overhead = MeasureMicroBatchSeconds(layers, shapes, layer_times,
                                                    device.call_overhead, p.batch_dim)
    ranking = planner.PlanPipeline(profiles, pipeline_batch, num_devices, device, memory,
                                   schedules=Schedules(p), bytes_per_param=p.bytes_per_param,
                                   title='%s %s' % (title, path), layer_times=layer_times,
                                   micro_batch_overhead=overhead)
    out.append((path, ranking))
  return out


def PlanText(cfg: hyperparams.Params, num_devices: int, device_name: str = planner.CPU,
             memory: Optional[str] = None, title: str = 'model', limit: Optional[int] = 10) -> str:
  """The plan of model params `cfg` as text (what --tensorpipe_plan logs): `device_name` is a
  profile (planner.Profile), `memory` a size such as '16GiB' (default: the profile's)."""
  device = planner.Profile(device_name)
  budget = None if not memory else units.ParseBytes(memory)
  return Text(PlanModel(cfg, num_devices, device, budget, title=title), limit)


def Text(plans: Sequence[Tuple[str, planner.Ranking]], limit: Optional[int] = 20) -> str:
  """The tables and, for each pipeline, the flags that apply its best configuration."""
  lines = []
  for path, ranking in plans:
    lines.append(planner.Format(ranking, limit))
    lines.append('best: %s; train it with: %s' % (
        ranking.best.Label(), planner.TrainerFlags(ranking.best, ranking.profile, path)))
  return '\n'.join(lines)
