"""Chrome trace: a traced step as a Trace Event Format file, for Perfetto and chrome://tracing.

`Events` turns a `profiling.Trace` into the JSON object both viewers read (ui.perfetto.dev, "Open
trace file"; chrome://tracing, "Load"): a list of events, each with a name, a phase `ph`, a process
`pid` and a thread `tid`. It holds the step at two levels, TensorPipe's tasks and TensorFlow's ops,
so a user who sees a slow B(3,4) can see which of its ops is slow.
  - The step is one process ('TensorPipe step'); each device is a run of its threads, named by the
    device and the row (e.g. 'CPU:1 tasks'), in device order (`Trace.devices`: CPU:0, CPU:1, ...,
    CPU:10 by index), and within a device in the order of its rows. The viewers keep a process's
    threads in the order of their ids (Perfetto) or of their thread_sort_index (chrome://tracing),
    and both are that order. (Processes are no use for devices: Perfetto orders them by how many
    slices each holds, whatever process_sort_index says.)
  - Complete events (`ph` 'X', with `ts` and `dur` in microseconds from the step's first op) are the
    slices. Task slices: every pipeline task, named F(k,t), B(k,t) or W(k,t), spanning its calls of
    partition k's function (one forward call; a backward task's calls that compute and add its
    gradients), and R(k,t), the re-computation inside a backward or weight-gradient task, spanning
    its ops (`Trace.Tasks()`), with the pipeline's name first when the trace has several (e.g.
    'encoder F(0,1)'), on the device that ran it; their `args` say which task. Work slices: the
    device's other work by category (setup, transfer, update, other), one slice per stretch of its
    ops. Op slices: every op TensorFlow ran in the step (RunMetadata.step_stats; the partition
    functions' call ops left out, their task slices stand for them), named by its op type (e.g.
    'MatMul'), its `args` giving the node's name and the task it ran in. A slice's `cat` is its
    category (profiling.CATEGORIES).
  - Counter events (`ph` 'C'), one counter per device named '<device> step memory': the memory
    allocated during the step and not yet freed (`Trace.MemoryOverTime`, the replay behind
    `Trace.PeakMemory`), in MiB, when the trace has allocation records.
  - Metadata events (`ph` 'M') name the process and the threads (process_name, thread_name) and
    give the threads' order (thread_sort_index).
The viewers draw the slices of one thread as a stack, so slices there must nest or not overlap: a
slice that would partly overlap another goes on another thread. Task slices go on the device's
'tasks' thread ('CPU:1 tasks'), or 'tasks 2', ... for one that overlaps another task (the second of
two forward passes that run at once, forward_overlap); a re-computation that lies within its
backward task nests under it. Work slices go on 'other work' ('other work 2', ...). An op goes on
the thread of the task or work slice that holds it, so the viewers draw it under that slice; an op
that runs at the same time as another one there goes on the next thread of concurrent ops ('tasks:
ops 2', ...). An op of a task that ran outside the task's span (e.g. a variable read for it issued
early) goes on 'ops outside tasks'. Device d (from 1, in device order) has thread ids 1000 * d + row
(row from 1): never the process id (Perfetto would call such a thread the process's "main thread").
"""

import bisect
import collections
import json
import os
from typing import Any, DefaultDict, Dict, List, Optional, Tuple

from lingvo import compat as tf

from tensorpipe.measure import profiling
from tensorpipe.measure import simulator

# Work outside the pipeline's tasks, drawn per category on the device's 'other work' threads.
OTHER_CATEGORIES = ('setup', 'transfer', 'update', 'other')
# The process that holds every device's threads.
PROCESS_ID = 1
PROCESS_NAME = 'TensorPipe step'
# Device d's threads (d from 1, in device order) have ids THREAD_ID_STRIDE * d + row (row >= 1).
THREAD_ID_STRIDE = 1000


def TaskName(category: str, partition: int, micro_batch: int,
             pipeline: Optional[str] = None) -> str:
  """'F(0,1)' for the forward task of partition 0 on micro-batch 1; 'encoder F(0,1)' in a trace of
  several pipelines."""
  name = '%s(%d,%d)' % (profiling.TASK_LETTERS[category], partition, micro_batch)
  return '%s %s' % (pipeline, name) if pipeline else name


def _Micros(seconds):
  """Whole microseconds (the trace's own resolution), so slices that nest in the trace nest here."""
  return int(round(seconds * 1e6))


