"""stateless_dropout: masks are a pure function of (example seed, site, position)."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe import stateless_dropout


class StatelessDropoutTest(test_utils.TestCase):

  def testMaskIsPerExampleDeterministicAndHasTheKeepRate(self):
    with self.session(graph=tf.Graph()) as sess:
      x = tf.ones([8, 40, 50])
      seeds = stateless_dropout.ExampleSeeds(8, 7)
      y = stateless_dropout.Dropout(x, 0.8, seeds, 3)
      again = stateless_dropout.Dropout(x, 0.8, seeds, 3)
      part = stateless_dropout.Dropout(x[4:6], 0.8, seeds[4:6], 3)  # A micro-batch of the same rows.
      other_site = stateless_dropout.Dropout(x, 0.8, seeds, 4)
      next_step = stateless_dropout.Dropout(x, 0.8, stateless_dropout.ExampleSeeds(8, 8), 3)
      y, again, part, other_site, next_step = sess.run([y, again, part, other_site, next_step])
    self.assertAllEqual(y, again)
    self.assertAllEqual(y[4:6], part)
    self.assertAllClose(np.mean(y == 0), 0.2, atol=0.01)
    self.assertAllClose(y[y != 0], np.full([np.sum(y != 0)], 1.25))
    for other in (other_site, next_step):
      self.assertAllClose(np.mean((y == 0) != (other == 0)), 2 * 0.2 * 0.8, atol=0.02)
    self.assertGreater(np.mean((y[0] == 0) != (y[1] == 0)), 0.2)  # Examples differ.

  def testKeepOneIsIdentityAndBadKeepProbRaises(self):
    x = tf.ones([2, 3])
    self.assertIs(stateless_dropout.Dropout(x, 1.0, tf.constant([1, 2]), 0), x)
    with self.assertRaisesRegex(ValueError, 'keep_prob must be in \\(0, 1\\], got 1.5'):
      stateless_dropout.Dropout(x, 1.5, tf.constant([1, 2]), 0)


if __name__ == '__main__':
  tf.test.main()
