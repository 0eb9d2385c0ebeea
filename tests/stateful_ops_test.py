"""Stock Lingvo layers in a TensorPipeLayer (the guide's table): exact, or refused with one line.

Each row is built unpipelined (SequentialLayer) and as a pipeline for K in {1, 2, 3} and M in {1,
4}:
- stateless rows: per-variable gradients equal the plain model's;
- batch-norm rows: at M = 1 gradients and moving averages equal the plain model's; at M = 4 (each
  micro-batch normalised on its own) they do not depend on K or on re-computation (K = 3), one update per
  moving average is registered, and the first layer's moving averages (whose input does not depend
  on M) still equal the plain model's;
- dropout rows: masks are the same in the forward pass and its re-computation (gradients equal
  between recompute='always' and 'never', at K = 3, M = 4), for any K, and for any M where every
  dropped tensor has an axis of the micro-batch's size; dropout really drops.
"""

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import bn_layers
from lingvo.core import layers
from lingvo.core import layers_with_attention
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import batch_norm
from tests import layer_helpers

BATCH = 12
DIM = 8
KS = (1, 2, 3)
MS = (1, 4)


def _Inputs(shape=(BATCH, DIM), seed=3):
  return (tf.constant(np.random.RandomState(seed).normal(1.0, 2.0, size=shape).astype(np.float32)),)


def _Loss(out):
  """Mean squared distance of the (first) output to a fixed random target.

  A random target: against a constant one, a layer norm's output gradient would be zero.
  """
  if isinstance(out, (tuple, list)):
    out = out[0]
  target = np.random.RandomState(9).normal(size=out.shape.as_list()).astype(np.float32)
  return tf.reduce_mean(tf.square(out - target))


def _Steps(models, inputs_fn, loss_fn=_Loss, num_devices=4):
  """One training step of each of `models` (layer Params) on the same variables, in one graph.

  Returns per model what layer_helpers.StepWithBatchNormUpdates does: ({trainable var name:
  gradient}, {moving-average var name: value after the step}, #registered batch-norm updates,
  #those relevant to the loss), the graph having a global step (as the trainer's: dropout masks and
  Lingvo's step seeds read it).

  One graph and session for all the variants of a test instead of one each: building and first
  running a graph is most of a step's time. The models share their variables (Lingvo's variable
  store, reuse), so every model must carry the first one's name (it is also the prefix of the
  dropout sites); a model may create no variable of its own (a variable it names differently from
  the first model fails here, as it would fail the name check of _MaxError). Each model's step
  starts from the initial moving averages and applies only that model's batch-norm updates.
  """
  graph = tf.Graph()
  steps = []
  with graph.as_default(), layer_helpers.Cluster(num_devices):
    tf.random.set_seed(1234)  # Lingvo then seeds unseeded variables from their names.
    py_utils.GetOrCreateGlobalStepVar()
    num_variables = None
    with py_utils.VariableStore(), tf.variable_scope('', reuse=tf.AUTO_REUSE):
      for params in models:
        assert params.name == models[0].name, (params.name, models[0].name)
        num_updates = len(tf.get_collection(py_utils.BATCH_NORM_UPDATES))
        out = params.Instantiate().FPropDefaultTheta(*inputs_fn())
        loss = loss_fn(out)
        num_variables = num_variables or len(tf.global_variables())
        assert len(tf.global_variables()) == num_variables, 'new variables in %s' % params.name
        variables = tf.trainable_variables()
        grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
        updates = tf.get_collection(py_utils.BATCH_NORM_UPDATES)[num_updates:]
        relevant, _ = py_utils.FindRelevantBatchNormUpdates(loss, updates)
        steps.append((grads, updates, len(relevant)))
    moving = [v for v in tf.global_variables() if 'moving_' in v.op.name]
    init = tf.global_variables_initializer()
    reset_moving = tf.variables_initializer(moving)
  # Values only: grappler's rewrites of the outer graph would take time too.
  config = layer_helpers.ValuesOnlyConfig(num_devices)
  results = []
  with tf.Session(graph=graph, config=config) as sess:
    sess.run(init)
    if moving:  # One model's updates at a time.
      grad_values = []
      for grads, updates, _ in steps:
        sess.run(reset_moving)
        grad_values.append(sess.run([grads, updates])[0])
        results.append(dict(zip([v.op.name for v in moving], sess.run(moving))))
    else:
      grad_values = sess.run([grads for grads, _, _ in steps])
      results = [{} for _ in steps]
  names = [v.op.name for v in variables]
  return [(dict(zip(names, values)), moving_values, len(updates), relevant)
          for values, moving_values, (_, updates, relevant) in zip(grad_values, results, steps)]


