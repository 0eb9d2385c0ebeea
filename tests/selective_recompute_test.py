"""recompute='selective': the unpipelined model's gradients for every schedule that takes it and K
in {1, 2, 3} (a dense stack, a Transformer layer with dropout, convolutions with batch norm); the
backward functions run no matmul or convolution of the forward pass again; a clear error where a
schedule cannot take it."""

import collections

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import layers as lingvo_layers
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import batch_norm
from tensorpipe import selective_recompute
from tensorpipe.tasks.mt import transformer
from tests import layer_helpers

DIM = 8
KS = (1, 2, 3)


class ConvBn(base_layer.BaseLayer):
  """y = relu(BatchNorm(conv3x3(x))) on [B, H, W, C]: a convolution with GPipe batch norm."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('channels', 4, 'Input and output channels.')
    p.Define('seed', 0, 'Seed of the filter initialiser.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateChild('bn', batch_norm.BatchNorm.Params().Set(name='bn', dim=p.channels,
                                                             decay=0.9))

  def _CreateLayerVariables(self):
    super()._CreateLayerVariables()
    p = self.params
    self.CreateVariable('w', py_utils.WeightParams(
        [3, 3, p.channels, p.channels], py_utils.WeightInit.Gaussian(0.3, seed=p.seed)))

  def FProp(self, theta, x):
    with tf.name_scope(self.params.name):
      y = tf.nn.conv2d(x, theta.w, strides=[1, 1, 1, 1], padding='SAME')
      return tf.nn.relu(self.bn.FProp(theta.bn, y))


class Squares(base_layer.BaseLayer):
  """Per-example losses: the sum of squares of each example's (or its `vec`'s) values, so that
  1F1B may run backward passes before later forward ones."""

  def FProp(self, theta, x):
    x = x.vec if isinstance(x, py_utils.NestedMap) else x
    return tf.reduce_sum(tf.square(x), axis=list(range(1, x.shape.rank)))


def _WithLoss(layers):
  return layers + [Squares.Params().Set(name='loss')]


class Linear(layer_helpers.Dense):
  """y = x w: its output is a kept matmul's (a partition may end in one, the next start with one
  reading it)."""

  def FProp(self, theta, x):
    return tf.matmul(x, theta.w)


class GatedDense(layer_helpers.Dense):
  """y = tanh(z) * sigmoid(z), z = x w: one matmul output, two activations its gradient reads."""

  def FProp(self, theta, x):
    with tf.name_scope(self.params.name):
      z = tf.matmul(x, theta.w)
      return tf.tanh(z) * tf.sigmoid(z)


def _ConvBnLayers(num=3):
  return _WithLoss([ConvBn.Params().Set(name='layer%d' % i, seed=20 + i) for i in range(num)])


def _Transformers(num=3, keep=0.7):
  return _WithLoss([transformer.TransformerLayer.Params().Set(
      name='tr%d' % i, model_dim=DIM, ffn_dim=16, num_heads=2, head_dim=4,
      dropout_keep_prob=keep) for i in range(num)])


def _FcLayerNorms():
  """Lingvo's FCLayer and LayerNorm, whose normalisation runs in a function call (CallDefun): its
  ops are re-run in full, the FCLayers' matmuls are kept."""
  stack = []
  for i in range(2):
    stack += [lingvo_layers.FCLayer.Params().Set(name='fc%d' % i, input_dim=DIM, output_dim=DIM,
                                                 activation='TANH'),
              lingvo_layers.LayerNorm.Params().Set(name='ln%d' % i, input_dim=DIM)]
  return _WithLoss(stack)


def _Dense(num):
  return _WithLoss(layer_helpers.DenseLayers(num, dim=DIM))


def _TransformerInputs():
  rng = np.random.RandomState(5)
  vec = rng.normal(size=[6, 5, DIM]).astype(np.float32)
  paddings = np.zeros([6, 5], np.float32)
  paddings[1, 3:] = 1.0
  return (py_utils.NestedMap(vec=tf.constant(vec), paddings=tf.constant(paddings)),)


def _Mean(out):
  return tf.reduce_mean(out)


