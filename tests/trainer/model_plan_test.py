"""model_plan: a registered model's TensorPipeLayers fed to the planner."""

import pytest
from absl import flags

from tensorpipe.measure import planner
from tensorpipe.trainer import model_plan
from tensorpipe.trainer import registry


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
    model_plan.PlanModel(cfg, 4, planner.PROFILES['V100-16GB'])


def testMicroBatchMeasurementChecksItsArguments():
  with pytest.raises(ValueError, match='model_plan: 1 layer times for 2 layers'):
    model_plan.MeasureMicroBatchSeconds([None, None], [[8, 4]], [planner.LayerTime(0, 0)], 0.0)
  # One example cannot be split into two micro-batches: nothing to measure.
  assert model_plan.MeasureMicroBatchSeconds([None], [[1, 4]], [planner.LayerTime(0, 0)], 0.0) == 0
