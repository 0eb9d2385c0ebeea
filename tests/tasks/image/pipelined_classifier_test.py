"""The classifier tasks' per-example loss: label smoothing, the auxiliary loss, bad input."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.tasks.image import pipelined_classifier


def _Softmax(x):
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


class PerExampleXentTest(test_utils.TestCase):

  def testSmoothingAndAuxiliaryLoss(self):
    rng = np.random.RandomState(0)
    logits, aux = rng.normal(size=[2, 3, 4]).astype(np.float32)
    labels = np.array([0, 3, 1])
    with self.session(graph=tf.Graph()) as sess:
      xent = pipelined_classifier.PerExampleXent
      plain = xent.Params().Set(name='x', num_classes=4).Instantiate()
      smooth = xent.Params().Set(name='s', num_classes=4, label_smoothing=0.1,
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
      pipelined_classifier.PerExampleXent.Params().Set(name='x', label_smoothing=1.0).Instantiate()


if __name__ == '__main__':
  test_utils.main()
