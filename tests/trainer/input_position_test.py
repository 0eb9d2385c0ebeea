"""input_position: each input starts at the restored global step, or the trainer says it cannot.

The real trainer path (a restart reads the batches a run without it reads, the same losses) is in
train_test.TrainerSmokeTest; the inputs' StartAtStep in tests/tasks."""

from unittest import mock

from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe.trainer import input_position


class SeekableInput:

  def __init__(self, name):
    self.params = py_utils.NestedMap(name=name)
    self.starts = []

  def StartAtStep(self, sess, global_step):
    self.starts.append((sess, global_step))


class PlainInput:

  def __init__(self, name):
    self.params = py_utils.NestedMap(name=name)


def _Task(inp):
  return py_utils.NestedMap(input=inp)


class StartInputsTest(test_utils.TestCase):

  def _Start(self, tasks, step):
    with mock.patch.object(tf.logging, 'warning') as warning:
      unmoved = input_position.StartInputs(tasks, 'SESS', step)
    return unmoved, [call.args[0] % call.args[1:] for call in warning.call_args_list]

  def testAnInputWithStartAtStepStartsThere(self):
    inp = SeekableInput('digits_input')
    self.assertEqual(self._Start([_Task(inp)], 200), ([], []))
    self.assertEqual(inp.starts, [('SESS', 200)])

  def testAnInputWithoutItIsNamedPastStepZero(self):
    unmoved, warnings = self._Start([_Task(PlainInput('records'))], 200)
    self.assertEqual(unmoved, ['records (PlainInput)'])
    self.assertEqual(warnings, [
        'TensorPipe: input records (PlainInput) restarts from its first batch at global step 200: '
        'it has no StartAtStep(sess, global_step) method, so the steps from here read other '
        'batches than a run without this restart (see tensorpipe.tasks.array_input.ArrayInput.'
        'StartAtStep for an input that can start at any step)'])
    # At step 0 its first batch is the right one: nothing to say.
    self.assertEqual(self._Start([_Task(PlainInput('records'))], 0), (['records (PlainInput)'], []))

  def testSeveralTasksKeepLingvosRestart(self):
    a, b = SeekableInput('a'), SeekableInput('b')
    unmoved, warnings = self._Start([_Task(a), _Task(b)], 7)
    self.assertEqual(unmoved, ['a (SeekableInput)', 'b (SeekableInput)'])
    self.assertEqual((a.starts, b.starts), ([], []))
    self.assertLen(warnings, 1)
    self.assertIn('a model of 2 tasks samples the task each step trains', warnings[0])


class Runner:
  """Stands in for Lingvo's Trainer: _Loop asks _ShouldStop before each step, as Lingvo's does."""

  def __init__(self, steps):
    self._model = py_utils.NestedMap(tasks=[_Task(SeekableInput('in'))])
    self._steps = steps

  def _Loop(self):
    for step in self._steps:
      if self._ShouldStop('SESS', step):
        return

  def _ShouldStop(self, sess=None, step=None, check_early_stop=True):
    del sess, check_early_stop
    return step == self._steps[-1]


class Trainer(input_position.InputAtStep, Runner):
  pass


class InputAtStepTest(test_utils.TestCase):

  def testEveryRunOfLoopStartsTheInputOnceAtItsFirstStep(self):
    trainer = Trainer([40, 41, 42])
    trainer._Loop()  # pylint: disable=protected-access
    trainer._steps = [20, 21]  # A retry restored an earlier checkpoint.
    trainer._Loop()  # pylint: disable=protected-access
    self.assertEqual(trainer._model.tasks[0].input.starts, [('SESS', 40), ('SESS', 20)])

  def testARunThatStopsAtOnceLeavesTheInputAlone(self):
    trainer = Trainer([800])  # Restored at the last step: training is done.
    trainer._Loop()  # pylint: disable=protected-access
    self.assertEqual(trainer._model.tasks[0].input.starts, [])

  def testAnotherThreadsCallDoesNotStartTheInput(self):
    trainer = Trainer([5])
    trainer._input_start_thread = -1  # A run of _Loop in another thread, not started yet.
    trainer._ShouldStop('ENQUEUE_SESS', 9)  # pylint: disable=protected-access
    self.assertEqual(trainer._model.tasks[0].input.starts, [])


if __name__ == '__main__':
  test_utils.main()
