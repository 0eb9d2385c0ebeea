"""Classifier tasks: per-example loss, its weighting, and the same step whatever the schedule."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import layer as layer_lib
from tensorpipe import placement
from tensorpipe.tasks.image import amoebanet
from tensorpipe.tasks.image import classifier
from tensorpipe.tasks.image import image_classifier
from tensorpipe.tasks.image import image_input


def _Softmax(x):
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


class PerExampleXentTest(test_utils.TestCase):

  def testSmoothingAndAuxiliaryLoss(self):
    rng = np.random.RandomState(0)
    logits, aux = rng.normal(size=[2, 3, 4]).astype(np.float32)
    labels = np.array([0, 3, 1])
    with self.session(graph=tf.Graph()) as sess:
      plain = classifier.PerExampleXent.Params().Set(name='x', num_classes=4).Instantiate()
      smooth = classifier.PerExampleXent.Params().Set(name='s', num_classes=4, label_smoothing=0.1,
                                                      aux_loss_weight=0.4).Instantiate()
      out_plain = plain.FProp(plain.theta, tf.constant(logits), tf.constant(labels))
      out_smooth = smooth.FProp(smooth.theta, (tf.constant(logits), tf.constant(aux)),
                                tf.constant(labels))
      got_plain, got_smooth = sess.run([out_plain, out_smooth])
    nll = -np.log(_Softmax(logits)[np.arange(3), labels])
    target = np.full([3, 4], 0.1 / 4) + 0.9 * np.eye(4)[labels]
    smoothed = -(target * np.log(_Softmax(logits))).sum(-1)
    smoothed_aux = -(target * np.log(_Softmax(aux))).sum(-1)
    self.assertAllClose(got_plain.xent, nll, rtol=1e-5)
    self.assertAllClose(got_plain.nll, nll, rtol=1e-5)
    self.assertNotIn('aux_logits', got_plain)
    self.assertAllClose(got_smooth.xent, smoothed + 0.4 * smoothed_aux, rtol=1e-5)
    self.assertAllClose(got_smooth.nll, nll, rtol=1e-5)
    self.assertAllClose(got_smooth.aux_logits, aux)

  def testBadSmoothingIsNamed(self):
    with self.assertRaisesRegex(ValueError, r"PerExampleXent 'x': label_smoothing must be in "
                                r"\[0, 1\), got 1.0"):
      classifier.PerExampleXent.Params().Set(name='x', label_smoothing=1.0).Instantiate()


class ImageClassifierTest(test_utils.TestCase):

  def _Step(self, schedule):
    """Metrics and gradients of a tiny AmoebaNet-B task (with its aux head) under `schedule`."""
    p = image_classifier.ImageClassifier.Params().Set(
        name='clf', num_classes=10, label_smoothing=0.1, aux_loss_weight=0.4)
    p.input = image_input.ImageInput.Params().Set(synthetic=True)
    p.pipeline = layer_lib.TensorPipeLayer.Params().Set(
        name='pipeline', num_partitions=2, num_micro_batches=2, schedule=schedule,
        layers=amoebanet.AmoebaNetLayers('B', 3, 8, 10, 8, image_channels=1, stem_filters=8,
                                         stem_stride=1, num_stem_cells=0, aux_head=True))
    rng = np.random.RandomState(0)
    graph = tf.Graph()
    with graph.as_default(), cluster_factory.ForTestingWorker(cpus=2, split_size=2):
      tf.random.set_seed(1)
      task = p.Instantiate()
      batch = py_utils.NestedMap(image=tf.constant(rng.uniform(size=[4, 8, 8, 1]), tf.float32),
                                 label=tf.constant([1, 2, 3, 4]),
                                 weight=tf.constant([1.0, 1.0, 1.0, 0.0]))
      predictions = task.ComputePredictions(task.theta, batch)
      metrics, _ = task.ComputeLoss(task.theta, predictions, batch)
      grads = [g for g in tf.gradients(metrics['loss'][0], tf.trainable_variables())
               if g is not None]
      with tf.Session(graph=graph, config=placement.SessionConfig(2)) as sess:
        sess.run(tf.global_variables_initializer())
        values, grad_values = sess.run([{k: v[0] for k, v in metrics.items()}, grads])
    return task, values, grad_values

  def testSchedulesGiveTheSameStep(self):
    task, gpipe, gpipe_grads = self._Step('gpipe')
    self.assertIsNone(task.pipeline.params.loss_layer)
    for schedule in ('1f1b', 'zero_bubble'):
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


if __name__ == '__main__':
  test_utils.main()
