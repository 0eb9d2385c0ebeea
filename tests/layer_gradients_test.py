"""Layer-by-layer gradients: the same as tf.gradients of the whole chain, one layer at a time."""

import re

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe import layer_gradients
from tests import layer_helpers
from tests import trace_helpers

K = 2  # Partitions of the pipelines below.

_RNG = np.random.RandomState(0)
X = _RNG.normal(size=[2, 3]).astype(np.float32)
W0 = _RNG.normal(size=[3, 4]).astype(np.float32)
W2 = _RNG.normal(size=[4, 5]).astype(np.float32)
DY = _RNG.normal(size=[2, 5]).astype(np.float32)
SUM0 = _RNG.normal(size=[3, 4]).astype(np.float32)
SUM2 = _RNG.normal(size=[4, 5]).astype(np.float32)
NUM_LAYERS = 3


def _RunLayer(j, theta, inputs):
  """Layer j of the chain. Layer 0: (x w0, ids) (ids an int passed through); layer 1: (tanh(h),
  None), no weights; layer 2: h w2. theta = [w0, step (an int weight), w2]."""
  w0, _, w2 = theta
  if j == 0:
    x, ids = inputs
    return (tf.matmul(x, w0), ids)
  if j == 1:
    h, _ = inputs
    return (tf.tanh(h), None)
  h, absent = inputs
  assert absent is None, absent
  return tf.matmul(h, w2)


class _Chain:
  """The chain built in the default graph: its boundaries, each layer's ops and its weights."""

  def __init__(self):
    graph = tf.get_default_graph()
    self.x, self.ids = tf.constant(X), tf.constant([1, 2])
    self.theta = [tf.constant(W0, name='w0'), tf.constant(7, name='step'),
                  tf.constant(W2, name='w2')]
    self.dy = tf.constant(DY)
    self.boundaries = [(self.x, self.ids)]
    self.layer_ops = []
    out = self.boundaries[0]
    for j in range(NUM_LAYERS):
      first = len(graph.get_operations())
      out = _RunLayer(j, self.theta, out)
      self.layer_ops.append(('layer%d' % j, graph.get_operations()[first:]))
      self.boundaries.append(out)
    self.y = out

  def Sums(self):
    """Running sums for the differentiable weights (a buffer each, as accumulation wants)."""
    return [tf.raw_ops.DeepCopy(x=tf.constant(SUM0)), None,
            tf.raw_ops.DeepCopy(x=tf.constant(SUM2))]

  def Expected(self):
    """tf.gradients of the whole chain: dx, dw0, dw2."""
    return tf.gradients(self.y, [self.x, self.theta[0], self.theta[2]], grad_ys=self.dy)


class LayerGradientsTest(test_utils.TestCase):

  def testEqualsTheGradientsOfTheComposition(self):
    graph = tf.Graph()
    with graph.as_default():
      chain = _Chain()
      sums = chain.Sums()
      grads, total = layer_gradients.LayerGradients(chain.boundaries, [chain.dy], chain.theta, sums)
      self.assertLen(grads, NUM_LAYERS + 1)
      self.assertEqual([len(g) for g in grads], [2, 2, 2, 1])
      self.assertIsNone(grads[0][1])  # The int ids have no gradient,
      self.assertIsNone(grads[1][1])
      self.assertIsNone(grads[2][1])  # nor has an absent leaf.
      self.assertIs(grads[3][0], chain.dy)
      self.assertIsNone(total[1])  # The int weight has no sum.
      self.assertIsNot(total[0], sums[0])
      self.assertIsNot(total[2], sums[2])
      with self.session(graph=graph) as sess:
        (dx, dw0, dw2), (got_dx, got0, got2) = sess.run(
            [chain.Expected(), [grads[0][0], total[0], total[2]]])
    self.assertAllClose(got_dx, dx)
    self.assertAllClose(got0, SUM0 + dw0)
    self.assertAllClose(got2, SUM2 + dw2)

  def testASumWithoutAGradientComesBackAsItWent(self):
    with tf.Graph().as_default():
      chain = _Chain()
      unused = tf.constant(np.ones([3, 3], np.float32), name='unused')
      sums = chain.Sums() + [tf.raw_ops.DeepCopy(x=tf.zeros([3, 3]))]
      _, total = layer_gradients.LayerGradients(chain.boundaries, [chain.dy],
                                                chain.theta + [unused], sums)
      self.assertIs(total[3], sums[3])  # How a partition tells which weights got gradients.
      self.assertIsNot(total[0], sums[0])

  def testWithoutSumsInputGradientsOnly(self):
    graph = tf.Graph()
    with graph.as_default():
      chain = _Chain()
      grads, total = layer_gradients.LayerGradients(chain.boundaries, [chain.dy], chain.theta)
      self.assertIsNone(total)
      self.assertEmpty([op for op in graph.get_operations() if op.type == 'InplaceAdd'])
      with self.session(graph=graph) as sess:
        dx, got_dx = sess.run([chain.Expected()[0], grads[0][0]])
    self.assertAllClose(got_dx, dx)


