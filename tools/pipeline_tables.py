"""Reproduces the GPipe paper's performance tables with TensorPipe on the devices at hand.

Sections (all by default; pick with --sections):
  throughput  Table 2: normalised throughput (to K=2, M=1) of a small AmoebaNet-D and a Transformer
              stack for K x M grids, measured on K logical CPU devices; beside each measurement the
              simulator's prediction, and predictions for K up to 128 (see below).
  overhead    Figure 4: the shares of a step spent on setup (micro-batch split and concat),
              bubble, load imbalance, re-computation and weight update, for a ResNet-style and a
              Transformer stack at K = 2, 4, from traced steps.
  memory      Table 1: for AmoebaNet-D and Transformer-L, the largest model that fits a
              per-device memory budget for Naive-1 (no pipeline, no re-computation), Pipeline-1
              and Pipeline-K, by cost_model's per-device estimate; the estimate is cross-checked
              against the process-wide allocator peak of real steps of small models.

How the simulator is fed: one traced step of each model with K = 1 and M micro-batches gives every
layer's forward, re-computation and backward span and work at that micro-batch size
(profiling.LayerTimes); simulator.SplitCosts cuts them into the same partitions as the measured run
and simulator.Simulate plays the fill-drain schedule twice: with independent devices (one task at a
time each, as separate accelerators) and with the shared-core model (the logical CPU devices' tasks
run as the graph allows and share the C threads that run ops: min(os.cpu_count(), the sessions'
inter_op_parallelism_threads)). A third prediction feeds the shared-core model per-task costs
instead (profiling.Trace.GroupTimes: each would-be partition's span and work per micro-batch, taken
from the same trace, so overlap between neighbouring layers counts once). Under each table: the
models' step time errors; the same with the predictions scaled by the K=1 timed / traced step ratio
(tracing slows ops down; K = 1 then only sets the scale, so those errors are over K > 1); and per
traced step its time, work and spans.

Usage:
  .venv/bin/python -m tools.pipeline_tables                      # everything (15-25 minutes)
  .venv/bin/python -m tools.pipeline_tables --sections=memory    # a few minutes
  .venv/bin/python -m tools.pipeline_tables --quick              # smoke run (smaller grids)

Results and the exact command: docs/benchmarks.md.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # The working directory of sub-runs.
os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')

import argparse  # pylint: disable=g-import-not-at-top
import collections
import json
import subprocess
import sys
import time

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf2
from lingvo import compat as tf

from tensorpipe.tasks.image import amoebanet
from tensorpipe.partition import balancing
from tensorpipe.partition import cost_model
from tensorpipe.partition import partitioning
from tensorpipe.measure import profiling
from tensorpipe.tasks.image import resnet
from tensorpipe import schedule
from tensorpipe.measure import simulator
from tools import benchmark_partitioning as bp

GIB = 2.0**30
# The throughput sessions: ops run on at most this many threads at once, each op on one thread.
_INTER_OP_THREADS = 2
_INTRA_OP_THREADS = 1


# ----------------------------------------------------------------------------------------------------
# Models at CPU size.


def _Images(batch, size):
  rng = np.random.RandomState(0)

  def Fn():
    return (tf.constant(rng.uniform(size=[batch, size, size, 3]).astype(np.float32)),)

  return Fn


def _Ids(seq, batch, vocab):
  rng = np.random.RandomState(0)

  def Fn():
    return (tf.constant(rng.randint(0, vocab, size=[seq, batch]).astype(np.int32)),)

  return Fn


def CpuModels(quick):
  """{name: (layers, inputs_fn, batch_dim, batch)} of the throughput and overhead models."""
  batch = 16 if quick else 32
  return {
      'AmoebaNet-D (6, 32)': (
          amoebanet.AmoebaNetLayers('D', 6, 32, num_classes=10, image_size=32, stem_stride=1,
                                    num_stem_cells=0, stem_filters=32, aux_head=False),
          _Images(batch, 32), 0, batch),
      'Transformer-8 (128, 512)': (
          bp.TransformerStack(8, 128, 512, 4, 4000), _Ids(32, batch, 4000), 1, batch),
      'ResNet-26 (width 16)': (
          resnet.ResNetLayers(blocks=[2, 2, 2, 2], num_classes=10, base_width=16, stem_kernel=3,
                              stem_stride=1, stem_max_pool=False),
          _Images(batch, 32), 0, batch),
  }


def _CountSizes(layers, k):
  """Partitions of equal layer count (what the measured runs use, so the simulator cuts the same)."""
  return balancing.OptimalSplit([1.0] * len(layers), k)


# ----------------------------------------------------------------------------------------------------
# Throughput (Table 2) with simulator validation.


def Cores():
  """C of the shared-core model: how many ops the throughput sessions run at once here."""
  return min(os.cpu_count() or 1, _INTER_OP_THREADS)


def _Step(name, layers, sizes, inputs_fn, m, batch_dim, k, warmup):
  return bp.Step(name, layers, sizes, inputs_fn, m, batch_dim, devices=k, warmup=warmup,
                 intra_op_threads=_INTRA_OP_THREADS, inter_op_threads=_INTER_OP_THREADS)


def _Simulate(partitions, m, cores=None):
  """simulator.Simulate of TensorPipeLayer's default schedule (fill-drain, forward_overlap on)."""
  return simulator.Simulate(partitions, schedule.FillDrainSchedule(len(partitions), m, 2), cores=cores)