def _MaxError(grads, reference):
  """max over variables of |g - g_ref| / max(|g_ref|, 1e-2 max_v |g_ref_v|) (Frobenius norms).

  The floor keeps gradients that are zero up to rounding (a key projection's bias in attention, a
  bias right before batch norm) from turning rounding into large relative errors: such a gradient
  is float32 noise of about 1e-8 whose value depends on the CPU's kernels and the summation order.
  """
  assert sorted(grads) == sorted(reference), (sorted(grads), sorted(reference))
  floor = 1e-2 * max(np.linalg.norm(r) for r in reference.values())
  return max(np.linalg.norm(grads[k] - reference[k]) / max(np.linalg.norm(reference[k]), floor)
             for k in grads)


def _Fc(name, dim=DIM, activation='TANH', **kwargs):
  """Lingvo's FCLayer (tanh: a ReLU layer can leave an example all zeros, and a layer norm after it
  then amplifies rounding a thousandfold)."""
  return layers.FCLayer.Params().Set(name=name, input_dim=dim, output_dim=dim,
                                     activation=activation, **kwargs)


class TransformerBlock(layers_with_attention.TransformerLayer):
  """Lingvo's TransformerLayer that passes its paddings on (its FProp returns attention probs)."""

  def FProp(self, theta, vecs, paddings):
    return super().FProp(theta, vecs, paddings)[0], paddings


class AttentionBlock(layers_with_attention.TransformerAttentionLayer):
  """Lingvo's TransformerAttentionLayer (multi-headed self-attention) passing its paddings on."""

  def FProp(self, theta, vecs, paddings):
    return super().FProp(theta, vecs, paddings)[0], paddings


class PerExampleSoftmax(layers.SimpleFullSoftmax):
  """Lingvo's SimpleFullSoftmax returning only its per-example outputs (a pipeline concatenates
  micro-batches; mini-batch scalars such as avg_xent cannot be)."""

  def FProp(self, theta, inputs, class_ids):
    out = super().FProp(theta, inputs, class_weights=tf.ones_like(class_ids, tf.float32),
                        class_ids=class_ids)
    return out.per_example_xent


class PassIds(base_layer.BaseLayer):
  """An FCLayer on x that passes the class ids on: (x, ids) -> (fc(x), ids)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', DIM, 'Width.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('fc', _Fc('fc', self.params.dim))

  def FProp(self, theta, x, ids):
    return self.fc.FProp(theta.fc, x), ids


class _NnDropout(base_layer.BaseLayer):
  """tf.nn.dropout (or tf.compat.v1.nn.dropout) called directly in FProp, twice."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('keep_prob', 0.5, 'Keep probability.')
    p.Define('v1', False, 'Call TensorFlow 1\'s signature (keep_prob=) instead of 2\'s (rate=).')
    return p

  def FProp(self, theta, x):
    p = self.params
    for _ in range(2):
      if p.v1:
        x = tf.compat.v1.nn.dropout(x, keep_prob=p.keep_prob)
      else:
        x = tf.nn.dropout(x, rate=1.0 - p.keep_prob, seed=7)
    return x


