"""BUILD stays in step with the code: it equals what tools/update_build.py derives from imports
(the tool's --check says so), and so it has a target per module and deps that follow imports."""

import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _Build():
  with open(os.path.join(ROOT, 'BUILD')) as f:
    return f.read()


class BuildTest(unittest.TestCase):

  def testBuildIsUpToDate(self):
    proc = subprocess.run([sys.executable, '-m', 'tools.update_build', '--check'], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    self.assertEqual((proc.returncode, proc.stdout), (0, 'BUILD is up to date\n'),
                     proc.stdout + proc.stderr)

  def testEveryModuleAndTestHasATarget(self):
    text = _Build()
    for top, rule in (('tensorpipe', 'py_library'), ('tests', 'py_test')):
      for folder, _, names in os.walk(os.path.join(ROOT, top)):
        for name in names:
          if name.endswith('.py') and name != '__init__.py' and (top != 'tests' or
                                                                  name.endswith('_test.py')):
            path = os.path.relpath(os.path.join(folder, name), ROOT)
            self.assertIn('%s(\n    name = "%s",\n    srcs = ["%s"]' % (rule, name[:-3], path),
                          text)

  def testDependenciesFollowImports(self):
    text = _Build()
    layer = text[text.index('name = "layer",'):]
    layer = layer[:layer.index(')')]
    for dep in (':partition_function', ':executor', ':micro_batching', ':partitioning',
                ':placement', ':schedule'):
      self.assertIn('"%s"' % dep, layer)
    self.assertIn('# External: lingvo.', layer)


if __name__ == '__main__':
  unittest.main()
