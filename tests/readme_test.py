"""The README's minimal example runs as printed: a finite loss and a two-partition report."""

import math
import os
import re
import subprocess
import sys
import unittest

import pytest

from tests import helpers


def _Example():
  """The Python block under the README's "A minimal example" heading."""
  with open(helpers.REPO + '/README.md') as f:
    text = f.read()
  match = re.search(r'^## A minimal example\n\n```python\n(.*?)^```', text, re.S | re.M)
  if match is None:
    raise AssertionError('README.md has no ```python block under "## A minimal example"')
  return match.group(1)


class ReadmeExampleTest(unittest.TestCase):

  @pytest.mark.slow
  def testMinimalExampleRuns(self):
    result = subprocess.run([sys.executable, '-c', _Example()], cwd=helpers.REPO,
                            capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    lines = result.stdout.splitlines()
    loss = float(lines[0])
    self.assertTrue(math.isfinite(loss), lines[0])
    report = '\n'.join(lines[1:])
    self.assertIn("TensorPipeLayer 'pipeline': 2 partitions", report)
    self.assertRegex(report, r'\n0 +fc0 \.\. fc\d+ ')
    self.assertRegex(report, r'\n1 +fc\d+ \.\. fc15 ')


if __name__ == '__main__':
  unittest.main()
