"""A partition's layers inside a trace: what they may read."""

from lingvo import compat as tf
from lingvo.core import test_utils

from tests import layer_helpers

K = 2


class DirectVariableReadTest(test_utils.TestCase):

  def testReadingAWeightOutsideThetaIsRefused(self):

    class Sneaky(layer_helpers.Dense):

      def FProp(self, theta, x):
        return tf.matmul(x, self.vars.w)

    layers = [Sneaky.Params().Set(name='sneaky', dim=8)] + layer_helpers.DenseLayers(1)
    with tf.Graph().as_default(), layer_helpers.Cluster(K):
      net = layer_helpers.Pipeline(layers, K, 2).Instantiate()
      with self.assertRaisesRegex(
          ValueError, r"a layer of pipe_partition0 reads trainable variables "
          r"\['pipe/sneaky/w/var'\] directly instead of through theta"):
        net.FPropDefaultTheta(tf.ones([4, 8]))


if __name__ == '__main__':
  tf.test.main()
