"""Profiling: what each device did in one traced TensorPipe training step.

`Trace` reads a step's RunMetadata. TensorPipeLayer runs every task as one call of a partition's
graph function (see `partition_function`), named by its scope `partition<k>_mb<t>/`: the forward
call F(k, t), and, inside tf.gradients, the backward call B(k, t) with the calls that start or add
to its weight-gradient sums, and, in a schedule that splits backward passes, the weight-gradient
call W(k, t). A full trace also holds the ops that ran inside those calls, under the names they have
in the function bodies (e.g. `layer3/MatMul`, `recompute/layer3/MatMul`,
`gradients_1/recompute/layer3/MatMul_grad/MatMul`). Each inner op belongs to a call that ran on its
device and spans it; where two calls of a partition overlap (two forward passes at once with
forward_overlap), to the one of the matching kind that started last. Every executed op is labelled:
  forward     F(k, t): the forward call and the ops inside it;
  recompute   R(k, t): the re-run of the forward pass inside a backward or weight-gradient call
              (`recompute/...`);
  backward    B(k, t): the backward calls and their other ops (the gradients, the additions);
  weight      W(k, t): the weight-gradient call's other ops;
  setup       splitting into and joining micro-batches (the pipeline's own ops, in no partition);
  transfer    sends and receives between devices;
  update      variable updates (Assign*/Apply* ops);
  other       everything else (input pipeline, loss, ...).
Given the TensorPipeLayers' names (`pipeline_scope`), each op of a pipeline also carries that
pipeline's name, so the tasks and times of a model with several pipelines (e.g. a translation
model's encoder and decoder, whose partitions share indices) can be read per pipeline.
Call ops are only containers: a task's span is that of its inner ops, and busy time and work count
inner ops only. From those: per-device busy time, per-partition and per-layer times (to feed
`simulator`), and a timeline to draw. A task's time is the union of its ops' spans (its span); its
work is the sum of its ops' durations (core-seconds: each op runs on one thread with
intra_op_parallelism_threads=1), and work / span is how many of its ops run at once, which the
simulator's shared-core model needs.

Memory: with a full trace every op's allocations and deallocations are recorded with their times.
`PeakMemory` replays them per device (an allocation counts on the device of the op that made it,
until it is freed), so it gives each device's peak of memory allocated during the step, even where
logical CPU devices share one allocator and the allocator itself can only report the process-wide
peak. Memory held before the step (variables, inputs) is not in it; a variable update that writes a
new buffer counts it until the update ends, when the old buffer is freed.
"""

import collections
import dataclasses
import re
import typing
from typing import Any, DefaultDict, Dict, List, Optional, Sequence, Tuple, Union

from lingvo import compat as tf

from tensorpipe.measure import simulator
from tensorpipe import units

CATEGORIES = ('forward', 'recompute', 'backward', 'weight', 'setup', 'transfer', 'update', 'other')
# The letter of each task category in task names, F(k,t), R(k,t), B(k,t), W(k,t).
TASK_LETTERS = {'forward': 'F', 'recompute': 'R', 'backward': 'B', 'weight': 'W'}
# Ops that move or alias data rather than compute: left out of task spans, which would otherwise
# start with weight reads issued long before the task's input arrives.
_BOOKKEEPING = frozenset(['ReadVariableOp', 'Identity', 'IdentityN', 'Const', 'NoOp', '_Send',
                          '_Recv', '_HostSend', '_HostRecv', 'VarHandleOp', 'Shape', '_Arg',
                          '_Retval'])
_CALLS = frozenset(['PartitionedCall', 'StatefulPartitionedCall'])
_PARTITION = re.compile(r'(?:^|/)partition(\d+)_mb(\d+)/')
# Send/receive nodes TF adds between devices: '<producer>/_<n>'.
_TRANSFER = re.compile(r'/_\d+$')
# An op inside a function body: an optional gradients scope, an optional re-computation scope, then
# the layer's scope.
_INNER = re.compile(r'^(gradients(?:_\d+)?/)?(recompute/)?([^/]+)/')


