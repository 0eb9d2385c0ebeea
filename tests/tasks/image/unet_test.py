"""The U-Net classifier (tensorpipe/tasks/image/unet.py, digits.TinyUNetPipeline).

Its long skip connections cross partitions at K = 4; its gradients equal a hand-written network's
for every K, schedule and M (dividing the batch or not); it learns the held-out digits.
"""

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import cluster_factory
from lingvo.core import test_utils
from lingvo.core import tshape

from tensorpipe import layer as layer_lib
from tensorpipe.tasks.image import pipelined_classifier
from tensorpipe.tasks.image import digits_input
from tensorpipe.tasks.image import unet
from tests import layer_helpers
from tests import trainer_helpers

BATCH = 16
IMAGE_SHAPE = (8, 8, 1)


def _Inputs():
  rng = np.random.RandomState(0)
  images = rng.uniform(size=[BATCH] + list(IMAGE_SHAPE)).astype(np.float32)
  labels = rng.randint(0, 10, size=[BATCH]).astype(np.int32)
  return tf.constant(images), tf.constant(labels)


def _XentParams():
  return pipelined_classifier.PerExampleXent.Params().Set(name='xent', num_classes=10)


class UNetByHand(base_layer.BaseLayer):
  """unet.TinyUNet's network with its skips written out, and the per-example cross-entropy."""

  def __init__(self, params):
    super().__init__(params)
    layers, _ = unet.TinyUNet(IMAGE_SHAPE)
    for layer_params in layers:
      self.CreateChild(layer_params.name, layer_params)
    self.CreateChild('xent', _XentParams())

  def FProp(self, theta, images, labels):
    down0 = self.down0.FProp(theta.down0, images)
    down1 = self.down1.FProp(theta.down1, down0)
    bottom = self.bottom.FProp(theta.bottom, down1)
    up1 = self.up1.FProp(theta.up1, bottom, down1)
    up0 = self.up0.FProp(theta.up0, up1, down0)
    return self.xent.FProp(theta.xent, self.head.FProp(theta.head, up0), labels)


def _Pipeline(name, k, m=1, sched='gpipe', **kwargs):
  layers, skips = unet.TinyUNet(IMAGE_SHAPE)
  return layer_lib.TensorPipeLayer.Params().Set(
      name=name, layers=layers, skip_connections=skips, num_devices=k, num_micro_batches=m,
      schedule=sched, cost_input_shapes=[[BATCH] + list(IMAGE_SHAPE)], loss_layer=_XentParams(),
      **kwargs)


def _MeanXent(out):
  return tf.reduce_mean(out.xent)


def _ErrorOverLargestNorm(grads, reference):
  """max over variables of |g - g_ref|, over the largest |g_ref| (Frobenius norms)."""
  assert sorted(grads) == sorted(reference), (sorted(grads), sorted(reference))
  largest = max(np.linalg.norm(g) for g in reference.values())
  return max(np.linalg.norm(grads[k] - reference[k]) for k in grads) / largest


class UpBlockTest(test_utils.TestCase):

  def testFPropMetaShapesMatchFProp(self):
    for merge in unet.MERGES:
      layers, _ = unet.TinyUNet(IMAGE_SHAPE, merge=merge)
      with tf.Graph().as_default():
        x = tf.zeros([2] + list(IMAGE_SHAPE))
        shape = tshape.Shape([2] + list(IMAGE_SHAPE))
        outs = {}
        for p in layers:
          meta = p.cls.FPropMeta(p, shape)
          self.assertGreater(meta.flops, 0, p.name)
          shape = meta.out_shapes[0]
          skip = [outs['down' + p.name[2:]]] if p.name.startswith('up') else []
          x = p.Instantiate().FPropDefaultTheta(x, *skip)
          outs[p.name] = x
          self.assertEqual(x.shape.as_list(), shape.ToTensorShape().as_list(), (merge, p.name))
      self.assertEqual(x.shape.as_list(), [2, 10])

  def testUpsamplingIsATransposedConvolution(self):
    """The 1x1 conv + depth_to_space equals conv2d_transpose (2x2 kernel, stride 2) with the same
    weights: filter[dy, dx, o, c] = up_w[0, 0, c, (2 dy + dx) skip_dim + o]."""
    rng = np.random.RandomState(1)
    x = rng.normal(size=[3, 2, 2, 5]).astype(np.float32)
    p = unet.UpBlock.Params().Set(name='up', input_dim=5, skip_dim=4, output_dim=6, seed=2)
    with tf.Graph().as_default():
      block = p.Instantiate()
      theta = block.theta
      up = tf.nn.depth_to_space(tf.nn.conv2d(x, theta.up_w, [1, 1, 1, 1], 'VALID'), 2)
      up_w = tf.reshape(theta.up_w, [5, 2, 2, 4])
      transposed = tf.nn.conv2d_transpose(x, tf.transpose(up_w, [1, 2, 3, 0]), [3, 4, 4, 4],
                                          strides=2, padding='SAME')
      with self.session() as sess:
        sess.run(tf.global_variables_initializer())
        got, expected = sess.run([up, transposed])
    self.assertAllClose(got, expected, rtol=1e-5, atol=1e-6)

  def testBadValuesAreNamed(self):
    with self.assertRaisesRegex(ValueError, r"UpBlock 'u': merge='sum' is not one of "
                                r"\('concat', 'add'\)"):
      unet.UpBlock.Params().Set(name='u', input_dim=4, skip_dim=2, output_dim=2,
                                merge='sum').Instantiate()
    with self.assertRaisesRegex(ValueError, "UpBlock 'u': skip_dim must be a positive integer, "
                                'got 0'):
      unet.UpBlock.Params().Set(name='u', input_dim=4, output_dim=2).Instantiate()
    with tf.Graph().as_default():
      block = unet.UpBlock.Params().Set(name='u', input_dim=4, skip_dim=2,
                                        output_dim=2).Instantiate()
      with self.assertRaisesRegex(ValueError, r"UpBlock 'u': x \[1, 2, 2, 4\] and skip "
                                  r"\[1, 8, 8, 2\] do not fit.*skip_dim=2"):
        block.FPropDefaultTheta(tf.zeros([1, 2, 2, 4]), tf.zeros([1, 8, 8, 2]))
    with self.assertRaisesRegex(ValueError, r'image_shape \(6, 6, 1\) is not divisible by 2\^2 = '
                                r'4.*use fewer channels entries or larger images'):
      unet.TinyUNet((6, 6, 1))


