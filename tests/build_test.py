"""BUILD stays in step with the code: it equals what tools/update_build.py derives from imports."""

import importlib.util
import os
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _Generator():
  spec = importlib.util.spec_from_file_location('update_build', os.path.join(ROOT, 'tools',
                                                                             'update_build.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


class BuildTest(unittest.TestCase):

  def testBuildIsUpToDate(self):
    with open(os.path.join(ROOT, 'BUILD')) as f:
      self.assertEqual(f.read(), _Generator().Generate(),
                       'BUILD is out of date: run .venv/bin/python -m tools.update_build')

  def testEveryModuleAndTestHasATarget(self):
    text = _Generator().Generate()
    for top, rule in (('tensorpipe', 'py_library'), ('tests', 'py_test')):
      for folder, _, names in os.walk(os.path.join(ROOT, top)):
        for name in names:
          if name.endswith('.py') and name != '__init__.py' and (top != 'tests' or
                                                                  name.endswith('_test.py')):
            path = os.path.relpath(os.path.join(folder, name), ROOT)
            self.assertIn('%s(\n    name = "%s",\n    srcs = ["%s"]' % (rule, name[:-3], path),
                          text)

  def testDependenciesFollowImports(self):
    text = _Generator().Generate()
    layer = text[text.index('name = "layer",'):]
    layer = layer[:layer.index(')')]
    for dep in (':partition_function', ':executor', ':micro_batching', ':partitioning',
                ':placement', ':schedule'):
      self.assertIn('"%s"' % dep, layer)
    self.assertIn('# External: lingvo.', layer)


if __name__ == '__main__':
  unittest.main()
