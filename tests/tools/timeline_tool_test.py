"""`python -m tools.timeline`, run as a user runs it: PNGs of a real traced step of a registered
model and of its simulated step, its Chrome trace, a one-line error for bad input, and its absl
flags' --help and --helpfull."""

import json
import os
import re
import tempfile
import unittest

import pytest
from PIL import Image

from tensorpipe.measure import timeline
from tests import helpers
from tests import trace_helpers


class TimelineToolTest(unittest.TestCase):

  @pytest.mark.slow
  def testDrawsATracedStepOfARegisteredModel(self):
    out_dir = os.path.join(tempfile.mkdtemp(), 'new')  # Created by the tool.
    code, text, err = helpers.RunTool('timeline', '--model=digits.TinyConvPipeline',
                                      '--out_dir=' + out_dir, '--prefix=digits', '--warmup=1')
    self.assertEqual(code, 0, err)
    # Progress on stderr: a line when the build, the warm-up and the trace start and end.
    for phase in ('building the training graph of digits.TinyConvPipeline on 4 devices',
                  'initialising the variables and the input, then the warm-up steps',
                  'tracing one step'):
      self.assertRegex(err, r'(?m)^timeline: %s: done in ' % re.escape(phase))
    self.assertIn('timeline: tracing one step\n', err)
    for device in ('CPU:0', 'CPU:1', 'CPU:2', 'CPU:3'):  # K = 4 partitions, one row each.
      self.assertIn(device, text)
    self.assertIn('simulator, fed with the traced per-partition times', text)
    traced, simulated = os.path.join(out_dir, 'digits.png'), os.path.join(out_dir,
                                                                         'digits_simulated.png')
    self.assertIn('wrote %s' % traced, text)
    self.assertIn('wrote %s' % simulated, text)
    self.assertEqual(sorted(os.listdir(out_dir)),
                     ['digits.json', 'digits.png', 'digits_simulated.png'])
    for path in (traced, simulated):
      with Image.open(path) as image:
        self.assertEqual(image.format, 'PNG')
        colours = set(image.convert('RGB').getdata())
      # Forward, re-computation and backward bars are all drawn.
      for hex_colour in (timeline.COLOURS[c] for c in ('forward', 'recompute', 'backward')):
        rgb = tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
        self.assertIn(rgb, colours, path)
    # The Chrome trace: F(k,t) and B(k,t) of K = 4, M = 8 once each, on device k's rows (task
    # slices carry their partition; the op slices under them name their node); devices in order.
    with open(os.path.join(out_dir, 'digits.json')) as f:
      events = json.load(f)['traceEvents']
    rows = trace_helpers.TraceRows(events)
    self.assertEqual(list(dict.fromkeys(rows[tid][0] for tid in sorted(rows))),
                     ['CPU:0', 'CPU:1', 'CPU:2', 'CPU:3'])
    self.assertEqual({rows[e['tid']][0] for e in events
                      if e['ph'] == 'X' and 'node' in e.get('args', {})},
                     {'CPU:0', 'CPU:1', 'CPU:2', 'CPU:3'})
    tasks = sorted((rows[e['tid']][0], e['name']) for e in events
                   if e['ph'] == 'X' and 'partition' in e.get('args', {}) and e['name'][0] in 'FB')
    self.assertEqual(tasks, sorted(('CPU:%d' % k, '%s(%d,%d)' % (kind, k, t))
                                   for kind in 'FB' for k in range(4) for t in range(8)))

  def testBadPrefixIsOneLine(self):
    code, _, err = helpers.RunTool('timeline', '--model=digits.TinyConvPipeline',
                                   '--prefix=docs/img/x')
    self.assertEqual(code, 2, err)
    self.assertEqual(helpers.OwnLines(err), [
        'timeline: error: flag --prefix=docs/img/x: give a file name stem, e.g. timeline_digits: '
        'no directory (that is --out_dir), not empty (see --helpfull)'])

  def testUnwritableOutDirIsOneLineBeforeAnyTracing(self):
    not_a_dir = tempfile.NamedTemporaryFile(dir=tempfile.mkdtemp(), delete=False).name
    bad = os.path.join(not_a_dir, 'out')  # Under a file: no user can create it, root included.
    code, text, err = helpers.RunTool('timeline', '--model=digits.TinyConvPipeline',
                                      '--out_dir=' + bad)
    self.assertEqual(code, 2, err)
    self.assertEqual(text, '')
    self.assertNotIn('Traceback', err)
    self.assertEqual(helpers.OwnLines(err), [
        "timeline: error: flag --out_dir=%s: '%s' cannot hold the outputs (Not a directory); give "
        "a directory you can write (see --helpfull)" % (bad, bad)])

  def testUnknownModelIsOneLine(self):
    code, _, err = helpers.RunTool('timeline', '--model=digits.NoSuchModel')
    self.assertEqual(code, 2, err)
    self.assertIn('timeline: error: unknown --model=digits.NoSuchModel', err)

  def testHelpListsTheToolsFlagsAndHelpfullEveryFlag(self):
    code, out, err = helpers.RunTool('timeline', '--help')
    self.assertEqual(code, 0, err)
    self.assertTrue(out.startswith('Draws one real training step of a registered model'), out)
    self.assertIn('  python -m tools.timeline --model=digits.TinyConvPipeline', out)
    for name in ('model', 'out_dir', 'prefix', 'warmup', 'inter_op_threads'):
      self.assertRegex(out, r'\n  --%s: ' % name)
    self.assertNotIn('--logtostderr', out)  # The tool's own flags only.
    code, full, err = helpers.RunTool('timeline', '--helpfull')
    self.assertEqual(code, 0, err)
    # Its own flags, absl's and those of the Lingvo modules it imports (py_utils).
    for name in ('model', 'out_dir', 'helpfull', 'logtostderr', 'flagfile', 'enable_asserts'):
      self.assertRegex(full, r'\n  (-\S,)?--(\[no\])?%s: ' % name)

  def testAnUnknownFlagOrABadValueIsOneLine(self):
    for args, line in [
        (['--model=digits.TinyConvPipeline', '--out-dir=/tmp/x'],
         "Unknown command line flag 'out-dir'. Did you mean: out_dir ?"),
        (['--model=digits.TinyConvPipeline', '--warmup=three'],
         "flag --warmup=three: invalid literal for int() with base 10: 'three'"),
        (['--model=digits.TinyConvPipeline', '--inter_op_threads=0'],
         'flag --inter_op_threads=0: 0 is not a positive integer'),
        (['--out_dir=/tmp/x'],
         'flag --model=None: Flag --model must have a value other than None.'),
        (['--model=digits.TinyConvPipeline', 'extra'],
         'takes no positional arguments (got: extra); flags are spelled --name=value')]:
      code, out, err = helpers.RunTool('timeline', *args)
      self.assertEqual((code, out), (2, ''), err)
      suffix = '' if line.startswith('takes') else ' (see --helpfull)'
      self.assertEqual(helpers.OwnLines(err), ['timeline: error: %s%s' % (line, suffix)])


if __name__ == '__main__':
  unittest.main()
