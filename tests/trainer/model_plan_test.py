"""model_plan: a registered model's TensorPipeLayers fed to the planner; measured within a budget,
kept in a cache, the same table as the exhaustive search of measurements of every layer."""

import dataclasses

import pytest
from absl import flags
from lingvo.core import hyperparams

from tensorpipe import disk_cache
from tensorpipe.measure import device_profiles
from tensorpipe.measure import planner
from tensorpipe.partitioner import cost_model
from tensorpipe.partitioner import measured_cost
from tensorpipe import progress as progress_lib
from tensorpipe.trainer import model_plan
from tensorpipe.trainer import registry
from tests import layer_helpers
from tests import trace_helpers

# This machine's CPU devices as the planner models them, with constant figures.
_CPU = device_profiles.DeviceProfile(device_profiles.CPU, peak_flops=1e9, memory=1e9,
                                     link_bandwidth=1e9, source='constructed', efficiency=1.0,
                                     op_overhead=1e-6, call_overhead=1e-5, cores=2.0,
                                     backward_parallelism=2.0)


def _Params(model):
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  registry.ImportModel(model)
  return registry.ModelParams(model, 'Train')


def testBatchOverrideScalesTheProfiles():
  cfg = _Params('digits.TinyConvPipeline')
  [(path, _, layers, batch, profiles)] = model_plan.PipelineInputs(cfg)
  [(_, _, _, half, halved)] = model_plan.PipelineInputs(cfg, batch=batch // 2)
  assert (path, batch, half, len(profiles)) == ('task.pipeline', 64, 32, len(layers))
  for a, b in zip(profiles, halved):
    assert b.flops == pytest.approx(a.flops / 2) and b.params == a.params


def testSchedulesNeedPerExampleLosses():
  assert model_plan.Schedules(_Params('digits.TinyConvPipeline').task.pipeline) == ('gpipe',)
  lm = [p for _, p in model_plan.layer_lib.Pipelines(_Params('lm.TinyTiedLm'))]
  assert model_plan.Schedules(lm[0]) == ('gpipe', '1f1b', 'zero_bubble', 'interleaved_1f1b',
                                         'zbv')


def testMissingShapesNameTheFix():
  cfg = _Params('digits.TinyConvPipeline')
  cfg.task.pipeline.cost_input_shapes = None
  with pytest.raises(ValueError, match='set task.pipeline.cost_input_shapes'):
    model_plan.PlanModel(cfg, 4, device_profiles.PROFILES['V100-16GB'])


def testMicroBatchMeasurementChecksItsArguments():
  with pytest.raises(ValueError, match='model_plan: 1 layer times for 2 layers'):
    model_plan.MeasureMicroBatchSeconds([None, None], [[8, 4]], [device_profiles.LayerTime(0, 0)],
                                        0.0)
  # One example cannot be split into two micro-batches: nothing to measure.
  assert model_plan.MeasureMicroBatchSeconds([None], [[1, 4]], [device_profiles.LayerTime(0, 0)],
                                             0.0) == 0


def _Model():
  """Model params holding one TensorPipeLayer of Dense layers, three of them alike."""
  layers = [layer_helpers.Dense.Params().Set(name='l%d' % i, dim=16, seed=0 if i < 3 else 1)
            for i in range(5)]
  cfg = hyperparams.Params()
  cfg.Define('task', hyperparams.Params(), '')
  cfg.task.Define('pipeline', layer_helpers.Pipeline(layers, 1, 1, cost_input_shapes=[[32, 16]]),
                  '')
  return cfg


@pytest.fixture(name='deterministic')
def _Deterministic(monkeypatch):
  """Measurements that follow the work, not the clock: layers by their MatMuls' elements, the
  micro-batch's cost a constant. Returns the list of the layer timer's calls."""
  calls = []

  def Timer(sess, step, repeats=5):
    calls.append(repeats)
    return trace_helpers.MatMulElementsRun(sess, step)

  monkeypatch.setattr(cost_model, 'StepSeconds', Timer)
  monkeypatch.setattr(model_plan, 'MeasureMicroBatchSeconds', lambda *args: 2e-4)
  return calls


def testTheTableIsTheExhaustiveSearchOfEveryLayerMeasured(tmp_path, deterministic):
  cfg = _Model()
  # The planner before distinct layers, caching and pruning: every layer measured in the chain at
  # the batch and an eighth of it, every configuration simulated.
  [(path, p, layers, batch, profiles)] = model_plan.PipelineInputs(cfg)
  full, low = [measured_cost.MeasureSeconds(layers, [[b, 16]]) for b in (32, 4)]
  times = [device_profiles.LayerTime(l - (f - l) / 28 * 4, (f - l) / 28) for f, l in zip(full, low)]
  old = model_plan.Text([(path, planner.PlanPipeline(
      profiles, batch, 4, _CPU, schedules=model_plan.Schedules(p), title='model ' + path,
      layer_times=times, micro_batch_overhead=2e-4))], 8)
  cache = disk_cache.DiskCache(str(tmp_path))
  del deterministic[:]
  plans = model_plan.PlanModel(cfg, 4, _CPU, cache=cache, exact=8)
  cold = model_plan.Text(plans, 8)
  assert len(deterministic) == 2 * 2  # Two distinct layers at 32 and 4 examples.
  assert any(not c.simulated for c in plans[0][1].configurations)  # The search was pruned.
  lines = []
  warm = model_plan.Text(model_plan.PlanModel(cfg, 4, _CPU, cache=cache, exact=8,
                                              progress=progress_lib.Progress(lines.append)), 8)
  assert len(deterministic) == 4  # Nothing measured again.
  assert 'measuring the distinct layers of 5 at 32 and 4 examples: 2 of 2 read from the cache' \
      in lines
  uncached = model_plan.Text(model_plan.PlanModel(cfg, 4, _CPU), 8)
  assert cold == warm == uncached == old


def testQuickOrATooSmallBudgetPlansFromFlops(deterministic):
  cfg = _Model()
  flops = model_plan.PlanModel(cfg, 4, dataclasses.replace(_CPU, cores=None))[0][1]
  lines = []
  small = model_plan.PlanModel(cfg, 4, _CPU, budget=1e-6,
                               progress=progress_lib.Progress(lines.append))[0][1]
  quick = model_plan.PlanModel(cfg, 4, _CPU, quick=True)[0][1]
  assert deterministic == []  # Nothing measured.
  assert [c.Label() for c in small.configurations] == [c.Label() for c in quick.configurations]
  assert any(line.startswith('task.pipeline: measuring the layers would take about ') and
             line.endswith('more than the budget of 1e-06 s: planning from flops (a larger '
                           'budget measures them)') for line in lines), lines
  # Shared cores, plus the estimated cost of a micro-batch: not the accelerators' flops plan.
  assert small.configurations[0].step_time != flops.configurations[0].step_time