class RowsTest(test_utils.TestCase):
  """Every row of the guide's table of stock Lingvo layers."""

  def _AssertEqualsPlain(self, layer_params, inputs_fn, loss_fn=_Loss, batch_dim=0, tol=1e-5):
    variants = [(k, m) for k in KS for m in MS]
    (plain, _, _, _), *steps = _Steps(
        [layer_helpers.Plain(layer_params)] +
        [layer_helpers.Pipeline(layer_params, k, m, batch_dim=batch_dim) for k, m in variants],
        inputs_fn, loss_fn)
    for (k, m), (grads, _, _, _) in zip(variants, steps):
      self.assertLess(_MaxError(grads, plain), tol, 'K=%d M=%d' % (k, m))

  def testFcLayer(self):
    self._AssertEqualsPlain([_Fc('fc%d' % i) for i in range(3)], _Inputs)

  def testProjectionLayer(self):
    self._AssertEqualsPlain([
        layers.ProjectionLayer.Params().Set(name='proj%d' % i, input_dim=DIM, output_dim=DIM,
                                            batch_norm=False, has_bias=True, activation='TANH')
        for i in range(3)
    ], _Inputs)

  def testLayerNorm(self):
    self._AssertEqualsPlain([
        layers.LayerNorm.Params().Set(name='ln0', input_dim=DIM), _Fc('fc1'),
        layers.LayerNorm.Params().Set(name='ln2', input_dim=DIM)
    ], _Inputs)

  def testEmbeddingAndSoftmax(self):
    vocab, classes = 11, 5
    ids = np.random.RandomState(4).randint(0, vocab, size=[BATCH]).astype(np.int32)
    labels = np.random.RandomState(5).randint(0, classes, size=[BATCH]).astype(np.int32)

    class Embed(layers.SimpleEmbeddingLayer):

      def FProp(self, theta, ids, class_ids):
        return super().FProp(theta, ids), class_ids

    stack = [
        Embed.Params().Set(name='emb', vocab_size=vocab, embedding_dim=DIM, use_matmul=True),
        PassIds.Params().Set(name='mid'),
        PerExampleSoftmax.Params().Set(name='softmax', input_dim=DIM, num_classes=classes)
    ]
    self._AssertEqualsPlain(stack, lambda: (tf.constant(ids), tf.constant(labels)))

  @pytest.mark.slow
  def testMultiHeadedAttention(self):
    self._AssertEqualsPlain([
        AttentionBlock.Params().Set(name='att%d' % i, source_dim=DIM, num_attention_heads=2)
        for i in range(3)
    ], self._TimeMajor, batch_dim=1)

  @staticmethod
  def _TimeMajor():
    rng = np.random.RandomState(6)
    vecs = rng.normal(size=[5, BATCH, DIM]).astype(np.float32)
    lengths = rng.randint(2, 6, size=[BATCH])
    paddings = (np.arange(5)[:, None] >= lengths[None, :]).astype(np.float32)
    return tf.constant(vecs), tf.constant(paddings)

  # Batch norm.

  def _AssertBatchNormRow(self, layer_params, inputs_fn, first_moving, loss_fn=_Loss):
    """The batch-norm row checks of the module docstring; `first_moving`: the first layer's moving
    variable names."""
    num_moving = None
    # As for dropout rows: re-computation against its absence at the largest K and M only.
    variants = [(m, k, 'always') for m in MS for k in KS] + [(MS[-1], KS[-1], 'never')]
    (plain_grads, plain_moving, _, _), *steps = _Steps(
        [layer_helpers.Plain(layer_params)] +
        [layer_helpers.Pipeline(layer_params, k, m, mode) for m, k, mode in variants], inputs_fn,
        loss_fn)
    steps = dict(zip(variants, steps))
    for m in MS:
      reference = None
      for k in KS:
        for mode in ('always', 'never'):
          if (m, k, mode) not in steps:
            continue
          grads, moving, updates, relevant = steps[m, k, mode]
          what = 'K=%d M=%d %s' % (k, m, mode)
          num_moving = num_moving or len(moving)
          # One per moving average, none per micro-batch.
          self.assertEqual(updates, num_moving, what)
          self.assertEqual(relevant, num_moving, what)
          if reference is None:
            reference = grads, moving
          self.assertLess(_MaxError(grads, reference[0]), 1e-4, what)
          for name in moving:
            self.assertAllClose(moving[name], reference[1][name], rtol=1e-5, atol=1e-6, msg=what)
          for name in first_moving:
            self.assertAllClose(moving[name], plain_moving[name], rtol=1e-5, atol=1e-6, msg=what)
          if m == 1:
            self.assertLess(_MaxError(grads, plain_grads), 1e-4, what)
            for name in moving:
              self.assertAllClose(moving[name], plain_moving[name], rtol=1e-5, atol=1e-6, msg=what)
    # The moving averages moved, and micro-batch statistics change the gradients.
    self.assertGreater(max(np.abs(v - np.round(v)).max() for v in plain_moving.values()), 1e-3)
    self.assertGreater(_MaxError(reference[0], plain_grads), 1e-3)

  @pytest.mark.slow
  def testBatchNormLayer(self):
    stack = []
    for i in range(3):
      stack += [_Fc('fc%d' % i, activation='NONE'),
                bn_layers.BatchNormLayer.Params().Set(name='bn%d' % i, dim=DIM, decay=0.9,
                                                      add_stats_to_moving_average_variables=True)]
    self._AssertBatchNormRow(stack, _Inputs, ['pipe/bn0/moving_mean/var',
                                              'pipe/bn0/moving_variance/var'])

  @pytest.mark.slow
  def testConvLayerWithBatchNorm(self):
    stack = [
        layers.ConvLayer.Params().Set(name='conv%d' % i, filter_shape=[3, 3, 2 if i == 0 else 4, 4],
                                      filter_stride=[1, 1]) for i in range(3)
    ]
    for p in stack:
      p.bn_decay = 0.9
    self._AssertBatchNormRow(stack, lambda: _Inputs([BATCH, 5, 5, 2]),
                             ['pipe/conv0/moving_mean/var', 'pipe/conv0/moving_variance/var'])

  def testPaddedBatchNormCombinesByPositions(self):
    """Micro-batches with different numbers of padded positions: moving averages still equal the
    unpipelined model's (statistics weighted by non-padded positions)."""
    rng = np.random.RandomState(7)
    x = rng.normal(1.0, 2.0, size=[BATCH, 6, DIM]).astype(np.float32)
    paddings = (np.arange(6)[None, :] >=
                rng.randint(1, 7, size=[BATCH])[:, None]).astype(np.float32)
    inputs_fn = lambda: (tf.constant(x), tf.constant(paddings))
    bn = [bn_layers.BatchNormLayer.Params().Set(name='bn', dim=DIM, decay=0.9)]
    ms = (2, 4, 12)
    (_, plain, _, _), *steps = _Steps(
        [layer_helpers.Plain(bn)] + [layer_helpers.Pipeline(bn, 1, m) for m in ms], inputs_fn)
    for m, (_, moving, _, _) in zip(ms, steps):
      for name in plain:
        self.assertAllClose(moving[name], plain[name], rtol=1e-5, atol=1e-6, msg='M=%d' % m)

  # Dropout.

  def _AssertDropoutRow(self, layer_params, no_dropout, inputs_fn, loss_fn=_Loss, batch_dim=0,
                        per_example=True, ks=KS):
    """The dropout row checks of the module docstring; `no_dropout`: the same stack, keep 1;
    `per_example`: every dropped tensor has an axis of the micro-batch's size (masks then do not
    depend on M either)."""
    # Every K and M with re-computation; without it at the largest K and M (re-computation and
    # its absence are the same masks whatever K and M are: one pair shows the forward pass and its
    # re-computation agree).
    variants = [(m, k, 'always') for m in MS for k in ks] + [(MS[-1], ks[-1], 'never')]
    *steps, (kept, _, _, _) = _Steps(
        [layer_helpers.Pipeline(layer_params, k, m, mode, batch_dim=batch_dim)
         for m, k, mode in variants] +
        [layer_helpers.Pipeline(no_dropout, 2, 4, batch_dim=batch_dim)], inputs_fn, loss_fn)
    grads = {variant: step[0] for variant, step in zip(variants, steps)}
    self.assertLess(_MaxError(grads[MS[-1], ks[-1], 'always'], grads[MS[-1], ks[-1], 'never']),
                    1e-4, 'recompute always vs never')
    reference = None
    for m in MS:
      if not per_example:
        reference = None
      for k in ks:
        always = grads[m, k, 'always']
        what = 'K=%d M=%d' % (k, m)
        if reference is None:
          reference = always
        self.assertLess(_MaxError(always, reference), 1e-4, what)  # Nor on K (and M).
    self.assertGreater(_MaxError(reference, kept), 1e-2)  # Dropout drops.

  def _DropoutStack(self, cls, keep_prob):
    return [_Fc('fc0'), cls.Params().Set(name='drop1', keep_prob=keep_prob), _Fc('fc2'),
            cls.Params().Set(name='drop3', keep_prob=keep_prob), _Fc('fc4')]

  @pytest.mark.slow
  def testDropoutLayer(self):
    self._AssertDropoutRow(self._DropoutStack(layers.DropoutLayer, 0.5),
                           self._DropoutStack(layers.DropoutLayer, 1.0), _Inputs)

  @pytest.mark.slow
  def testDeterministicDropoutLayer(self):
    self._AssertDropoutRow(self._DropoutStack(layers.DeterministicDropoutLayer, 0.5),
                           self._DropoutStack(layers.DeterministicDropoutLayer, 1.0), _Inputs)

  @pytest.mark.slow
  def testTfNnDropoutInsideALayer(self):
    self._AssertDropoutRow(
        [_Fc('fc0'), _NnDropout.Params().Set(name='drop1', keep_prob=0.6), _Fc('fc2'),
         _NnDropout.Params().Set(name='drop3', keep_prob=0.6, v1=True), _Fc('fc4')],
        [_Fc('fc0'), _Fc('fc2'), _Fc('fc4')], _Inputs)

  @pytest.mark.slow
  def testTransformerLayerDropouts(self):

    def Stack(prob):
      stack = []
      for i in range(3):
        p = TransformerBlock.Params().Set(name='tr%d' % i, source_dim=DIM, output_dim=DIM)
        p.tr_atten_tpl.num_attention_heads = 2
        p.tr_atten_tpl.residual_dropout_prob = prob
        p.tr_atten_tpl.atten_dropout_prob = prob
        p.tr_fflayer_tpl.hidden_dim = 16
        p.tr_fflayer_tpl.residual_dropout_prob = prob
        p.tr_fflayer_tpl.relu_dropout_prob = prob
        stack.append(p)
      return stack

    # Attention probabilities ([B * heads, T, T]) and the attention's residual ([T * B, D]) are
    # dropped after reshapes that merge the batch axis: their masks are drawn per micro-batch.
    # K in {1, 3}: one partition, and layers split across devices (the other rows cover K = 2).
    self._AssertDropoutRow(Stack(0.3), Stack(0.0), RowsTest._TimeMajor, batch_dim=1,
                           per_example=False, ks=(1, 3))

  def testDropoutKeepsTheRateAndMasksPerExample(self):
    """The replaced tf.nn.dropout keeps about keep_prob of the elements, and an example's mask is
    the same whatever M is (so it is the example, not its place in a micro-batch, that counts)."""
    x = np.ones([64, 256], np.float32)
    outs = []
    for m in (1, 8):
      graph = tf.Graph()
      with graph.as_default(), layer_helpers.Cluster(2):
        net = layer_helpers.Pipeline([layers.DropoutLayer.Params().Set(name='drop0', keep_prob=0.7),
                                layers.DropoutLayer.Params().Set(name='drop1', keep_prob=1.0)],
                               2, m).Instantiate()
        out = net.FPropDefaultTheta(tf.constant(x))
        with layer_helpers.Session(graph, 2) as sess:
          sess.run(tf.global_variables_initializer())
          outs.append(sess.run(out))
    kept = (outs[0] != 0).mean()
    self.assertNear(kept, 0.7, 0.01)
    self.assertAllClose(outs[0][outs[0] != 0], np.full([(outs[0] != 0).sum()], 1 / 0.7), rtol=1e-6)
    self.assertAllEqual(outs[0], outs[1])