@dataclasses.dataclass
class Op:
  """One executed op."""
  device: str  # Short form, e.g. 'CPU:1'.
  name: str
  op_type: str
  start: float  # Seconds from the first op of the step.
  end: float
  category: str
  partition: Optional[int] = None
  micro_batch: Optional[int] = None
  layer: Optional[str] = None  # The layer's name scope, for ops inside the partitions' functions.
  task: Optional[str] = None  # The task of a partition op: the category of the call it ran in.
  is_call: bool = False  # A call op of a partition function: a container of other ops, not work.
  pipeline: Optional[str] = None  # The name of the TensorPipeLayer it belongs to, if given.


def ShortDevice(device: str) -> str:
  """'CPU:1' for '/job:localhost/replica:0/task:0/device:CPU:1' (and for '/device:CPU:1');
  'worker:2/CPU:0' for '/job:worker/replica:0/task:2/device:CPU:0' (another process's device)."""
  spec = tf.DeviceSpec.from_string(device)
  if not spec.device_type:
    return device
  short = '%s:%d' % (spec.device_type, spec.device_index or 0)
  if spec.job and spec.job != 'localhost':
    short = '%s:%d/%s' % (spec.job, spec.task or 0, short)
  return short


def _Scopes(pipeline_scope):
  """The tuple of pipeline names in `pipeline_scope` (None, one name, or a sequence of names)."""
  if not pipeline_scope:
    return ()
  return (pipeline_scope,) if isinstance(pipeline_scope, str) else tuple(pipeline_scope)


def PipelineOf(name: str, pipeline_scope: Union[None, str, Sequence[str]]) -> Optional[str]:
  """The pipeline in `pipeline_scope` whose name scope (e.g. 'encoder' or 'encoder_1') holds the op
  `name`, the innermost if several do; None if none does."""
  best, position = None, -1
  for scope in _Scopes(pipeline_scope):
    for match in re.finditer(r'(?:^|/)%s(?:_\d+)?/' % re.escape(scope), name):
      if match.start() > position:
        best, position = scope, match.start()
  return best


def Classify(name: str, op_type: str, pipeline_scope: Union[None, str, Sequence[str]] = None
             ) -> Tuple[str, Optional[int], Optional[int]]:
  """(category, partition, micro_batch) of an op of the step's own graph, from its name.

  Ops inside the partitions' functions carry no partition in their names; `Trace` labels them by the
  call they ran in (see the module docstring). `pipeline_scope`: the TensorPipeLayers' names (one or
  several), whose ops outside any partition are 'setup'.
  """
  if op_type.startswith(('Assign', 'Apply', 'ResourceApply', 'ResourceScatter')):
    return 'update', None, None
  if op_type in ('_Send', '_Recv', '_HostSend', '_HostRecv') or _TRANSFER.search(name) or (
      name.startswith('GroupCrossDeviceControlEdges')) or name == 'RecvTensor':
    # RecvTensor: a tensor received from another process over gRPC.
    return 'transfer', None, None
  match = _PARTITION.search(name)
  if match is None:
    if PipelineOf(name, pipeline_scope) is not None:
      return 'setup', None, None
    return 'other', None, None
  partition, micro_batch = int(match.group(1)), int(match.group(2))
  if not name.startswith('gradients'):
    return 'forward', partition, micro_batch
  return ('weight' if name.endswith('/weight') else 'backward'), partition, micro_batch


def _InnerLabel(name, call_category):
  """(category, layer) of an op that ran inside a call of category `call_category`."""
  match = _INNER.match(name)
  if call_category == 'forward':
    return 'forward', match.group(3) if match else None
  if match and match.group(2) and not match.group(1):
    return 'recompute', match.group(3)
  return call_category, match.group(3) if match else None


