"""Tiny Lingvo tasks for the TensorPipe tests: a constant input, a task over a TensorPipeLayer, and
time-major tasks for the consistency check (its library test, its tool test and the trainer's
user-module test register them)."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_input_generator
from lingvo.core import base_layer
from lingvo.core import base_model
from lingvo.core import bn_layers
from lingvo.core import py_utils

from tensorpipe import layer as layer_lib
from tests import layer_helpers

TIME_MAJOR_SHAPE = (4, 8, 4)  # T, B, D of ConstantInput's default x.
_TIME, _BATCH, _DIM = TIME_MAJOR_SHAPE


class ConstantInput(base_input_generator.BaseInputGenerator):
  """Every batch is the same: x uniform in [-1, 1] of `shape`, from a fixed numpy seed."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.name = 'constant_input'
    p.batch_size = _BATCH
    p.Define('shape', [_TIME, _BATCH, _DIM], 'Shape of x, e.g. time-major [T, B, D].')
    p.Define('seed', 0, 'Numpy seed of x.')
    return p

  def _InputBatch(self):
    p = self.params
    x = np.random.RandomState(p.seed).uniform(-1, 1, size=p.shape).astype(np.float32)
    return py_utils.NestedMap(x=tf.constant(x))


class PipelineTask(base_model.BaseTask):
  """loss = mean((pipeline(x) - 0.5)^2) over every output element."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.name = 'tiny'
    p.Define('pipeline', None, 'The TensorPipeLayer Params run on input_batch.x.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('pipeline', self.params.pipeline)

  def ComputePredictions(self, theta, input_batch):
    return self.pipeline.FProp(theta.pipeline, input_batch.x)

  def ComputeLoss(self, theta, predictions, input_batch):
    loss = tf.reduce_mean(tf.square(predictions - 0.5))
    return {'loss': (loss, tf.constant(1.0))}, {}


class TimeMix(base_layer.BaseLayer):
  """y = x + mean of x over axis 0: mixes the time steps of time-major [T, B, D] inputs."""

  def FProp(self, theta, x):
    with tf.name_scope(self.params.name):
      return x + tf.reduce_mean(x, axis=0, keepdims=True)


def TimeMajorTask(batch_dim):
  """A task on time-major x [T, B, D] whose layers mix along T. batch_dim=1 is right; with
  batch_dim=0 the micro-batches cut the time axis, so results depend on M (the batch_dim check is
  off, as it would otherwise stop the first step)."""
  layers = layer_helpers.DenseLayers(2, _DIM)
  layers.insert(1, TimeMix.Params().Set(name='mix'))
  return PipelineTask.Params().Set(pipeline=layer_lib.TensorPipeLayer.Params().Set(
      name='pipe', layers=layers, num_devices=2, num_micro_batches=2, batch_dim=batch_dim,
      check_batch_dim=False))


def TimeMajorBatchNormTask(batch_dim):
  """A time-major task on x [T, B, D]: FC, Lingvo BatchNormLayer, FC, BatchNormLayer, FC. Nothing
  but batch norm mixes positions, and it reduces over T and B alike, so only the input's example
  axis tells batch_dim=0 (micro-batches of time steps) from the right batch_dim=1. The batch_dim
  check is off: what is tested is the comparison, not the check inside the step."""
  dense = layer_helpers.DenseLayers(3, _DIM)

  def Norm(name):
    return bn_layers.BatchNormLayer.Params().Set(name=name, dim=_DIM,
                                                 add_stats_to_moving_average_variables=True)

  layers = [dense[0], Norm('bn0'), dense[1], Norm('bn1'), dense[2]]
  return PipelineTask.Params().Set(pipeline=layer_lib.TensorPipeLayer.Params().Set(
      name='pipe', layers=layers, num_devices=2, num_micro_batches=2, batch_dim=batch_dim,
      check_batch_dim=False))
