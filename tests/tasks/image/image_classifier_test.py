"""ImageClassifier's bfloat16 activations: the float32 loss, and which devices each mode uses."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import test_utils

from tensorpipe import placement
from tensorpipe.tasks.image import image_input


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


if __name__ == '__main__':
  tf.test.main()
