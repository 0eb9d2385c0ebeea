"""Partitions as graph functions: traced once, real re-computation, per-layer gradients, errors."""

import re

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import layers as lingvo_layers
from lingvo.core import py_utils
from lingvo.core import test_utils

from tests import layer_helpers
from tests import trace_helpers

K, M, L = 2, 4, 4


def _IsForwardMatMul(name):
  # Gradient ops are named in a scope '<op>_grad/' (a matmul's, or selective re-computation's
  # stand-in's for it).
  return '_grad/' not in name


class RecomputeCountTest(test_utils.TestCase):

  def _ForwardMatMuls(self, mode):
    with tf.Graph().as_default() as g, layer_helpers.Cluster(K):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(L), K, M, mode).Instantiate()
      out = net.FPropDefaultTheta(tf.ones([8, 8]))
      loss = tf.reduce_sum(out * out)
      grads = tf.gradients(loss, tf.trainable_variables(), colocate_gradients_with_ops=True)
      with layer_helpers.Session(g, K) as sess:
        sess.run(tf.global_variables_initializer())
        _, nodes = trace_helpers.TracedStep(sess, [loss, grads])
    return trace_helpers.CountByType(nodes, trace_helpers.MATMUL_TYPES, _IsForwardMatMul)

  def testForwardRunsTwiceWithAlwaysOnceWithNever(self):
    self.assertEqual(self._ForwardMatMuls('never'), L * M)
    self.assertEqual(self._ForwardMatMuls('always'), 2 * L * M)
    self.assertEqual(self._ForwardMatMuls('except_last'), 2 * L * M - L)

  def testSelectiveRunsNoForwardMatMulTwice(self):
    # The backward functions take the forward pass's matmul outputs: no MatMul of theirs runs but
    # the gradients' (see selective_recompute).
    self.assertEqual(self._ForwardMatMuls('selective'), L * M)


class NumericChecksTest(test_utils.TestCase):

  def testCheckNumericsRunsInTheForwardPassOnly(self):
    fcs = [lingvo_layers.FCLayer.Params().Set(name='fc%d' % i, input_dim=8, output_dim=8)
           for i in range(L)]
    with tf.Graph().as_default() as g, layer_helpers.Cluster(K):
      out = layer_helpers.Pipeline(fcs, K, M).Instantiate().FPropDefaultTheta(tf.ones([8, 8]))
      loss = tf.reduce_sum(out * out)
      grads = tf.gradients(loss, tf.trainable_variables(), colocate_gradients_with_ops=True)
      with layer_helpers.Session(g, K) as sess:
        sess.run(tf.global_variables_initializer())
        _, nodes = trace_helpers.TracedStep(sess, [loss, grads])
    checks = [name for _, name, op_type, _, _ in nodes if op_type == 'CheckNumerics']
    self.assertNotEmpty(checks)
    self.assertEmpty([c for c in checks if 'gradients' in c or 'recompute' in c])


def _Library(graph):
  """{function name: number of nodes} of the graph's function library."""
  return {f.signature.name: len(f.node_def) for f in graph.as_graph_def().library.function}


class TracedOnceTest(test_utils.TestCase):
  """Each partition's functions are traced once: the graph's functions do not change with M."""

  def _Build(self, num_micro):
    with tf.Graph().as_default() as g, layer_helpers.Cluster(K):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(L), K, num_micro).Instantiate()
      loss = tf.reduce_sum(tf.square(net.FPropDefaultTheta(tf.ones([16, 8]))))
      tf.gradients(loss, tf.trainable_variables(), colocate_gradients_with_ops=True)
      calls = [op for op in g.get_operations() if op.type.endswith('PartitionedCall')]
      return _Library(g), calls, len(g.get_operations())

  def testFunctionsDoNotGrowWithM(self):
    small, small_calls, small_ops = self._Build(2)
    large, large_calls, large_ops = self._Build(8)
    self.assertEqual(sorted(small.values()), sorted(large.values()))
    self.assertLen(small, 3 * K)  # forward, backward and zeros per partition
    for m, calls in ((2, small_calls), (8, large_calls)):
      names = sorted(re.sub(r'^.*(partition\d+_mb\d+/\w+)$', r'\1', op.name) for op in calls)
      self.assertEqual(names, sorted(['partition%d_mb%d/%s' % (k, t, kind) for k in range(K)
                                      for t in range(m) for kind in ('forward', 'backward')] +
                                     ['partition%d_mb%d/zeros' % (k, m - 1) for k in range(K)]))
      for op in calls:
        self.assertEqual(op.device, '/job:localhost/replica:0/task:0/device:CPU:%s' %
                         re.search(r'partition(\d+)_', op.name).group(1), op.name)
    self.assertLess((large_ops - small_ops) / (2 * K * 6), 12)  # a few ops per task, not per layer


class InPlaceUpdateTest(test_utils.TestCase):
  """Once a weight's summed gradient exists nothing reads it, so the update copies nothing."""

  def testUpdatesCopyNoWeight(self):
    params = layer_helpers.Pipeline(layer_helpers.DenseLayers(8, dim=256), K, M)
    for step_stats in trace_helpers.TracedSgdSteps(params, 1024, K):
      updates = [n for dev in step_stats.dev_stats for n in dev.node_stats
                 if re.fullmatch(r'AssignSubVariableOp(_\d+)?', n.node_name)]
      self.assertLen(updates, 8)
      copies = [n.node_name for n in updates
                if any(r.alloc_bytes > 0 for m in n.memory for r in m.allocation_records)]
      self.assertEmpty(copies)