class Trace:
  """The executed ops of one step, labelled (see the module docstring).

  Args:
    run_metadata: of a step run with a full trace (`TracedRun`).
    pipeline_scope: the name of the TensorPipeLayer, or the names of several: their ops outside the
      partitions are 'setup' rather than 'other', and every op of a pipeline carries its name.
  """

  def __init__(self, run_metadata: tf.compat.v1.RunMetadata,
               pipeline_scope: Union[None, str, Sequence[str]] = None):
    self._scopes = _Scopes(pipeline_scope)
    records = []
    self._allocations = []  # (device, micros, bytes); negative bytes free.
    for dev in run_metadata.step_stats.dev_stats:
      if 'stream' in dev.device or 'memcpy' in dev.device:
        continue
      for n in dev.node_stats:
        label = n.timeline_label or ''
        op_type = label.split('(')[0].split('=')[-1].strip() if '=' in label else ''
        if n.node_name == '_SOURCE':
          continue
        start = n.all_start_micros
        end = start + max(n.all_end_rel_micros, 0)
        records.append((dev.device, n.node_name, op_type, start, end))
        net = 0
        for memory in n.memory:
          for r in memory.allocation_records:
            self._allocations.append((ShortDevice(dev.device), r.alloc_micros, r.alloc_bytes))
            net += r.alloc_bytes
        if net > 0 and Classify(n.node_name, op_type)[0] == 'update':
          # The update wrote a new buffer; the old one, allocated before the step, is freed as the
          # op ends, without a record here.
          self._allocations.append((ShortDevice(dev.device), end, -net))
    if not records:
      raise ValueError('the RunMetadata has no step stats; run the step with '
                       'RunOptions(trace_level=FULL_TRACE)')
    t0 = min(r[3] for r in records)
    self._t0 = t0  # Micros of the step's first op, the trace's time zero.
    self.ops = []
    calls = collections.defaultdict(list)  # device -> call ops
    inner = []
    for device, name, op_type, start, end in records:
      category, partition, micro_batch = Classify(name, op_type, pipeline_scope)
      op = Op(ShortDevice(device), name, op_type, (start - t0) / 1e6, (end - t0) / 1e6, category,
              partition, micro_batch, is_call=op_type in _CALLS,
              pipeline=PipelineOf(name, pipeline_scope))
      if partition is not None:
        # An op of the step's own graph named after a task (its call, or e.g. a variable read for
        # it) belongs to that task.
        op.task = category
      if op.is_call and partition is not None:
        calls[op.device].append(op)
      elif category in ('other', 'setup'):
        inner.append(op)
      self.ops.append(op)
    for op in inner:
      call = self._EnclosingCall(op, calls[op.device])
      if call is not None:
        op.category, op.layer = _InnerLabel(op.name, call.category)
        op.partition, op.micro_batch, op.task = call.partition, call.micro_batch, call.category
        op.pipeline = call.pipeline
    self.step_time = max(op.end for op in self.ops)

  @staticmethod
  def _EnclosingCall(op, calls):
    """The call `op` ran in: one that spans it, of the kind its name suggests, started last."""
    spanning = [c for c in calls if c.start <= op.start and op.end <= c.end]
    if not spanning:
      return None
    match = _INNER.match(op.name)
    want = ('backward', 'weight') if match and (match.group(1) or match.group(2)) else ('forward',)
    preferred = [c for c in spanning if c.category in want] or spanning
    return max(preferred, key=lambda c: c.start)

  @property
  def compute_ops(self) -> List[Op]:
    """The executed ops without the call ops that contain them."""
    return [op for op in self.ops if not op.is_call]

  @property
  def devices(self) -> List[str]:
    return sorted({op.device for op in self.ops}, key=lambda d: (d.split(':')[0], _Index(d)))

  def Busy(self, ops: Optional[Sequence[Op]] = None) -> Dict[str, float]:
    """{device: seconds with at least one op running} (over `ops`, default all)."""
    spans = collections.defaultdict(list)
    for op in self.compute_ops if ops is None else ops:
      spans[op.device].append((op.start, op.end))
    return {d: simulator.UnionLength(s) for d, s in spans.items()}

  def BusyByCategory(self) -> Dict[str, Dict[str, float]]:
    """{device: {category: busy seconds}}, adding up to `Busy()` per device.

    Concurrent ops of one category count once; an instant when ops of n categories run on a device
    counts 1/n to each, so shares of the step (e.g. bubble vs re-computation) never sum past 1.
    """
    # device -> (time, +1 at an op's start or -1 at its end, the op's category)
    events: DefaultDict[str, List[Tuple[float, int, str]]] = collections.defaultdict(list)
    for op in self.compute_ops:
      events[op.device] += [(op.start, 1, op.category), (op.end, -1, op.category)]
    out = {}
    for device, evs in events.items():
      running: typing.Counter[str] = collections.Counter()  # category -> its ops running
      seconds: DefaultDict[str, float] = collections.defaultdict(float)
      last = 0.0
      for t, delta, category in sorted(evs, key=lambda e: (e[0], e[1])):
        active = [c for c, n in running.items() if n > 0]
        if active and t > last:
          for c in active:
            seconds[c] += (t - last) / len(active)
        running[category] += delta
        last = t
      out[device] = dict(seconds)
    return out

  def WorkByCategory(self) -> Dict[str, Dict[str, float]]:
    """{device: {category: summed op seconds}}; concurrent ops all count (core-seconds)."""
    out: DefaultDict[str, DefaultDict[str, float]] = collections.defaultdict(
        lambda: collections.defaultdict(float))
    for op in self.compute_ops:
      out[op.device][op.category] += op.end - op.start
    return {d: dict(c) for d, c in out.items()}

  @typing.overload
  def PeakMemory(self, devices: None = None) -> Dict[str, int]:
    ...

  @typing.overload
  def PeakMemory(self, devices: Sequence[str]) -> int:
    ...

  def PeakMemory(self, devices: Optional[Sequence[str]] = None) -> Union[Dict[str, int], int]:
    """Bytes: the peak of memory allocated during the step and not yet freed, on `devices`.

    Args:
      devices: None: {device: its own peak} for every device that allocated; a list of devices:
        the peak of their sum (e.g. all of them, to compare with a process-wide allocator peak).
    """
    if not self._allocations:
      raise ValueError('the trace has no allocation records; run the step with '
                       'RunOptions(trace_level=FULL_TRACE)')
    if devices is None:
      return {d: self.PeakMemory([d]) for d in sorted({a[0] for a in self._allocations})}
    live = peak = 0
    # At equal times frees go first, so an op that frees and allocates at once is not counted twice.
    for _, _, size in sorted((a[1], a[2], a[2]) for a in self._allocations if a[0] in devices):
      live += size
      peak = max(peak, live)
    return peak

  def MemoryOverTime(self) -> Dict[str, List[Tuple[float, int]]]:
    """{device: [(seconds from the step's first op, bytes allocated during the step and not yet
    freed)]}: the replay behind `PeakMemory`, one point per instant an allocation or free happened
    (the last value at that instant), starting from (0, 0); {} without allocation records.

    For drawing the step's memory as a counter (chrome_trace). Instants before the first op (an
    allocation record may be stamped slightly earlier) count at 0.
    """
    out = {}
    for device in sorted({a[0] for a in self._allocations}):
      live, points = 0, [(0.0, 0)]
      for micros, size in sorted((a[1], a[2]) for a in self._allocations if a[0] == device):
        live += size
        at = max(0.0, (micros - self._t0) / 1e6)
        if points[-1][0] == at:
          points[-1] = (at, live)
        else:
          points.append((at, live))
      out[device] = points
    return out

  def HasMemory(self) -> bool:
    """Whether the trace recorded allocations (it does with FULL_TRACE on CPU and GPU)."""
    return bool(self._allocations)

  def DeviceOfPartition(self) -> Dict[Tuple[Optional[str], int], str]:
    """{(pipeline, partition): the device its ops ran on}; pipeline as in `Op.pipeline`. The
    partition's calls decide where there are any (the partition's functions run there)."""
    devices: Dict[Tuple[Optional[str], int], str] = {}
    for op in sorted(self.ops, key=lambda op: not op.is_call):
      if op.partition is not None:
        devices.setdefault((op.pipeline, op.partition), op.device)
    return devices

  @property
  def pipelines(self) -> List[str]:
    """The names given to the Trace (`pipeline_scope`) of the pipelines that ran partition ops."""
    ran = {op.pipeline for op in self.ops if op.partition is not None}
    return [name for name in self._scopes if name in ran]

  def PipelineKeys(self) -> List[Optional[str]]:
    """The `pipeline` arguments that take each pipeline's tasks apart (see Tasks): the pipelines'
    names, or [None] (every partition op) in a trace without pipeline names."""
    keys: List[Optional[str]] = list(self.pipelines)
    return keys or [None]

  def Tasks(self, pipeline: Optional[str] = None) -> List[Tuple[int, str, int, float, float]]:
    """[(partition, category, micro_batch, start, end)] of every pipeline task (its ops' span).

    Args:
      pipeline: only that pipeline's tasks (a name given to the Trace); None: every partition op,
        where partitions of several pipelines with the same index count together.
    """
    # (partition, category, micro-batch, task) -> (start, end) of its ops
    spans: Dict[Tuple[int, str, int, Optional[str]], Tuple[float, float]] = {}
    for op in self.compute_ops:
      # (An op of a partition has a micro-batch too: both come from its name.)
      if op.partition is None or op.micro_batch is None or op.op_type in _BOOKKEEPING:
        continue
      if pipeline is not None and op.pipeline != pipeline:
        continue
      key = (op.partition, op.category, op.micro_batch, op.task)
      start, end = spans.get(key, (op.start, op.end))
      spans[key] = (min(start, op.start), max(end, op.end))
    return sorted((k[:3] + v for k, v in spans.items()), key=lambda r: r[3])

  def PipelinePartitionTimes(self) -> List[Tuple[Optional[str], List[simulator.TaskTimes]]]:
    """[(pipeline name, its PartitionTimes)] of each pipeline whose partitions ran in the trace;
    [(None, every partition's)] in a trace without pipeline names; [] without partition ops."""
    out = []
    for pipeline in self.PipelineKeys():
      try:
        out.append((pipeline, self.PartitionTimes(pipeline)))
      except ValueError:  # That pipeline's partitions did not run in this step.
        continue
    return out

  def PartitionTimes(self, pipeline: Optional[str] = None) -> List[simulator.TaskTimes]:
    """Per partition, simulator.TaskTimes: mean span per task of F, B, R, W, and parallelism.

    Args:
      pipeline: only that pipeline's partitions (a name given to the Trace); None: every partition
        op, where partitions of several pipelines with the same index count together.
    """
    def Mine(op):
      return op.partition is not None and pipeline in (None, op.pipeline)

    partitions = [op.partition for op in self.ops if Mine(op) and op.partition is not None]
    if not partitions:
      raise ValueError('no TensorPipe partition calls%s in the trace (names with '
                       'partition<k>_mb<t>)' % ('' if pipeline is None else
                                                ' of pipeline %r' % pipeline))
    return self._TaskCosts(1 + max(partitions), lambda op: op.partition if Mine(op) else None)

  def GroupTimes(self, groups: Sequence[Sequence[str]]) -> List[simulator.TaskTimes]:
    """Per group of layers: simulator.TaskTimes per micro-batch, as if it were a partition.

    For predicting another partition from this trace (e.g. K = 2 partitions from a K = 1 step with
    the same M): group g's task on micro-batch t spans the union of its layers' ops on t, so ops of
    neighbouring layers that overlap count once, and its parallelism is its work over that span.

    Args:
      groups: lists of layer names (the first name scope inside a partition, see `LayerTimes`).
    """
    return self._GroupCosts(groups, per_micro_batch=True)

  def LayerTimes(self, layer_names: Sequence[str]) -> List[simulator.TaskTimes]:
    """Per layer, simulator.TaskTimes: its F, B, R ops' span summed over the step; parallelism.

    Summed over micro-batches, so a layer's costs are those of the whole mini-batch; concurrent
    ops of one layer count once in its span, and each in its work. Ops outside any layer's name
    scope are not counted.
    """
    return self._GroupCosts([[name] for name in layer_names], per_micro_batch=False)

  def _GroupCosts(self, groups, per_micro_batch):
    """_TaskCosts with group g's tasks made of its layers' ops (bookkeeping ops left out)."""
    index = {name: g for g, names in enumerate(groups) for name in names}
    return self._TaskCosts(len(groups), lambda op: (
        index.get(op.layer) if op.op_type not in _BOOKKEEPING else None), per_micro_batch)

  def _TaskCosts(self, num_tasks, task_of, per_micro_batch=True):
    """simulator.TaskTimes per task index from per-micro-batch spans.

    `task_of(op)` gives an op's task index, or None to leave it out. Times are the mean over
    micro-batches with `per_micro_batch`, else the sum.
    """
    # (task index, category) -> (micro-batch, task) -> (start, end) of each of its ops
    per: DefaultDict[Tuple[int, str], DefaultDict[Tuple[Optional[int], Optional[str]],
                                                  List[Tuple[float, float]]]] = (
                                                      collections.defaultdict(
                                                          lambda: collections.defaultdict(list)))
    for op in self.compute_ops:
      task = task_of(op)
      if task is not None:
        per[(task, op.category)][(op.micro_batch, op.task)].append((op.start, op.end))
    out = []
    for k in range(num_tasks):
      by_kind = {}
      for kind in simulator.TASK_KINDS:
        by_mb = per[(k, kind)] if (k, kind) in per else {}
        by_kind[kind] = ([simulator.UnionLength(s) for s in by_mb.values()],
                         sum(end - start for s in by_mb.values() for start, end in s))
      out.append(_TaskTimesOf(by_kind, per_micro_batch))
    return out


