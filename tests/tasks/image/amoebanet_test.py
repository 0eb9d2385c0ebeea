"""AmoebaNet layers: FPropMeta shapes match FProp, a tiny AmoebaNet-D pipelines exactly with
drop-path and dropout on, their masks do not depend on re-computation, K or M, bad genotypes and
sizes are reported."""

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import test_utils
from lingvo.core import tshape

from tensorpipe.tasks.image import amoebanet
from tensorpipe.tasks.image import conv_layers
from tests import layer_helpers

BATCH = 8
NUM_CLASSES = 5


def TinyLayers(genotype='D', keep_prob=1.0, dropout=1.0):
  """8 layers on 8x8x1 input: stem, cell, reduction, cell, aux head, reduction, cell, classifier."""
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

  @pytest.mark.slow
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

  @pytest.mark.slow
  def testSameGradientsAndMovingAveragesAsUnpipelinedForK4WithDropPath(self):
    reference, ref_moving, num_updates, _ = layer_helpers.StepWithBatchNormUpdates(
        layer_helpers.Plain(TinyLayers(keep_prob=0.6, dropout=0.5)), _Inputs, loss_fn=_Loss)
    self.assertGreater(len(ref_moving), 50)
    self.assertEqual(num_updates, len(ref_moving))
    # Re-computation against its absence, with drop-path: the test below.
    for k, mode in ((4, 'always'),):
      grads, moving, num_updates, num_relevant = layer_helpers.StepWithBatchNormUpdates(
          layer_helpers.Pipeline(TinyLayers(keep_prob=0.6, dropout=0.5), k, 1, mode), _Inputs,
          loss_fn=_Loss)
      # Element by element: a batch-norm scale's gradient can nearly cancel (norm ~1e-3), where the
      # function bodies' own optimised kernels round differently from the unoptimised plain graph.
      self.assertEqual(sorted(grads), sorted(reference))
      for name in reference:
        self.assertAllClose(grads[name], reference[name], rtol=1e-4, atol=1e-6,
                            msg='K=%d %s' % (k, name))
      self.assertEqual(num_updates, len(ref_moving))
      self.assertEqual(num_relevant, num_updates)
      for name in ref_moving:
        self.assertAllClose(moving[name], ref_moving[name], rtol=1e-5, atol=1e-6,
                            msg='K=%d %s' % (k, name))

  @pytest.mark.slow
  def testDropPathAndDropoutMasksSurviveRecomputation(self):
    """stem, cell_0 (drop-path) and classifier (dropout): 'always' re-computes the same masks."""

    def Layers():
      stem, cell, _, _, _, _, _, classifier = TinyLayers(keep_prob=0.6, dropout=0.5)
      classifier.input_dim = amoebanet.Cell.Plan(cell).output_dim
      return [stem, cell, classifier]

    loss = lambda out: _Loss((out[0], out[0]))
    never, _, _, _ = layer_helpers.StepWithBatchNormUpdates(
        layer_helpers.Pipeline(Layers(), 2, 2, 'never'), _Inputs, loss_fn=loss)
    always, _, _, _ = layer_helpers.StepWithBatchNormUpdates(
        layer_helpers.Pipeline(Layers(), 2, 2, 'always'), _Inputs, loss_fn=loss)
    self.assertLess(layer_helpers.MaxRelativeError(always, never), 1e-5)

  def testDropPathAndDropoutMasksDoNotDependOnKOrM(self):
    """Batch-norm-free drop-path cells and the classifier: pipelined gradients equal the plain ones.

    (Batch norm normalises each micro-batch on its own, so with it only M = 1 matches the plain
    model.)
    """

    def Layers(keep):
      def Conv(name, cin):
        return conv_layers.ConvBn.Params().Set(name=name, filter_shape=(3, 3, cin, 8),
                                               relu_first=True, batch_norm=False)
      def Pool(name, op, cell_index):
        return amoebanet.CellOp.Params().Set(name=name, operation=op, input_dim=8, filters=8,
                                             drop_path_keep_prob=keep, cell_index=cell_index,
                                             num_cells=2)
      return [Conv('conv0', 1), Pool('pool0', 'max_pool_3x3', 0), Conv('conv1', 8),
              Pool('pool1', 'avg_pool_3x3', 1),
              amoebanet.Classifier.Params().Set(name='classifier', input_dim=8,
                                                num_classes=NUM_CLASSES, dropout_keep_prob=keep)]

    loss = lambda out: _Loss((out[0], out[0]))
    reference = layer_helpers.StepWithBatchNormUpdates(layer_helpers.Plain(Layers(0.5)), _Inputs,
                                                 loss_fn=loss)[0]
    no_dropout = layer_helpers.StepWithBatchNormUpdates(layer_helpers.Plain(Layers(1.0)), _Inputs,
                                                  loss_fn=loss)[0]
    self.assertGreater(layer_helpers.MaxRelativeError(no_dropout, reference), 0.05)  # Masks matter.
    for k, m in ((1, 4), (2, 1), (2, 2), (2, 4), (4, 2)):
      grads = layer_helpers.StepWithBatchNormUpdates(layer_helpers.Pipeline(Layers(0.5), k, m),
                                                     _Inputs,
                                               loss_fn=loss)[0]
      self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-5, 'K=%d M=%d' % (k, m))

  def testCellDrawsItsOpsDropPathsTogetherBitForBit(self):
    """A cell's drop-path masks, drawn together, are those its ops would each draw."""
    cell_p = [p for p in TinyLayers(keep_prob=0.6) if p.name == 'cell_0'][0]
    cell_p.drop_path_steps = 10  # A keep probability that ramps with the step (a tensor).
    with self.session(graph=tf.Graph()) as sess:
      step = tf.train.get_or_create_global_step()
      cell = cell_p.Instantiate()
      x = tf.constant(np.random.RandomState(1).normal(size=[BATCH, 8, 8, cell_p.input_dim]),
                      tf.float32)
      together = cell.FPropDefaultTheta(x)[0]
      self.assertLen(cell.DropPaths(x), len([op for op in cell.ops if op.drops_path]))
      cell.DropPaths = lambda unused_x: {}  # Each op draws its own.
      alone = cell.FPropDefaultTheta(x)[0]
      sess.run(tf.global_variables_initializer())
      sess.run(tf.assign(step, 5))
      together, alone = sess.run([together, alone])
    self.assertAllEqual(together, alone)

  def testEvalHasNoAuxLogitsNorDropout(self):
    graph = tf.Graph()
    with graph.as_default(), cluster_factory.ForTestingWorker(cpus=2, split_size=2, do_eval=True):
      net = layer_helpers.Pipeline(TinyLayers(keep_prob=0.5, dropout=0.5), 2, 2).Instantiate()
      logits, aux = net.FPropDefaultTheta(*_Inputs())
      self.assertIsNone(aux)
      with layer_helpers.Session(graph, 2) as sess:
        sess.run(tf.global_variables_initializer())
        first, second = sess.run(logits), sess.run(logits)
    self.assertEqual(first.shape, (BATCH, NUM_CLASSES))
    self.assertAllEqual(first, second)


if __name__ == '__main__':
  tf.test.main()
