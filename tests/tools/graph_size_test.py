"""Smoke test of `python -m tools.graph_size`, run as a user runs it: its quick stack report and a
models report of one tiny registered model. Checks the rows' shape: TensorPipe's function bodies do
not grow with M, its outer graph grows by a few ops per added task, and a registered model
builds; a missing or unknown report is one line."""

import re
import unittest

import pytest

from tests import helpers

KINDS = ('plain', 'tensorpipe')  # Lingvo's GPipe rows are the benchmark's, not this test's.
NUM_PARTITIONS = 4  # K of the stack report.
# Ops TensorPipe's outer graph may add per added task (a forward or backward call of one partition
# on one micro-batch): the call op and a little bookkeeping (slices, stash, gradient sums), not the
# layers.
MAX_OPS_PER_TASK = 8
# Flags of the stack report's smallest configuration (--layers must be a multiple of K; batch 8
# leaves every micro-batch 2 examples or more at M = 4, so both M get the first step's batch_dim
# check).
_TINY_STACK = ('--layers', str(NUM_PARTITIONS), '--model_dim', '8', '--num_heads', '2',
               '--hidden_dim', '16', '--seq_len', '4', '--batch', '8')

_NUMBER = r'(-|[\d.]+x?)'
_STACK_ROW = re.compile(r'^(plain|tensorpipe|gpipe)\s+(\d+)' + r'\s+' + r'\s+'.join([_NUMBER] * 9) +
                        r'\s*$')


def _Run(*flags, timeout=300):
  """The tool's stdout; fails the test if it exits with an error or takes longer than `timeout`."""
  code, out, err = helpers.RunTool('graph_size', *flags, timeout=timeout)
  if code:
    raise AssertionError('graph_size %s failed (exit %d):\n%s\n%s' % (
        ' '.join(flags), code, out[-2000:], err[-3000:]))
  return out


def _Value(text):
  return None if text == '-' else float(text.rstrip('x'))


class GraphSizeToolTest(unittest.TestCase):

  @pytest.mark.slow
  def testQuickStackReport(self):
    # The smallest stack the tool takes (4 layers: one per partition, tiny shapes): what is checked
    # is how the graph grows with M and that rows are well-formed, not the size of the layers. Each
    # row is still a fresh child process that imports TensorFlow.
    out = _Run('stack', '--quick', '--first_run_m', '2', '--kinds', ','.join(KINDS), *_TINY_STACK,
               timeout=240)
    rows = {}
    for line in out.splitlines():
      match = _STACK_ROW.match(line)
      if match:
        (inst, build, ops, fn_nodes, total, ratio, first, nxt,
         rss) = [_Value(v) for v in match.groups()[2:]]
        rows[(match.group(1), int(match.group(2)))] = dict(
            inst=inst, build=build, ops=ops, fn_nodes=fn_nodes, total=total, ratio=ratio,
            first=first, next=nxt, rss=rss)
    self.assertEqual(sorted(rows), sorted((k, m) for k in KINDS for m in (2, 4)), out)
    for key, row in rows.items():
      for name in ('ops', 'total', 'ratio', 'rss'):
        self.assertGreater(row[name], 0, (key, name, out))
      # Times are checked for shape only: printed rounded, a tiny stack's may read 0.0.
      for name in ('inst', 'build'):
        self.assertGreaterEqual(row[name], 0, (key, name, out))
      self.assertEqual(row['total'], row['ops'] + row['fn_nodes'], key)
      # The first session.run is timed only at --first_run_m.
      if key[1] == 2:
        self.assertGreaterEqual(row['first'], 0, key)
        self.assertGreaterEqual(row['next'], 0, key)
      else:
        self.assertIsNone(row['first'], key)
    for m in (2, 4):
      self.assertEqual(rows[('plain', m)]['ratio'], 1.0)
    # The plain model does not depend on M.
    self.assertEqual(rows[('plain', 2)]['ops'], rows[('plain', 4)]['ops'])
    small, large = rows[('tensorpipe', 2)], rows[('tensorpipe', 4)]
    # Partition bodies are traced once, whatever M is.
    self.assertGreater(small['fn_nodes'], 0)
    self.assertEqual(small['fn_nodes'], large['fn_nodes'])
    # M 2 -> 4 adds 2 micro-batches x K partitions x (forward + backward) tasks; each adds a few
    # ops.
    added_tasks = (4 - 2) * NUM_PARTITIONS * 2
    self.assertGreaterEqual(large['ops'], small['ops'])
    self.assertLessEqual(large['ops'] - small['ops'], MAX_OPS_PER_TASK * added_tasks)
    self.assertRegex(out, r'TensorPipe total nodes \(ops \+ fn nodes\) at M=4 <= 3x plain +'
                     r'[\d.]+x  (PASS|FAIL)')
    self.assertNotIn("Lingvo's GPipe", out)  # Not built, so not compared.

  @pytest.mark.slow
  def testModelsReportOfATinyModel(self):
    out = _Run('models', '--match', r'^digits\.TinyConvPipeline$', '--timeout', '240', timeout=300)
    rows = [line.split() for line in out.splitlines() if line.startswith('digits.')]
    self.assertEqual(len(rows), 1, out)
    fields = rows[0]
    self.assertEqual(fields[0], 'digits.TinyConvPipeline')
    self.assertEqual(fields[-1], 'ok', out)
    self.assertEqual(fields[1:3], ['4', '8'])  # K and M of the registered model.
    inst, fprop_bprop, total, ops, fn_nodes, rss = [float(v) for v in fields[3:9]]
    self.assertGreaterEqual(inst, 0)
    self.assertGreater(fprop_bprop, 0)
    self.assertAlmostEqual(total, inst + fprop_bprop, delta=0.11)  # Printed to 0.1 s.
    self.assertGreater(ops, 0)
    self.assertGreater(fn_nodes, 0)  # Its TensorPipeLayer's partitions are graph functions.
    self.assertGreater(rss, 0)

  def testAMissingOrUnknownReportIsOneLine(self):
    for args, line in [
        ((), 'takes 1 positional argument, stack|models (got: none); see --help'),
        (('stak', '--quick'), "unknown report 'stak': give stack or models, e.g. python -m "
                              'tools.graph_size stack'),
        (('stack', 'models'),
         'takes 1 positional argument, stack|models (got: stack models); see --help')]:
      code, out, err = helpers.RunTool('graph_size', *args)
      self.assertEqual((code, out), (2, ''), err)
      self.assertEqual(helpers.OwnLines(err), ['graph_size: error: ' + line])


if __name__ == '__main__':
  unittest.main()