class Conv(layer_helpers.Dense):
  """relu(conv2d(x as [batch, 2, 2, dim / 4], w) + b) as [batch, dim]: a convolution with bias."""

  def __init__(self, params):
    base_layer.BaseLayer.__init__(self, params)
    p = self.params
    self.CreateVariable('w', py_utils.WeightParams(
        [2, 2, p.dim // 4, p.dim // 4], py_utils.WeightInit.Gaussian(0.5, seed=p.seed)))
    self.CreateVariable('b', py_utils.WeightParams(
        [p.dim // 4], py_utils.WeightInit.Gaussian(0.5, seed=p.seed + 1)))

  def FProp(self, theta, x):
    p = self.params
    images = tf.reshape(x, [-1, 2, 2, p.dim // 4])
    y = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(images, theta.w, 1, 'SAME'), theta.b))
    return tf.reshape(y, [-1, p.dim])


class Loop(layer_helpers.Dense):
  """tanh(x w) applied twice in a tf.while_loop: weights read inside control flow."""

  def FProp(self, theta, x):
    return tf.while_loop(lambda i, _: i < 2, lambda i, h: (i + 1, tf.tanh(tf.matmul(h, theta.w))),
                         (0, x))[1]


def _Fc(name, seed, activation):
  return lingvo_layers.FCLayer.Params().Set(
      name=name, input_dim=8, output_dim=8, activation=activation,
      params_init=py_utils.WeightInit.Gaussian(0.5, seed=seed))


class WeightGradientTest(test_utils.TestCase):
  """The zero-bubble weight-gradient task re-creates only the ops that read weights."""

  def testWeightGradientsEqualTheReRunningSchedules(self):
    # FC with and without activation, a convolution, batch norm (gamma and beta read by a Mul and a
    # Sub), layer norm (read in a function call) and a while loop (both re-run).
    def Stack():
      return [_Fc('fc0', 1, 'TANH'), _Fc('fc1', 2, 'NONE'), Conv.Params().Set(name='conv', seed=3),
              lingvo_layers.BatchNormLayer.Params().Set(name='bn', dim=8),
              lingvo_layers.LayerNorm.Params().Set(name='ln', input_dim=8),
              Loop.Params().Set(name='loop', seed=5), _Fc('fc2', 6, 'RELU')]

    x = np.random.RandomState(0).normal(size=[8, 8]).astype(np.float32)
    results = layer_helpers.GradientsOfVariants(
        [(name, layer_helpers.Pipeline(Stack(), K, 2, name=name, schedule=name))
         for name in ('gpipe', 'zero_bubble')], lambda: (tf.constant(x),), num_devices=K)
    (want, _), (got, _) = results['gpipe'], results['zero_bubble']
    self.assertLen(got, 13)
    for name in want:
      self.assertAllClose(got[name], want[name], rtol=1e-6, atol=1e-7, msg=name)

  def testTheWeightGradientFunctionRunsNoForwardOp(self):
    num_layers = 3
    with tf.Graph().as_default() as g, layer_helpers.Cluster(1):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(num_layers), 1, M,
                             schedule='zero_bubble').Instantiate()
      loss = tf.reduce_sum(net.FPropDefaultTheta(tf.ones([8, 8])))
      grads = tf.gradients(loss, tf.trainable_variables(), colocate_gradients_with_ops=True)
      (weight,) = [f for f in g.as_graph_def().library.function
                   if 'weight_backward' in f.signature.name]
      with layer_helpers.Session(g, 1) as sess:
        sess.run(tf.global_variables_initializer())
        _, nodes = trace_helpers.TracedStep(sess, [loss, grads])
    # What the function's outputs are computed from (what TensorFlow runs of it): the weight
    # gradients' MatMuls, no Tanh, no forward MatMul.
    nodes_by_name = {n.name: n for n in weight.node_def}
    todo = [v.split(':')[0] for v in weight.ret.values()]
    live = set()
    while todo:
      name = todo.pop()
      if name in nodes_by_name and name not in live:
        live.add(name)
        todo.extend(x.lstrip('^').split(':')[0] for x in nodes_by_name[name].input)
    types = [nodes_by_name[n].op for n in live]
    self.assertNotIn('Tanh', types)
    matmuls = [n for n in live if nodes_by_name[n].op == 'MatMul']
    self.assertLen(matmuls, num_layers)
    self.assertTrue(all('MatMul_grad' in n for n in matmuls), matmuls)
    # Run: one forward MatMul per layer and micro-batch in the forward task, one in the
    # input-gradient task's re-computation, none in the weight-gradient task.
    self.assertEqual(trace_helpers.CountByType(nodes, trace_helpers.MATMUL_TYPES, _IsForwardMatMul),
                     2 * num_layers * M)


class RecomputeMemoryTest(test_utils.TestCase):
  """On a deep, narrow model 'always' keeps only boundary activations: a much lower peak."""

  def _PeakBytes(self, mode):
    with tf.Graph().as_default() as g, layer_helpers.Cluster(K):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(32, dim=64), K, 8, mode).Instantiate()
      out = net.FPropDefaultTheta(tf.random.uniform([8192, 64]))
      grads = tf.gradients(tf.reduce_mean(out), tf.trainable_variables(),
                           colocate_gradients_with_ops=True)
      norm = tf.add_n([tf.reduce_sum(x * x) for x in grads])
      with layer_helpers.Session(g, K) as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(norm)
        return layer_helpers.StepPeakBytes(lambda: sess.run(norm))[0]

  def testAlwaysPeaksFarBelowNever(self):
    never = self._PeakBytes('never')
    always = self._PeakBytes('always')
    # 'never' keeps a 2 MiB activation per layer (measured ~68 MiB above resident); 'always' ~16
    # MiB.
    self.assertGreater(never, 32 * 2**20)
    self.assertLess(always, 0.5 * never, 'always %d vs never %d bytes' % (always, never))


if __name__ == '__main__':
  test_utils.main()
