"""ResNet layers: ResNet-101 has the standard 44.5M parameters; FPropMeta matches FProp; a tiny
ResNet pipelines with the gradients of the plain model."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils
from lingvo.core import tshape

from tensorpipe.partitioner import cost_model
from tensorpipe.tasks.image import resnet
from tests import layer_helpers


def TinyLayers():
  return resnet.ResNetLayers(num_classes=5, image_channels=1, base_width=4, stem_kernel=3,
                             stem_stride=1, stem_max_pool=False, blocks=(1, 1, 1, 1))


def _Inputs():
  return (tf.constant(np.random.RandomState(0).uniform(size=[4, 8, 8, 1]).astype(np.float32)),)


class ResNetTest(test_utils.TestCase):

  def testResNet101HasTheStandardParameterCount(self):
    layers = resnet.ResNetLayers(101)
    self.assertLen(layers, 1 + 33 + 1)
    # 44,549,160: torchvision's / the paper's ResNet-101 (convolutions without bias, batch-norm
    # scale and offset, a 2048 x 1000 classifier with bias).
    self.assertEqual(cost_model.ParamCount(layers), 44549160)

  def testFPropMetaShapesMatchFProp(self):
    layers = resnet.ResNetLayers(50, num_classes=7, base_width=4)
    with tf.Graph().as_default():
      x = tf.zeros([2, 64, 64, 3])
      shape = tshape.Shape([2, 64, 64, 3])
      for p in layers:
        meta = p.cls.FPropMeta(p, shape)
        self.assertGreater(meta.flops, 0)
        shape = meta.out_shapes[0]
        x = p.Instantiate().FPropDefaultTheta(x)
        self.assertEqual(x.shape.as_list(), shape.ToTensorShape().as_list(), p.name)
    self.assertEqual(x.shape.as_list(), [2, 7])

  def testPipelinedGradientsEqualPlain(self):
    loss = lambda out: tf.reduce_mean(tf.square(out))
    reference, ref_moving, _, _ = layer_helpers.StepWithBatchNormUpdates(
        layer_helpers.Plain(TinyLayers()), _Inputs, loss_fn=loss)
    grads, moving, num_updates, _ = layer_helpers.StepWithBatchNormUpdates(
        layer_helpers.Pipeline(TinyLayers(), 4, 1), _Inputs, loss_fn=loss)
    self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-4)
    self.assertEqual(num_updates, len(ref_moving))
    for name in ref_moving:
      self.assertAllClose(moving[name], ref_moving[name], rtol=1e-5, atol=1e-6, msg=name)

  def testBadDepth(self):
    with self.assertRaisesRegex(ValueError,
                                'ResNet depth must be one of \\[50, 101, 152\\], got 34'):
      resnet.ResNetLayers(34)


if __name__ == '__main__':
  tf.test.main()
