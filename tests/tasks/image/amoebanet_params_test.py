"""Registered image models: parameter counts of the paper's tables, hyper-parameters,
transfer-learning configs, the image input (missing data named, synthetic data, flips and cutout), a
tiny AmoebaNet-B training on the digits."""

import os
import re
import tempfile

import numpy as np
from absl import flags
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import optimizer
from lingvo.core import schedule
from lingvo.core import test_utils

from params import amoebanet as amoebanet_params
from tensorpipe.partition import cost_model
from tensorpipe import placement
from tensorpipe.tasks.image import image_input
from tensorpipe.trainer import preflight
from tensorpipe.trainer import registry

# (model, (L, F), K, paper's parameter count, tolerance).
TABLE1 = [
    ('amoebanet.AmoebaNetDNaive1', (18, 208), 1, 82e6, 0.02),
    ('amoebanet.AmoebaNetDPipeline1', (18, 416), 1, 318e6, 0.02),
    ('amoebanet.AmoebaNetDPipeline2', (18, 544), 2, 542e6, 0.02),
    ('amoebanet.AmoebaNetDPipeline4', (36, 544), 4, 1.05e9, 0.02),
    # 1.843B: the paper's "1.8B" to two significant digits, 2.4% above it (see amoebanet.py).
    ('amoebanet.AmoebaNetDPipeline8', (72, 512), 8, 1.8e9, 0.025),
]

TRANSFER = {
    'Cifar10': (0.0125, 4e-5, 10), 'Cifar100': (0.0125, 4e-5, 100),
    'StanfordCars': (0.15, 0.0, 196), 'OxfordPets': (0.00375, 4e-6, 37),
    'Food101': (0.15, 4e-8, 101), 'FgvcAircraft': (0.075, 4e-8, 100),
    'Birdsnap': (0.15, 4e-6, 500),
}


def _Params(name, dataset='Train'):
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(['test'])
  registry.ImportModel(name)
  return registry.ModelParams(name, dataset)


def _Layers(cfg):
  return cfg.task.pipeline.layers


def _CellFilters(layers):
  cells = [p for p in layers if p.name.startswith('cell_')]
  return len(cells), cells[0].filters


class ParameterCountTest(test_utils.TestCase):

  def testTable1RowsAndImageNetModelMatchThePaper(self):
    for name, (num_cells, filters), k, paper, tolerance in TABLE1:
      cfg = _Params(name)
      layers = _Layers(cfg)
      self.assertEqual(_CellFilters(layers), (num_cells, filters), name)
      self.assertEqual(cfg.task.pipeline.num_partitions, k, name)
      count = cost_model.ParamCount(layers)
      self.assertBetween(count / paper - 1, -tolerance, tolerance, '%s: %d' % (name, count))
    count = cost_model.ParamCount(_Layers(_Params('amoebanet.ImageNetAmoebaNetB18x512')))
    self.assertBetween(count / 557e6 - 1, -0.02, 0.02, count)


