"""Timeline: PNGs of a traced and of a simulated step, with every task kind drawn in its colour."""

import collections
import os
import tempfile

from lingvo import compat as tf
from lingvo.core import test_utils
from PIL import Image

from tensorpipe.measure import simulator
from tensorpipe.measure import timeline
from tensorpipe.measure import training_step
from tensorpipe import schedule_builders
from tests import layer_helpers


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
                                schedule_builders.FillDrainSchedule(3, 4))
    path = os.path.join(tempfile.mkdtemp(), 's.png')
    self.assertEqual(timeline.DrawSimulated(result, path, 'K=3, M=4'), path)
    self._AssertDrawsTasks(path)

  def testDrawTrace(self):
    step = training_step.TrainingStep('K=2', layer_helpers.DenseLayers(4, dim=64), [2, 2],
                                      lambda: (tf.ones([32, 64]),), 4, devices=2, warmup=1)
    trace = step.Trace()
    step.Close()
    path = os.path.join(tempfile.mkdtemp(), 't.png')
    self.assertEqual(timeline.DrawTrace(trace, path, 'K=2, M=4'), path)
    self._AssertDrawsTasks(path)


class LabelsTest(test_utils.TestCase):

  def _SimulatedLabels(self, name, k, m, v):
    result = simulator.Simulate([simulator.TaskTimes(1.0, 2.0, 1.0, 1.0)] * (k * v),
                                schedule_builders.Build(name, k, m, v))
    tasks = [('device %d' % i.device, i.kind, i.partition, i.micro_batch, i.start, i.end)
             for i in result.timeline]
    out = collections.defaultdict(set)
    for row, _, text, _ in timeline.Labels(tasks, result.step_time):
      out[row].add(text)
    return out

  def testADeviceOfSeveralPartitionsSaysWhichRuns(self):
    labels = self._SimulatedLabels('zbv', 4, 4, 2)  # Device 0 holds partitions 0 and 7 (a V).
    self.assertTrue({'F(0,0)', 'F(7,0)', 'B(7,3)', 'R(0,3)'} <= labels['device 0'],
                    sorted(labels['device 0']))
    self.assertTrue(all(text[1] == '(' for texts in labels.values() for text in texts))

  def testADeviceOfOnePartitionSaysTheMicroBatch(self):
    labels = self._SimulatedLabels('gpipe', 3, 4, 1)
    self.assertEqual(labels['device 1'], {'%s%d' % (kind, t) for kind in 'FRB' for t in range(4)})

  def testALabelGoesAlongItsBarAcrossItOrNowhere(self):
    step = timeline.AXES_POINTS  # A second per point of the axis.
    along, across, none = [timeline.Labels([('d', 'forward', 0, 3, 0.0, width)], step)
                           for width in (20.0, 10.0, 4.0)]
    self.assertEqual([(text, rotation) for _, _, text, rotation in along], [('F3', 0)])
    self.assertEqual([(text, rotation) for _, _, text, rotation in across], [('F3', 90)])
    self.assertEqual(none, [])

  def testMillisecondsAndALegendOfWhatIsDrawn(self):
    fig = timeline.Figure({'CPU:0': {'forward': [(0.0, 0.002)], 'backward': [(0.002, 0.006)],
                                     'recompute': []}}, 0.006, 'a step')
    self.assertEqual([t.get_text() for t in fig.legends[0].get_texts()], ['forward', 'backward'])
    (ax,) = fig.axes
    self.assertEqual(ax.get_xlim(), (0.0, 6.0))
    self.assertIn('milliseconds', ax.get_xlabel())


if __name__ == '__main__':
  test_utils.main()