class AddWeightGradientsTest(test_utils.TestCase):

  def testAddsIntoTheSumsAndSkipsNonDifferentiableWeights(self):
    graph = tf.Graph()
    with graph.as_default():
      theta = [tf.ones([2]), tf.constant(3), tf.ones([2])]
      total = [tf.raw_ops.DeepCopy(x=tf.constant([1.0, 2.0])), None,
               tf.raw_ops.DeepCopy(x=tf.constant([5.0, 6.0]))]
      first, last = total[0], total[2]
      # One gradient per differentiable weight: the int weight takes none.
      added = layer_gradients.AddWeightGradients(total, [tf.constant([10.0, 20.0]), None], theta)
      self.assertLen(added, 1)
      self.assertIs(added[0], total[0])
      self.assertIsNot(total[0], first)
      self.assertIs(total[2], last)  # No gradient, no addition.
      self.assertIsNone(total[1])
      with self.session(graph=graph) as sess:
        self.assertAllEqual(sess.run(total[0]), [11.0, 22.0])

  def testNoRunningSumIsNamed(self):
    with tf.Graph().as_default():
      theta = [tf.ones([2], name='first'), tf.ones([2], name='orphan')]
      total = [tf.zeros([2]), None]
      with self.assertRaisesRegex(AssertionError, r'no running sum for weight 1 \(orphan:0\)'):
        layer_gradients.AddWeightGradients(total, [None, tf.ones([2])], theta)


def _Split(chain):
  """An input-gradient pass of `chain` and what it keeps: (kept, layout, its shared tensors)."""
  shared = [chain.x, chain.ids] + chain.theta + [chain.dy]
  reads = layer_gradients.WeightReads(chain.boundaries, chain.layer_ops, chain.theta)
  grads, read_grads = layer_gradients.InputGradients(
      chain.boundaries, [chain.dy], layer_gradients.ReadOutputs(reads, len(chain.layer_ops)))
  kept, layout = layer_gradients.Keep(chain.boundaries, grads, reads, read_grads, shared)
  return kept, layout, shared


def _WeightPass(chain, sums, run_layer=None):
  """The weight-gradient pass of `chain` on its kept and shared tensors as arguments (no path
  back to the weights, stop_gradient standing for the function boundary)."""
  kept, layout, shared = _Split(chain)
  arguments = lambda ts: [tf.stop_gradient(t) if layer_gradients.IsDifferentiable(t) else t
                          for t in ts]
  shared = arguments(shared[:2]) + chain.theta + arguments(shared[-1:])
  run_layer = run_layer or (lambda j, xs: _RunLayer(j, chain.theta, xs))
  return layer_gradients.WeightGradients(layout, arguments(kept), shared, run_layer, chain.theta,
                                         sums)


