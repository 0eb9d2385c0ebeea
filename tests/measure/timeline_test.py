"""Timeline: the one-command PNG of a real traced step of a registered model, and of a simulated one."""

import contextlib
import io
import os
import tempfile

from lingvo.core import test_utils
from PIL import Image

from tensorpipe import schedule
from tensorpipe.measure import simulator
from tensorpipe.measure import timeline
from tools import timeline as tool


class TimelineTest(test_utils.TestCase):

  def testDrawsATracedStepOfARegisteredModel(self):
    out_dir = tempfile.mkdtemp()
    traced, simulated = os.path.join(out_dir, 'traced.png'), os.path.join(out_dir, 'sim.png')
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      code = tool.main(['--model=digits.TinyConvPipeline', '--out=' + traced,
                        '--simulated_out=' + simulated, '--warmup=1'])
    self.assertEqual(code, 0)
    text = out.getvalue()
    for device in ('CPU:0', 'CPU:1', 'CPU:2', 'CPU:3'):  # K = 4 partitions, one row each.
      self.assertIn(device, text)
    self.assertIn('simulator, fed with the traced per-partition times', text)
    for path in (traced, simulated):
      with Image.open(path) as image:
        self.assertEqual(image.format, 'PNG')
        colours = set(image.convert('RGB').getdata())
      # Forward, re-computation and backward bars are all drawn.
      for hex_colour in (timeline.COLOURS[c] for c in ('forward', 'recompute', 'backward')):
        rgb = tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
        self.assertIn(rgb, colours, path)

  def testUnknownModelIsOneLine(self):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
      code = tool.main(['--model=digits.NoSuchModel', '--out=/tmp/x.png'])
    self.assertEqual(code, 2)
    self.assertIn('timeline: error: unknown --model=digits.NoSuchModel', err.getvalue())

  def testDrawSimulated(self):
    result = simulator.Simulate([simulator.PartitionCost(1.0, 2.0, 1.0)] * 3,
                                schedule.FillDrainSchedule(3, 4))
    path = os.path.join(tempfile.mkdtemp(), 's.png')
    timeline.DrawSimulated(result, path, 'K=3, M=4')
    with Image.open(path) as image:
      self.assertGreater(image.size[0], 500)


if __name__ == '__main__':
  test_utils.main()
