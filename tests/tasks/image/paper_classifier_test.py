"""ImageClassifier: the same step whatever the schedule, and its bfloat16 activations."""

import contextlib

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import layer as layer_lib
from tensorpipe.tasks.image import amoebanet
from tensorpipe.tasks.image import paper_classifier
from tensorpipe.tasks.image import image_input
from tests import layer_helpers


@contextlib.contextmanager
def _TinyTask(num_micro_batches, schedule='gpipe', weights=None, **task_params):
  """Yields (graph, task, predictions, metrics) of a tiny AmoebaNet-B ImageClassifier.

  The task has an auxiliary head and K = 2 partitions; it runs on 4 random 8x8 images, in a new
  graph and a 2-device cluster.
  """
  p = paper_classifier.ImageClassifier.Params().Set(name='clf', num_classes=10,
                                                    label_smoothing=0.1, **task_params)
  p.input = image_input.ImageInput.Params().Set(synthetic=True)
  p.pipeline = layer_lib.TensorPipeLayer.Params().Set(
      name='pipeline', num_devices=2, num_micro_batches=num_micro_batches, schedule=schedule,
      layers=amoebanet.AmoebaNetLayers('B', 3, 8, 10, 8, image_channels=1, stem_filters=8,
                                       stem_stride=1, num_stem_cells=0, aux_head=True))
  rng = np.random.RandomState(0)
  graph = tf.Graph()
  with graph.as_default(), cluster_factory.ForTestingWorker(cpus=2, split_size=2):
    tf.random.set_seed(1)
    task = p.Instantiate()
    batch = py_utils.NestedMap(image=tf.constant(rng.uniform(size=[4, 8, 8, 1]), tf.float32),
                               label=tf.constant([1, 2, 3, 4]))
    if weights is not None:
      batch.weight = tf.constant(weights)
    predictions = task.ComputePredictions(task.theta, batch)
    metrics, _ = task.ComputeLoss(task.theta, predictions, batch)
    yield graph, task, predictions, metrics


class ImageClassifierTest(test_utils.TestCase):

  def _Step(self, schedule):
    """Metrics and gradients of the tiny task (with its aux head) under `schedule`."""
    with _TinyTask(2, schedule, weights=[1.0, 1.0, 1.0, 0.0],
                   aux_loss_weight=0.4) as (graph, task, _, metrics):
      grads = [g for g in tf.gradients(metrics['loss'][0], tf.trainable_variables())
               if g is not None]
      with tf.Session(graph=graph, config=layer_helpers.ValuesOnlyConfig(2)) as sess:
        sess.run(tf.global_variables_initializer())
        values, grad_values = sess.run([{k: v[0] for k, v in metrics.items()}, grads])
    return task, values, grad_values

  @pytest.mark.slow
  def testSchedulesGiveTheSameStep(self):
    task, gpipe, gpipe_grads = self._Step('gpipe')
    self.assertIsNone(task.pipeline.params.loss_layer)
    # The task puts the per-example loss in the last partition for every schedule but gpipe alike;
    # zero_bubble also splits the backward passes.
    for schedule in ('zero_bubble',):
      task, got, grads = self._Step(schedule)
      self.assertEqual(task.pipeline.params.loss_layer.label_smoothing, 0.1)  # In the pipeline.
      self.assertEqual(set(got), set(gpipe))
      for name in gpipe:
        self.assertAllClose(got[name], gpipe[name], rtol=1e-5, atol=1e-6, msg=(schedule, name))
      self.assertLen(grads, len(gpipe_grads))
      for g, ref in zip(grads, gpipe_grads):
        self.assertAllClose(g, ref, rtol=1e-4, atol=1e-6, msg=schedule)
    self.assertGreater(len(gpipe_grads), 20)
    self.assertEqual(gpipe['num_samples_in_batch'], 3.0)  # The example of weight 0 is padding.
    self.assertIn('accuracy_top5', gpipe)
    self.assertGreater(gpipe['loss'], gpipe['log_pplx'])  # Smoothing and the auxiliary loss add.


class Bfloat16Test(test_utils.TestCase):

  def _Loss(self, mode):
    with _TinyTask(1, bfloat16_activations=mode) as (graph, _, predictions, metrics):
      with tf.Session(graph=graph, config=layer_helpers.ValuesOnlyConfig(2)) as sess:
        sess.run(tf.global_variables_initializer())
        loss = sess.run(metrics['loss'][0])
    return predictions.logits.dtype, predictions.aux_logits.dtype, loss

  @pytest.mark.slow
  def testBfloat16ActivationsMatchFloat32(self):
    logits32, _, loss32 = self._Loss('never')
    logits16, aux16, loss16 = self._Loss('always')
    self.assertEqual((logits32, logits16, aux16), (tf.float32, tf.bfloat16, tf.bfloat16))
    self.assertTrue(np.isfinite(loss16))
    self.assertAllClose(loss16, loss32, rtol=0.05)

  def testAcceleratorsModeNeedsTpusOrGpus(self):
    uses = paper_classifier.UsesBfloat16
    self.assertFalse(uses('accelerators', ['/job:w/device:CPU:0', '/job:w/device:CPU:1']))
    self.assertFalse(uses('accelerators', ['/job:w/device:GPU:0', '/job:w/device:CPU:1']))
    self.assertTrue(uses('accelerators', ['/job:w/device:TPU:0', '/job:w/device:TPU:1']))
    self.assertTrue(uses('accelerators', ['/job:w/device:GPU:0']))
    self.assertTrue(uses('always', ['/job:w/device:CPU:0']))
    self.assertFalse(uses('never', ['/job:w/device:TPU:0']))


if __name__ == '__main__':
  test_utils.main()
