"""Chrome trace: a real traced step as Trace Event Format JSON, its slices against the schedule.

Only structure is checked (names, rows, counts, nesting, ts >= 0, dur >= 0), never durations.
"""

import collections
import json
import os
import tempfile
from unittest import mock

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.measure import chrome_trace
from tensorpipe.measure import profiling
from tensorpipe import schedule_builders
from tests import layer_helpers
from tests import trace_helpers

NUM_MICRO_BATCHES = 4


def _TracedStep(schedule_name):
  """profiling.Trace of one traced SGD step of a 2-partition Dense pipeline on 2 devices."""
  # The loss is the outputs' mean: a sum of per-example terms, as 1F1B and zero-bubble need.
  p = layer_helpers.Pipeline(layer_helpers.DenseLayers(4, dim=16), 2, NUM_MICRO_BATCHES, schedule=schedule_name)
  return trace_helpers.TracedPipelineStep(p, np.ones([8, 16], np.float32))


class ChromeTraceTest(test_utils.TestCase):

  def _Load(self, trace):
    path = os.path.join(tempfile.mkdtemp(dir=self.get_temp_dir()), 'step.json')
    self.assertEqual(chrome_trace.Write(trace, path, 'a step'), path)
    with open(path) as f:
      return json.load(f)

  def _AssertTraceEventFormat(self, data):
    """The fields the viewers read; returns ([devices] in the order of their rows, {tid: (device,
    row)}, [task and work slices], [op slices]): op slices are those whose args name a node."""
    events = data['traceEvents']
    processes, sort_index, slices, ops = {}, {}, [], []
    for e in events:
      self.assertIn(e['ph'], ('X', 'M', 'C'), e)
      self.assertIsInstance(e['name'], str)
      self.assertEqual(e['pid'], chrome_trace.PROCESS_ID, e)  # The step is one process.
      self.assertIsInstance(e['tid'], int)
      if e['ph'] != 'M' or e['name'] != 'process_name':
        self.assertNotEqual(e['tid'], e['pid'], e)  # Else Perfetto calls the row "main thread".
      if e['ph'] == 'M':
        self.assertIn(e['name'], ('process_name', 'thread_name', 'thread_sort_index'), e)
        if e['name'] == 'process_name':
          processes[e['pid']] = e['args']['name']
        elif e['name'] == 'thread_sort_index':
          sort_index[e['tid']] = e['args']['sort_index']
      elif e['ph'] == 'C':
        self.assertGreaterEqual(e['ts'], 0)
        self.assertTrue(e['args'])
        for value in e['args'].values():
          self.assertIsInstance(value, (int, float))
      else:
        self.assertIsInstance(e['ts'], int)
        self.assertIsInstance(e['dur'], int)
        self.assertGreaterEqual(e['ts'], 0)
        self.assertGreaterEqual(e['dur'], 0)
        self.assertIn(e['cat'], profiling.CATEGORIES)
        (ops if 'node' in e.get('args', {}) else slices).append(e)
    self.assertEqual(processes, {chrome_trace.PROCESS_ID: chrome_trace.PROCESS_NAME})
    rows = trace_helpers.TraceRows(events)
    for e in slices + ops:  # Every slice's thread is named.
      self.assertIn(e['tid'], rows)
    # Both viewers' order of the rows (Perfetto: thread ids; chrome://tracing: thread_sort_index)
    # is the same, and keeps each device's rows together.
    self.assertEqual(sorted(rows), sorted(sort_index, key=sort_index.get))
    devices = list(dict.fromkeys(rows[tid][0] for tid in sorted(rows)))
    self.assertEqual([rows[tid][0] for tid in sorted(rows)],
                     sorted((rows[tid][0] for tid in rows), key=devices.index))
    for e in events:
      if e['ph'] == 'C':
        self.assertRegex(e['name'], r'^CPU:\d+ step memory$')
    by_thread = collections.defaultdict(list)
    for e in slices + ops:
      by_thread[e['tid']].append((e['ts'], e['ts'] + e['dur']))
    for spans in by_thread.values():  # Slices of a thread nest or follow each other.
      open_ends = []
      for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
        while open_ends and open_ends[-1] <= start:
          open_ends.pop()
        self.assertTrue(not open_ends or end <= open_ends[-1], (start, end, open_ends))
        open_ends.append(end)
    return devices, rows, slices, ops

  def _AssertOpsNestInTheirTasks(self, rows, slices, ops):
    """Each op of a task lies within that task's slice (or its re-computation's) on the same device;
    one on the task's own thread lies within a task slice of that thread; every task slice holds at
    least one of its ops on its own thread or that thread's rows of concurrent ops."""
    device = {tid: row[0] for tid, row in rows.items()}
    threads = {tid: row[1] for tid, row in rows.items()}
    tasks = [e for e in slices if 'partition' in e.get('args', {})]
    self.assertTrue(tasks)

    def Within(op, task):
      return task['ts'] <= op['ts'] and op['ts'] + op['dur'] <= task['ts'] + task['dur']

    nested = collections.Counter()
    for op in ops:
      if 'task' not in op['args']:
        continue
      names = {op['args']['task']}
      if op['cat'] == 'recompute':
        names.add('R' + op['args']['task'][1:])
      self.assertTrue(
          any(Within(op, t) for t in tasks
              if device[t['tid']] == device[op['tid']] and t['name'] in names) or
          threads[op['tid']] == 'ops outside tasks', op)
      row = threads[op['tid']]
      if row.startswith('tasks') and ': ops' not in row:
        holders = [t for t in tasks if t['tid'] == op['tid'] and Within(op, t)]
        self.assertTrue(holders, op)
      # Under its task: on the task's thread, or on one of that thread's rows of concurrent ops
      # (which ops run at the same time as others depends on the machine, not on the trace).
      for t in tasks:
        if device[t['tid']] == device[op['tid']] and t['name'] in names and Within(op, t):
          label = threads[t['tid']]
          if row == label or row.startswith(label + ': ops '):
            nested[id(t)] += 1
    for t in tasks:
      # Two forward calls of a partition that overlap run ops of the same names: the trace gives
      # them all to one of the two (profiling.Trace), so the other may hold none.
      overlapped = any(u is not t and device[u['tid']] == device[t['tid']] and
                       u['cat'] == t['cat'] and
                       u['ts'] < t['ts'] + t['dur'] and t['ts'] < u['ts'] + u['dur']
                       for u in tasks)
      if not overlapped:
        self.assertGreater(nested[id(t)], 0, t)

  def _AssertSlicesMatchSchedule(self, schedule_name, sched):
    trace = _TracedStep(schedule_name)
    data = self._Load(trace)
    devices, rows, slices, ops = self._AssertTraceEventFormat(data)
    self.assertEqual(devices, ['CPU:0', 'CPU:1'])
    self._AssertOpsNestInTheirTasks(rows, slices, ops)
    # TensorFlow's ops: every compute op of the step, once, on its device's row.
    self.assertEqual(
        collections.Counter((rows[e['tid']][0], e['args']['node']) for e in ops),
        collections.Counter((op.device, op.name) for op in trace.compute_ops))
    self.assertIn('MatMul', {e['args']['op'].lstrip('_').replace('Mkl', '') for e in ops})
    # The step's memory as a counter per device, from zero.
    counters = collections.defaultdict(list)
    for e in data['traceEvents']:
      if e['ph'] == 'C':
        counters[e['name'].split(' ')[0]].append((e['ts'], e['args']['MiB']))
    self.assertEqual(sorted(counters), ['CPU:0', 'CPU:1'])
    for points in counters.values():
      self.assertEqual(points[0], (0, 0.0))
      self.assertEqual(points, sorted(points, key=lambda p: p[0]))
      self.assertGreater(max(mib for _, mib in points), 0)
    tasks = collections.Counter((rows[e['tid']][0], e['name']) for e in slices
                                if e['name'][0] in 'FBW')
    expected = collections.Counter(
        ('CPU:%d' % a.partition, '%s(%d,%d)' % (a.kind, a.partition, a.micro_batch))
        for actions in sched.device_actions for a in actions)
    self.assertEqual(tasks, expected)  # Every action once, on its device's row, and nothing else.
    kinds = {e['name'][0]: e['cat'] for e in slices if e['name'][0] in 'FBWR'}
    self.assertEqual(kinds.get('F'), 'forward')
    self.assertEqual(kinds.get('B'), 'backward')
    self.assertEqual(kinds.get('R'), 'recompute')  # recompute='always' re-runs every partition.
    for e in slices:
      if e['name'][0] in 'FBWR':
        k, t = (int(n) for n in e['name'][2:-1].split(','))
        self.assertEqual(e['args'], {'partition': k, 'micro_batch': t, 'pipeline': 'pipe'})
    self.assertIn('update', {e['name'] for e in slices})
    return slices

  def testAWriteThatFailsHalfwayLeavesTheEarlierFileWhole(self):
    trace = _TracedStep('gpipe')
    directory = tempfile.mkdtemp(dir=self.get_temp_dir())
    path = os.path.join(directory, 'step.json')
    chrome_trace.Write(trace, path, 'first')

    def _HalfDump(obj, f, **kwargs):
      f.write(json.dumps(obj, **kwargs)[:4096])
      raise OSError('disk full')

    with mock.patch.object(chrome_trace.json, 'dump', _HalfDump):
      with self.assertRaisesRegex(OSError, 'disk full'):
        chrome_trace.Write(trace, path, 'second')
    self.assertEqual(os.listdir(directory), ['step.json'])
    with open(path) as f:
      self.assertEqual(json.load(f)['otherData']['title'], 'first')
    chrome_trace.Write(trace, path, 'third')  # Over an existing file.
    with open(path) as f:
      self.assertEqual(json.load(f)['otherData']['title'], 'third')

  def testFillDrainStep(self):
    slices = self._AssertSlicesMatchSchedule(
        'gpipe', schedule_builders.FillDrainSchedule(2, NUM_MICRO_BATCHES))
    self.assertNotIn('W', {e['name'][0] for e in slices})

  def testZeroBubbleStep(self):
    slices = self._AssertSlicesMatchSchedule(
        'zero_bubble', schedule_builders.ZeroBubbleSchedule(2, NUM_MICRO_BATCHES))
    self.assertEqual({e['cat'] for e in slices if e['name'][0] == 'W'}, {'weight'})

  def testPipelinesNamedAndOverlappingTasksOnTheirOwnThread(self):
    # Two pipelines' partition 0 on one device; the encoder's two forward passes overlap.
    trace = profiling.Trace(trace_helpers.OpsMetadata([
        ('m/encoder/partition0_mb0/forward', 'PartitionedCall', 1000, 1020),
        ('fc0/MatMul', 'MatMul', 1001, 1010),
        ('m/encoder/partition0_mb1/forward', 'PartitionedCall', 1005, 1030),
        ('fc0/MatMul', 'MatMul', 1006, 1018),  # Inside both: mb1's (it started last).
        ('m/decoder/partition0_mb0/forward', 'PartitionedCall', 1040, 1050),
        ('fc0/MatMul', 'MatMul', 1041, 1049),
        ('m/decoder/partition0_mb0/ReadVariableOp', 'ReadVariableOp', 1035, 1036),
        ('loss/Mean', 'Mean', 1052, 1053)]), pipeline_scope=['encoder', 'decoder'])
    self.assertEqual(trace.pipelines, ['encoder', 'decoder'])
    data = self._Load(trace)
    devices, rows, slices, ops = self._AssertTraceEventFormat(data)
    self.assertEqual(devices, ['CPU:0'])
    names = {e['name']: e for e in slices}
    self.assertEqual(sorted(names), ['decoder F(0,0)', 'encoder F(0,0)', 'encoder F(0,1)',
                                     'other'])
    threads = {tid: name for tid, (_, name) in rows.items()}
    self.assertEqual(threads[names['encoder F(0,0)']['tid']], 'tasks')
    self.assertEqual(threads[names['encoder F(0,1)']['tid']], 'tasks 2')
    self.assertEqual(threads[names['other']['tid']], 'other work')
    # A task spans its call, in microseconds from the step's first op (at 1000).
    self.assertEqual((names['decoder F(0,0)']['ts'], names['decoder F(0,0)']['dur']), (40, 10))
    # Each op on the thread of the task that ran it (or of the work it is), named by its type;
    # the decoder's early variable read lies outside its task and has a row of its own.
    rows = {(e['args']['node'], e['ts']): (threads[e['tid']], e['name'], e['args'].get('task'))
            for e in ops}
    self.assertEqual(rows, {
        ('fc0/MatMul', 1): ('tasks', 'MatMul', 'encoder F(0,0)'),
        ('fc0/MatMul', 6): ('tasks 2', 'MatMul', 'encoder F(0,1)'),
        ('fc0/MatMul', 41): ('tasks', 'MatMul', 'decoder F(0,0)'),
        ('m/decoder/partition0_mb0/ReadVariableOp', 35): (
            'ops outside tasks', 'ReadVariableOp', 'decoder F(0,0)'),
        ('loss/Mean', 52): ('other work', 'Mean', None)})
    self.assertNotIn('C', {e['ph'] for e in data['traceEvents']})  # No allocation records.

  def testDevicesInOrderOfTheirIndex(self):
    meta = tf.compat.v1.RunMetadata()
    for index in (10, 2, 0, 11, 1, 3):
      dev = meta.step_stats.dev_stats.add(
          device='/job:localhost/replica:0/task:0/device:CPU:%d' % index)
      dev.node_stats.add(node_name='op%d' % index, all_start_micros=1000 + index,
                         all_end_rel_micros=5, timeline_label='op%d = Neg(x)' % index)
    data = self._Load(profiling.Trace(meta))
    devices, rows, _, ops = self._AssertTraceEventFormat(data)
    in_order = ['CPU:0', 'CPU:1', 'CPU:2', 'CPU:3', 'CPU:10', 'CPU:11']
    self.assertEqual(devices, in_order)  # By thread id and by thread_sort_index alike.
    self.assertEqual({rows[e['tid']][0]: e['args']['node'] for e in ops},
                     {'CPU:%d' % i: 'op%d' % i for i in (0, 1, 2, 3, 10, 11)})


if __name__ == '__main__':
  test_utils.main()