class _SquaredDistance(base_layer.BaseLayer):
  """A loss layer: per example, the summed squared distance of the (first) output to a target."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('batch_dim', 0, 'The batch dimension.')
    return p

  def FProp(self, theta, out, target):
    if isinstance(out, (tuple, list)):
      out = out[0]
    axes = [i for i in range(out.shape.rank) if i != self.params.batch_dim]
    return tf.reduce_sum(tf.square(out - target), axis=axes, keepdims=True)


class ZeroBubbleTest(test_utils.TestCase):
  """schedule='zero_bubble' re-runs each layer in its weight-gradient tasks: stock layers give the
  same gradients and moving averages as 'gpipe' with the same per-example loss, for K in {1, 2, 3}
  and M in {1, 4} (the Transformer at K = 3, M = 4): the same dropout masks, batch-norm
  statistics and layer norms in every re-run."""

  def _AssertSchedulesAgree(self, layer_params, inputs_fn, batch_dim=0, ks=KS, ms=MS):

    def Inputs():
      inputs = inputs_fn()
      target = tf.constant(np.random.RandomState(9).normal(
          size=inputs[0].shape.as_list()).astype(np.float32))
      return inputs, (target,)

    loss = _SquaredDistance.Params().Set(name='loss', batch_dim=batch_dim)
    variants = [(k, m, name) for k in ks for m in ms for name in ('gpipe', 'zero_bubble')]
    steps = dict(zip(variants, _Steps(
        [layer_helpers.Pipeline(layer_params, k, m, batch_dim=batch_dim, schedule=name,
                                loss_layer=loss)
         for k, m, name in variants], Inputs, tf.reduce_mean)))
    for k in ks:
      for m in ms:
        gpipe, gpipe_moving, _, _ = steps[k, m, 'gpipe']
        zb, zb_moving, _, _ = steps[k, m, 'zero_bubble']
        self.assertLess(_MaxError(zb, gpipe), 1e-5, 'K=%d M=%d' % (k, m))
        for name in gpipe_moving:
          self.assertAllClose(zb_moving[name], gpipe_moving[name], rtol=1e-5, atol=1e-6)

  @pytest.mark.slow
  def testDropoutAndLayerNorm(self):
    self._AssertSchedulesAgree([
        _Fc('fc0'), layers.DropoutLayer.Params().Set(name='drop1', keep_prob=0.5),
        layers.LayerNorm.Params().Set(name='ln2', input_dim=DIM), _Fc('fc3'),
        _NnDropout.Params().Set(name='drop4', keep_prob=0.6)], _Inputs)

  @pytest.mark.slow
  def testBatchNormLayer(self):
    self._AssertSchedulesAgree([
        _Fc('fc0', activation='NONE'),
        bn_layers.BatchNormLayer.Params().Set(name='bn1', dim=DIM, decay=0.9), _Fc('fc2')], _Inputs)

  @pytest.mark.slow
  def testTransformerLayerWithDropouts(self):
    stack = []
    for i in range(3):
      p = TransformerBlock.Params().Set(name='tr%d' % i, source_dim=DIM, output_dim=DIM)
      p.tr_atten_tpl.num_attention_heads = 2
      p.tr_atten_tpl.residual_dropout_prob = 0.3
      p.tr_atten_tpl.atten_dropout_prob = 0.3
      p.tr_fflayer_tpl.hidden_dim = 16
      p.tr_fflayer_tpl.relu_dropout_prob = 0.3
      stack.append(p)
    self._AssertSchedulesAgree(stack, RowsTest._TimeMajor, batch_dim=1, ks=(3,), ms=(4,))


class _Noisy(base_layer.BaseLayer):
  """x + N(0, 1) from a stateful random op."""

  def FProp(self, theta, x):
    with tf.name_scope(self.params.name):
      return x + tf.random.normal(tf.shape(x))


class _VariationalFc(layers.FCLayer):
  """An FCLayer adding Lingvo's variational noise to its weight inside FProp."""

  def FProp(self, theta, x):
    theta = theta.DeepCopy()
    theta.w = py_utils.AddVN(self.params, theta.w)
    return super().FProp(theta, x)