def _TaskTimesOf(by_kind, per_micro_batch):
  """simulator.TaskTimes from {kind: (span of each micro-batch's task, summed op seconds)}.

  Times: the spans summed, or their mean with `per_micro_batch`; parallelism: work / span (1 without
  ops).
  """
  fields = {}
  for kind, (spans, work) in by_kind.items():
    span = float(sum(spans))
    fields[kind] = span / len(spans) if per_micro_batch and spans else span
    fields[kind + '_parallelism'] = max(1.0, work / span) if span > 0 else 1.0
  return simulator.TaskTimes(**fields)


def _Index(device):
  try:
    return int(device.rsplit(':', 1)[1])
  except (IndexError, ValueError):
    return 0


def TracedRun(sess: tf.compat.v1.Session, fetches: Any, feed_dict: Optional[Dict[Any, Any]] = None,
              **kwargs: Any) -> Tuple[Any, tf.compat.v1.RunMetadata]:
  """Runs `fetches` once with a full trace; returns (values, RunMetadata).

  The one way the project traces a step, so that every trace records the same things (op times and
  allocations). `feed_dict` and other keyword arguments go to sess.run unchanged; `options` and
  `run_metadata` are the trace's own.
  """
  for key in ('options', 'run_metadata'):
    if key in kwargs:
      raise ValueError('TracedRun sets %s itself; got %s=%r' % (key, key, kwargs[key]))
  opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
  meta = tf.compat.v1.RunMetadata()
  values = sess.run(fetches, feed_dict=feed_dict, options=opts, run_metadata=meta, **kwargs)
  return values, meta


