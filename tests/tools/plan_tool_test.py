"""`python -m tools.plan`, run as a user runs it: a ranked table with the flags of the best, and
one-line errors with exit code 2."""

import unittest

import pytest

from tests import helpers


class PlanToolTest(unittest.TestCase):

  @pytest.mark.slow
  def testPlansARegisteredModelAndFailsClearly(self):
    code, out, err = helpers.RunTool('plan', '--model=digits.TinyConvPipeline', '--devices=4',
                                     '--device=V100-16GB', '--rows=5')
    self.assertEqual(code, 0, err)
    self.assertRegex(out, r'rank +S +K +v +M +schedule +recompute +step ms +examples/s +bubble')
    self.assertRegex(out, r'best: S=\d K=\d M=\d+ gpipe \w+; train it with: --worker_gpus=\d')
    code, _, err = helpers.RunTool('plan', '--model=digits.TinyConvPipeline', '--devices=4',
                                   '--device=V100-16GB', '--device_memory=1KiB')
    self.assertEqual(code, 2, err)
    self.assertRegex(err, r'(?m)^tools.plan: error: digits.TinyConvPipeline task.pipeline fits no '
                     r'configuration on 4 devices of 1.00 KiB: the least memory one needs is '
                     r'[0-9.]+ \w+ per device \(S=\d K=\d M=\d+ .*\n\Z')


if __name__ == '__main__':
  unittest.main()
