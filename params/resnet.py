"""Registered ResNet models: ResNet-101 on ImageNet (the paper's model for overhead analysis) and a
tiny ResNet on the digits that trains on CPU.

  resnet.ImageNetResNet101   ResNet-101, 224x224, K = 4 partitions, M = 8 micro-batches
  resnet.TinyResNet          bottleneck ResNet (1, 1, 1, 1 blocks, width 4) on the digits, K = 2
"""

from lingvo import model_registry
from lingvo.core import base_model_params
from lingvo.core import learner
from lingvo.core import optimizer
from lingvo.core import schedule

from tensorpipe import layer as layer_lib
from tensorpipe.tasks.image import paper_classifier
from tensorpipe.tasks.image import image_input
from tensorpipe.tasks.image import resnet
# The registered models' package: `params` in a checkout, `tensorpipe.params` when installed.
from . import digits


@model_registry.RegisterSingleTaskModel
class ImageNetResNet101(base_model_params.SingleTaskModelParams):
  """ResNet-101 (44.5M params) on ImageNet, pipelined over 4 devices (SGD momentum, step decay)."""

  SMOKE_TEST = False  # Full size: tests/tasks/image/resnet_test.py checks its structure.
  DEPTH = 101
  IMAGE_SIZE = 224
  NUM_CLASSES = 1000
  NUM_DEVICES = 4
  NUM_MICRO_BATCHES = 8
  BATCH_SIZE = 256
  TFDS_NAME = 'imagenet2012'
  DATA_DIR = '/data/tensorflow_datasets'
  MANUAL_DIR = '/data/imagenet_manual'
  SYNTHETIC = False
  NUM_TRAIN_IMAGES = 1281167
  NUM_EPOCHS = 90

  def _Input(self, split):
    return image_input.ImageInput.Params().Set(
        tfds_name=self.TFDS_NAME, data_dir=self.DATA_DIR, manual_dir=self.MANUAL_DIR, split=split,
        image_size=self.IMAGE_SIZE, num_classes=self.NUM_CLASSES, synthetic=self.SYNTHETIC,
        batch_size=self.BATCH_SIZE)

  def Train(self):
    return self._Input('train')

  def Test(self):
    return self._Input('validation')

  def Dev(self):
    return self.Test()

  def _Layers(self):
    return resnet.ResNetLayers(self.DEPTH, self.NUM_CLASSES)

  def _Learner(self):
    steps_per_epoch = self.NUM_TRAIN_IMAGES // self.BATCH_SIZE
    return learner.Learner.Params().Set(
        name='loss', learning_rate=0.1 * self.BATCH_SIZE / 256,
        optimizer=optimizer.Momentum.Params().Set(alpha=0.9),
        lr_schedule=schedule.PiecewiseConstantSchedule.Params().Set(
            boundaries=[30 * steps_per_epoch, 60 * steps_per_epoch, 80 * steps_per_epoch],
            values=[1.0, 0.1, 0.01, 0.001]),
        l2_regularizer_weight=1e-4)

  def Task(self):
    p = paper_classifier.ImageClassifier.Params().Set(name='resnet', num_classes=self.NUM_CLASSES,
                                                      label_smoothing=0.0)
    channels = 1 if self.IMAGE_SIZE == 8 else 3
    p.pipeline = layer_lib.TensorPipeLayer.Params().Set(
        name='pipeline', layers=self._Layers(), num_devices=self.NUM_DEVICES,
        num_micro_batches=self.NUM_MICRO_BATCHES, recompute='always',
        cost_input_shapes=[[self.BATCH_SIZE, self.IMAGE_SIZE, self.IMAGE_SIZE, channels]])
    p.eval.samples_per_summary = 0
    p.train.max_steps = self.NUM_EPOCHS * self.NUM_TRAIN_IMAGES // self.BATCH_SIZE
    p.train.learner = self._Learner()
    return p


@model_registry.RegisterSingleTaskModel
class TinyResNet(digits.DigitsData, ImageNetResNet101):
  """A tiny bottleneck ResNet on the digits (8x8x1): K = 2 partitions on 2 CPU devices, M = 4."""

  SMOKE_TEST = True
  IMAGE_SIZE = 8
  NUM_CLASSES = 10
  NUM_DEVICES = 2
  NUM_MICRO_BATCHES = 4
  BATCH_SIZE = 64
  MAX_STEPS = 600

  def _Layers(self):
    return resnet.ResNetLayers(num_classes=self.NUM_CLASSES, image_channels=1, base_width=4,
                               stem_kernel=3, stem_stride=1, stem_max_pool=False,
                               blocks=(1, 1, 1, 1))

  def Task(self):
    p = super().Task()
    p.train.max_steps = self.MAX_STEPS
    p.train.save_interval_steps = 200
    p.train.summary_interval_steps = 50
    return p
