"""`python -m tools.partition_report`, run as a user runs it: a registered model's report, the
plan the layer itself builds for virtual stages (K x v partitions), and one-line errors with exit
code 2."""

import os
import tempfile
import textwrap
import unittest
from unittest import mock

import pytest

from tests import helpers

# A user's params module: the digits model's 4 layers on K = 2 devices with v = 2 partitions each.
INTERLEAVED_MODULE = '''
from lingvo import model_registry

from params import digits


@model_registry.RegisterSingleTaskModel
class TinyConvInterleaved(digits.TinyConvPipeline):
  """The digits model interleaved: 2 devices, 2 partitions each."""

  def Task(self):
    p = super().Task()
    p.pipeline.Set(num_devices=2, virtual_stages=2, schedule='interleaved_1f1b')
    return p
'''


class PartitionReportToolTest(unittest.TestCase):

  def testReportsARegisteredModel(self):
    code, out, err = helpers.RunTool('partition_report', '--model=digits.TinyConvPipeline',
                                     '--num_devices=2', '--algorithm=both')
    self.assertEqual(code, 0, err)
    self.assertIn("digits.TinyConvPipeline task.pipeline: 2 partitions, cost 'flops', algorithm "
                  "'optimal', M = 8", out)
    self.assertIn("algorithm 'min_variance'", out)
    self.assertEqual(out.count('predicted efficiency'), 2)

  def testVirtualStagesGiveKTimesVPartitionsOnTheirDevices(self):
    directory = tempfile.mkdtemp()
    with open(os.path.join(directory, 'tp_report_models.py'), 'w') as f:
      f.write(textwrap.dedent(INTERLEAVED_MODULE))
    path = os.pathsep.join([directory, helpers.REPO, os.environ.get('PYTHONPATH', '')])
    with mock.patch.dict(os.environ, {'PYTHONPATH': path}):
      for flags in ((), ('--num_devices=2',)):
        code, out, err = helpers.RunTool('partition_report', '--model=tp_report_models.'
                                         'TinyConvInterleaved', *flags)
        self.assertEqual(code, 0, err)
        self.assertIn('TinyConvInterleaved task.pipeline: 4 partitions', out)
        rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
        # Partition k of K x v on device k mod K (interleaved_1f1b's placement).
        self.assertEqual([(r[0], r[4 if r[2] == '..' else 2]) for r in rows],
                         [('0', '0'), ('1', '1'), ('2', '0'), ('3', '1')], out)

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
