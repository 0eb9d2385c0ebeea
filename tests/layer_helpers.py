"""Small Lingvo layers and session helpers shared by the TensorPipe tests: dense layers, pipelines
of them, sessions on logical CPU devices, gradients of a model and of its variants."""

import os

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import builder_layers
from lingvo.core import cluster_factory
from lingvo.core import py_utils

from tensorpipe import layer as layer_lib
from tensorpipe import placement

class Dense(base_layer.BaseLayer):
  """y = tanh(x w): cheap, with one MatMul per forward pass (easy to count in step stats)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 8, 'Input and output width.')
    p.Define('seed', 0, 'Seed of the weight initialiser.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable('w', py_utils.WeightParams(
        [p.dim, p.dim], py_utils.WeightInit.Gaussian(1.0 / np.sqrt(p.dim), seed=p.seed)))

  def FProp(self, theta, x):
    with tf.name_scope(self.params.name):
      return tf.tanh(tf.matmul(x, theta.w))

  @classmethod
  def FPropMeta(cls, p, x):
    return py_utils.NestedMap(flops=2 * x.num_elements() * p.dim, out_shapes=(x,))


class MaskedDense(Dense):
  """Dense on NestedMap(vec, paddings, ids, extra=None): transforms vec, passes the rest through."""

  def FProp(self, theta, inputs):
    with tf.name_scope(self.params.name):
      vec = tf.tanh(tf.matmul(inputs.vec, theta.w)) * (1.0 - inputs.paddings)
      return py_utils.NestedMap(vec=vec, paddings=inputs.paddings, ids=inputs.ids, extra=None)


def DenseLayers(num_layers, dim=8, cls=Dense):
  return [cls.Params().Set(name='layer%d' % i, dim=dim, seed=100 + i) for i in range(num_layers)]


def Pipeline(layers, num_devices, num_micro_batches, recompute='always', name='pipe', **kwargs):
  return layer_lib.TensorPipeLayer.Params().Set(
      name=name, layers=layers, num_devices=num_devices,
      num_micro_batches=num_micro_batches, recompute=recompute, **kwargs)


def Plain(layers, name='pipe'):
  """The same layers, unpipelined (variables named like TensorPipeLayer's: pipe/<layer>/...)."""
  return builder_layers.SequentialLayer.Params().Set(name=name, sub=layers)


def Cluster(num_devices):
  return cluster_factory.ForTestingWorker(cpus=num_devices, split_size=num_devices)


def StepPeakBytes(run):
  """Peak CPU allocator bytes of `run()` above what was allocated before it (earlier tests in the
  process may hold memory), and what `run()` returned. All logical CPU devices share the allocator.

  Needs an allocator that keeps statistics: the root conftest.py sets TF_CPU_ALLOCATOR_USE_BFC=true
  before TensorFlow is imported (TensorFlow 2.13 keeps none without oneDNN)."""
  try:
    tf.config.experimental.reset_memory_stats('CPU:0')
  except ValueError as e:
    raise AssertionError(
        'the CPU allocator keeps no statistics (%s): TF_CPU_ALLOCATOR_USE_BFC=%r; set '
        'TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow is imported (the root conftest.py does)'
        % (e, os.environ.get('TF_CPU_ALLOCATOR_USE_BFC'))) from e
  before = tf.config.experimental.get_memory_info('CPU:0')['current']
  value = run()
  return tf.config.experimental.get_memory_info('CPU:0')['peak'] - before, value


def Session(graph, num_devices, intra_op_threads=None, inter_op_threads=None):
  return tf.Session(graph=graph, config=placement.SessionConfig(
      num_devices, intra_op_threads, inter_op_threads))


def Gradients(params, inputs_fn, num_devices=4, loss_fn=None, seed=None):
  """Builds `params`, runs one forward/backward pass; returns {var name: gradient} and outputs.
  `seed`: the graph's random seed, if set."""
  graph = tf.Graph()
  with graph.as_default(), Cluster(num_devices):
    if seed is not None:
      tf.random.set_seed(seed)
    net = params.Instantiate()
    inputs = inputs_fn()
    out = net.FPropDefaultTheta(*inputs)
    loss = loss_fn(out) if loss_fn else tf.reduce_mean(out)
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    with Session(graph, num_devices) as sess:
      sess.run(tf.global_variables_initializer())
      values, loss_value = sess.run([grads, loss])
  return {v.op.name: g for v, g in zip(variables, values)}, loss_value


def ValuesOnlyConfig(num_devices):
  """A session config for `num_devices` devices without grappler's rewrites.

  For tests that compare values only: optimising a many-variant graph before its single run would
  take most of the test's time. Tests of what training runs (placement, memory, schedules) keep the
  default config.
  """
  config = placement.SessionConfig(num_devices)
  config.graph_options.rewrite_options.disable_meta_optimizer = True
  return config


def GradientsOfVariants(variants, inputs_fn, loss_fn=None, num_devices=4, grappler=False):
  """As Gradients for each (name, params) of `variants`, all in one graph and one run.

  Building and running the variants together saves a session (and its graph optimisation) per
  variant, which is most of the time of a small model's check. Each params must be named `name`, so
  its variables are distinct from the others'; they are still initialised identically, since every
  layer here seeds its initialiser explicitly. Each variant gets its own inputs (so gradient
  construction never walks another variant's ops). `grappler`: run with TensorFlow's graph
  optimiser, as training does (slower to start; the paper's test keeps it on).

  Returns:
    {name: ({variable name below name/: gradient}, loss)}.
  """
  graph = tf.Graph()
  fetches = {}
  with graph.as_default(), Cluster(num_devices):
    for name, params in variants:
      assert params.name == name, (params.name, name)
      out = params.Instantiate().FPropDefaultTheta(*inputs_fn())
      loss = loss_fn(out) if loss_fn else tf.reduce_mean(out)
      variables = [v for v in tf.trainable_variables() if v.op.name.startswith(name + '/')]
      grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
      fetches[name] = ({v.op.name[len(name) + 1:]: g for v, g in zip(variables, grads)}, loss)
    config = (placement.SessionConfig(num_devices) if grappler else
              ValuesOnlyConfig(num_devices))
    with tf.Session(graph=graph, config=config) as sess:
      sess.run(tf.global_variables_initializer())
      return sess.run(fetches)


def MaxRelativeError(grads, reference):
  """max over variables of |g - g_ref| / |g_ref| (Frobenius norms)."""
  assert sorted(grads) == sorted(reference), (sorted(grads), sorted(reference))
  return max(np.linalg.norm(grads[k] - reference[k]) / np.linalg.norm(reference[k]) for k in grads)


def StepWithBatchNormUpdates(params, inputs_fn, num_devices=4, loss_fn=None):
  """One forward/backward pass that also runs the registered batch-norm updates.

  Returns ({trainable var name: gradient}, {moving-average var name: value after the step}, the
  number of registered batch-norm updates, the number of those Lingvo finds relevant to the loss).
  """
  graph = tf.Graph()
  with graph.as_default(), Cluster(num_devices):
    tf.random.set_seed(1234)  # Lingvo then seeds unseeded variables from their names.
    net = params.Instantiate()
    out = net.FPropDefaultTheta(*inputs_fn())
    loss = loss_fn(out) if loss_fn else tf.reduce_mean(tf.square(out - 0.5))
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    updates = tf.get_collection(py_utils.BATCH_NORM_UPDATES)
    relevant, _ = py_utils.FindRelevantBatchNormUpdates(loss, updates)
    moving = [v for v in tf.global_variables() if 'moving_' in v.op.name]
    # Values only: grappler's rewrites would take most of the time on these 10k-op graphs.
    with tf.Session(graph=graph, config=ValuesOnlyConfig(num_devices)) as sess:
      sess.run(tf.global_variables_initializer())
      grad_values, _ = sess.run([grads, updates])
      moving_values = sess.run(moving)
  return ({v.op.name: g for v, g in zip(variables, grad_values)},
          {v.op.name: m for v, m in zip(moving, moving_values)}, len(updates), len(relevant))
