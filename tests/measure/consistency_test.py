"""consistency: the comparison core; a run failure's first meaningful line (`_Cause`), and the
checks of Compare's own arguments."""

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.measure import consistency
from tensorpipe.measure import consistency_cases


class CompareTest(test_utils.TestCase):

  def testAToleranceMustBePositive(self):
    for tolerance in (0, -1e-5):
      with self.assertRaisesRegex(ValueError, r'^tolerance must be positive, got %r' % tolerance):
        consistency.Compare(consistency_cases.PaperExample(), tolerance=tolerance)


class CauseTest(test_utils.TestCase):
  """_Cause: the first meaningful line of a run failure."""

  def _RunError(self, fn):
    with tf.Graph().as_default() as graph, tf.Session(graph=graph) as sess:
      try:
        sess.run(fn())
      except tf.errors.OpError as e:
        return e
    raise AssertionError('the graph ran')

  def testAnAssertionGivesItsMessageAlone(self):
    error = self._RunError(lambda: tf.debugging.Assert(
        tf.constant(False), ['TensorPipeLayer p: partition 0 mixes examples along batch_dim=0 '
                             '(inputs args[0] [4, 8, 4])', tf.constant(0.5), tf.constant([1, 2])]))
    self.assertStartsWith(error.message, 'Graph execution error:')
    self.assertEqual(consistency._Cause(error),  # pylint: disable=protected-access
                     'TensorPipeLayer p: partition 0 mixes examples along batch_dim=0 (inputs '
                     'args[0] [4, 8, 4])')

  def testOtherErrorsGiveTypeAndFirstLineAfterTensorFlowsTraceback(self):
    message = ('Graph execution error:\n\nDetected at node \'add\' defined at (most recent call '
               'last):\n    File "model.py", line 3, in <module>\n      y = x + {\'a\': 1}\nNode: '
               '\'add\'\nIncompatible shapes: [2,4] vs. [3,4]\n\t [[{{node add}}]]')
    error = tf.errors.InvalidArgumentError(None, None, message)
    self.assertEqual(consistency._Cause(error),  # pylint: disable=protected-access
                     'InvalidArgumentError: Incompatible shapes: [2,4] vs. [3,4]')
    grouped = ('Graph execution error:\n\n2 root error(s) found.\n  (0) INVALID_ARGUMENT: '
               'assertion failed: [M=4 is larger than the batch of 3 examples] [3]\n')
    self.assertEqual(
        consistency._Cause(tf.errors.InvalidArgumentError(None, None, grouped)),  # pylint: disable=protected-access
        'M=4 is larger than the batch of 3 examples')
    self.assertEqual(consistency._Cause(ValueError('bad\nmore')), 'ValueError: bad')  # pylint: disable=protected-access


if __name__ == '__main__':
  test_utils.main()
