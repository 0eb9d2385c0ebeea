"""`python -m tools.timeline`, run as a user runs it: PNGs of a real traced step of a registered
model and of its simulated step, and a one-line error for an unknown model."""

import os
import tempfile
import unittest

import pytest
from PIL import Image

from tensorpipe.measure import timeline
from tests import helpers


class TimelineToolTest(unittest.TestCase):

  @pytest.mark.slow
  def testDrawsATracedStepOfARegisteredModel(self):
    out_dir = tempfile.mkdtemp()
    traced, simulated = os.path.join(out_dir, 'traced.png'), os.path.join(out_dir, 'sim.png')
    code, text, err = helpers.RunTool('timeline', '--model=digits.TinyConvPipeline',
                                      '--out=' + traced, '--simulated_out=' + simulated,
                                      '--warmup=1')
    self.assertEqual(code, 0, err)
    for device in ('CPU:0', 'CPU:1', 'CPU:2', 'CPU:3'):  # K = 4 partitions, one row each.
      self.assertIn(device, text)
    self.assertIn('simulator, fed with the traced per-partition times', text)
    self.assertIn('wrote %s' % traced, text)
    self.assertIn('wrote %s' % simulated, text)
    for path in (traced, simulated):
      with Image.open(path) as image:
        self.assertEqual(image.format, 'PNG')
        colours = set(image.convert('RGB').getdata())
      # Forward, re-computation and backward bars are all drawn.
      for hex_colour in (timeline.COLOURS[c] for c in ('forward', 'recompute', 'backward')):
        rgb = tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
        self.assertIn(rgb, colours, path)

  def testUnknownModelIsOneLine(self):
    code, _, err = helpers.RunTool('timeline', '--model=digits.NoSuchModel', '--out=/tmp/x.png')
    self.assertEqual(code, 2, err)
    self.assertIn('timeline: error: unknown --model=digits.NoSuchModel', err)


if __name__ == '__main__':
  unittest.main()