def _Variants(layers, ms=(4,), virtual=True):
  """(name, TensorPipeLayer Params) with recompute='selective': K in KS, each schedule that takes
  it, M in `ms`; all named 'pipe' (so they share variables and dropout sites, see _SharedSteps)."""
  variants = []
  for k in KS:
    for m in ms:
      for sched in ('gpipe', '1f1b'):
        variants.append(('K%d_M%d_%s' % (k, m, sched),
                         layer_helpers.Pipeline(layers, k, m, 'selective', schedule=sched)))
    if virtual and k > 1 and 2 * k <= len(layers) - 1:
        mv = k * max(1, ms[-1] // k)  # Interleaved 1F1B takes M a multiple of K.
        variants.append(('K%d_M%d_interleaved' % (k, mv), layer_helpers.Pipeline(
            layers, k, mv, 'selective', schedule='interleaved_1f1b', virtual_stages=2)))
  return variants


def _SharedSteps(variants, inputs_fn, loss_fn):
  """{name: {trainable variable name: gradient}} of one step of each (name, Params) of
  `variants`, all named alike and sharing their variables, in one graph with a global step (as a
  trainer's: dropout masks read it) and one session run."""
  graph = tf.Graph()
  fetches = {}
  with graph.as_default(), layer_helpers.Cluster(3):
    tf.random.set_seed(1234)
    py_utils.GetOrCreateGlobalStepVar()
    with py_utils.VariableStore(), tf.variable_scope('', reuse=tf.AUTO_REUSE):
      for name, params in variants:
        loss = loss_fn(params.Instantiate().FPropDefaultTheta(*inputs_fn()))
        variables = tf.trainable_variables()
        grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
        fetches[name] = {v.op.name: g for v, g in zip(variables, grads) if g is not None}
    with tf.Session(graph=graph, config=layer_helpers.ValuesOnlyConfig(3)) as sess:
      sess.run(tf.global_variables_initializer())
      return sess.run(fetches)


def _MaxError(grads, reference):
  """max over variables of |g - g_ref| / max(|g_ref|, 1e-3 max_v |g_ref_v|): the floor keeps a
  gradient that is zero up to rounding (attention's key bias) from counting its rounding."""
  assert sorted(grads) == sorted(reference), (sorted(grads), sorted(reference))
  floor = 1e-3 * max(np.linalg.norm(r) for r in reference.values())
  return max(np.linalg.norm(grads[k] - reference[k]) / max(np.linalg.norm(reference[k]), floor)
             for k in grads)


class GradientsTest(test_utils.TestCase):
  """'selective' gives the unpipelined model's gradients (up to float rounding)."""

  def _AssertEqualUnpipelined(self, layers, inputs_fn, loss_fn, ms=(4,), virtual=True):
    variants = _Variants(layers, ms, virtual)
    reference = layer_helpers.Pipeline(layers, 1, 1, unpipelined=True)
    results = _SharedSteps([('unpipelined', reference)] + variants, inputs_fn, loss_fn)
    plain = results.pop('unpipelined')
    self.assertLen(results, len(variants))
    self.assertGreater(max(np.linalg.norm(g) for g in plain.values()), 0.0)
    for name, grads in sorted(results.items()):
      self.assertLess(_MaxError(grads, plain), 1e-5, name)

  @pytest.mark.slow
  def testDenseStack(self):
    x = np.random.RandomState(2).normal(size=[12, DIM]).astype(np.float32)
    self._AssertEqualUnpipelined(_Dense(6), lambda: (tf.constant(x),),
                                 _Mean, ms=(1, 4))

  @pytest.mark.slow
  def testMatmulsReadingMatmulsAcrossPartitions(self):
    x = np.random.RandomState(2).normal(size=[12, DIM]).astype(np.float32)
    self._AssertEqualUnpipelined(
        _WithLoss([Linear.Params().Set(name='l%d' % i, dim=DIM, seed=i) for i in range(6)]),
        lambda: (tf.constant(x),), _Mean)

  @pytest.mark.slow
  def testLingvoLayersWithFunctionCalls(self):
    x = np.random.RandomState(2).normal(size=[12, DIM]).astype(np.float32)
    variants = _Variants(_FcLayerNorms(), virtual=False)
    always = [(name + '_always', params.Copy().Set(recompute='always'))
              for name, params in variants]
    results = _SharedSteps([('unpipelined', layer_helpers.Pipeline(_FcLayerNorms(), 1, 1,
                                                             unpipelined=True))] +
                           variants + always, lambda: (tf.constant(x),), _Mean)
    plain = results.pop('unpipelined')
    # A layer norm amplifies float rounding: 'always' is 1e-4 from the unpipelined model too.
    for name, grads in sorted(results.items()):
      self.assertLess(_MaxError(grads, plain), 5e-4, name)

  @pytest.mark.slow
  def testTransformerLayerWithDropout(self):
    self._AssertEqualUnpipelined(_Transformers(), _TransformerInputs, _Mean,
                                 virtual=False)
    # Dropout drops: without it the gradients differ.
    results = _SharedSteps([('with', layer_helpers.Pipeline(_Transformers(), 2, 3, 'selective')),
                            ('without', layer_helpers.Pipeline(_Transformers(keep=1.0), 2, 3,
                                                         'selective'))],
                           _TransformerInputs, _Mean)
    self.assertGreater(_MaxError(results['with'], results['without']), 1e-2)

  @pytest.mark.slow
  def testConvolutionsWithBatchNorm(self):
    x = np.random.RandomState(4).normal(size=[8, 5, 5, 4]).astype(np.float32)
    inputs_fn = lambda: (tf.constant(x),)
    # One micro-batch: batch norm's statistics are the whole batch's, as unpipelined.
    self._AssertEqualUnpipelined(_ConvBnLayers(), inputs_fn, _Mean, ms=(1,),
                                 virtual=False)
    # M micro-batches normalise each with its own statistics: as 'always' does.
    variants = _Variants(_ConvBnLayers(), (4,), virtual=False)
    always = [(name + '_always', params.Copy().Set(recompute='always'))
              for name, params in variants]
    results = _SharedSteps(variants + always, inputs_fn, _Mean)
    for name, _ in variants:
      self.assertLess(_MaxError(results[name], results[name + '_always']), 1e-5, name)


def _Reached(function):
  """{node name: op type} of a FunctionDef's nodes its outputs depend on: what TensorFlow runs of
  it (it prunes the others from the function it instantiates)."""
  nodes = {n.name: n for n in function.node_def}
  todo = [v.split(':')[0] for v in function.ret.values()] + list(function.control_ret.values())
  seen = set()
  while todo:
    name = todo.pop().lstrip('^').split(':')[0]
    if name in seen or name not in nodes:
      continue  # An argument.
    seen.add(name)
    todo.extend(nodes[name].input)
  return {name: nodes[name].op for name in seen}


def _KeptTypeOps(reached, gradients):
  """The names of the reached ops of a kept type: those of gradients ('<op>_grad/' scopes) or
  (gradients False) those of the forward pass or its re-computation."""
  return sorted(name for name, op_type in reached.items()
                if op_type in selective_recompute.KEPT_OP_TYPES and
                ('_grad/' in name) == gradients)


class BackwardGraphTest(test_utils.TestCase):
  """The traced backward function of each partition runs no op of a kept type but gradients:
  'always''s gradient matmuls, none of the re-computed ones."""

  def _Functions(self, layers, inputs_fn, k=2, kept_ops=None):
    """{mode: {(partition, task): FunctionDef}} of pipelines 'always' and 'selective' (keeping
    `kept_ops`)."""
    graph = tf.Graph()
    with graph.as_default(), layer_helpers.Cluster(k):
      py_utils.GetOrCreateGlobalStepVar()
      for mode in ('always', 'selective'):
        extra = dict(selective_kept_ops=kept_ops) if mode == 'selective' else {}
        out = layer_helpers.Pipeline(layers, k, 2, mode, name=mode, **extra).Instantiate(
        ).FPropDefaultTheta(*inputs_fn())
        tf.gradients(_Mean(out), tf.trainable_variables(), colocate_gradients_with_ops=True)
    found = collections.defaultdict(dict)
    for function in graph.as_graph_def().library.function:
      name = function.signature.name
      for mode in ('always', 'selective'):
        for part in range(k):
          for task in ('forward', 'backward'):
            if '_%s_partition%d_%s_' % (mode, part, task) in name and name.endswith('_call'):
              found[mode][(part, task)] = function
    self.assertLen(found['always'], 2 * k)
    self.assertLen(found['selective'], 2 * k)
    return found

  def _Check(self, layers, inputs_fn, kept_types):
    found = self._Functions(layers, inputs_fn)
    for part in range(2):
      forward = _Reached(found['selective'][(part, 'forward')])
      always = _Reached(found['always'][(part, 'backward')])
      selective = _Reached(found['selective'][(part, 'backward')])
      self.assertEqual({forward[n] for n in _KeptTypeOps(forward, False)}, set(kept_types))
      self.assertNotEmpty(_KeptTypeOps(always, False))  # 'always' re-runs the matmuls.
      self.assertEmpty(_KeptTypeOps(selective, False), part)  # 'selective' does not.
      self.assertLen(_KeptTypeOps(selective, True), len(_KeptTypeOps(always, True)))

  def testDenseStack(self):
    self._Check(_Dense(4), lambda: (tf.ones([8, DIM]),), ['MatMul'])

  def testLingvoLayersWithFunctionCalls(self):
    self._Check(_FcLayerNorms(), lambda: (tf.ones([8, DIM]),), ['MatMul'])

  def testKeptOpsChooseWhatIsNotReRun(self):
    # Keeping only convolutions: a dense stack's matmuls are re-run as with 'always'.
    found = self._Functions(_Dense(4), lambda: (tf.ones([8, DIM]),), kept_ops=['Conv2D'])
    for part in range(2):
      self.assertLen(found['selective'][(part, 'forward')].signature.output_arg,
                     len(found['always'][(part, 'forward')].signature.output_arg))
      always = _KeptTypeOps(_Reached(found['always'][(part, 'backward')]), False)
      selective = _KeptTypeOps(_Reached(found['selective'][(part, 'backward')]), False)
      self.assertNotEmpty(selective)
      self.assertEqual([n.split('/', 1)[1] for n in selective],
                       [n.split('/', 1)[1] for n in always])

  @pytest.mark.slow
  def testTransformerLayers(self):
    self._Check(_Transformers(4), _TransformerInputs, ['Einsum'])

  @pytest.mark.slow
  def testConvolutionsWithBatchNorm(self):
    self._Check(_ConvBnLayers(4), lambda: (tf.ones([4, 5, 5, 4]),), ['Conv2D'])


class MemoryTest(test_utils.TestCase):
  """Keeping one matmul output per layer instead of its activations keeps most of the saving."""

  def _PeakBytes(self, mode):
    layers = [GatedDense.Params().Set(name='layer%d' % i, dim=64, seed=i) for i in range(16)]
    with tf.Graph().as_default() as g, layer_helpers.Cluster(2):
      net = layer_helpers.Pipeline(layers, 2, 8, mode).Instantiate()
      out = net.FPropDefaultTheta(tf.random.uniform([4096, 64]))
      grads = tf.gradients(tf.reduce_mean(out), tf.trainable_variables(),
                           colocate_gradients_with_ops=True)
      norm = tf.add_n([tf.reduce_sum(x * x) for x in grads])
      with layer_helpers.Session(g, 2) as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(norm)
        return layer_helpers.StepPeakBytes(lambda: sess.run(norm))[0]

  @pytest.mark.slow
  def testSelectivePeaksWellBelowNever(self):
    never = self._PeakBytes('never')
    selective = self._PeakBytes('selective')
    # 'never' keeps each layer's input, tanh and sigmoid (1 MiB each for the mini-batch),
    # 'selective' each layer's matmul output.
    self.assertGreater(never, 40 * 2**20)
    self.assertLess(selective, 0.6 * never, 'selective %d vs never %d bytes' % (selective, never))


class ParamsTest(test_utils.TestCase):

  def testKeptOpsAreCheckedEarly(self):
    x = np.random.RandomState(2).normal(size=[12, DIM]).astype(np.float32)
    results = _SharedSteps([
        ('unpipelined', layer_helpers.Pipeline(_Dense(4), 1, 1, unpipelined=True)),
        ('einsums',
         layer_helpers.Pipeline(_Dense(4), 2, 4, 'selective', selective_kept_ops=['Einsum'])),
        ('matmuls',
         layer_helpers.Pipeline(_Dense(4), 2, 4, 'selective', selective_kept_ops=('MatMul',)))
    ], lambda: (tf.constant(x),), _Mean)
    for name in ('einsums', 'matmuls'):
      self.assertLess(_MaxError(results[name], results['unpipelined']), 1e-5, name)
    for bad, error in (
        (['Tanh'], r"selective_kept_ops=\['Tanh'\] must be a non-empty list of op types among "
                   r"\['BatchMatMul', .*'MatMul'\]"),
        ('MatMul', r"selective_kept_ops='MatMul' must be a non-empty list"),
        ([], r'selective_kept_ops=\[\] must be a non-empty list')):
      with self.assertRaisesRegex(ValueError, r"TensorPipeLayer 'pipe': " + error):
        with layer_helpers.Cluster(2):
          layer_helpers.Pipeline(_Dense(2), 2, 4, 'selective', selective_kept_ops=bad).Instantiate()
    with self.assertRaisesRegex(
        ValueError, r"TensorPipeLayer 'pipe': selective_kept_ops=\['MatMul'\] applies to "
        r"recompute='selective' only, got recompute='always': set recompute='selective' or "
        r"selective_kept_ops=None"):
      with layer_helpers.Cluster(2):
        layer_helpers.Pipeline(_Dense(2), 2, 4, 'always',
                               selective_kept_ops=['MatMul']).Instantiate()


class ScheduleTest(test_utils.TestCase):

  def testZeroBubbleRefusesSelective(self):
    for sched, extra in (('zero_bubble', {}), ('zbv', {'virtual_stages': 2})):
      with self.assertRaisesRegex(
          ValueError, r"TensorPipeLayer 'pipe': schedule='%s' needs recompute='always', got "
          r"recompute='selective'" % sched):
        with layer_helpers.Cluster(2):
          layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 2, 4, 'selective', schedule=sched,
                           **extra).Instantiate()


