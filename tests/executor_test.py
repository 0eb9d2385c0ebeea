"""Executor: one op per action, the executed step follows the schedule's edges, gradients flow."""

import re

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import cluster_factory
from lingvo.core import test_utils

from tensorpipe.measure import profiling
from tensorpipe import schedule
from tensorpipe import schedule_builders
from tests import layer_helpers

DIM = 8


class SquaredNorm(base_layer.BaseLayer):
  """Per-example losses: |x|^2 over the last axis (so a schedule may run backward passes early)."""

  def FProp(self, theta, x):
    return tf.reduce_sum(tf.square(x), axis=-1)


def _WithLoss(layers):
  return layers + [SquaredNorm.Params().Set(name='loss')]


_KINDS = {'forward': schedule.FORWARD, 'backward': schedule.BACKWARD, 'weight': schedule.WEIGHT}


def _Action(name):
  """The schedule.Action a call op named '.../partition<k>_mb<t>/forward|backward|weight' runs, else
  None."""
  match = re.search(r'partition(\d+)_mb(\d+)/(forward|backward|weight)$', name)
  if not match:
    return None
  return schedule.Action(_KINDS[match.group(3)], int(match.group(1)), int(match.group(2)))


class ExecutedOrderTest(test_utils.TestCase):
  """Every edge of the schedule holds in a traced step: the later action's op starts after the
  earlier one's has ended."""

  def _Check(self, k, m, overlap, schedule_name='gpipe'):
    with tf.Graph().as_default() as g, layer_helpers.Cluster(k):
      params = layer_helpers.Pipeline(_WithLoss(layer_helpers.DenseLayers(2 * k, dim=64)), k, m,
                                forward_overlap=overlap, schedule=schedule_name)
      net = params.Instantiate()
      loss = tf.reduce_mean(net.FPropDefaultTheta(tf.random.uniform([16 * m, 64])))
      grads = tf.gradients(loss, tf.trainable_variables(), colocate_gradients_with_ops=True)
      sched = net.Schedule(16 * m)
      with layer_helpers.Session(g, k, intra_op_threads=1, inter_op_threads=2) as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(2):
          # The loss needs the last partition's F.
          _, meta = profiling.TracedRun(sess, [grads, loss])
          spans = {}
          for dev in meta.step_stats.dev_stats:
            for n in dev.node_stats:
              action = _Action(n.node_name)
              if action:
                self.assertNotIn(action, spans)
                self.assertTrue(dev.device.endswith('CPU:%d' % action.partition),
                                (action, dev.device))
                spans[action] = (n.all_start_micros, n.all_start_micros + n.all_end_rel_micros)
          self.assertEqual(sorted(spans), sorted(a for acts in sched.device_actions for a in acts))
          for edge in sched.edges:
            self.assertGreaterEqual(spans[edge.after][0], spans[edge.before][1],
                                    'rule %d: %s after %s' % (edge.rule, edge.after, edge.before))
    return sched

  def testFillDrainWithAndWithoutForwardOverlap(self):
    for overlap, lag in ((True, 2), (False, 1)):
      sched = self._Check(3, 4, overlap)
      self.assertEqual({e.before.micro_batch for e in sched.edges if e.rule == 2},
                       set(range(4 - lag)))
      self.assertTrue(all(e.after.micro_batch - e.before.micro_batch == lag
                          for e in sched.edges if e.rule == 2))


  def testOneFOneB(self):
    for overlap in (True, False):
      sched = self._Check(3, 5, overlap, '1f1b')
      self.assertIn(8, {e.rule for e in sched.edges})  # Forward passes wait for backward ones.

  def testZeroBubble(self):
    sched = self._Check(3, 5, True, 'zero_bubble')
    self.assertEqual({e.rule for e in sched.edges}, {1, 2, 4, 6, 8, 9, 10, 11, 12, 13})


