"""AmoebaNet layers: FPropMeta shapes match FProp, a tiny AmoebaNet-D pipelines exactly, dropout/drop-path
masks survive re-computation, bad genotypes and sizes are reported."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import test_utils
from lingvo.core import tshape

from tensorpipe import amoebanet
from tests import helpers

BATCH = 8
NUM_CLASSES = 5


def TinyLayers(genotype='D', keep_prob=1.0, dropout=1.0):
  """8 layers on 8x8x1 images: stem, cell, reduction, cell, aux head, reduction, cell, classifier."""
  return amoebanet.AmoebaNetLayers(genotype, num_cells=3, filters=8, num_classes=NUM_CLASSES,
                                   image_size=8, image_channels=1, stem_filters=8, stem_stride=1,
                                   num_stem_cells=0, drop_path_keep_prob=keep_prob,
                                   dropout_keep_prob=dropout)


def _Inputs():
  x = np.random.RandomState(0).uniform(size=[BATCH, 8, 8, 1]).astype(np.float32)
  return (tf.constant(x),)


def _Loss(out):
  logits, aux = out
  labels = tf.constant(np.arange(BATCH) % NUM_CLASSES)
  xent = tf.nn.sparse_softmax_cross_entropy_with_logits
  return tf.reduce_mean(xent(labels=labels, logits=logits)) + 0.4 * tf.reduce_mean(
      xent(labels=labels, logits=aux))


class AmoebaNetStructureTest(test_utils.TestCase):

  def testLayerSequence(self):
    names = [p.name for p in TinyLayers()]
    self.assertEqual(names, ['stem', 'cell_0', 'reduction_cell_0', 'cell_1', 'aux_head',
                             'reduction_cell_1', 'cell_2', 'classifier'])
    full = [p.name for p in amoebanet.AmoebaNetLayers('B', 18, 64)]
    self.assertEqual(full[:4], ['stem', 'stem_cell_0', 'stem_cell_1', 'cell_0'])
    self.assertEqual(full.index('reduction_cell_0'), 3 + 6)
    self.assertEqual(full.index('aux_head'), full.index('cell_11') + 1)
    self.assertEqual(len(full), 1 + 2 + 18 + 2 + 1 + 1)

  def testFPropMetaShapesMatchFProp(self):
    for genotype in ('B', 'D'):
      layers = amoebanet.AmoebaNetLayers(genotype, 3, 8, NUM_CLASSES, image_size=33,
                                         stem_filters=8)
      with tf.Graph().as_default():
        args = (tf.zeros([2, 33, 33, 3]),)
        shapes = (tshape.Shape([2, 33, 33, 3]),)
        for p in layers:
          meta = p.cls.FPropMeta(p, *shapes)
          self.assertGreater(meta.flops, 0, p.name)
          shapes = tuple(meta.out_shapes)
          out = p.Instantiate().FPropDefaultTheta(*args)
          args = out if isinstance(out, tuple) else (out,)
          self.assertEqual([None if a is None else a.shape.as_list() for a in args],
                           [None if s is None else s.ToTensorShape().as_list() for s in shapes],
                           '%s %s' % (genotype, p.name))

  def testBadGenotypeAndSizes(self):
    with self.assertRaisesRegex(ValueError, "genotype must be one of \\['B', 'D'\\], got 'C'"):
      amoebanet.AmoebaNetLayers('C')
    with self.assertRaisesRegex(ValueError, 'num_cells \\(L\\) must be a positive multiple of 3, '
                                'got 20'):
      amoebanet.AmoebaNetLayers('D', 20)
    with self.assertRaisesRegex(ValueError, 'filters \\(F\\) must be a positive multiple of 4, '
                                'got 30'):
      amoebanet.AmoebaNetLayers('D', 18, 30)


class TinyAmoebaNetPipelineTest(test_utils.TestCase):

  def testSameGradientsAndMovingAveragesAsUnpipelinedForK124(self):
    reference, ref_moving, num_updates, _ = helpers.StepWithBatchNormUpdates(
        helpers.Plain(TinyLayers()), _Inputs, loss_fn=_Loss)
    self.assertGreater(len(ref_moving), 50)
    self.assertEqual(num_updates, len(ref_moving))
    for k, mode in ((1, 'never'), (2, 'always'), (4, 'always')):
      grads, moving, num_updates, num_relevant = helpers.StepWithBatchNormUpdates(
          helpers.Pipeline(TinyLayers(), k, 1, mode), _Inputs, loss_fn=_Loss)
      self.assertLess(helpers.MaxRelativeError(grads, reference), 1e-4, 'K=%d' % k)
      self.assertEqual(num_updates, len(ref_moving))
      self.assertEqual(num_relevant, num_updates)
      for name in ref_moving:
        self.assertAllClose(moving[name], ref_moving[name], rtol=1e-5, atol=1e-6,
                            msg='K=%d %s' % (k, name))

  def testDropPathAndDropoutMasksSurviveRecomputation(self):
    """stem, cell_0 (drop-path) and the classifier (dropout): 'always' re-computes the same masks."""

    def Layers():
      stem, cell, _, _, _, _, _, classifier = TinyLayers(keep_prob=0.6, dropout=0.5)
      classifier.input_dim = amoebanet.Cell.Plan(cell).output_dim
      return [stem, cell, classifier]

    loss = lambda out: _Loss((out[0], out[0]))
    never, _, _, _ = helpers.StepWithBatchNormUpdates(
        helpers.Pipeline(Layers(), 2, 2, 'never'), _Inputs, loss_fn=loss)
    always, _, _, _ = helpers.StepWithBatchNormUpdates(
        helpers.Pipeline(Layers(), 2, 2, 'always'), _Inputs, loss_fn=loss)
    self.assertLess(helpers.MaxRelativeError(always, never), 1e-5)

  def testEvalHasNoAuxLogitsNorDropout(self):
    graph = tf.Graph()
    with graph.as_default(), cluster_factory.ForTestingWorker(cpus=2, split_size=2, do_eval=True):
      net = helpers.Pipeline(TinyLayers(keep_prob=0.5, dropout=0.5), 2, 2).Instantiate()
      logits, aux = net.FPropDefaultTheta(*_Inputs())
      self.assertIsNone(aux)
      with helpers.Session(graph, 2) as sess:
        sess.run(tf.global_variables_initializer())
        first, second = sess.run(logits), sess.run(logits)
    self.assertEqual(first.shape, (BATCH, NUM_CLASSES))
    self.assertAllEqual(first, second)


if __name__ == '__main__':
  tf.test.main()