class OpFlopsTest(test_utils.TestCase):
  """The FLOPs of kept ops, from their static shapes (what the cost model counts as kept)."""

  def testMultiplyAddsFromShapes(self):
    with tf.Graph().as_default():
      a, w = tf.zeros([2, 3, 4]), tf.zeros([4, 5])
      cases = [(tf.einsum('btd,dh->bth', a, w), 2 * (2 * 3 * 5) * 4),
               (tf.einsum('...d,dh->...h', a, w), 2 * (2 * 3 * 5) * 4),
               (tf.einsum('btd,bsd->bts', a, a), 2 * (2 * 3 * 3) * 4),
               (tf.matmul(tf.zeros([3, 4]), w), 2 * (3 * 5) * 4),
               (tf.matmul(tf.zeros([4, 3]), w, transpose_a=True), 2 * (3 * 5) * 4),
               (tf.matmul(a, tf.zeros([2, 4, 6])), 2 * (2 * 3 * 6) * 4),
               (tf.nn.conv2d(tf.zeros([1, 5, 5, 2]), tf.zeros([3, 3, 2, 4]), 1, 'VALID'),
                2 * (1 * 3 * 3 * 4) * (3 * 3 * 2))]
      for y, flops in cases:
        self.assertTrue(selective_recompute.IsKept(y.op), y.op.type)
        self.assertEqual(selective_recompute.OpFlops(y.op), flops, y.op.type)
      self.assertFalse(selective_recompute.IsKept(tf.tanh(a).op))
      unknown = tf.matmul(tf.placeholder(tf.float32, [None, 4]), w)
      self.assertEqual(selective_recompute.OpFlops(unknown.op), 0)
