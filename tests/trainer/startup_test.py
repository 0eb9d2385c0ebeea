"""The trainer's start-up wait: it polls the global step (fake reads, a fake clock) and never sleeps
a fixed time (the trainer's runners have it: runners_test)."""

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import startup


class _FakeStep:
  """A global step that is uninitialised for `uninitialised` reads, then reads `values` in turn."""

  def __init__(self, uninitialised, values):
    self.uninitialised = uninitialised
    self.values = list(values)
    self.reads = 0
    self.message = 'global_step is not initialised'

  def __call__(self):
    self.reads += 1
    if self.reads <= self.uninitialised:
      raise tf.errors.FailedPreconditionError(None, None, self.message)
    return self.values.pop(0) if len(self.values) > 1 else self.values[0]


class WaitForGlobalStepTest(test_utils.TestCase):

  def _Wait(self, fake, min_step=None):
    slept = []
    step = startup.WaitForGlobalStep(fake, min_step, sleep=slept.append, log=lambda *a: None)
    return step, slept

  def testReadyModelStartsWithoutSleeping(self):
    step, slept = self._Wait(_FakeStep(0, [7]))
    self.assertEqual(step, 7)
    self.assertEqual(slept, [])

  def testWaitsWhileUninitialisedWithGrowingBoundedDelays(self):
    fake = _FakeStep(12, [0])
    step, slept = self._Wait(fake)
    self.assertEqual(step, 0)
    self.assertEqual(fake.reads, 13)
    self.assertLen(slept, 12)
    self.assertEqual(slept[0], startup.FIRST_DELAY_S)
    self.assertTrue(all(b >= a for a, b in zip(slept, slept[1:])), slept)
    self.assertEqual(max(slept), startup.MAX_DELAY_S)
    # The whole wait is the sum of the delays: far below Lingvo's fixed 30 s for 12 reads.
    self.assertLess(sum(slept), 30.0)

  def testOneLinePerConditionAndOneWhenTheWaitEnds(self):
    lines = []
    fake = _FakeStep(12, [3, 4, 5, 6])
    fake.message = 'Graph execution error:\n\nDetected at node ...\n  File "x.py", line 1\n'
    step = startup.WaitForGlobalStep(fake, 5, sleep=lambda s: None,
                                     log=lambda fmt, *args: lines.append(fmt % args))
    self.assertEqual(step, 5)
    self.assertEqual(lines[:2], [
        "TensorPipe: waiting for the model's variables, which another task initialises or "
        'restores (the global step is not initialised yet)',
        'TensorPipe: waiting for the global step (3) to reach start_up_delay_steps (5)'])
    self.assertRegex(lines[2], r'^TensorPipe: the global step is 5 after [0-9.]+ s of waiting; '
                     r'starting$')
    self.assertLen(lines, 3)

  def testAReadyModelSaysNothing(self):
    lines = []
    startup.WaitForGlobalStep(_FakeStep(0, [7]), sleep=lambda s: None,
                              log=lambda fmt, *args: lines.append(fmt % args))
    self.assertEqual(lines, [])

  def testStartUpDelayStepsAreHonoured(self):
    step, slept = self._Wait(_FakeStep(1, [3, 4, 5, 6]), min_step=5)
    self.assertEqual(step, 5)
    self.assertLen(slept, 3)  # Uninitialised, then steps 3 and 4 are below 5.

  def testOtherErrorsAreNotSwallowed(self):
    def Broken():
      raise tf.errors.InvalidArgumentError(None, None, 'bad graph')
    with self.assertRaisesRegex(tf.errors.InvalidArgumentError, 'bad graph'):
      self._Wait(Broken)


if __name__ == '__main__':
  test_utils.main()
