"""Smoke test of tools/graph_size.py, run as a command: TensorPipe's functions do not grow with M."""

import os
import re
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, 'tools', 'graph_size.py')


def _Run(*flags):
  proc = subprocess.run([sys.executable, TOOL] + list(flags), capture_output=True, text=True,
                        timeout=600, check=False, cwd=ROOT)
  if proc.returncode:
    raise AssertionError('graph_size %s failed:\n%s' % (' '.join(flags), proc.stderr[-3000:]))
  return proc.stdout


class GraphSizeToolTest(unittest.TestCase):

  def testStackRowsAndTheirShape(self):
    out = _Run('stack', '--quick', '--first_run_m', '0')
    rows = {}
    for line in out.splitlines():
      match = re.match(r'(plain|tensorpipe|gpipe)\s+(\d+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(\d+)', line)
      if match:
        rows[(match.group(1), int(match.group(2)))] = [float(v) for v in match.groups()[2:]]
    self.assertEqual(sorted(rows), sorted((k, m) for k in ('plain', 'tensorpipe', 'gpipe')
                                          for m in (2, 4)))
    for values in rows.values():
      self.assertTrue(all(v > 0 for v in values), values)
    small, large = rows[('tensorpipe', 2)], rows[('tensorpipe', 4)]
    self.assertEqual(small[2], large[2])  # Function bodies: traced once, whatever M is.
    # Outer ops: a few per task more (two forward and two backward tasks per added micro-batch and
    # cell), nothing per layer.
    self.assertLess(large[1] - small[1], 2 * 4 * 2 * 15)
    self.assertEqual(rows[('plain', 2)][1:], rows[('plain', 4)][1:])
    self.assertRegex(out, r'TensorPipe graph \(ops \+ function nodes\) at M=4 <= 3x plain +'
                     r'[\d.]+x  (PASS|FAIL)')

  def testModelRow(self):
    out = _Run('models', '--match', r'^digits\.TinyConvPipeline$', '--timeout', '300')
    rows = [line for line in out.splitlines() if line.startswith('digits.TinyConvPipeline')]
    self.assertEqual(len(rows), 1, out)
    fields = rows[0].split()
    self.assertEqual(fields[-1], 'ok')
    self.assertEqual(fields[1:3], ['4', '8'])  # K and M of the registered model.
    self.assertTrue(all(float(v) > 0 for v in fields[3:9]), fields)


if __name__ == '__main__':
  unittest.main()
