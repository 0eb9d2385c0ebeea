"""SharedLayer: tied weights across partitions give the gradients of one layer used twice."""

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import layers as lingvo_layers
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import layer as layer_lib
from tensorpipe import shared_layer
from tests import layer_helpers

VOCAB, DIM, BATCH = 11, 8, 14


class TiedEmbedding(base_layer.BaseLayer):
  """One [vocab, dim] table: Embed looks rows up, Xent scores against every row (tied softmax)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab', VOCAB, 'Vocabulary size.')
    p.Define('dim', DIM, 'Embedding width.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable('table', py_utils.WeightParams(
        [p.vocab, p.dim], py_utils.WeightInit.Gaussian(0.5, seed=7)))

  def Embed(self, theta, ids):
    return tf.gather(theta.table, ids)

  def Xent(self, theta, x, labels):
    logits = tf.matmul(x, theta.table, transpose_b=True)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def _Tied():
  return TiedEmbedding.Params().Set(name='tied')


def _Layers():
  return ([shared_layer.SharedLayer.Params().Set(name='embed', layer=_Tied(), method='Embed')] +
          layer_helpers.DenseLayers(4, DIM))


def _LossLayer():
  return shared_layer.SharedLayer.Params().Set(name='xent', layer=_Tied(), method='Xent')


class TiedNet(base_layer.BaseLayer):
  """The same network, unpipelined, with one TiedEmbedding used at both ends."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('tied', _Tied())
    for p in layer_helpers.DenseLayers(4, DIM):
      self.CreateChild(p.name, p)

  def FProp(self, theta, ids, labels):
    x = self.tied.Embed(theta.tied, ids)
    for i in range(4):
      x = self.children['layer%d' % i].FProp(theta['layer%d' % i], x)
    return self.tied.Xent(theta.tied, x, labels)


def _Inputs():
  rng = np.random.RandomState(3)
  ids = tf.constant(rng.randint(0, VOCAB, size=[BATCH]).astype(np.int32))
  labels = tf.constant(rng.randint(0, VOCAB, size=[BATCH]).astype(np.int32))
  return ids, labels


class SharedLayerTest(test_utils.TestCase):

  def _Pipeline(self, name, k, m, sched):
    layers = _Layers()
    sizes = [len(layers) // k + (1 if i < len(layers) % k else 0) for i in range(k)]
    partitions, start = [], 0
    for size in sizes:
      partitions.append(layers[start:start + size])
      start += size
    return layer_lib.TensorPipeLayer.Params().Set(
        name=name, partitions=partitions, loss_layer=_LossLayer(), num_micro_batches=m,
        schedule=sched)

  @pytest.mark.slow
  def testTiedWeightsGetTheSumOfBothUsesGradients(self):
    variants = [('plain', TiedNet.Params().Set(name='plain'))]
    for k in (1, 2, 3):
      for sched in ('gpipe', '1f1b', 'zero_bubble'):
        for m in (2, 3):
          name = 'K%d_M%d_%s' % (k, m, sched)
          variants.append((name, self._Pipeline(name, k, m, sched)))
    results = layer_helpers.GradientsOfVariants(variants, _Inputs, loss_fn=tf.reduce_mean)
    plain, plain_loss = results.pop('plain')
    self.assertIn('tied/table/var', plain)
    for name, (grads, loss) in sorted(results.items()):
      self.assertEqual(sorted(grads), sorted(plain), name)  # One table, named after the layer.
      self.assertLess(layer_helpers.MaxRelativeError(grads, plain), 1e-5, name)
      self.assertAllClose(loss, plain_loss, rtol=1e-6)

  def testOneVariableOnTheFirstUsersDevice(self):
    with tf.Graph().as_default(), layer_helpers.Cluster(3):
      net = self._Pipeline('pipe', 3, 2, 'gpipe').Instantiate()
      tables = [v for v in tf.global_variables() if 'table' in v.op.name]
      self.assertEqual([v.op.name for v in tables], ['pipe/tied/table/var'])
      self.assertTrue(tables[0].device.endswith('CPU:0'), tables[0].device)
      self.assertEqual(net.partition_layer_names,
                       [['embed', 'layer0'], ['layer1', 'layer2'], ['layer3', 'xent']])

  def testLingvoSharedSoftmaxAsEmbeddingAndSoftmax(self):
    """Lingvo's own SharedSoftmaxLayer, as EmbLookup first and as Logits last."""
    softmax = lingvo_layers.SharedSoftmaxLayer.Params().Set(
        name='softmax', input_dim=DIM, num_classes=VOCAB,
        params_init=py_utils.WeightInit.Gaussian(0.5, seed=1))
    layers = ([shared_layer.SharedLayer.Params().Set(name='emb', layer=softmax,
                                                     method='EmbLookup')] +
              layer_helpers.DenseLayers(2, DIM) +
              [shared_layer.SharedLayer.Params().Set(name='logits', layer=softmax,
                                                     method='Logits')])
    variants = [('pipe%d' % k, layer_helpers.Pipeline(layers, k, 2, name='pipe%d' % k))
                for k in (1, 2)]
    results = layer_helpers.GradientsOfVariants(variants, lambda: (_Inputs()[0],),
                                          loss_fn=lambda out: tf.reduce_mean(tf.square(out)))
    one, _ = results['pipe1']
    two, _ = results['pipe2']
    self.assertEqual(len([name for name in one if name.startswith('softmax/')]), 2)  # w and b.
    self.assertLess(layer_helpers.MaxRelativeError(two, one), 1e-5)

  def testBadSharing(self):
    # Entries that share a layer are checked by entries.CheckSharedNames (tests/entries_test.py).
    with self.assertRaisesRegex(ValueError, "SharedLayer 'x': set `layer`"):
      shared_layer.SharedLayer.Params().Set(name='x').Instantiate()

  def testAloneItRunsItsLayersMethod(self):
    with self.session(graph=tf.Graph()) as sess:
      layer = _Layers()[0].Instantiate()
      out = layer.FPropDefaultTheta(tf.constant([1, 2]))
      sess.run(tf.global_variables_initializer())
      table = sess.run(layer.vars.tied.table)
      self.assertAllClose(sess.run(out), table[[1, 2]])


if __name__ == '__main__':
  test_utils.main()