class SchedulesTest(test_utils.TestCase):
  """Every schedule gives the plain model's gradients; each refuses what it cannot run."""

  @pytest.mark.slow
  def testGradientsIdenticalAcrossSchedules(self):
    layers = _WithLoss(layer_helpers.DenseLayers(4, dim=DIM))
    variants = [('plain', layer_helpers.Plain(layers, name='plain'))]
    cases = []
    for k in (1, 2, 4):
      for m in (1, 4, 8, 16):
        for name in schedule_builders.SCHEDULES:
          modes = (('always', 'except_last', 'never', 'selective')
                   if (k, m) == (2, 4) and name != 'zero_bubble' else ('always',))
          for mode in modes:
            cases.append((k, m, name, mode))
            variants.append(('K%d_M%d_%s_%s' % cases[-1], layer_helpers.Pipeline(
                layers, k, m, mode, schedule=name, name='K%d_M%d_%s_%s' % cases[-1])))
    self.assertLen(cases, 3 * 4 * 3 + 2 * 3)
    x = np.random.RandomState(2).normal(size=[32, DIM]).astype(np.float32)
    results = layer_helpers.GradientsOfVariants(variants, lambda: (tf.constant(x),))
    plain, _ = results['plain']
    for case in cases:
      grads, _ = results['K%d_M%d_%s_%s' % case]
      self.assertLess(layer_helpers.MaxRelativeError(grads, plain), 1e-5, case)

  def testRefusesALossOfTheJoinedOutputs(self):
    for name, shown in (('1f1b', '1F1B'), ('zero_bubble', 'zero-bubble')):
      for batch in (8, None):
        with tf.Graph().as_default(), layer_helpers.Cluster(2):
          net = layer_helpers.Pipeline(layer_helpers.DenseLayers(2, dim=DIM), 2, 4,
                                 schedule=name).Instantiate()
          x = tf.placeholder_with_default(np.ones([8, DIM], np.float32), [batch, DIM])
          out = net.FPropDefaultTheta(x)
          loss = tf.reduce_mean(tf.nn.softmax(out)[:, 0])  # Each row's gradient needs every output.
          with self.assertRaisesRegex(
              ValueError, r"TensorPipeLayer 'pipe': the %s K=2, M=4 schedule .* may depend on "
              r"their shapes but not on their values; it depends on the values of outputs through "
              r"op '.*Softmax.*'.*per-example losses inside the pipeline" % shown):
            tf.gradients(loss, tf.trainable_variables())

  def testZeroBubbleNeedsRecomputation(self):
    for mode in ('never', 'except_last'):
      with self.assertRaisesRegex(ValueError, r"TensorPipeLayer 'pipe': schedule='zero_bubble' "
                                  r"needs recompute='always', got recompute='%s'" % mode):
        with layer_helpers.Cluster(2):
          layer_helpers.Pipeline(layer_helpers.DenseLayers(2), 2, 4, mode, schedule='zero_bubble').Instantiate()

  def testLossLayerTakesInputsAndLossInputs(self):
    with tf.Graph().as_default(), layer_helpers.Cluster(2):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(2, dim=DIM), 2, 4, schedule='1f1b',
                             loss_layer=SquaredNorm.Params().Set(name='sq')).Instantiate()
      self.assertEqual(net.partition_layer_names, [['layer0'], ['layer1', 'sq']])
      with self.assertRaisesRegex(ValueError, r"with a loss_layer, FProp takes \(inputs, "
                                  r"loss_inputs\); got 1 arguments"):
        net.FPropDefaultTheta(tf.random.uniform([8, DIM]))

  def testUnknownSchedule(self):
    with self.assertRaisesRegex(
        ValueError, r"schedule='zb' is not one of \('gpipe', '1f1b', 'zero_bubble', "
        r"'interleaved_1f1b', 'zbv'\)"):
      with layer_helpers.Cluster(2):
        layer_helpers.Pipeline(layer_helpers.DenseLayers(2), 2, 4, schedule='zb').Instantiate()


class TokenDense(layer_helpers.Dense):
  """tanh(x w) over the last axis of x [..., dim]."""

  def FProp(self, theta, x):
    return tf.tanh(tf.einsum('...i,ij->...j', x, theta.w))


class RunTimeShapesTest(test_utils.TestCase):
  """With batch and sequence sizes known only when the graph runs, the sum or mean of per-example
  (or per-token) outputs trains every schedule exactly: the loss gradient's shape reads do not wait
  for the forward passes."""

  LOSSES = {
      'sum_over_batch': lambda out: tf.reduce_sum(out) / tf.cast(tf.shape(out)[0], tf.float32),
      'mean': tf.reduce_mean,
      'mean_over_tokens': lambda out: tf.reduce_mean(tf.reduce_mean(out, axis=1)),
  }

  @pytest.mark.slow
  def testSumsAndMeansTrainEveryScheduleExactly(self):
    # 7 examples of 5 tokens, both sizes unknown when the graph is built; M = 3 gives 3 + 2 + 2.
    x = np.random.RandomState(7).normal(size=[7, 5, DIM]).astype(np.float32)
    layers = [TokenDense.Params().Set(name='layer%d' % i, dim=DIM, seed=i) for i in range(3)] + [
        SquaredNorm.Params().Set(name='loss')]

    def Inputs():
      return (tf.placeholder_with_default(x, [None, None, DIM]),)

    # Every K with the mean; one K each for the others (the same mechanism, other shape reads).
    for loss_name, ks in (('mean', (1, 2, 3)), ('sum_over_batch', (2,)), ('mean_over_tokens', (3,))):
      loss_fn = self.LOSSES[loss_name]
      variants = [('plain', layer_helpers.Plain(layers, name='plain'))]
      for k in ks:
        for sched in schedule_builders.SCHEDULES:
          name = 'K%d_%s' % (k, sched)
          variants.append((name, layer_helpers.Pipeline(layers, k, 3, schedule=sched, name=name)))
      results = layer_helpers.GradientsOfVariants(variants, Inputs, loss_fn)
      plain, plain_loss = results.pop('plain')
      for name, (grads, loss) in sorted(results.items()):
        self.assertLess(layer_helpers.MaxRelativeError(grads, plain), 1e-5, (loss_name, name))
        self.assertAllClose(loss, plain_loss, rtol=1e-6)

  def testEarlyShapesAreReadBeforeTheLastForwardPass(self):
    """The loss gradient no longer depends on any forward pass but the first micro-batch's."""
    with tf.Graph().as_default() as g, layer_helpers.Cluster(2):
      layers = [TokenDense.Params().Set(name='layer%d' % i, dim=DIM, seed=i) for i in range(2)]
      net = layer_helpers.Pipeline(layers + [SquaredNorm.Params().Set(name='loss')], 2, 4,
                             schedule='1f1b').Instantiate()
      out = net.FPropDefaultTheta(tf.placeholder(tf.float32, [None, None, DIM]))
      loss = tf.reduce_mean(out)
      tf.gradients(loss, tf.trainable_variables())
      stand_ins = [op for op in g.get_operations() if op.name.endswith('_shape_stand_in')]
      checks = [op for op in g.get_operations() if 'read early differs' in str(op.node_def)]
    self.assertTrue(stand_ins)
    self.assertTrue(checks)