def Summary(trace: Trace) -> str:
  """A text table: per device, busy seconds by category, idle share and peak step memory."""
  by_cat = trace.BusyByCategory()
  busy = trace.Busy()
  peaks = trace.PeakMemory() if trace.HasMemory() else {}
  lines = ['step %.1f ms' % (1e3 * trace.step_time),
           '%-8s ' % 'device' + ' '.join('%9s' % c for c in CATEGORIES + ('busy',)) +
           '   idle  peak memory']
  for device in trace.devices:
    cats = by_cat.get(device, {})
    lines.append('%-8s ' % device + ' '.join('%7.1fms' % (1e3 * cats.get(c, 0.0))
                                             for c in CATEGORIES) +
                 ' %7.1fms %5.1f%%' % (1e3 * busy.get(device, 0.0),
                                       100 * (1 - busy.get(device, 0.0) / trace.step_time)) +
                 '  %11s' % (units.FormatBytes(peaks[device]) if device in peaks else '-'))
  return '\n'.join(lines)


def PipelineSummary(
    pipeline_times: Sequence[Tuple[Optional[str], Sequence[simulator.TaskTimes]]]) -> str:
  """`PartitionSummary` of each pipeline's partitions (`Trace.PipelinePartitionTimes()`), headed by
  its name where it has one; '' for an empty list."""
  tables = []
  for pipeline, partitions in pipeline_times:
    head = '' if pipeline is None else "partitions of pipeline '%s'\n" % pipeline
    tables.append(head + PartitionSummary(partitions))
  return '\n'.join(tables)


def PartitionSummary(partitions: Sequence[simulator.TaskTimes]) -> str:
  """A text table of `Trace.PartitionTimes()`: per partition, mean F, B, R, W ms per task."""
  lines = ['%-5s %10s %10s %10s %10s' % ('partition', 'forward', 'backward', 'recompute', 'weight')]
  for k, c in enumerate(partitions):
    lines.append('%-5d %8.2fms %8.2fms %8.2fms %8.2fms' % (
        k, 1e3 * c.forward, 1e3 * c.backward, 1e3 * c.recompute, 1e3 * c.weight))
  return '\n'.join(lines)