class HyperParameterTest(test_utils.TestCase):

  def testImageNetAmoebaNetB(self):
    cfg = _Params('amoebanet.ImageNetAmoebaNetB18x512')
    layers = _Layers(cfg)
    self.assertEqual(_CellFilters(layers), (18, 512))
    self.assertTrue(all(p.genotype == 'B' for p in layers if 'cell' in p.name))
    self.assertEqual(cfg.input.image_size, 480)
    self.assertEqual(cfg.task.pipeline.num_partitions, 4)
    self.assertEqual(cfg.task.pipeline.recompute, 'always')
    self.assertEqual(cfg.task.label_smoothing, 0.1)
    self.assertEqual(cfg.task.aux_loss_weight, 0.4)
    self.assertIn('aux_head', [p.name for p in layers])
    self.assertEqual(layers[-1].dropout_keep_prob, 0.5)
    self.assertLess(layers[3].drop_path_keep_prob, 1.0)
    self.assertGreater(layers[3].drop_path_steps, 0)  # NASNet schedule: ramps over training.
    lp = cfg.task.train.learner
    self.assertIs(lp.optimizer.cls, optimizer.RMSProp)
    self.assertEqual((lp.optimizer.decay, lp.optimizer.epsilon), (0.9, 0.1))
    self.assertEqual(lp.l2_regularizer_weight, 4e-5)
    batch = cfg.input.batch_size
    self.assertAllClose(lp.learning_rate, 0.00125 * batch)
    self.assertIs(lp.lr_schedule.cls, schedule.StepwiseExponentialSchedule)
    self.assertEqual(lp.lr_schedule.decay, 0.97)
    self.assertEqual(lp.lr_schedule.num_steps_per_decay, 3 * (1281167 // batch))

  def testTable2Configs(self):
    for k in (2, 4, 8):
      for m in (1, 4, 32):
        cfg = _Params('amoebanet.AmoebaNetD18x256K%dM%d' % (k, m))
        self.assertEqual(_CellFilters(_Layers(cfg)), (18, 256))
        self.assertEqual((cfg.task.pipeline.num_partitions, cfg.task.pipeline.num_micro_batches),
                         (k, m))
        self.assertEqual(cfg.input.batch_size % m, 0)

  def testTable1NaiveHasNoPipelineNorRecomputation(self):
    p = _Params('amoebanet.AmoebaNetDNaive1').task.pipeline
    self.assertEqual((p.num_partitions, p.num_micro_batches, p.recompute), (1, 1, 'never'))
    for name in ('Pipeline1', 'Pipeline2', 'Pipeline4', 'Pipeline8'):
      p = _Params('amoebanet.AmoebaNetD' + name).task.pipeline
      self.assertEqual((p.num_micro_batches, p.recompute), (16, 'always'))
      self.assertEqual(p.cost_input_shapes, [[128, 224, 224, 3]])

  def testTransferLearningConfigs(self):
    for name, (lr, l2, classes) in TRANSFER.items():
      cfg = _Params('amoebanet.Transfer' + name)
      lp = cfg.task.train.learner
      self.assertAllClose(lp.learning_rate, lr, msg=name)
      self.assertAllClose(lp.l2_regularizer_weight or 0.0, l2, msg=name)
      self.assertIs(lp.optimizer.cls, optimizer.Momentum)
      self.assertEqual(cfg.task.train.max_steps, 20000)
      self.assertEqual(cfg.input.batch_size, 256)
      self.assertEqual(cfg.input.image_size, 480)
      self.assertTrue(cfg.input.random_flip)
      self.assertGreater(cfg.input.cutout_size, 0)
      self.assertEqual(cfg.task.num_classes, classes)
      self.assertEqual(_Layers(cfg)[-1].num_classes, classes)
      self.assertEqual(_CellFilters(_Layers(cfg)), (18, 512))
      ((ckpt, rules),) = cfg.task.train.init_from_checkpoint_rules.items()
      self.assertTrue(ckpt)
      self.assertEqual(cfg.task.name, 'amoebanet')  # Same variable names as the ImageNet model.
      self.assertEqual(rules, amoebanet_params.FreshSoftmaxRules('amoebanet'))

  def testFreshSoftmaxRulesLoadEverythingButTheOutputLayers(self):
    """Lingvo's own rule matching on the tiny transfer model's variables (and a fake slot)."""
    from lingvo.core import py_utils  # pylint: disable=g-import-not-at-top
    cfg = _Params('amoebanet.TinyTransferAmoebaNetB')
    k = cfg.task.pipeline.num_partitions
    with tf.Graph().as_default(), cluster_factory.ForTestingWorker(cpus=k, split_size=k):
      task = cfg.task.Instantiate()
      del task
      all_vars = tf.global_variables()
      slot = tf.Variable(0.0, name='amoebanet/pipeline/cell_0/base/w/var/Momentum')
      step = py_utils.GetOrCreateGlobalStepVar()
      loaded = py_utils._GetVarsToLoad(  # pylint: disable=protected-access
          all_vars + [slot, step], *amoebanet_params.FreshSoftmaxRules('amoebanet'), 'ckpt',
          suppress_logging=True)
    names = {v.name: ckpt_name for ckpt_name, v in loaded}
    self.assertGreater(len(names), 100)
    model_vars = [v for v in all_vars if v.name.startswith('amoebanet/pipeline/')]
    self.assertGreater(len(model_vars), 100)
    for v in model_vars:
      fresh = re.match(r'.*/(classifier|aux_head)/(w|b)/var', v.name)
      self.assertEqual(v.name in names, not fresh, v.name)
      if not fresh:
        self.assertEqual(names[v.name] + ':0', v.name)
    self.assertNotIn(slot.name, names)
    self.assertNotIn(step.name, names)
    self.assertEqual(len(names), len(model_vars) - 4)  # All but classifier and aux head w, b.


class Bfloat16Test(test_utils.TestCase):

  def _Loss(self, mode):
    from tensorpipe.tasks.image import amoebanet  # pylint: disable=g-import-not-at-top
    from tensorpipe.tasks.image import image_classifier  # pylint: disable=g-import-not-at-top
    from tensorpipe import layer as layer_lib  # pylint: disable=g-import-not-at-top
    from lingvo.core import py_utils  # pylint: disable=g-import-not-at-top
    p = image_classifier.ImageClassifier.Params().Set(
        name='clf', num_classes=10, label_smoothing=0.1, bfloat16_activations=mode)
    p.input = image_input.ImageInput.Params().Set(synthetic=True)
    p.pipeline = layer_lib.TensorPipeLayer.Params().Set(
        name='pipeline', num_partitions=2, num_micro_batches=1,
        layers=amoebanet.AmoebaNetLayers('B', 3, 8, 10, 8, image_channels=1, stem_filters=8,
                                         stem_stride=1, num_stem_cells=0))
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default(), cluster_factory.ForTestingWorker(cpus=2, split_size=2):
      tf.random.set_seed(1)
      task = p.Instantiate()
      batch = py_utils.NestedMap(image=tf.constant(rng.uniform(size=[4, 8, 8, 1]), tf.float32),
                                 label=tf.constant([1, 2, 3, 4]))
      predictions = task.ComputePredictions(task.theta, batch)
      metrics, _ = task.ComputeLoss(task.theta, predictions, batch)
      with tf.Session(graph=graph, config=placement.SessionConfig(2)) as sess:
        sess.run(tf.global_variables_initializer())
        loss = sess.run(metrics['loss'][0])
    return predictions.logits.dtype, predictions.aux_logits.dtype, loss

  def testBfloat16ActivationsMatchFloat32(self):
    logits32, _, loss32 = self._Loss('never')
    logits16, aux16, loss16 = self._Loss('always')
    self.assertEqual((logits32, logits16, aux16), (tf.float32, tf.bfloat16, tf.bfloat16))
    self.assertTrue(np.isfinite(loss16))
    self.assertAllClose(loss16, loss32, rtol=0.05)

  def testAcceleratorsModeNeedsTpusOrGpus(self):
    from tensorpipe.tasks.image import image_classifier  # pylint: disable=g-import-not-at-top
    uses = image_classifier.UsesBfloat16
    self.assertFalse(uses('accelerators', ['/job:w/device:CPU:0', '/job:w/device:CPU:1']))
    self.assertFalse(uses('accelerators', ['/job:w/device:GPU:0', '/job:w/device:CPU:1']))
    self.assertTrue(uses('accelerators', ['/job:w/device:TPU:0', '/job:w/device:TPU:1']))
    self.assertTrue(uses('accelerators', ['/job:w/device:GPU:0']))
    self.assertTrue(uses('always', ['/job:w/device:CPU:0']))
    self.assertFalse(uses('never', ['/job:w/device:TPU:0']))


class ImageInputTest(test_utils.TestCase):

  def testMissingDataDirIsNamed(self):
    missing = os.path.join(tempfile.gettempdir(), 'no-such-imagenet-dir')
    p = image_input.ImageInput.Params().Set(tfds_name='imagenet2012', data_dir=missing)
    with self.assertRaisesRegex(ValueError, "data_dir '.*no-such-imagenet-dir' does not exist"):
      p.Instantiate()
    cfg = _Params('amoebanet.ImageNetAmoebaNetB18x512')
    cfg.input.data_dir = missing
    with self.assertRaisesRegex(registry.UsageError, 'no-such-imagenet-dir'):
      preflight.CheckDataDirs(cfg, 'Train')

  def testUnpreparedDatasetAndImageFolderAreNamed(self):
    with tempfile.TemporaryDirectory() as tmp:
      p = image_input.ImageInput.Params().Set(tfds_name='imagenet2012', data_dir=tmp,
                                              manual_dir='/manual')
      with self.assertRaisesRegex(ValueError, "'imagenet2012' is not prepared under data_dir "
                                  ".*manual download in manual_dir '/manual'"):
        image_input.CheckDataSource(p)
      p = image_input.ImageInput.Params().Set(tfds_name='image_folder:birdsnap', data_dir=tmp)
      with self.assertRaisesRegex(ValueError, "image folder '.*birdsnap/train' does not exist"):
        image_input.CheckDataSource(p)

  def testSyntheticBatches(self):
    p = image_input.ImageInput.Params().Set(synthetic=True, image_size=16, num_classes=7,
                                            batch_size=4)
    with tf.Graph().as_default():
      batch = p.Instantiate().GetPreprocessedInputBatch()
      with self.session() as sess:
        value = sess.run(batch)
    self.assertEqual(value.image.shape, (4, 16, 16, 3))
    self.assertTrue(np.all((value.label >= 0) & (value.label < 7)))
    self.assertAllEqual(value.weight, np.ones([4]))

  def testImageFolderThroughTensorflowDatasets(self):
    """Real files read by tensorflow-datasets' ImageFolder, resized, flipped and cut out."""
    from PIL import Image  # pylint: disable=g-import-not-at-top
    with tempfile.TemporaryDirectory() as tmp:
      for split in ('train', 'test'):
        for label, value in (('cat', 40), ('dog', 200)):
          folder = os.path.join(tmp, 'pets', split, label)
          os.makedirs(folder)
          for i in range(3):
            Image.fromarray(np.full([10, 12, 3], value + i, np.uint8)).save(
                os.path.join(folder, '%d.png' % i))
      values = {}
      for split in ('train', 'test'):
        p = image_input.ImageInput.Params().Set(
            tfds_name='image_folder:pets', data_dir=tmp, split=split, image_size=16,
            num_classes=2, batch_size=4, cutout_size=6, seed=1)
        with tf.Graph().as_default():
          inp = p.Instantiate()
          batch = inp.GetPreprocessedInputBatch()
          with self.session() as sess:
            inp.Initialize(sess)
            values[split] = [sess.run(batch) for _ in range(2)]
    train_batch = values['train'][0]
    self.assertEqual(train_batch.image.shape, (4, 16, 16, 3))
    self.assertTrue(set(train_batch.label.tolist()) <= {0, 1})
    self.assertTrue(np.any(train_batch.image == 0))  # Cutout in training.
    test_batches = values['test']
    # Eval: 6 images = one full batch and one padded with weight 0, no cutout.
    self.assertAllEqual(np.concatenate([b.weight for b in test_batches]), [1] * 6 + [0] * 2)
    self.assertFalse(np.any(test_batches[0].image == 0))
    pixel = test_batches[0].image[:, 0, 0, 0] * 255.0
    expected = np.where(test_batches[0].label == 0, 41, 201)
    self.assertAllClose(pixel, expected, atol=1.5)

  def testCutoutZeroesOneSquare(self):
    with tf.Graph().as_default():
      out = image_input.Cutout(tf.ones([32, 32, 3]), 8, seed=3)
      with self.session() as sess:
        value = sess.run(out)
    zeros = value[:, :, 0] == 0
    self.assertAllEqual(zeros, value[:, :, 2] == 0)
    self.assertBetween(int(zeros.sum()), 16, 64)  # An 8x8 square, possibly cut by the border.
    rows, cols = np.nonzero(zeros)
    self.assertLessEqual(rows.max() - rows.min(), 7)
    self.assertLessEqual(cols.max() - cols.min(), 7)


class TinyTrainingTest(test_utils.TestCase):
  """Tiny variants train on the digits through Lingvo's task (BN updates, aux loss, optimizer)."""

  def _Train(self, name, steps=50):
    cfg = _Params(name)
    k = cfg.task.pipeline.num_partitions
    graph = tf.Graph()
    with graph.as_default(), cluster_factory.ForTestingWorker(
        mode='sync', job='trainer_client', cpus=k, split_size=k):
      tf.random.set_seed(1)
      model = cfg.Instantiate()
      model.ConstructFPropBPropGraph()
      task = model.GetTask()
      moving = [v for v in tf.global_variables() if 'moving_mean' in v.op.name]
      init = tf.global_variables_initializer()
    config = placement.SessionConfig(k)
    config.graph_options.rewrite_options.disable_meta_optimizer = True  # Faster to start.
    losses = []
    with tf.Session(graph=graph, config=config) as sess:
      sess.run(init)
      task.input.Initialize(sess)
      for _ in range(steps):
        metrics, _ = sess.run([task.eval_metrics, task.train_op])
        losses.append(metrics['loss'][0])
      moved = sess.run(moving)
    self.assertTrue(np.all(np.isfinite(losses)), losses)
    self.assertLess(np.mean(losses[-5:]), 0.8 * np.mean(losses[:5]), '%s: %s' % (name, losses))
    self.assertGreater(max(np.abs(m).max() for m in moved), 0.0)  # BN updates were applied.

  def testTinyAmoebaNetDLearnsTheDigitsWithFourPartitions(self):
    self._Train('amoebanet.TinyAmoebaNetD')

  def testTinyAmoebaNetBLearnsTheDigits(self):
    self._Train('amoebanet.TinyAmoebaNetB')


if __name__ == '__main__':
  tf.test.main()