def TracedCosts(layers, inputs_fn, batch_dim, m, warmup=2, traces=2):
  """(per layer simulator.PartitionCost for the whole mini-batch, the profiling.Trace) of a K=1 step.

  Of `traces` traced steps the fastest is used: the least disturbed (a process's first trace also
  starts the profiler).
  """
  step = _Step('K=1 M=%d' % m, layers, [len(layers)], inputs_fn, m, batch_dim, 1, warmup)
  trace = min((step.Trace() for _ in range(traces)), key=lambda t: t.step_time)
  step.Close()
  return trace.LayerTimes([p.name for p in layers]), trace


def LayerCosts(layers, inputs_fn, batch_dim, m, warmup=2):
  """Per layer simulator.PartitionCost (whole mini-batch) of a traced K=1 step, M micro-batches."""
  return TracedCosts(layers, inputs_fn, batch_dim, m, warmup)[0]


# --throughput_models name -> the model of CpuModels.
THROUGHPUT_MODELS = {'amoebanet': 'AmoebaNet-D (6, 32)', 'transformer': 'Transformer-8 (128, 512)'}


def Throughput(args):
  ks, ms = ((1, 2), (1, 4)) if args.quick else ((1, 2, 4), (1, 4, 8))
  models = CpuModels(args.quick)
  cores = Cores()
  for name in [THROUGHPUT_MODELS[key] for key in args.throughput_models.split(',')]:
    layers, inputs_fn, batch_dim, batch = models[name]
    steps = {}
    for k in ks:
      for m in ms:
        steps[(k, m)] = _Step('K=%d M=%d' % (k, m), layers, _CountSizes(layers, k), inputs_fn, m,
                              batch_dim, k, args.warmup)
    order = list(steps.values())
    for r in range(args.rounds):
      for s in order[r % len(order):] + order[:r % len(order)]:
        s.Time(args.steps_per_round)
    measured = {key: s.Median() for key, s in steps.items()}
    for s in steps.values():
      s.Close()
    traced = {m: TracedCosts(layers, inputs_fn, batch_dim, m) for m in ms}
    independent, shared, shared_tasks = {}, {}, {}
    for m in ms:
      for k in ks:
        sizes = _CountSizes(layers, k)
        partitions = simulator.SplitCosts(traced[m][0], sizes, m)
        independent[(k, m)] = _Simulate(partitions, m).step_time
        shared[(k, m)] = _Simulate(partitions, m, cores=cores).step_time
        groups = np.split(np.array([p.name for p in layers]), np.cumsum(sizes)[:-1])
        shared_tasks[(k, m)] = _Simulate(
            traced[m][1].GroupTimes([list(g) for g in groups]), m, cores=cores).step_time
    print('\n%s, batch %d' % (name, batch))
    tracing = {m: measured[(1, m)] / traced[m][1].step_time for m in ms if (1, m) in measured}
    print(ThroughputTable(ks, ms, measured, independent, shared, cores, tracing, shared_tasks))
    for m in ms:
      print(TraceNote(m, traced[m][1], traced[m][0], measured.get((1, m))))
    if name.startswith('Transformer'):
      PredictDeep(costs_by_m={m: traced[m][0] if m in traced else
                              LayerCosts(layers, inputs_fn, batch_dim, m) for m in (1, 4)},
                  name=name)


