"""`python -m tools.plan`, run as a user runs it: a ranked table with the flags of the best, and
one-line errors with exit code 2."""

import re
import unittest

import pytest

from tests import helpers


class PlanToolTest(unittest.TestCase):

  @pytest.mark.slow
  def testPlansARegisteredModelAndFailsClearly(self):
    code, out, err = helpers.RunTool('plan', '--model=digits.TinyConvPipeline', '--devices=4',
                                     '--device=V100-16GB', '--rows=5')
    self.assertEqual(code, 0, err)
    self.assertRegex(out, r'rank +S +K +M +schedule +recompute +step ms +examples/s +bubble')
    self.assertRegex(out, r'best: S=\d K=\d M=\d+ gpipe \w+; train it with: --worker_gpus=\d')
    code, _, err = helpers.RunTool('plan', '--model=digits.TinyConvPipeline', '--devices=4',
                                   '--device=V100-16GB', '--device_memory=1KiB')
    self.assertEqual(code, 2, err)
    least = re.search(r'the least memory one needs is ([0-9.]+ \w+) per device', err)
    self.assertIsNotNone(least, err)
    code, _, err = helpers.RunTool('plan', '--model=digits.TinyConvPipeline', '--devices=4',
                                   '--device=V200')
    self.assertEqual(code, 2, err)
    self.assertIn("unknown device profile 'V200'; known profiles: cpu, A100-40GB", err)


if __name__ == '__main__':
  unittest.main()
