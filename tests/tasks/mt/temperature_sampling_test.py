"""temperature_sampling: q_l = p_l^(1/T) / sum_k p_k^(1/T), p_l = D_l / sum(D), vs the formula."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.tasks.mt import temperature_sampling


class LanguageProbabilitiesTest(test_utils.TestCase):

  def testMatchesTheFormula(self):
    sizes = [2000000000, 35000, 1000000, 5]
    for t in (1.0, 2.0, 5.0, 100.0):
      p = np.array(sizes, np.float64) / sum(sizes)
      expected = p**(1.0 / t) / np.sum(p**(1.0 / t))
      self.assertAllClose(temperature_sampling.LanguageProbabilities(sizes, t), expected,
                          rtol=1e-12)

  def testLimits(self):
    sizes = [900, 90, 9]
    self.assertAllClose(temperature_sampling.LanguageProbabilities(sizes, 1.0),
                        np.array(sizes) / 999.0)
    self.assertAllClose(temperature_sampling.LanguageProbabilities(sizes, 1e9), [1 / 3.0] * 3)
    # T = 5 over-samples the low-resource language relative to its share of the data.
    q = temperature_sampling.LanguageProbabilities(sizes, 5.0)
    self.assertGreater(q[2], 9 / 999.0)
    self.assertLess(q[0], 900 / 999.0)

  def testBadInput(self):
    with self.assertRaisesRegex(ValueError, 'temperature must be > 0, got 0'):
      temperature_sampling.LanguageProbabilities([1, 2], 0)
    with self.assertRaisesRegex(ValueError, r'at least one example, got sizes \[3.0, 0.0\]'):
      temperature_sampling.LanguageProbabilities([3, 0], 5)
    with self.assertRaisesRegex(ValueError, 'non-empty list'):
      temperature_sampling.LanguageProbabilities([], 5)


if __name__ == '__main__':
  tf.test.main()