def ThroughputTable(ks, ms, measured, independent, shared, cores, tracing=None, shared_tasks=None):
  """Text: the K x M grid of measured and simulated throughput and step times, and the mean errors.

  Args:
    ks, ms: the grid's K and M values.
    measured, independent, shared: {(K, M): step seconds} measured, simulated with independent
      devices, and simulated with `cores` shared cores.
    cores: C of the shared-core model.
    tracing: optional {M: timed / traced step time of K=1}: adds the errors of the predictions
      scaled by it (the tracing's own cost taken out), over K > 1 only, since K = 1 set the scale.
    shared_tasks: optional {(K, M): step seconds} of the shared-core model fed with per-task costs
      (profiling.Trace.GroupTimes) instead of summed per-layer ones: adds its errors.
  """
  base_k = 2 if 2 in ks else ks[0]
  lines = ['throughput normalised to K=%d, M=1: measured / independent devices / shared cores '
           '(C=%s); in brackets the step ms of each' % (base_k, cores)]
  lines.append('%4s ' % 'M' + ''.join('%35s' % ('K=%d' % k) for k in ks))
  for m in ms:
    row = ''
    for k in ks:
      row += '  %5.2f / %4.2f / %4.2f (%3.0f/%3.0f/%3.0f)' % (
          tuple(v[(base_k, 1)] / v[(k, m)] for v in (measured, independent, shared)) +
          tuple(1e3 * v[(k, m)] for v in (measured, independent, shared)))
    lines.append('%4d ' % m + row)

  def Errors(model, keys):
    errors = [abs(model[key] - measured[key]) / measured[key] for key in keys]
    return 100 * float(np.mean(errors)), 100 * float(np.max(errors))

  keys = sorted(measured)
  lines.append('step time error over %d configurations: independent devices mean %.0f%% '
               '(max %.0f%%), shared cores mean %.0f%% (max %.0f%%)' % (
                   (len(keys),) + Errors(independent, keys) + Errors(shared, keys)))
  few = [key for key in keys if key[0] <= cores]
  if len(few) < len(keys):
    lines.append('  with K <= %s only (%d configurations): independent devices mean %.0f%%, shared '
                 'cores mean %.0f%%' % (cores, len(few), Errors(independent, few)[0],
                                        Errors(shared, few)[0]))
  if shared_tasks:
    lines.append('  shared cores fed per-task spans and parallelism: mean %.0f%% (max %.0f%%)' %
                 Errors(shared_tasks, keys))
  if tracing:
    scaled = [key for key in keys if key[0] > 1 and key[1] in tracing]

    def Scaled(model):
      return {key: model[key] * tracing[key[1]] for key in scaled}

    lines.append('  scaled by timed/traced K=1 step (%s), K > 1 only (%d configurations): '
                 'independent devices mean %.0f%%, shared cores mean %.0f%%%s' % (
                     ', '.join('M=%d: %.2f' % (m, tracing[m]) for m in sorted(tracing)),
                     len(scaled), Errors(Scaled(independent), scaled)[0],
                     Errors(Scaled(shared), scaled)[0],
                     ', per-task %.0f%%' % Errors(Scaled(shared_tasks), scaled)[0]
                     if shared_tasks else ''))
  return '\n'.join(lines)


def TraceNote(m, trace, layer_costs, timed):
  """One line on the traced K=1 step that fed the simulator: time, work and spans.

  The traced step against the timed one shows the tracing's own cost; the layers' spans summed
  against the tasks' (F, R, B per micro-batch, first op to last) show how much layers overlap each
  other, which per-layer costs cannot carry; the other ops' work is outside the simulated tasks.
  """
  work = sum(sum(by_cat.values()) for by_cat in trace.WorkByCategory().values())
  layer_work = sum(c.Work(kind) for c in layer_costs for kind in simulator.KINDS)
  layer_span = sum(getattr(c, kind) for c in layer_costs for kind in simulator.KINDS)
  task_span = sum(end - start for _, kind, _, start, end in trace.Tasks()
                  if kind in simulator.KINDS)
  return ('  traced K=1 M=%d step %.0f ms (timed %s): layers\' F, R, B ops %.0f core-ms, their '
          'spans %.0f ms, the tasks\' %.0f ms; other ops %.0f core-ms' % (
              m, 1e3 * trace.step_time, '%.0f ms' % (1e3 * timed) if timed else '-',
              1e3 * layer_work, 1e3 * layer_span, 1e3 * task_span, 1e3 * (work - layer_work)))