class _Counter(base_layer.BaseLayer):
  """Counts its FProp calls in a variable."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('calls', py_utils.WeightParams([], py_utils.WeightInit.Constant(0.0)),
                        trainable=False)

  def FProp(self, theta, x):
    with tf.name_scope(self.params.name):
      with tf.control_dependencies([tf.assign_add(self.vars.calls, 1.0)]):
        return tf.identity(x)


class RefusedTest(test_utils.TestCase):
  """What cannot be made exact under re-computation is refused when the graph is built."""

  def _Build(self, layer_params, recompute='always', k=2, m=4, shape=(BATCH, DIM)):
    graph = tf.Graph()
    with graph.as_default(), layer_helpers.Cluster(k):
      py_utils.GetOrCreateGlobalStepVar()
      net = layer_helpers.Pipeline(layer_params, k, m, recompute).Instantiate()
      (x,) = _Inputs(shape)
      out = net.FPropDefaultTheta(x)
      return tf.gradients(tf.reduce_sum(out), tf.trainable_variables())

  def testStatefulRandomOp(self):
    stack = [_Fc('fc0'), _Noisy.Params().Set(name='noisy'), _Fc('fc2')]
    with self.assertRaisesRegex(
        ValueError, r"TensorPipeLayer 'pipe' \(pipe_partition\d\): layer 'noisy' draws random "
        r"numbers with stateful op RandomStandardNormal \('noisy/.*RandomStandardNormal'\).*"
        r"recompute='never'"):
      self._Build(stack)
    for mode in ('always', 'except_last', 'selective'):
      with self.assertRaisesRegex(ValueError, "layer 'noisy' draws random numbers"):
        self._Build(stack, mode)
    # Without re-computation the forward pass's numbers are the ones differentiated: allowed.
    self.assertLen(self._Build(stack, 'never'), 4)
    self.assertLen(self._Build(stack, 'except_last', m=1), 4)

  def testStatefulVariationalNoise(self):
    p = _VariationalFc.Params().Set(name='vn', input_dim=DIM, output_dim=DIM)
    p.vn.global_vn = True
    p.vn.scale = 0.1
    p.vn.deterministic = False  # Lingvo's default in unit tests is True.
    with self.assertRaisesRegex(ValueError, r"layer 'vn' draws random numbers.*"
                                r"p\.vn\.deterministic=True"):
      self._Build([_Fc('fc0'), p])
    p.vn.deterministic = True  # Stateless, seeded per step and layer: exact.
    self.assertLen(self._Build([_Fc('fc0'), p]), 4)

  def testVariableWrittenInFProp(self):
    with self.assertRaisesRegex(
        ValueError, r"layer 'count' writes variable 'pipe/count/calls/var' in FProp "
        r"\(AssignAddVariableOp .*\).*written M or 2M times a step"):
      self._Build([_Fc('fc0'), _Counter.Params().Set(name='count')], 'never')

  def testBatchNormLayerNoPaddingKeepsAccumulators(self):
    bn = [bn_layers.BatchNormLayerNoPadding.Params().Set(name='bn%d' % i, dim=DIM) for i in (0, 1)]
    with self.assertRaisesRegex(ValueError, r"layer 'bn0' keeps Lingvo accumulators \(counts, "
                                r"mean_ss, variance_ss\).*use bn_layers.BatchNormLayer"):
      self._Build(bn, shape=(BATCH, 2, 2, DIM))

  def testVarianceWithoutItsMean(self):

    class VarianceOnly(base_layer.BaseLayer):

      def __init__(self, params):
        super().__init__(params)
        self.CreateVariable('running_variance', py_utils.WeightParams(
            [DIM], py_utils.WeightInit.Constant(1.0)), trainable=False)

      def FProp(self, theta, x):
        py_utils.UpdateBatchNormVars(self.vars.running_variance, tf.nn.moments(x, [0])[1], 0.9)
        return x

    with self.assertRaisesRegex(ValueError, r"cannot combine the micro-batch statistics of "
                                r"batch-norm variable 'pipe/var/running_variance'"):
      self._Build([_Fc('fc0'), VarianceOnly.Params().Set(name='var')])


class CombineMomentsTest(test_utils.TestCase):

  def testCountWeighted(self):
    rng = np.random.RandomState(0)
    groups = [rng.normal(size=[n, 3]).astype(np.float32) for n in (1, 5, 2)]
    with self.session():
      mean, var = self.evaluate(batch_norm.CombineMoments(
          [g.mean(0) for g in groups], [g.var(0) for g in groups],
          [tf.constant(float(len(g))) for g in groups]))
    whole = np.concatenate(groups)
    self.assertAllClose(mean, whole.mean(0), rtol=1e-5, atol=1e-6)
    self.assertAllClose(var, whole.var(0), rtol=1e-5, atol=1e-6)


if __name__ == '__main__':
  tf.test.main()
