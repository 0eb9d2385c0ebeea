"""`python -m tools.partition_report`, run as a user runs it: a registered model's report, and
one-line errors with exit code 2."""

import unittest

import pytest

from tests import helpers


class PartitionReportToolTest(unittest.TestCase):

  def testReportsARegisteredModel(self):
    code, out, err = helpers.RunTool('partition_report', '--model=digits.TinyConvPipeline',
                                     '--num_partitions=2', '--algorithm=both')
    self.assertEqual(code, 0, err)
    self.assertIn("digits.TinyConvPipeline task.pipeline: 2 partitions, cost 'flops', algorithm "
                  "'optimal', M = 8", out)
    self.assertIn("algorithm 'min_variance'", out)
    self.assertEqual(out.count('predicted efficiency'), 2)

  @pytest.mark.slow
  def testErrorsAreOneLine(self):
    code, _, err = helpers.RunTool('partition_report', '--model=digits.TinyConvPipeline',
                                   '--memory_budget=1KiB')
    self.assertEqual(code, 2, err)
    self.assertRegex(err, r'(?m)^partition_report: error: .*fits a memory budget of 1.00 KiB per '
                     r'device; the best split needs .*\n\Z')
    self.assertEqual(len([l for l in err.splitlines() if 'partition_report' in l]), 1, err)
    code, _, err = helpers.RunTool('partition_report', '--model=digits.TinyConvPipeline',
                                   '--memory_budget=lots')
    self.assertEqual(code, 2, err)
    self.assertIn("memory budget 'lots' is not a size such as 8GiB", err)


if __name__ == '__main__':
  unittest.main()