def PredictDeep(costs_by_m, name):
  """Simulated throughput of a 128-block stack of the measured Transformer blocks, K up to 128."""
  print('\nSimulated: %s blocks stacked 128 deep (+ embedding and softmax), normalised to K=2, '
        'M=1' % name.split(' ')[0])
  ks = (2, 4, 8, 16, 32, 64, 128)
  print('%4s ' % 'M' + ''.join('%8s' % ('K=%d' % k) for k in ks))
  base = None
  for m, costs in sorted(costs_by_m.items()):
    block = costs[1:-1]
    mean_block = simulator.PartitionCost(*[float(np.median([getattr(c, f) for c in block]))
                                      for f in ('forward', 'backward', 'recompute')])
    deep = [costs[0]] + [mean_block] * 128 + [costs[-1]]
    row = []
    for k in ks:
      sizes = balancing.OptimalSplit([c.forward + c.backward + c.recompute for c in deep], k)
      step = _Simulate(simulator.SplitCosts(deep, sizes, m), m).step_time
      if base is None:
        base = step
      row.append(base / step)
    print('%4d ' % m + ''.join('%8.2f' % v for v in row))


# ----------------------------------------------------------------------------------------------------
# Overhead breakdown (Figure 4).


def Overhead(args):
  models = CpuModels(args.quick)
  m = 4
  print('\nOverhead breakdown (Figure 4): share of K x step time, M = %d, from one traced step' % m)
  print('%-28s %2s %8s %8s %10s %10s %8s %8s %8s' % ('model', 'K', 'setup', 'bubble', 'imbalance',
                                                    'recompute', 'update', 'other', 'work'))
  for name in ('ResNet-26 (width 16)', 'Transformer-8 (128, 512)'):
    layers, inputs_fn, batch_dim, _ = models[name]
    for k in (2, 4):
      sizes = partitioning.MakePlan(layers, k, None, cost='count').sizes
      step = bp.Step('K=%d' % k, layers, sizes, inputs_fn, m, batch_dim, devices=k,
                     warmup=args.warmup)
      trace = step.Trace()
      step.Close()
      shares = OverheadShares(trace, m)
      print('%-28s %2d %7.1f%% %7.1f%% %9.1f%% %9.1f%% %7.1f%% %7.1f%% %7.1f%%' % (
          (name, k) + tuple(100 * shares[c] for c in ('setup', 'bubble', 'imbalance', 'recompute',
                                                       'update', 'other', 'work'))))


def OverheadShares(trace, num_micro_batches):
  """Shares of (devices x step time): setup, bubble, imbalance, recompute, update, other, work.

  Busy time by category comes from the trace. Idle time is split into bubble and imbalance with the
  simulator: the idle share the same schedule has with every partition at the mean partition time is
  bubble; the rest of the idle time is put down to imbalance (and to dependencies the schedule does
  not model, such as transfers).
  """
  devices = trace.devices
  total = len(devices) * trace.step_time
  by_cat = trace.BusyByCategory()
  busy = trace.Busy()
  shares = {c: sum(by_cat[d].get(c, 0.0) for d in devices) / total
            for c in ('setup', 'recompute', 'update', 'forward', 'backward', 'transfer', 'other')}
  idle = 1.0 - sum(busy.values()) / total
  partitions = trace.PartitionTimes()
  mean = simulator.PartitionCost(*[float(np.mean([getattr(c, f) for c in partitions]))
                              for f in ('forward', 'backward', 'recompute')])
  bubble = _Simulate([mean] * len(partitions), num_micro_batches).idle_fraction
  bubble = min(bubble, idle)
  return {'setup': shares['setup'], 'bubble': bubble, 'imbalance': idle - bubble,
          'recompute': shares['recompute'], 'update': shares['update'],
          'other': shares['other'] + shares['transfer'],
          'work': shares['forward'] + shares['backward']}