def _Lanes(slices, first=()):
  """Assigns each (start, end, event) to a lane where it nests in or follows the lane's slices.

  Returns [[event]] per lane. Slices go in by start, longest first, so a slice that holds another
  is placed before it. `first`: (start, end, event) already nested in one lane, which becomes lane
  0; a slice goes there only if no start or end of theirs lies strictly inside it, so it nests
  under them without crossing one (the ops of the tasks on a thread).
  """
  boundaries = sorted(time for start, end, _ in first for time in (start, end))
  # (open slice ends, events) per lane
  lanes: List[Tuple[List[float], List[Any]]] = (
      [([], [event for _, _, event in first])] if first else [])
  for start, end, event in sorted(slices, key=lambda s: (s[0], -s[1])):
    for i, (stack, events) in enumerate(lanes):
      while stack and stack[-1] <= start:
        stack.pop()
      if stack and end > stack[-1]:
        continue
      if first and i == 0 and (bisect.bisect_right(boundaries, start) !=
                               bisect.bisect_left(boundaries, end)):
        continue
      stack.append(end)
      events.append(event)
      break
    else:
      lanes.append(([end], [event]))
  return [events for _, events in lanes]


def _TaskSlice(pipeline, category, partition, micro_batch, start, end, named_pipeline):
  ts, te = _Micros(start), _Micros(end)
  args = {'partition': partition, 'micro_batch': micro_batch}
  if pipeline:
    args['pipeline'] = pipeline
  name = TaskName(category, partition, micro_batch, pipeline if named_pipeline else None)
  return ts, te, {'name': name, 'cat': category, 'ph': 'X', 'ts': ts, 'dur': te - ts,
                  'args': args}


def _TaskSlices(trace):
  """{device: [(start us, end us, event, key)]} of the pipeline tasks and their re-computations;
  key: (pipeline, category, partition, micro_batch).

  A task's slice spans its calls: they are the task, whatever runs at the same time (the ops inside
  two forward calls that overlap have the same names, see profiling.Trace). A re-computation's
  slice spans its ops, inside the backward or weight-gradient call that re-ran them.
  """
  named_pipeline = len(trace.pipelines) > 1
  # (pipeline, category, partition, micro_batch) -> (start, end) of its calls
  spans: Dict[Tuple[Optional[str], str, int, Optional[int]], Tuple[float, float]] = {}
  for op in trace.ops:
    if op.is_call and op.partition is not None:
      key = (op.pipeline, op.category, op.partition, op.micro_batch)
      start, end = spans.get(key, (op.start, op.end))
      spans[key] = (min(start, op.start), max(end, op.end))
  device_of = trace.DeviceOfPartition()
  slices = [key + span for key, span in spans.items()]
  for pipeline in trace.PipelineKeys():
    # One per backward or weight-gradient task that re-ran partition k on micro-batch t.
    slices += [(pipeline, category, k, t, start, end)
               for k, category, t, start, end in trace.Tasks(pipeline) if category == 'recompute']
  out = collections.defaultdict(list)
  for pipeline, category, partition, micro_batch, start, end in slices:
    out[device_of[(pipeline, partition)]].append(
        _TaskSlice(pipeline, category, partition, micro_batch, start, end, named_pipeline) +
        ((pipeline, category, partition, micro_batch),))
  return out


def _OtherSlices(trace):
  """{device: [(start us, end us, event, key)]}: each device's work outside the tasks, per
  category; key: (None, category, None, None)."""
  spans: DefaultDict[str, DefaultDict[str, List[Tuple[float, float]]]] = (
      collections.defaultdict(lambda: collections.defaultdict(list)))
  for op in trace.compute_ops:
    if op.category in OTHER_CATEGORIES:
      spans[op.device][op.category].append((op.start, op.end))
  out = collections.defaultdict(list)
  for device, by_category in spans.items():
    for category, category_spans in by_category.items():
      for start, end in simulator.MergeSpans(category_spans):
        ts, te = _Micros(start), _Micros(end)
        out[device].append((ts, te, {'name': category, 'cat': category, 'ph': 'X', 'ts': ts,
                                     'dur': te - ts}, (None, category, None, None)))
  return out


def _OpSlice(op, named_pipeline):
  """(start us, end us, event) of one executed op; its task named as the task slices are."""
  ts, te = _Micros(op.start), _Micros(op.end)
  args = {'node': op.name, 'op': op.op_type}
  if op.partition is not None:
    args['task'] = TaskName(op.task or op.category, op.partition, op.micro_batch,
                            op.pipeline if named_pipeline else None)
  if op.layer:
    args['layer'] = op.layer
  return ts, te, {'name': op.op_type or op.name, 'cat': op.category, 'ph': 'X', 'ts': ts,
                  'dur': te - ts, 'args': args}


