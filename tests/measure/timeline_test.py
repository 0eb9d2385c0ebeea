"""Timeline: PNGs of a traced and of a simulated step, with every task kind drawn in its colour."""

import os
import tempfile

from lingvo import compat as tf
from lingvo.core import test_utils
from PIL import Image

from tensorpipe.measure import simulator
from tensorpipe.measure import timeline
from tensorpipe.measure import training_step
from tensorpipe import schedule
from tests import helpers


class TimelineTest(test_utils.TestCase):

  def _AssertDrawsTasks(self, path, min_width=500):
    with Image.open(path) as image:
      self.assertEqual(image.format, 'PNG')
      self.assertGreater(image.size[0], min_width)
      colours = set(image.convert('RGB').getdata())
    for category in ('forward', 'recompute', 'backward'):
      hex_colour = timeline.COLOURS[category]
      self.assertIn(tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)), colours, category)

  def testDrawSimulated(self):
    result = simulator.Simulate([simulator.TaskTimes(1.0, 2.0, 1.0)] * 3,
                                schedule.FillDrainSchedule(3, 4))
    path = os.path.join(tempfile.mkdtemp(), 's.png')
    self.assertEqual(timeline.DrawSimulated(result, path, 'K=3, M=4'), path)
    self._AssertDrawsTasks(path)

  def testDrawTrace(self):
    step = training_step.TrainingStep('K=2', helpers.DenseLayers(4, dim=64), [2, 2],
                                      lambda: (tf.ones([32, 64]),), 4, devices=2, warmup=1)
    trace = step.Trace()
    step.Close()
    path = os.path.join(tempfile.mkdtemp(), 't.png')
    self.assertEqual(timeline.DrawTrace(trace, path, 'K=2, M=4'), path)
    self._AssertDrawsTasks(path)


if __name__ == '__main__':
  test_utils.main()