class KeepTest(test_utils.TestCase):

  def testKeepsOnlyWhatTheReadingOpsWeightGradientsNeed(self):
    with tf.Graph().as_default():
      chain = _Chain()
      kept, layout, shared = _Split(chain)
      # Layer 1 reads no weights. Layers 0 and 2 read theirs in a MatMul, whose weight gradient
      # needs its other input (layer 0's is the partition's input, shared) and the gradient at
      # its output.
      self.assertEqual([layer.j for layer in layout.layers], [0, 2])
      for layer in layout.layers:
        self.assertIsInstance(layer, layer_gradients.RereadLayer)
        self.assertEqual([op.type for op, _, _ in layer.ops], ['MatMul'])
      (_, ins0, dzs0), = layout.layers[0].ops
      (_, ins2, dzs2), = layout.layers[1].ops
      self.assertEqual(ins0, (('shared', 0), ('weights', chain.theta[0])))
      self.assertEqual(ins2, (('kept', 2), ('weights', chain.theta[2])))
      self.assertEqual((dzs0, dzs2), ((('kept', 0),), (('kept', 1),)))
      self.assertLen(kept, 3)
      self.assertIs(kept[2], chain.boundaries[2][0])
      self.assertEqual(layout.shared, tuple(shared))

  def testKeepsATensorOnce(self):
    with tf.Graph().as_default():
      x = tf.constant(X)
      theta = [tf.constant(W0), tf.constant(W0 + 1)]
      first = len(tf.get_default_graph().get_operations())
      y = tf.matmul(x, theta[0]) * tf.matmul(x, theta[1])
      boundaries = [x, tf.identity(y)]
      ops = tf.get_default_graph().get_operations()[first:]
      reads = layer_gradients.WeightReads(boundaries, [('layer', ops)], theta)
      grads, read_grads = layer_gradients.InputGradients(
          boundaries, [tf.ones([2, 4])], layer_gradients.ReadOutputs(reads, 1))
      kept, layout = layer_gradients.Keep(boundaries, grads, reads, read_grads, theta)
      self.assertLen(layout.layers[0].ops, 2)
      self.assertLen([t for t in kept if t is x], 1)  # Both MatMuls' input, kept once.
      self.assertLen(kept, 3)


class WeightGradientsTest(test_utils.TestCase):

  def testEqualsTheGradientsWithRespectToTheWeightsWithoutReRunningLayers(self):
    graph = tf.Graph()
    with graph.as_default():
      chain = _Chain()
      sums = chain.Sums()
      run = []
      total = _WeightPass(chain, sums, lambda j, xs: run.append(j))
      self.assertEmpty(run)  # Every layer's weights are read by MatMuls alone.
      self.assertIsNone(total[1])
      with self.session(graph=graph) as sess:
        (_, dw0, dw2), got0, got2 = sess.run([chain.Expected(), total[0], total[2]])
    self.assertAllClose(got0, SUM0 + dw0)
    self.assertAllClose(got2, SUM2 + dw2)

  def testSumsAreRunningSumsOverMicroBatches(self):
    # Two micro-batches' weight-gradient passes, each adding to the sums the other handed on.
    graph = tf.Graph()
    with graph.as_default():
      chains = [_Chain(), _Chain()]
      total = chains[0].Sums()
      for chain in chains:
        total = _WeightPass(chain, total)
      with self.session(graph=graph) as sess:
        (_, dw0, dw2), got0, got2 = sess.run([chains[0].Expected(), total[0], total[2]])
    self.assertAllClose(got0, SUM0 + 2 * dw0)
    self.assertAllClose(got2, SUM2 + 2 * dw2)

  def _Layer(self, fn, x_shape, w, feed):
    """(weight-gradient pass of the one-layer chain fn(x, w) -> y, its plain gradient, the layout),
    with x fed `feed` through a placeholder of `x_shape`, y's gradient 1 + y."""
    x = tf.placeholder_with_default(feed, x_shape)
    theta = [tf.constant(w)]
    first = len(tf.get_default_graph().get_operations())
    y = fn(x, theta[0])
    ops = tf.get_default_graph().get_operations()[first:]
    dy = tf.stop_gradient(1.0 + y)
    boundaries = [x, y]
    reads = layer_gradients.WeightReads(boundaries, [('layer', ops)], theta)
    grads, read_grads = layer_gradients.InputGradients(
        boundaries, [dy], layer_gradients.ReadOutputs(reads, 1))
    shared = [tf.stop_gradient(x)] + theta + [dy]
    kept, layout = layer_gradients.Keep(boundaries, grads, reads, read_grads, shared)
    run_layer = lambda j, inputs: fn(inputs, theta[0])
    sums = [tf.raw_ops.DeepCopy(x=tf.zeros_like(theta[0]))]
    total = layer_gradients.WeightGradients(layout, [tf.stop_gradient(t) for t in kept], shared,
                                            run_layer, theta, sums)
    return total[0], tf.gradients(y, theta[0], grad_ys=dy)[0], layout

  def testAStandInOfRunTimeShapeForAnInputOnlyItsShapeIsNeeded(self):
    graph = tf.Graph()
    with graph.as_default():
      # The bias add's weight gradient sums over a dimension known only at run time.
      got, want, layout = self._Layer(lambda x, w: tf.tanh(tf.matmul(x, w) + w[0]), [None, 3], W0,
                                      X)
      (layer,) = layout.layers
      stand_ins = [s for _, ins, _ in layer.ops for s in ins if s[0] == 'stand_in']
      self.assertLen(stand_ins, 1)
      self.assertIsNotNone(stand_ins[0][3])  # Its shape, kept.
      with self.session(graph=graph) as sess:
        got, want = sess.run([got, want])
    self.assertAllClose(got, want)

  def testALayerWhoseWeightsGoThroughControlFlowIsReRun(self):
    def Loop(x, w):
      return tf.while_loop(lambda i, _: i < 2, lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))),
                           (0, x))[1]

    graph = tf.Graph()
    with graph.as_default():
      got, want, layout = self._Layer(Loop, [2, 3], W0[:, :3], X)
      (layer,) = layout.layers
      self.assertIsInstance(layer, layer_gradients.RerunLayer)
      with self.session(graph=graph) as sess:
        got, want = sess.run([got, want])
    self.assertAllClose(got, want)


