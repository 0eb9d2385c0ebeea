"""In-step checks fail with TensorPipe's one line first: CheckFailure, OneLine, Raising and Run."""

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe import check_failure

LINE = "TensorPipeLayer 'pipe': shape [20, 8] of layer 'a\\b' is \"wrong\""


class CheckFailureTest(test_utils.TestCase):

  def _Failing(self, graph):
    """A check that fails, with a message holding brackets, quotes, a backslash and numbers."""
    with graph.as_default():
      shape = tf.constant([20, 8])
      size = tf.constant(3)
      return check_failure.Assert(tf.equal(size, 4), [
          "TensorPipeLayer 'pipe': shape ", shape, " of layer 'a\\b' is \"wrong\" (", size,
          ' examples)'])

  def testOneLineFromARealSessionError(self):
    graph = tf.Graph()
    check = self._Failing(graph)
    with self.session(graph=graph) as sess:
      with self.assertRaises(tf.errors.InvalidArgumentError) as failure:
        sess.run(check)
    self.assertIn('Graph execution error', str(failure.exception))
    self.assertEqual(check_failure.OneLine(failure.exception), LINE + ' (3 examples)')

  def testRunRaisesTheLineFirst(self):
    graph = tf.Graph()
    check = self._Failing(graph)
    with self.session(graph=graph) as sess:
      with self.assertRaises(check_failure.CheckFailure) as failure:
        check_failure.Run(sess, check)
    self.assertEqual(str(failure.exception), LINE + ' (3 examples)')
    self.assertIsNone(failure.exception.__cause__)  # Only TensorPipe's line is printed.
    self.assertIsInstance(failure.exception.error, tf.errors.InvalidArgumentError)
    self.assertEqual(check_failure.OneLine(failure.exception), LINE + ' (3 examples)')
    # An error raised while handling one keeps the line reachable.
    try:
      try:
        raise failure.exception
      except check_failure.CheckFailure as e:
        raise RuntimeError('while stopping') from e
    except RuntimeError as e:
      self.assertEqual(check_failure.OneLine(e), LINE + ' (3 examples)')

  def testPassingChecksAndOtherErrorsAreUnchanged(self):
    graph = tf.Graph()
    with graph.as_default():
      passing = check_failure.Assert(tf.constant(True), ['never shown'])
      other = tf.debugging.Assert(tf.constant(False), ['plain TensorFlow assert [1, 2]'])
    with self.session(graph=graph) as sess:
      check_failure.Run(sess, passing)
      with self.assertRaises(tf.errors.InvalidArgumentError) as failure:
        check_failure.Run(sess, other)
    self.assertIsNone(check_failure.OneLine(failure.exception))
    self.assertIsNone(check_failure.OneLine(ValueError('no check [here]')))
    # An opening delimiter without its closing one is not a line.
    self.assertIsNone(check_failure.OneLine(ValueError(check_failure.OPEN + 'cut short')))


if __name__ == '__main__':
  test_utils.main()
