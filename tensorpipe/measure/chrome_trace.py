"""Chrome trace: a traced step as a Trace Event Format file, for Perfetto and chrome://tracing.

`Events` turns a `profiling.Trace` into the JSON object both viewers read (ui.perfetto.dev, "Open
trace file"; chrome://tracing, "Load"): a list of events, each with a name, a phase `ph`, a process
`pid` and a thread `tid`.
  - Each device is a process, named by the device (e.g. 'CPU:1'), in the order of `Trace.devices`.
  - Complete events (`ph` 'X', with `ts` and `dur` in microseconds from the step's first op) are the
    slices: every pipeline task, named F(k,t), B(k,t) or W(k,t), spanning its calls of partition
    k's function (one forward call; a backward task's calls that compute and add its gradients),
    and R(k,t), the re-computation inside a backward or weight-gradient task, spanning its ops
    (`Trace.Tasks()`), with the pipeline's name first when the trace has several (e.g. 'encoder
    F(0,1)'), on the device that ran it; and the device's other work by category (setup, transfer,
    update, other), one slice per stretch of its ops. A slice's `cat` is its category
    (profiling.CATEGORIES), its `args` say which task.
  - Metadata events (`ph` 'M') name the processes and threads: process_name, thread_name, and
    process_sort_index / thread_sort_index to keep the rows in order.
The viewers draw the slices of one thread as a stack, so slices there must nest or not overlap:
a slice that would partly overlap another goes on the device's next thread ('tasks 2', ...), e.g.
the second of two forward passes that run at once (forward_overlap); a re-computation that lies
within its backward task nests under it.
"""

import collections
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from lingvo import compat as tf

from tensorpipe.measure import profiling
from tensorpipe.measure import simulator

# Work outside the pipeline's tasks, drawn per category on the device's 'other work' threads.
OTHER_CATEGORIES = ('setup', 'transfer', 'update', 'other')


def TaskName(category: str, partition: int, micro_batch: int,
             pipeline: Optional[str] = None) -> str:
  """'F(0,1)' for the forward task of partition 0 on micro-batch 1; 'encoder F(0,1)' in a trace of
  several pipelines."""
  name = '%s(%d,%d)' % (profiling.TASK_LETTERS[category], partition, micro_batch)
  return '%s %s' % (pipeline, name) if pipeline else name


def _Micros(seconds):
  """Whole microseconds (the trace's own resolution), so slices that nest in the trace nest here."""
  return int(round(seconds * 1e6))


def _Lanes(slices):
  """Assigns each (start, end, event) to a lane where it nests in or follows the lane's slices.

  Returns [[event]] per lane. Slices go in by start, longest first, so a slice that holds another
  is placed before it.
  """
  lanes = []  # (stack of open slice ends, events)
  for start, end, event in sorted(slices, key=lambda s: (s[0], -s[1])):
    for stack, events in lanes:
      while stack and stack[-1] <= start:
        stack.pop()
      if not stack or end <= stack[-1]:
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
  """{device: [(start us, end us, event)]} of the pipeline tasks and their re-computations.

  A task's slice spans its calls: they are the task, whatever runs at the same time (the ops inside
  two forward calls that overlap have the same names, see profiling.Trace). A re-computation's
  slice spans its ops, inside the backward or weight-gradient call that re-ran them.
  """
  named_pipeline = len(trace.pipelines) > 1
  spans = {}  # (pipeline, category, partition, micro_batch) -> (start, end) of its calls
  for op in trace.ops:
    if op.is_call and op.partition is not None:
      key = (op.pipeline, op.category, op.partition, op.micro_batch)
      start, end = spans.get(key, (op.start, op.end))
      spans[key] = (min(start, op.start), max(end, op.end))
  device_of = trace.PartitionDevices()
  slices = [key + span for key, span in spans.items()]
  for pipeline in trace.pipelines or [None]:
    # One per backward or weight-gradient task that re-ran partition k on micro-batch t.
    slices += [(pipeline, category, k, t, start, end)
               for k, category, t, start, end in trace.Tasks(pipeline) if category == 'recompute']
  out = collections.defaultdict(list)
  for pipeline, category, partition, micro_batch, start, end in slices:
    out[device_of[(pipeline, partition)]].append(
        _TaskSlice(pipeline, category, partition, micro_batch, start, end, named_pipeline))
  return out


def _OtherSlices(trace):
  """{device: [(start us, end us, event)]}: each device's work outside the tasks, per category."""
  spans = collections.defaultdict(lambda: collections.defaultdict(list))
  for op in trace.compute_ops:
    if op.category in OTHER_CATEGORIES:
      spans[op.device][op.category].append((op.start, op.end))
  out = collections.defaultdict(list)
  for device, by_category in spans.items():
    for category, category_spans in by_category.items():
      for start, end in simulator.MergeSpans(category_spans):
        ts, te = _Micros(start), _Micros(end)
        out[device].append((ts, te, {'name': category, 'cat': category, 'ph': 'X', 'ts': ts,
                                     'dur': te - ts}))
  return out


def _Metadata(name, pid, tid, value):
  return {'name': name, 'ph': 'M', 'pid': pid, 'tid': tid, 'args': value}


def Events(trace: profiling.Trace, title: str = '') -> Dict[str, Any]:
  """The Trace Event Format object of `trace` (see the module docstring)."""
  tasks, other = _TaskSlices(trace), _OtherSlices(trace)
  events: List[Dict[str, Any]] = []
  for pid, device in enumerate(trace.devices, start=1):
    events.append(_Metadata('process_name', pid, 0, {'name': device}))
    events.append(_Metadata('process_sort_index', pid, 0, {'sort_index': pid}))
    threads: List[Tuple[str, List[Dict[str, Any]]]] = []
    for label, slices in (('tasks', tasks.get(device, [])), ('other work', other.get(device, []))):
      for i, lane in enumerate(_Lanes(slices)):
        threads.append((label if i == 0 else '%s %d' % (label, i + 1), lane))
    for tid, (label, lane) in enumerate(threads, start=1):
      events.append(_Metadata('thread_name', pid, tid, {'name': label}))
      events.append(_Metadata('thread_sort_index', pid, tid, {'sort_index': tid}))
      for event in lane:
        events.append(dict(event, pid=pid, tid=tid))
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
