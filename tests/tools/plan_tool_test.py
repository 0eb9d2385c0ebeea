"""`python -m tools.plan`, run as a user runs it: a ranked table with the flags of the best, progress
on stderr, a cache for the next run, and one-line errors with exit code 2."""

import os
import re
import shutil
import tempfile
import unittest

import pytest

from tests import helpers


# A phase's time as progress.Seconds writes it: '40 ms', '2.5 s', '12 s', '3 min 05 s'.
_DONE_IN = r'done in (\d+ ms|[0-9.]+ s|\d+ min \d\d s);'


class PlanToolTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.cache_dir = tempfile.mkdtemp()  # Never the user's cache.
    self.addCleanup(shutil.rmtree, self.cache_dir)

  @pytest.mark.slow
  def testPlansARegisteredModelAndFailsClearly(self):
    code, out, err = helpers.RunTool('plan', '--model=digits.TinyConvPipeline', '--devices=4',
                                     '--device=V100-16GB', '--rows=5',
                                     '--cache_dir=' + self.cache_dir)
    self.assertEqual(code, 0, err)
    self.assertRegex(out, r'rank +S +K +v +M +schedule +recompute +step ms +examples/s +bubble')
    self.assertRegex(out, r'best: S=\d K=\d M=\d+ gpipe \w+; train it with: --worker_gpus=\d')
    code, _, err = helpers.RunTool('plan', '--model=digits.TinyConvPipeline', '--devices=4',
                                   '--device=V100-16GB', '--device_memory=1KiB',
                                   '--cache_dir=' + self.cache_dir)
    self.assertEqual(code, 2, err)
    self.assertRegex(err, r'(?m)^tools.plan: error: digits.TinyConvPipeline task.pipeline fits no '
                     r'configuration on 4 devices of 1.00 KiB: the least memory one needs is '
                     r'[0-9.]+ \w+ per device \(S=\d K=\d M=\d+ .*\n\Z')

  @pytest.mark.slow
  def testQuickOnThisCpuSaysWhatItDoesAndCachesTheCostModel(self):
    args = ('plan', '--model=digits.TinyConvPipeline', '--devices=2', '--rows=3', '--quick',
            '--cache_dir=' + self.cache_dir)
    code, out, err = helpers.RunTool(*args)
    self.assertEqual(code, 0, err)
    self.assertRegex(out, r'devices cpu \(shared \d+ cores\)')
    lines = [l for l in err.splitlines() if l.startswith('tools.plan: ')]
    self.assertEqual(lines[:3], [
        "tools.plan: measuring this machine's CPU devices",
        'tools.plan: cost model: building the distinct layers of 4: 4 to do',
        'tools.plan: cost model: building the distinct layers of 4: done in %s; 0 read from the '
        'cache' % re.search(_DONE_IN, lines[2]).group(1)])
    # A few lines per phase, not one per item: besides a line every 10 s while a phase runs (how
    # many depends on the machine's load), at most 8.
    periodic = [l for l in lines if re.search(r': \d+ (of \d+ )?done, ', l)]
    self.assertLessEqual(len(lines) - len(periodic), 8, lines)
    code, again, err = helpers.RunTool(*args)
    self.assertEqual(code, 0, err)
    self.assertEqual(again, out)  # The CPU profile and the layers from the cache.
    self.assertIn('; 4 read from the cache', err)
    self.assertNotIn('measuring', err)

  @pytest.mark.slow
  def testABadCacheDirectoryIsNamed(self):
    not_a_dir = os.path.join(self.cache_dir, 'file')
    with open(not_a_dir, 'w') as f:
      f.write('not a directory')
    code, _, err = helpers.RunTool('plan', '--model=digits.TinyConvPipeline', '--devices=2',
                                   '--quick', '--cache_dir=%s/cache' % not_a_dir)
    self.assertEqual(code, 2, err)
    self.assertEqual(err.splitlines()[-1], "tools.plan: error: --cache_dir: cache directory "
                     "'%s/cache' cannot be created (Not a directory); give a writable directory, "
                     "or --cache_dir=none" % not_a_dir)


if __name__ == '__main__':
  unittest.main()
