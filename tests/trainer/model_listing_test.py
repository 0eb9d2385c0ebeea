"""--list_models's lines (tensorpipe.trainer.model_listing)."""

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import model_listing
from tensorpipe.trainer import registry

MODEL = 'digits.TinyConvPipeline'


class ListModelsTest(test_utils.TestCase):

  def _Line(self, name):
    return model_listing.ModelLine(name, registry.RegisteredModels()[name])

  def testTinyAndPaperScaleWithTheirK(self):
    self.assertEqual(
        self._Line(MODEL),
        MODEL + '  [tiny, K=4]  Tiny conv net on the digits, pipelined over 4 devices with 8 '
        'micro-batches.')
    self.assertStartsWith(self._Line('amoebanet.AmoebaNetDPipeline8'),
                          'amoebanet.AmoebaNetDPipeline8  [paper-scale, K=8]  Table 1, ')
    self.assertStartsWith(self._Line('mt.Num2WordsTinyT'),
                          'mt.Num2WordsTinyT  [tiny, K=2 (encoder), 2 (decoder)]  T(3, 256, 4)')
    self.assertStartsWith(self._Line('mt.T24H8192A16'),
                          'mt.T24H8192A16  [paper-scale, K=4 (encoder), 4 (decoder)]  ')


if __name__ == '__main__':
  tf.test.main()