class PartitioningTest(test_utils.TestCase):
  """The registered model's skip connections cross partitions, and go straight there."""

  def testSkipsCrossPartitionsAtK4(self):
    cfg = trainer_helpers.ModelParams('digits.TinyUNetPipeline')
    params = cfg.task.pipeline.Copy().Set(name='pipe')
    self.assertEqual(params.num_devices, 4)
    self.assertEqual(params.num_micro_batches, 8)
    self.assertEqual(params.skip_connections, [('down1', 'up1'), ('down0', 'up0')])
    with tf.Graph().as_default(), layer_helpers.Cluster(4):
      net = params.Instantiate()
      names = net.partition_layer_names
      partition_of = {name: k for k, layers in enumerate(names) for name in layers}
      for source, destination in params.skip_connections:
        self.assertLess(partition_of[source], partition_of[destination], (source, destination))
      self.assertEqual(names, [['down0', 'down1'], ['bottom'], ['up1'], ['up0', 'head']])
      net.FPropDefaultTheta(tf.zeros([BATCH] + list(IMAGE_SHAPE)))
      functions = layer_lib._FUNCTIONS.Of(tf.get_default_graph())[net]  # pylint: disable=protected-access
      inputs = {sig[0].index: f.num_inputs for sig, f in functions.items()}
    # 'bottom' gets down1's output only: neither skip passes through its partition. up1 gets
    # bottom's output and down1's; up0 gets up1's and down0's, straight from partition 0.
    self.assertEqual(inputs, {0: 1, 1: 1, 2: 2, 3: 2})


class GradientsTest(test_utils.TestCase):
  """Every variable's gradient (and the loss) equals the hand-written network's, for K in {1, 2,
  4} and M in {8, 3} (16 examples: 8 x 2, or 6 + 5 + 5), for one schedule per test."""

  def _Check(self, sched):
    variants = [('hand', UNetByHand.Params().Set(name='hand'))]
    if sched == 'gpipe':
      variants.append(('unpipelined', _Pipeline('unpipelined', 4, unpipelined=True)))
    for k in (1, 2, 4):
      for m in (8, 3):
        name = 'K%d_M%d' % (k, m)
        variants.append((name, _Pipeline(name, k, m, sched)))
    results = layer_helpers.GradientsOfVariants(variants, _Inputs, _MeanXent)
    reference, ref_loss = results.pop('hand')
    # w, b of the 3 down layers; up_w, up_b, w, b of the 2 up layers; w1, b1, w2, b2 of the head.
    self.assertLen(reference, 3 * 2 + 2 * 4 + 4)
    self.assertGreater(max(np.linalg.norm(g) for g in reference.values()), 0.0)
    for name, (grads, loss) in sorted(results.items()):
      self.assertLess(_ErrorOverLargestNorm(grads, reference), 1e-5, (sched, name))
      self.assertAllClose(loss, ref_loss, rtol=1e-6, msg=(sched, name))

  @pytest.mark.slow
  def testGpipe(self):
    self._Check('gpipe')

  @pytest.mark.slow
  def testOneFOneB(self):
    self._Check('1f1b')

  @pytest.mark.slow
  def testZeroBubble(self):
    self._Check('zero_bubble')


class TrainingTest(test_utils.TestCase):
  """A short run of the registered model's training step learns the held-out digits."""

  STEPS = 150

  @pytest.mark.slow
  def testLearnsTheHeldOutDigits(self):
    cfg = trainer_helpers.ModelParams('digits.TinyUNetPipeline')
    test_images, test_labels = digits_input.LoadArrays(
        digits_input.DigitsInput.Params().Set(split='test'))
    graph, task = trainer_helpers.TrainerGraph(cfg, 4)
    with graph.as_default():
      # The same variables, evaluated on the 359 held-out images (M = 8: 45 or 44 per micro-batch).
      with cluster_factory.ForTestingWorker(mode='sync', job='trainer_client', cpus=4,
                                            split_size=4, do_eval=True):
        logits = task.pipeline.FProp(task.theta.pipeline, tf.constant(test_images))
        predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
        accuracy = tf.reduce_mean(tf.cast(tf.equal(predicted, test_labels), tf.float32))
      init = tf.global_variables_initializer()
    with tf.Session(graph=graph, config=layer_helpers.ValuesOnlyConfig(4)) as sess:
      sess.run(init)
      task.input.Initialize(sess)
      before = sess.run(accuracy)
      losses = [sess.run([task.eval_metrics, task.train_op])[0]['loss'][0]
                for _ in range(self.STEPS)]
      after = sess.run(accuracy)
    # Chance is 10%; 150 of the model's 800 steps reach about 95% held-out accuracy.
    self.assertLess(before, 0.3)
    self.assertGreater(after, 0.85)
    self.assertLess(np.mean(losses[-20:]), 0.3 * np.mean(losses[:5]))


if __name__ == '__main__':
  tf.test.main()