class GradientFlowTest(test_utils.TestCase):
  """Gradients reach the pipeline's inputs and any subset of its weights, as in the plain model."""

  _TARGETS = ((True, []), (False, [0, 4]), (True, [2]))  # (wrt inputs, indices of weights)

  def _Grads(self, variants):
    """{name: [gradients for each of _TARGETS]} for each (name, params) of `variants`.

    One graph and one session.run for all (grappler off: values only); each params is named `name`
    and has its own inputs, and each target set gets its own tf.gradients call.
    """
    with tf.Graph().as_default() as g, layer_helpers.Cluster(3):
      fetches = {}
      for name, params in variants:
        assert params.name == name, (params.name, name)
        net = params.Instantiate()
        rng = np.random.RandomState(7)
        x = tf.constant(rng.uniform(-1, 1, size=[12, DIM]).astype(np.float32))
        scale = tf.constant(1.5)
        out = net.FPropDefaultTheta(x * scale)
        loss = tf.reduce_sum(tf.square(out))
        variables = [v for v in tf.trainable_variables() if v.op.name.startswith(name + '/')]
        fetches[name] = []
        for wrt_inputs, wrt_vars in self._TARGETS:
          targets = ([x, scale] if wrt_inputs else []) + [variables[i] for i in wrt_vars]
          fetches[name].append(tf.gradients(loss, targets, colocate_gradients_with_ops=True))
      with tf.Session(graph=g, config=layer_helpers.ValuesOnlyConfig(3)) as sess:
        sess.run(tf.global_variables_initializer())
        return sess.run(fetches)

  def testInputAndPartialWeightGradientsEqualPlain(self):
    modes = ('always', 'except_last', 'never')
    results = self._Grads([('plain', layer_helpers.Plain(layer_helpers.DenseLayers(5), name='plain'))] +
                          [(mode, layer_helpers.Pipeline(layer_helpers.DenseLayers(5), 3, 4, mode, name=mode))
                           for mode in modes])
    for mode in modes:
      for (wrt_inputs, wrt_vars), piped, plain in zip(self._TARGETS, results[mode],
                                                      results['plain']):
        self.assertLen(piped, (2 if wrt_inputs else 0) + len(wrt_vars))
        self.assertLen(plain, len(piped))
        for a, b in zip(piped, plain):
          self.assertAllClose(a, b, rtol=1e-5, atol=1e-6, msg=(mode, wrt_inputs, wrt_vars))

  def testEvalBuildsNoGradientMachinery(self):
    with tf.Graph().as_default() as g, layer_helpers.Cluster(2):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 2, 4).Instantiate()
      x = tf.ones([8, DIM])
      before = len(g.get_operations())
      train_out = net.FPropDefaultTheta(x)
      train_ops = g.get_operations()[before:]
      before = len(g.get_operations())
      with cluster_factory.SetEval(True):
        eval_out = net.FPropDefaultTheta(x)
      eval_ops = g.get_operations()[before:]
      self.assertNotEmpty([op for op in train_ops if op.type == 'IdentityN'])
      self.assertEmpty([op for op in eval_ops if op.type == 'IdentityN'])
      self.assertLen([op for op in eval_ops if op.type.endswith('PartitionedCall')], 2 * 4)
      with layer_helpers.Session(g, 2) as sess:
        sess.run(tf.global_variables_initializer())
        a, b = sess.run([train_out, eval_out])
      self.assertAllClose(a, b, rtol=1e-6, atol=1e-7)


if __name__ == '__main__':
  test_utils.main()