def _Holder(op_slice, op, holders):
  """The innermost of `holders` ({key: [(start, end, event, key)]}) that is the op's task or work
  and spans it, or None."""
  ts, te, _ = op_slice
  if op.partition is None:
    keys = [(None, op.category, None, None)]
  else:
    keys = [(op.pipeline, category, op.partition, op.micro_batch)
            for category in dict.fromkeys((op.category, op.task)) if category]
  spanning = [h for key in keys for h in holders.get(key, ()) if h[0] <= ts and te <= h[1]]
  return min(spanning, key=lambda h: h[1] - h[0]) if spanning else None


def _Metadata(name, pid, tid, value):
  return {'name': name, 'ph': 'M', 'pid': pid, 'tid': tid, 'args': value}


def _DeviceThreads(device, trace, tasks, other):
  """[(thread name, [event])] of one device, in the order of its rows (module docstring)."""
  holders = collections.defaultdict(list)
  for holder in tasks + other:
    holders[holder[3]].append(holder)
  # (label, [(start, end, event)] of the lane's holders, [op slices under them])
  groups: List[Tuple[str, List[Any], List[Any]]] = []
  for label, slices in (('tasks', tasks), ('other work', other)):
    by_event = {id(h[2]): h[:3] for h in slices}
    for i, lane in enumerate(_Lanes([h[:3] for h in slices])):
      groups.append((label if i == 0 else '%s %d' % (label, i + 1),
                     [by_event[id(e)] for e in lane], []))
  group_of = {id(h[2]): g for g, (_, lane, _) in enumerate(groups) for h in lane}
  outside = []
  for op in trace.compute_ops:
    if op.device != device:
      continue
    op_slice = _OpSlice(op, len(trace.pipelines) > 1)
    holder = _Holder(op_slice, op, holders)
    if holder is None:
      outside.append(op_slice)
    else:
      groups[group_of[id(holder[2])]][2].append(op_slice)
  threads = []
  for label, lane, ops in groups:
    for i, events in enumerate(_Lanes(ops, first=lane)):
      threads.append((label if i == 0 else '%s: ops %d' % (label, i + 1), events))
  for i, events in enumerate(_Lanes(outside)):
    threads.append(('ops outside tasks' if i == 0 else 'ops outside tasks %d' % (i + 1), events))
  return threads


def _MemoryCounters(device, points, tid):
  """The 'C' events of `device`'s memory over the step, [(seconds, bytes)], in MiB."""
  return [{'name': '%s step memory' % device, 'ph': 'C', 'pid': PROCESS_ID, 'tid': tid,
           'ts': _Micros(seconds), 'args': {'MiB': round(size / 2.0**20, 6)}}
          for seconds, size in points]


def Events(trace: profiling.Trace, title: str = '') -> Dict[str, Any]:
  """The Trace Event Format object of `trace` (see the module docstring)."""
  tasks, other = _TaskSlices(trace), _OtherSlices(trace)
  memory = trace.MemoryOverTime() if trace.HasMemory() else {}
  events: List[Dict[str, Any]] = [
      _Metadata('process_name', PROCESS_ID, PROCESS_ID, {'name': PROCESS_NAME})]
  for number, device in enumerate(trace.devices, start=1):
    threads: List[Tuple[str, List[Dict[str, Any]]]] = _DeviceThreads(
        device, trace, tasks.get(device, []), other.get(device, []))
    for row, (label, lane) in enumerate(threads, start=1):
      tid = THREAD_ID_STRIDE * number + row
      events.append(_Metadata('thread_name', PROCESS_ID, tid, {'name': '%s %s' % (device, label)}))
      events.append(_Metadata('thread_sort_index', PROCESS_ID, tid, {'sort_index': tid}))
      for event in lane:
        events.append(dict(event, pid=PROCESS_ID, tid=tid))
    events += _MemoryCounters(device, memory.get(device, []), THREAD_ID_STRIDE * number)
  return {'traceEvents': events, 'displayTimeUnit': 'ms',
          'otherData': {'title': title, 'step_ms': '%.3f' % (1e3 * trace.step_time)}}


def Write(trace: profiling.Trace, path: str, title: str = '') -> str:
  """Writes `trace` as Trace Event Format JSON at `path` (a tf.io.gfile path); returns `path`.

  The file appears whole or not at all (written beside `path`, then renamed), so a trainer killed
  while it writes never leaves a truncated trace for a viewer to choke on.
  """
  partial = '%s.partial-%d' % (path, os.getpid())
  try:
    with tf.io.gfile.GFile(partial, 'w') as f:
      json.dump(Events(trace, title), f, separators=(',', ':'))
    tf.io.gfile.rename(partial, path, overwrite=True)
  finally:
    if tf.io.gfile.exists(partial):
      tf.io.gfile.remove(partial)
  return path
