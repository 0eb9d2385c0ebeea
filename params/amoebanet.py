"""Registered AmoebaNet models: the GPipe paper's ImageNet run, Table 1 and Table 2, transfer
learning, and tiny variants that train on CPU (the scikit-learn digits).

  amoebanet.ImageNetAmoebaNetB18x512   AmoebaNet-B (18, 512), 480x480, K = 4 (the paper's 84.4% run)
  amoebanet.AmoebaNetDNaive1 / AmoebaNetDPipeline1 / 2 / 4 / 8   Table 1 (largest model per setting)
  amoebanet.AmoebaNetD18x256K{2,4,8}M{1,4,32}                      Table 2 (throughput)
  amoebanet.Transfer{Cifar10,Cifar100,StanfordCars,OxfordPets,Food101,FgvcAircraft,Birdsnap}
  amoebanet.TinyAmoebaNetD / TinyAmoebaNetB                       digits, K = 4 / 2 CPU devices

Real-data models read tensorflow-datasets from DATA_DIR (override with
--model_params_override='input.data_dir: /path' or a subclass); set SYNTHETIC = True (or
input.synthetic: True) for speed runs without data. The launcher stops with one line naming the
directory if the data is missing. These models skip the one-step smoke test of
tests/trainer/params_test.py (SMOKE_TEST = False): tests/tasks/image/amoebanet_params_test.py checks
the full-size models' structure, hyper-parameters and parameter counts without allocating them, and
trains the tiny variants.
"""

from lingvo import model_registry
from lingvo.core import base_model_params
from lingvo.core import learner
from lingvo.core import optimizer
from lingvo.core import schedule

from tensorpipe import layer as layer_lib
from tensorpipe.tasks.image import amoebanet
from tensorpipe.tasks.image import paper_classifier
from tensorpipe.tasks.image import image_input
# The registered models' package: `params` in a checkout, `tensorpipe.params` when installed.
from . import digits

IMAGENET_TRAIN_IMAGES = 1281167


