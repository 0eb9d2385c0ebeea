"""param_count: a registered model's parameters from its built variables, and the progress of a
build that declares them one at a time."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe import progress as progress_lib
from tensorpipe.trainer import param_count
from tensorpipe.trainer import registry


class _Clock:
  """A fake clock that moves 1 s each time it is read: every variable is one progress interval."""

  def __init__(self):
    self.now = 0.0

  def __call__(self):
    self.now += 1.0
    return self.now


class ParamCountTest(test_utils.TestCase):

  def testCountsEveryTrainableWeightAndReportsEachVariableBuilt(self):
    task_params = registry.TensorPipeModels()['digits.TinyConvPipeline']().Task()
    lines = []
    count = param_count.CountParameters(
        task_params, progress_lib.Progress(lines.append, interval=1.0, clock=_Clock()))
    graph, _ = param_count.BuildTask(task_params)
    with graph.as_default():
      variables = tf.global_variables()
      weights = tf.trainable_variables()
    self.assertEqual(count, sum(int(np.prod(v.shape.as_list())) for v in weights))
    self.assertGreater(count, 0)
    what = 'building %s, counting its variables' % task_params.name
    self.assertEqual(lines[0], what)
    # One line per variable (the clock passes an interval between two), then the total.
    self.assertEqual(lines[1:-1], ['%s: %d done, %s' % (what, i, progress_lib.Seconds(i))
                                   for i in range(1, len(variables) + 1)])
    self.assertRegex(lines[-1], r'^%s: done in [\d.]+ s; %d variables$' % (what, len(variables)))
