"""Registered models on the scikit-learn handwritten digits (8x8 images, 10 classes).

  digits.TinyConvPipeline: a 4-layer conv net as one TensorPipeLayer, K = 4 partitions (one per
  logical device: --cpu_devices=4 on CPU, --worker_gpus=4 --worker_split_size=4 on GPUs), M = 8
  micro-batches.
  digits.TinyUNetPipeline: a small U-Net-like classifier (tensorpipe/tasks/image/unet.py) with long
  skip connections across its 4 partitions; otherwise as TinyConvPipeline (same data, task,
  learner, K, M and steps).

Train: python -m tensorpipe.trainer.train --model=digits.TinyConvPipeline --cpu_devices=4 \
         --mode=sync --run_locally=cpu --logdir=/tmp/digits
Eval:  python -m tensorpipe.trainer.train --model=digits.TinyConvPipeline --cpu_devices=4 \
         --mode=sync --run_locally=cpu --logdir=/tmp/digits --job=evaler_test
(--model=digits.TinyUNetPipeline likewise.)
"""

from lingvo import model_registry
from lingvo.core import base_model_params
from lingvo.core import learner
from lingvo.core import optimizer
from lingvo.core import schedule

from tensorpipe import layer as layer_lib
from tensorpipe.tasks.image import pipelined_classifier
from tensorpipe.tasks.image import digits_input
from tensorpipe.tasks.image import unet


class DigitsData:
  """The digits splits and a learner for the tiny models of every family that train on them.

  Mix in before the family's params class, e.g. `class TinyX(digits.DigitsData, XBase)`.
  """

  TINY = True  # CPU-sized: --list_models marks it tiny.
  BATCH_SIZE = 64
  EVAL_BATCH_SIZE = 120  # 359 held-out examples = 3 batches, the last one padded.
  MAX_STEPS = 800
  DATA_DIR = ''  # scikit-learn's bundled copy.

  def Train(self):
    return digits_input.DigitsInput.Params().Set(
        data_dir=self.DATA_DIR, split='train', batch_size=self.BATCH_SIZE,
        max_shift=1)  # Random +-1 pixel shifts.

  def Test(self):
    # resettable: the evaler covers the whole held-out split once per checkpoint.
    return digits_input.DigitsInput.Params().Set(
        data_dir=self.DATA_DIR, split='test', batch_size=self.EVAL_BATCH_SIZE, resettable=True)

  def Dev(self):
    # No separate dev split: --job=evaler_dev evaluates the same held-out split as evaler_test.
    return self.Test()

  def _Learner(self):
    """Adam at 3e-3 decaying linearly to 5% over MAX_STEPS, L2 1e-4."""
    return learner.Learner.Params().Set(
        name='loss', learning_rate=3e-3, optimizer=optimizer.Adam.Params(),
        lr_schedule=schedule.LinearSchedule.Params().Set(start=(0, 1.0),
                                                         limit=(self.MAX_STEPS, 0.05)),
        l2_regularizer_weight=1e-4)


@model_registry.RegisterSingleTaskModel
class TinyConvPipeline(DigitsData, base_model_params.SingleTaskModelParams):
  """Tiny conv net on the digits, pipelined over 4 devices with 8 micro-batches."""

  NUM_DEVICES = 4
  NUM_MICRO_BATCHES = 8

  def Task(self):
    p = pipelined_classifier.PipelinedClassifier.Params().Set(name='digits', num_classes=10)
    p.pipeline = layer_lib.TensorPipeLayer.Params().Set(
        name='pipeline',
        layers=pipelined_classifier.TinyConvLayers(image_shape=(8, 8, 1), num_classes=10),
        num_devices=self.NUM_DEVICES,
        num_micro_batches=self.NUM_MICRO_BATCHES,
        cost_input_shapes=[[self.BATCH_SIZE, 8, 8, 1]],
        recompute='always')
    p.eval.samples_per_summary = 0  # The whole held-out split.

    tp = p.train
    tp.max_steps = self.MAX_STEPS
    tp.save_interval_steps = 200
    tp.save_max_to_keep = 10
    tp.summary_interval_steps = 50
    tp.learner = self._Learner()
    return p


@model_registry.RegisterSingleTaskModel
class TinyUNetPipeline(TinyConvPipeline):
  """A tiny U-Net on the digits: skip connections from the first partition into the last two.

  Only the network differs from TinyConvPipeline: down0 -> down1 -> bottom -> up1 -> up0 -> head
  (unet.TinyUNet), where up1 also reads down1's output and up0 reads down0's. Balanced by flops
  into K = 4 partitions, [down0, down1] [bottom] [up1] [up0, head], so both skips cross partitions.
  """

  def Task(self):
    p = super().Task()
    layers, skips = unet.TinyUNet(image_shape=(8, 8, 1), num_classes=10)
    p.pipeline.Set(layers=layers, skip_connections=skips)
    return p