class AmoebaNetBase(base_model_params.SingleTaskModelParams):
  """AmoebaNet-GENOTYPE (NUM_CELLS, FILTERS) on ImageNet, pipelined over NUM_DEVICES devices."""

  SMOKE_TEST = False  # Full size: see the module docstring.
  GENOTYPE = 'D'
  NUM_CELLS = 18
  FILTERS = 256
  IMAGE_SIZE = 224
  IMAGE_CHANNELS = 3
  NUM_CLASSES = 1000
  NUM_DEVICES = 4
  NUM_MICRO_BATCHES = 16
  RECOMPUTE = 'always'
  BATCH_SIZE = 128
  EVAL_BATCH_SIZE = 128
  TFDS_NAME = 'imagenet2012'
  DATA_DIR = '/data/tensorflow_datasets'
  MANUAL_DIR = '/data/imagenet_manual'
  TRAIN_SPLIT = 'train'
  EVAL_SPLIT = 'validation'
  NUM_TRAIN_IMAGES = IMAGENET_TRAIN_IMAGES
  SYNTHETIC = False
  RANDOM_FLIP = True
  CUTOUT_SIZE = 0
  # Paper hyper-parameters (ImageNet run).
  LEARNING_RATE_PER_EXAMPLE = 0.00125
  LR_DECAY = 0.97
  LR_DECAY_EPOCHS = 3
  RMSPROP_DECAY = 0.9
  RMSPROP_EPSILON = 0.1
  L2 = 4e-5
  LABEL_SMOOTHING = 0.1
  AUX_LOSS_WEIGHT = 0.4
  AUX_SCALING = 0.4  # Aux head widths 128 and 768 scaled as in the AmoebaNet reference.
  DROP_PATH_KEEP_PROB = 0.7
  DROPOUT_KEEP_PROB = 0.5
  BN_DECAY = 0.9997  # As the AmoebaNet reference (per mini-batch).
  BFLOAT16_ACTIVATIONS = 'accelerators'  # bfloat16 activations on TPUs/GPUs, float32 on CPUs.
  NUM_EPOCHS = 100
  STEM_STRIDE = 2
  NUM_STEM_CELLS = 2
  STEM_FILTERS = 32

  def _Input(self, split, batch_size):
    return image_input.ImageInput.Params().Set(
        tfds_name=self.TFDS_NAME, data_dir=self.DATA_DIR, manual_dir=self.MANUAL_DIR, split=split,
        image_size=self.IMAGE_SIZE, num_classes=self.NUM_CLASSES, random_flip=None,
        cutout_size=self.CUTOUT_SIZE, synthetic=self.SYNTHETIC, batch_size=batch_size)

  def Train(self):
    p = self._Input(self.TRAIN_SPLIT, self.BATCH_SIZE)
    p.random_flip = self.RANDOM_FLIP
    return p

  def Test(self):
    return self._Input(self.EVAL_SPLIT, self.EVAL_BATCH_SIZE)

  def Dev(self):
    return self.Test()

  def _TrainSteps(self):
    return int(self.NUM_EPOCHS * self.NUM_TRAIN_IMAGES / self.BATCH_SIZE)

  def _Layers(self):
    return amoebanet.AmoebaNetLayers(
        self.GENOTYPE, self.NUM_CELLS, self.FILTERS, self.NUM_CLASSES, self.IMAGE_SIZE,
        image_channels=self.IMAGE_CHANNELS, stem_filters=self.STEM_FILTERS,
        stem_stride=self.STEM_STRIDE, num_stem_cells=self.NUM_STEM_CELLS,
        aux_head=self.AUX_LOSS_WEIGHT > 0, aux_scaling=self.AUX_SCALING,
        drop_path_keep_prob=self.DROP_PATH_KEEP_PROB, drop_path_steps=self._TrainSteps(),
        dropout_keep_prob=self.DROPOUT_KEEP_PROB, bn_decay=self.BN_DECAY)

  def _Learner(self):
    steps_per_epoch = max(1, self.NUM_TRAIN_IMAGES // self.BATCH_SIZE)
    return learner.Learner.Params().Set(
        name='loss',
        learning_rate=self.LEARNING_RATE_PER_EXAMPLE * self.BATCH_SIZE,
        optimizer=optimizer.RMSProp.Params().Set(decay=self.RMSPROP_DECAY, momentum=0.9,
                                                 epsilon=self.RMSPROP_EPSILON),
        lr_schedule=schedule.StepwiseExponentialSchedule.Params().Set(
            decay=self.LR_DECAY, num_steps_per_decay=self.LR_DECAY_EPOCHS * steps_per_epoch),
        l2_regularizer_weight=self.L2)

  def Task(self):
    p = paper_classifier.ImageClassifier.Params().Set(
        name='amoebanet', num_classes=self.NUM_CLASSES, label_smoothing=self.LABEL_SMOOTHING,
        aux_loss_weight=self.AUX_LOSS_WEIGHT, bfloat16_activations=self.BFLOAT16_ACTIVATIONS)
    p.pipeline = layer_lib.TensorPipeLayer.Params().Set(
        name='pipeline', layers=self._Layers(), num_devices=self.NUM_DEVICES,
        num_micro_batches=self.NUM_MICRO_BATCHES, recompute=self.RECOMPUTE,
        cost_input_shapes=[[self.BATCH_SIZE, self.IMAGE_SIZE, self.IMAGE_SIZE,
                            self.IMAGE_CHANNELS]])
    p.eval.samples_per_summary = 0
    tp = p.train
    tp.max_steps = self._TrainSteps()
    tp.learner = self._Learner()
    tp.save_interval_steps = 1000
    tp.summary_interval_steps = 100
    return p


@model_registry.RegisterSingleTaskModel
class ImageNetAmoebaNetB18x512(AmoebaNetBase):
  """The paper's ImageNet model: AmoebaNet-B (18, 512), 557M parameters, 480x480, 4 partitions."""
  GENOTYPE = 'B'
  NUM_CELLS = 18
  FILTERS = 512
  IMAGE_SIZE = 480
  NUM_DEVICES = 4
  NUM_MICRO_BATCHES = 8  # Not given in the paper; the bubble (K-1)/(M+K-1) is 27% at M = 8.
  BATCH_SIZE = 256
  EVAL_BATCH_SIZE = 64


class _Table1(AmoebaNetBase):
  """Table 1: AmoebaNet-D, 224x224, mini-batch 128, M = 16 (memory experiments)."""
  GENOTYPE = 'D'
  IMAGE_SIZE = 224
  BATCH_SIZE = 128
  NUM_MICRO_BATCHES = 16


@model_registry.RegisterSingleTaskModel
class AmoebaNetDNaive1(_Table1):
  """Table 1, Naive-1: AmoebaNet-D (18, 208), 82M parameters, no pipeline or re-computation."""
  NUM_CELLS, FILTERS = 18, 208
  NUM_DEVICES = 1
  NUM_MICRO_BATCHES = 1
  RECOMPUTE = 'never'


@model_registry.RegisterSingleTaskModel
class AmoebaNetDPipeline1(_Table1):
  """Table 1, Pipeline-1: AmoebaNet-D (18, 416), 318M parameters, one device with re-computation."""
  NUM_CELLS, FILTERS = 18, 416
  NUM_DEVICES = 1


@model_registry.RegisterSingleTaskModel
class AmoebaNetDPipeline2(_Table1):
  """Table 1, Pipeline-2: AmoebaNet-D (18, 544), 542M parameters, 2 devices."""
  NUM_CELLS, FILTERS = 18, 544
  NUM_DEVICES = 2


@model_registry.RegisterSingleTaskModel
class AmoebaNetDPipeline4(_Table1):
  """Table 1, Pipeline-4: AmoebaNet-D (36, 544), 1.05B parameters, 4 devices."""
  NUM_CELLS, FILTERS = 36, 544
  NUM_DEVICES = 4


@model_registry.RegisterSingleTaskModel
class AmoebaNetDPipeline8(_Table1):
  """Table 1, Pipeline-8: AmoebaNet-D (72, 512), 1.8B parameters, 8 devices."""
  NUM_CELLS, FILTERS = 72, 512
  NUM_DEVICES = 8


class _Table2(AmoebaNetBase):
  """Table 2: AmoebaNet-D (18, 256) throughput for K in {2, 4, 8} and M in {1, 4, 32}."""
  GENOTYPE = 'D'
  NUM_CELLS, FILTERS = 18, 256
  IMAGE_SIZE = 224
  BATCH_SIZE = 128  # Divisible by every M of the table.


def _RegisterTable2():
  for k in (2, 4, 8):
    for m in (1, 4, 32):
      name = 'AmoebaNetD18x256K%dM%d' % (k, m)
      cls = type(name, (_Table2,), dict(
          NUM_DEVICES=k, NUM_MICRO_BATCHES=m, __module__=__name__,
          __doc__='Table 2: AmoebaNet-D (18, 256), K = %d partitions, M = %d micro-batches.' %
                  (k, m)))
      globals()[name] = model_registry.RegisterSingleTaskModel(cls)


_RegisterTable2()


class _Transfer(ImageNetAmoebaNetB18x512):
  """Fine-tunes the ImageNet AmoebaNet-B (18, 512) on DATASET with a fresh softmax (paper, Sec. 4).

  480x480, random flips and cutout, SGD with momentum 0.9, batch 256, 20,000 steps, the paper's
  learning rate and L2 per data set. IMAGENET_CHECKPOINT (a checkpoint of ImageNetAmoebaNetB18x512)
  initialises every variable except the classifier's and auxiliary head's final layers.
  """
  TFDS_NAME = ''
  TRAIN_SPLIT = 'train'
  EVAL_SPLIT = 'test'
  NUM_CLASSES = 0
  LEARNING_RATE = 0.0
  L2 = 0.0
  CUTOUT_SIZE = 112
  BATCH_SIZE = 256
  MAX_STEPS = 20000
  MOMENTUM = 0.9
  IMAGENET_CHECKPOINT = '/data/checkpoints/amoebanet_b_18_512_imagenet/ckpt'
  AUX_LOSS_WEIGHT = 0.4

  def _TrainSteps(self):
    return self.MAX_STEPS

  def _Learner(self):
    return learner.Learner.Params().Set(
        name='loss', learning_rate=self.LEARNING_RATE,
        optimizer=optimizer.Momentum.Params().Set(alpha=self.MOMENTUM),
        lr_schedule=schedule.Constant.Params(), l2_regularizer_weight=self.L2 or None)

  def Task(self):
    p = super().Task()
    if self.IMAGENET_CHECKPOINT:
      p.train.init_from_checkpoint_rules = {
          self.IMAGENET_CHECKPOINT: FreshSoftmaxRules(p.name)}
    return p


def FreshSoftmaxRules(task_name):
  """Lingvo checkpoint-loading rules: every model weight and batch-norm average of the pipeline,
  under the same name, except the classifier's and auxiliary head's output layers (a fresh softmax);
  not the optimizer's slots nor the global step."""
  load = [(r'^(%s/pipeline/.*/var):0$' % task_name, '%s')]
  ignore = [r'^%s/pipeline/(classifier|aux_head)/(w|b)/var:0$' % task_name]
  return load, ignore


_TRANSFER = {
    # name: (tfds name, classes, train split, eval split, learning rate, L2)
    'Cifar10': ('cifar10', 10, 'train', 'test', 0.0125, 4e-5),
    'Cifar100': ('cifar100', 100, 'train', 'test', 0.0125, 4e-5),
    'StanfordCars': ('cars196', 196, 'train', 'test', 0.15, 0.0),
    'OxfordPets': ('oxford_iiit_pet', 37, 'train', 'test', 0.00375, 4e-6),
    'Food101': ('food101', 101, 'train', 'validation', 0.15, 4e-8),
    # Not in tensorflow-datasets 4.9.2: read from DATA_DIR/<name>/{train,test}/<class>/*.jpg.
    'FgvcAircraft': ('image_folder:fgvc_aircraft', 100, 'train', 'test', 0.075, 4e-8),
    'Birdsnap': ('image_folder:birdsnap', 500, 'train', 'test', 0.15, 4e-6),
}


def _RegisterTransfer():
  for name, (tfds_name, classes, train, test, lr, l2) in _TRANSFER.items():
    cls_name = 'Transfer' + name
    cls = type(cls_name, (_Transfer,), dict(
        TFDS_NAME=tfds_name, NUM_CLASSES=classes, TRAIN_SPLIT=train, EVAL_SPLIT=test,
        LEARNING_RATE=lr, L2=l2, __module__=__name__,
        __doc__='Transfer learning to %s (learning rate %g, L2 %g).' % (name, lr, l2)))
    globals()[cls_name] = model_registry.RegisterSingleTaskModel(cls)


_RegisterTransfer()


class _Tiny(digits.DigitsData, AmoebaNetBase):
  """A tiny AmoebaNet on the digits (8x8x1, 10 classes) that trains on CPU in a minute."""
  # tests/tasks/image/amoebanet_params_test.py trains both tiny models (faster there, without
  # grappler's rewrites).
  SMOKE_TEST = False
  NUM_CELLS, FILTERS = 3, 8
  IMAGE_SIZE = 8
  IMAGE_CHANNELS = 1
  NUM_CLASSES = 10
  STEM_STRIDE = 1
  NUM_STEM_CELLS = 0
  STEM_FILTERS = 8
  BATCH_SIZE = 64
  EVAL_BATCH_SIZE = 120
  NUM_MICRO_BATCHES = 2
  MAX_STEPS = 600
  DROP_PATH_KEEP_PROB = 0.9
  DROPOUT_KEEP_PROB = 0.8
  BN_DECAY = 0.95  # Moving averages must settle within a few hundred steps.

  def _TrainSteps(self):
    return self.MAX_STEPS

  def Task(self):
    p = super().Task()
    p.train.save_interval_steps = 200
    p.train.summary_interval_steps = 50
    return p


@model_registry.RegisterSingleTaskModel
class TinyAmoebaNetD(_Tiny):
  """Tiny AmoebaNet-D (3, 8) on the digits: K = 4 partitions on 4 CPU devices, M = 2."""
  GENOTYPE = 'D'
  NUM_DEVICES = 4


@model_registry.RegisterSingleTaskModel
class TinyAmoebaNetB(_Tiny):
  """Tiny AmoebaNet-B (3, 8) on the digits: K = 2 partitions on 2 CPU devices, M = 2."""
  GENOTYPE = 'B'
  NUM_DEVICES = 2


@model_registry.RegisterSingleTaskModel
class TinyTransferAmoebaNetB(TinyAmoebaNetB):
  """Fine-tunes a TinyAmoebaNetB checkpoint (set CHECKPOINT) with a fresh softmax: SGD with
  momentum, as the paper's transfer runs (the digits stand in for the target data set)."""
  CHECKPOINT = ''  # e.g. /tmp/tiny_b/train/ckpt-00000600; empty: train from scratch.
  MAX_STEPS = 300

  def _Learner(self):
    return learner.Learner.Params().Set(
        name='loss', learning_rate=0.05, optimizer=optimizer.Momentum.Params().Set(alpha=0.9),
        lr_schedule=schedule.Constant.Params(), l2_regularizer_weight=4e-5)

  def Task(self):
    p = super().Task()
    if self.CHECKPOINT:
      p.train.init_from_checkpoint_rules = {self.CHECKPOINT: FreshSoftmaxRules(p.name)}
    return p
