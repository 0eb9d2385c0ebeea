"""BUILD stays in step with the code: it equals what tools/update_build.py derives from the imports."""

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
                       'BUILD is out of date: run python tools/update_build.py')

  def testEveryModuleAndTestHasATarget(self):
    text = _Generator().Generate()
    for folder, rule in (('tensorpipe', 'py_library'), ('tests', 'py_test')):
      for name in os.listdir(os.path.join(ROOT, folder)):
        if name.endswith('.py') and name != '__init__.py' and (folder != 'tests' or
                                                                name.endswith('_test.py')):
          self.assertIn('%s(\n    name = "%s",\n    srcs = ["%s/%s"]' %
                        (rule, name[:-3], folder, name), text)

  def testDependenciesFollowImports(self):
    text = _Generator().Generate()
    layer = text[text.index('name = "layer",'):]
    layer = layer[:layer.index(')')]
    for dep in (':cell_function', ':executor', ':micro_batching', ':partitioning', ':placement',
                ':schedule'):
      self.assertIn('"%s"' % dep, layer)
    self.assertIn('# External: lingvo.', layer)


if __name__ == '__main__':
  unittest.main()
