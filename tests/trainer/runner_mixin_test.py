"""RunnerMixin at run time: an empty base, so a mixin over a Lingvo runner behaves as if it derived
from object (its super() calls reach the runner's methods)."""

import unittest

from tensorpipe.trainer import runner_mixin


class _Runner:
  """Stands for a Lingvo runner: a method the mixin overrides and an attribute it reads."""

  def __init__(self):
    self.steps = []

  def _Loop(self):
    self.steps.append('runner')
    return 'ran'


class _Mixin(runner_mixin.RunnerMixin):

  def _Loop(self):
    self.steps.append('mixin')
    return super()._Loop()


class _Combined(_Mixin, _Runner):
  pass


class RunnerMixinTest(unittest.TestCase):

  def testAddsNoMembers(self):
    own = set(vars(runner_mixin.RunnerMixin)) - {'__module__', '__doc__', '__dict__',
                                                  '__weakref__', '__qualname__'}
    self.assertEqual(own, set())

  def testMixinReachesTheRunner(self):
    runner = _Combined()
    self.assertEqual(runner._Loop(), 'ran')  # pylint: disable=protected-access
    self.assertEqual(runner.steps, ['mixin', 'runner'])
    self.assertEqual(_Combined.__mro__,
                     (_Combined, _Mixin, runner_mixin.RunnerMixin, _Runner, object))


if __name__ == '__main__':
  unittest.main()