# ----------------------------------------------------------------------------------------------------
# Memory (Table 1).


_PROFILES = {}


def AmoebaProfiles(num_cells, filters, shapes):
  """cost_model.Profiles of AmoebaNet-D (num_cells, filters), cached (they do not depend on K, M)."""
  key = (num_cells, filters, str(shapes))
  if key not in _PROFILES:
    layers = amoebanet.AmoebaNetLayers('D', num_cells, filters, image_size=shapes[0][1])
    _PROFILES[key] = cost_model.Profiles(layers, shapes)
  return _PROFILES[key]


def PeakOfBestSplit(profiles, k, m, recompute):
  """(estimated bytes of the fullest device, sizes) for the split that minimises it."""
  mem = cost_model.MemoryCost(profiles, m, recompute)
  sizes = balancing.OptimalSplit(mem, k)
  return max(mem.Partitions(sizes)), sizes


def LargestFilters(num_cells, shapes, k, m, recompute, budget, lo=32, hi=1024, step=32):
  """The largest filter count (multiple of `step`) that fits `budget`, by bisection; or None."""
  def Fits(d):
    return PeakOfBestSplit(AmoebaProfiles(num_cells, d, shapes), k, m, recompute)[0] <= budget
  largest = _Largest(lambda i: Fits(i * step), lo // step, hi // step)
  return None if largest is None else largest * step


def _Largest(fits, lo, hi):
  """The largest integer n in [lo, hi] with fits(n), by bisection (fits is true up to some n).

  None if not fits(lo).
  """
  if not fits(lo):
    return None
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if fits(mid):
      lo = mid
    else:
      hi = mid - 1
  return lo


def Memory(args):
  budget = args.memory_budget_gib * GIB
  print('\nMemory (Table 1): largest AmoebaNet-D whose estimated per-device peak fits %.0f GiB '
        '(parameters x 12 bytes + activations, float32)' % args.memory_budget_gib)
  batch, m = 128, 16
  shapes = [[batch, 224, 224, 3]]
  configs = [('Naive-1', 1, 1, 'never'), ('Pipeline-1', 1, m, 'always'),
             ('Pipeline-2', 2, m, 'always'), ('Pipeline-4', 4, m, 'always'),
             ('Pipeline-8', 8, m, 'always')]
  cell_counts = (18, 36, 72)
  if args.quick:
    configs, cell_counts = configs[:2], (18,)
  print('224x224, batch %d, M = %d; each config: the (L, D) with the most parameters over L in %s'
        % (batch, m, list(cell_counts)))
  print('%-12s %10s %12s %12s %14s' % ('config', '(L, D)', 'parameters', 'param mem',
                                      'peak / device'))
  fits = {}
  for label, k, mm, recompute in configs:
    best = None
    for num_cells in cell_counts:
      d = LargestFilters(num_cells, shapes, k, mm, recompute, budget)
      if d is None:
        continue
      profiles = AmoebaProfiles(num_cells, d, shapes)
      params = sum(p.params for p in profiles)
      if best is None or params > best[2]:
        best = (num_cells, d, params, PeakOfBestSplit(profiles, k, mm, recompute)[0])
    if best is None:
      print('%-12s %10s' % (label, 'none fits'))
      continue
    num_cells, d, params, peak = best
    fits[label] = params
    print('%-12s %10s %11.0fM %8.2f GiB %10.2f GiB' % (label, '(%d, %d)' % (num_cells, d),
                                                    params / 1e6, params * 12 / GIB, peak / GIB))
  last = configs[-1][0]
  if 'Naive-1' in fits and last in fits and last != 'Naive-1':
    print('%s / Naive-1 parameters: %.1fx (the paper: 25x for Pipeline-8)' %
          (last, fits[last] / fits['Naive-1']))
  TransformerLMemory(args)
  CrossCheck(args)


_TRANSFORMER_L = {}


def TransformerLProfiles(num_layers):
  """cost_model.Profiles of Transformer-L with `num_layers` blocks (one block profiled, repeated)."""
  if 'one' not in _TRANSFORMER_L:
    # Model 2048, feed-forward 8192, 32 heads, 32k vocabulary; ids [sequence 1024, batch 32].
    layers = bp.TransformerStack(1, 2048, 8192, 32, 32000)
    _TRANSFORMER_L['one'] = cost_model.Profiles(layers, [[1024, 32]])
  embedding, block, softmax = _TRANSFORMER_L['one']
  return [embedding] + [block] * num_layers + [softmax]


def LargestL(k, m, recompute, budget, bytes_per_param, hi=8192):
  """The largest Transformer-L whose fullest device's estimate fits `budget`, by bisection; or None."""
  def Fits(num_layers):
    if num_layers + 2 < k:
      return True
    mem = cost_model.MemoryCost(TransformerLProfiles(num_layers), m, recompute, bytes_per_param)
    return max(mem.Partitions(balancing.OptimalSplit(mem, k))) <= budget
  return _Largest(Fits, 1, hi)


def TransformerLMemory(args):
  """Table 1's Transformer-L rows: the largest L per config, by the estimate."""
  budget = args.transformer_budget_gib * GIB
  bytes_per_param = 8
  m = 32
  configs = [('Naive-1', 1, 1, 'never'), ('Pipeline-1', 1, m, 'always'),
             ('Pipeline-8', 8, m, 'always'), ('Pipeline-32', 32, m, 'always'),
             ('Pipeline-128', 128, m, 'always')]
  print('\nMemory (Table 1): largest Transformer-L (2048, 8192, 32 heads, 32k vocabulary; sequence '
        '1024, batch 32) whose estimated per-device peak fits %.0f GiB; M = %d, %d bytes per '
        'parameter (weight + gradient; factored Adafactor slots are small), float32'
        % (args.transformer_budget_gib, m, bytes_per_param))
  print('%-14s %16s %12s %12s %14s   %s' % ('config', 'L', 'parameters', 'param mem',
                                          'peak / device', 'the paper (TPUv3, 16 GB)'))
  paper = {'Naive-1': 3, 'Pipeline-1': 13, 'Pipeline-8': 103, 'Pipeline-32': 415,
           'Pipeline-128': 1663}
  fits = {}
  for label, k, mm, recompute in configs:
    num_layers = LargestL(k, mm, recompute, budget, bytes_per_param)
    shown = num_layers or 1
    profiles = TransformerLProfiles(shown)
    params = sum(p.params for p in profiles)
    mem = cost_model.MemoryCost(profiles, mm, recompute, bytes_per_param)
    peak = max(mem.Partitions(balancing.OptimalSplit(mem, min(k, shown + 2))))
    if num_layers:
      fits[label] = num_layers
    print('%-14s %16s %11.2fB %8.1f GiB %10.2f GiB   L=%d' % (
        label, num_layers or 'none (L=1 shown)', params / 1e9, params * bytes_per_param / GIB,
        peak / GIB, paper[label]))
  if 'Pipeline-1' in fits and 'Pipeline-128' in fits:
    print('Pipeline-128 / Pipeline-1 layers: %.0fx (the paper: %.0fx)' % (
        fits['Pipeline-128'] / fits['Pipeline-1'], paper['Pipeline-128'] / paper['Pipeline-1']))


def _MemoryChild(spec):
  """Runs in a child process: measured and estimated peaks of one training step of a small AmoebaNet.

  Measured per device: the variables placed on it plus its peak of step allocations, replayed from
  the allocation records of a traced step (profiling.Trace.PeakMemory). Measured for the process:
  the allocator's own peak, which the logical CPU devices share; the trace's all-device peak plus
  all variables is checked against it.
  """
  layers = amoebanet.AmoebaNetLayers('D', 6, spec['filters'], num_classes=10, image_size=32,
                                     stem_stride=1, num_stem_cells=0, stem_filters=16,
                                     aux_head=False)
  sizes = _CountSizes(layers, spec['k'])
  step = bp.Step('mem', layers, sizes, _Images(spec['batch'], 32), spec['m'], 0, devices=spec['k'],
                 recompute=spec['recompute'], warmup=1)
  with step.graph.as_default():
    variables = tf.global_variables()
  resident = collections.Counter()
  for v in variables:
    resident[profiling.ShortDevice(v.device)] += v.dtype.size * v.shape.num_elements()
  tf2.config.experimental.reset_memory_stats('CPU:0')
  _, meta = profiling.TracedRun(step.sess, step.fetches)
  process = tf2.config.experimental.get_memory_info('CPU:0')['peak']
  trace = profiling.Trace(meta)
  peaks = trace.PeakMemory()
  devices = ['CPU:%d' % k for k in range(spec['k'])]
  # 8 bytes a parameter: the weight and its gradient (this step's SGD update has no slots).
  plan = partitioning.MakePlan(layers, spec['k'], [[spec['batch'], 32, 32, 3]], cost='count',
                               num_micro_batches=spec['m'], recompute=spec['recompute'],
                               bytes_per_param=8, sizes=sizes)
  return {'process': process,
          'trace_total': trace.PeakMemory(trace.devices) + sum(resident.values()),
          'measured': [peaks.get(d, 0) + resident[d] for d in devices],
          'estimated': list(plan.Memory().Partitions(sizes))}


def CrossCheck(args):
  """Estimated vs measured per-device peaks for small AmoebaNets (one process per config)."""
  print('\nCross-check on this machine: small AmoebaNet-D (6, F), 32x32, batch 64, one traced step. '
        'Per device: variables + peak of step allocations from the trace, against the estimate. '
        'Process: the shared allocator\'s peak against the trace\'s all-device peak + variables.')
  print('%-28s %-24s %-24s %7s %10s %10s' % ('config', 'measured / device', 'estimated / device',
                                            'est/meas', 'process', 'trace'))
  specs = [dict(filters=32, batch=64, k=1, m=1, recompute='never'),
           dict(filters=32, batch=64, k=1, m=8, recompute='always'),
           dict(filters=32, batch=64, k=2, m=8, recompute='always')]
  if not args.quick:
    specs += [dict(filters=64, batch=64, k=2, m=8, recompute='always'),
              dict(filters=32, batch=64, k=4, m=8, recompute='always')]
  mib = 2.0**20
  for spec in specs:
    out = subprocess.run([sys.executable, '-m', 'tools.pipeline_tables', '--memory_child',
                          json.dumps(spec)], capture_output=True, text=True, check=True, cwd=_REPO)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    label = 'F=%d K=%d M=%d %s' % (spec['filters'], spec['k'], spec['m'], spec['recompute'])
    print('%-28s %-24s %-24s %7.2f %6.1f MiB %6.1f MiB' % (
        label, ' '.join('%.1f' % (b / mib) for b in r['measured']),
        ' '.join('%.1f' % (b / mib) for b in r['estimated']),
        max(r['estimated']) / max(r['measured']), r['process'] / mib, r['trace_total'] / mib))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--sections', default='throughput,overhead,memory',
                      help='Comma-separated: throughput, overhead, memory.')
  parser.add_argument('--quick', action='store_true', help='Smaller grids (a smoke run).')
  parser.add_argument('--rounds', type=int, default=4, help='Interleaved timing rounds.')
  parser.add_argument('--steps_per_round', type=int, default=3, help='Timed steps per round.')
  parser.add_argument('--warmup', type=int, default=2, help='Untimed steps first.')
  parser.add_argument('--throughput_models', default='amoebanet,transformer',
                      help='Comma-separated models of the throughput section: amoebanet, transformer.')
  parser.add_argument('--memory_budget_gib', type=float, default=8.0,
                      help='Per-device budget of the memory table (8 GiB: a TPUv2 core).')
  parser.add_argument('--transformer_budget_gib', type=float, default=16.0,
                      help='Per-device budget of the Transformer-L memory rows (16 GiB: a TPUv3 core).')
  parser.add_argument('--memory_child', default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.memory_child:
    print(json.dumps(_MemoryChild(json.loads(args.memory_child))))
    return 0
  start = time.time()
  sections = args.sections.split(',')
  for section in sections:
    if section not in ('throughput', 'overhead', 'memory'):
      parser.error('unknown section %r' % section)
  for model in args.throughput_models.split(','):
    if model not in THROUGHPUT_MODELS:
      parser.error('unknown --throughput_models entry %r (known: %s)' %
                   (model, ', '.join(THROUGHPUT_MODELS)))
  if 'throughput' in sections:
    Throughput(args)
  if 'overhead' in sections:
    Overhead(args)
  if 'memory' in sections:
    Memory(args)
  print('\n(%.0f s)' % (time.time() - start))
  return 0


if __name__ == '__main__':
  sys.exit(main())