class LayerOrderTest(test_utils.TestCase):
  """Inside a backward call, layer j's backward pass starts after layer j + 1's weight gradients
  have been added to their sums (so neither output nor weight gradients pile up)."""

  def testEachLayerWaitsForTheSumsOfTheLayerAfterIt(self):
    num_layers, per_partition, num_micro = 8, 4, 3
    with tf.Graph().as_default() as g, layer_helpers.Cluster(K):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(num_layers, dim=32), K,
                                   num_micro).Instantiate()
      loss = tf.reduce_sum(tf.square(net.FPropDefaultTheta(tf.ones([24, 32]))))
      grads = tf.gradients(loss, tf.trainable_variables(), colocate_gradients_with_ops=True)
      with layer_helpers.Session(g, K) as sess:
        sess.run(tf.global_variables_initializer())
        _, nodes = trace_helpers.TracedStep(sess, [loss, grads])
    checked = 0
    for partition in range(K):
      device = 'CPU:%d' % partition
      mine = [n for n in nodes if n[0].endswith(device)]
      calls = sorted((start, end) for _, name, _, start, end in mine
                     if re.search(r'partition%d_mb\d+/backward$' % partition, name))
      self.assertLen(calls, num_micro)
      for start, end in calls:
        inside = [n for n in mine if start <= n[3] and n[4] <= end]
        adds = sorted(n[4] for n in inside if n[2] == 'InplaceAdd')
        self.assertLen(adds, per_partition)  # One weight per layer.
        for j in range(partition * per_partition, (partition + 1) * per_partition - 1):
          backward = [n[3] for n in inside if re.search(r'/layer%d/\w+_grad/' % j, n[1])]
          added = [n[4] for n in inside if n[2] == 'InplaceAdd' and n[4] <= min(backward)]
          # Every later layer of the partition has added its gradient before layer j's backward
          # starts.
          self.assertGreaterEqual(len(added), (partition + 1) * per_partition - 1 - j,
                                  (partition, j))
          checked += 1
    self.assertEqual(checked, K * (per_partition - 1) * num_micro)


if __name__ == '__main__':
  tf.test.main()
