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
  python -m tools.pipeline_tables                      # everything (throughput alone: 37 minutes)
  python -m tools.pipeline_tables --sections=memory    # about 11 minutes
  python -m tools.pipeline_tables --quick              # smoke run (smaller grids)

Run time on a 2-core CPU (docs/benchmarks.md): the throughput section 2199 s, about 37 minutes
(both models, K = 1, 2, 4 x M = 1, 4, 8, batch 32), the memory section 632 s at a load average of
3-4; the overhead section and --quick were not timed. Every line of the tables is flushed as it is
printed; progress goes to stderr: per throughput model a line for each configuration built, each
timing round and each traced K = 1 step.

Results and the exact command: docs/benchmarks.md.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# The working directory of sub-runs: the repository root.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')

import collections
import functools
import json
import subprocess
import sys
import time

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf2
from absl import flags
from lingvo import compat as tf

from tensorpipe import progress as progress_lib
from tensorpipe.measure import machine
from tensorpipe.measure import overhead
from tensorpipe.measure import profiling
from tensorpipe.measure import simulator
from tensorpipe.measure import throughput_report
from tensorpipe.measure import training_step
from tensorpipe.measure import workloads
from tensorpipe.partitioner import balancing
from tensorpipe.partitioner import capacity
from tensorpipe.partitioner import cost_model
from tensorpipe.partitioner import partitioning
from tensorpipe.tasks.image import amoebanet
from tensorpipe.tasks.image import resnet
from tensorpipe.trainer import command_line

GIB = 2.0**30
# The throughput sessions: ops run on at most this many threads at once, each op on one thread.
_INTER_OP_THREADS = 2
_INTRA_OP_THREADS = 1


# --------------------------------------------------------------------------------------------------
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
          workloads.TransformerStack(8, 128, 512, 4, 4000), _Ids(32, batch, 4000), 1, batch),
      'ResNet-26 (width 16)': (
          resnet.ResNetLayers(blocks=[2, 2, 2, 2], num_classes=10, base_width=16, stem_kernel=3,
                              stem_stride=1, stem_max_pool=False),
          _Images(batch, 32), 0, batch),
  }


def _CountSizes(layers, k):
  """Partitions of equal layer count (as the measured runs use, so the simulator cuts the same)."""
  return balancing.OptimalSplit([1.0] * len(layers), k)


# --------------------------------------------------------------------------------------------------
# Throughput (Table 2) with simulator validation.


def Cores():
  """C of the shared-core model: how many ops the throughput sessions run at once here."""
  return min(os.cpu_count() or 1, _INTER_OP_THREADS)


def _Step(name, layers, sizes, inputs_fn, m, batch_dim, k, warmup):
  return training_step.TrainingStep(
      name, layers, sizes, inputs_fn, m, batch_dim, devices=k, warmup=warmup,
      intra_op_threads=_INTRA_OP_THREADS, inter_op_threads=_INTER_OP_THREADS)


def TracedCosts(layers, inputs_fn, batch_dim, m, warmup=2, traces=2):
  """(per layer simulator.TaskTimes of the whole mini-batch, the profiling.Trace) of K=1.

  Of `traces` traced steps the fastest is used: the least disturbed (a process's first trace also
  starts the profiler).
  """
  step = _Step('K=1 M=%d' % m, layers, [len(layers)], inputs_fn, m, batch_dim, 1, warmup)
  trace = min((step.Trace() for _ in range(traces)), key=lambda t: t.step_time)
  step.Close()
  return trace.LayerTimes([p.name for p in layers]), trace


def LayerCosts(layers, inputs_fn, batch_dim, m, warmup=2):
  """Per layer simulator.TaskTimes (whole mini-batch) of a traced K=1 step, M micro-batches."""
  return TracedCosts(layers, inputs_fn, batch_dim, m, warmup)[0]


# --throughput_models name -> the model of CpuModels.
THROUGHPUT_MODELS = {'amoebanet': 'AmoebaNet-D (6, 32)', 'transformer': 'Transformer-8 (128, 512)'}

SECTIONS = ('throughput', 'overhead', 'memory')
flags.DEFINE_list('sections', list(SECTIONS), 'Comma-separated: throughput, overhead, memory.')
flags.register_validator('sections', lambda values: set(values) <= set(SECTIONS),
                         message='give a comma-separated subset of %s' % ', '.join(SECTIONS))
flags.DEFINE_bool('quick', False, 'Smaller grids (a smoke run).')
flags.DEFINE_integer('rounds', 4, 'Interleaved timing rounds.')
flags.DEFINE_integer('steps_per_round', 3, 'Timed steps per round.')
flags.DEFINE_integer('warmup', 2, 'Untimed steps first.')
flags.DEFINE_list('throughput_models', list(THROUGHPUT_MODELS),
                  'Comma-separated models of the throughput section: amoebanet, transformer.')
flags.register_validator('throughput_models', lambda values: set(values) <= set(THROUGHPUT_MODELS),
                         message='give a comma-separated subset of %s' %
                         ', '.join(THROUGHPUT_MODELS))
flags.DEFINE_float('memory_budget_gib', 8.0,
                   'Per-device budget of the memory table (8 GiB: a TPUv2 core).')
flags.DEFINE_float('transformer_budget_gib', 16.0,
                   'Per-device budget of the Transformer-L memory rows (16 GiB: a TPUv3 core).')
flags.DEFINE_string('memory_child', None,
                    'Internal: a memory-table configuration (JSON) to measure in this process.')
FLAGS = flags.FLAGS


def Throughput(args, progress=progress_lib.QUIET):
  """Prints the throughput tables (Table 2) of --throughput_models; `progress`: the phases of each
  model's build, timing and traces."""
  ks, ms = ((1, 2), (1, 4)) if args.quick else ((1, 2, 4), (1, 4, 8))
  models = CpuModels(args.quick)
  cores = Cores()
  for name in [THROUGHPUT_MODELS[key] for key in args.throughput_models]:
    layers, inputs_fn, batch_dim, batch = models[name]
    steps = {}
    with progress.Phase('pipeline_tables: %s: building K x M = %d configurations' %
                        (name, len(ks) * len(ms)), len(ks) * len(ms)) as phase:
      for k in ks:
        for m in ms:
          steps[(k, m)] = _Step('K=%d M=%d' % (k, m), layers, _CountSizes(layers, k), inputs_fn,
                                m, batch_dim, k, args.warmup)
          phase.Step()
    order = list(steps.values())
    with progress.Phase('pipeline_tables: %s: timing, %d rounds of %d steps per configuration' %
                        (name, args.rounds, args.steps_per_round), args.rounds) as phase:
      for r in range(args.rounds):
        for s in order[r % len(order):] + order[:r % len(order)]:
          s.Time(args.steps_per_round)
        phase.Step()
    measured = {key: s.Median() for key, s in steps.items()}
    for s in steps.values():
      s.Close()
    traced = {}
    with progress.Phase('pipeline_tables: %s: tracing K=1 at each M for the simulator' % name,
                        len(ms)) as phase:
      for m in ms:
        traced[m] = TracedCosts(layers, inputs_fn, batch_dim, m)
        phase.Step()
    independent, shared, shared_tasks = {}, {}, {}
    for m in ms:
      for k in ks:
        sizes = _CountSizes(layers, k)
        partitions = simulator.SplitCosts(traced[m][0], sizes, m)
        independent[(k, m)] = simulator.SimulateFillDrain(partitions, m).step_time
        shared[(k, m)] = simulator.SimulateFillDrain(partitions, m, cores=cores).step_time
        groups = np.split(np.array([p.name for p in layers]), np.cumsum(sizes)[:-1])
        shared_tasks[(k, m)] = simulator.SimulateFillDrain(
            traced[m][1].GroupTimes([list(g) for g in groups]), m, cores=cores).step_time
    print('\n%s, batch %d' % (name, batch))
    tracing = {m: measured[(1, m)] / traced[m][1].step_time for m in ms if (1, m) in measured}
    print(throughput_report.ThroughputTable(ks, ms, measured, independent, shared, cores, tracing,
                                            shared_tasks))
    for m in ms:
      print(throughput_report.TraceNote(m, traced[m][1], traced[m][0], measured.get((1, m))))
    if name.startswith('Transformer'):
      costs_by_m = {m: traced[m][0] if m in traced else LayerCosts(layers, inputs_fn, batch_dim, m)
                    for m in (1, 4)}
      print('\n' + throughput_report.DeepPredictionTable(costs_by_m, name))


# --------------------------------------------------------------------------------------------------
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
      step = training_step.TrainingStep('K=%d' % k, layers, sizes, inputs_fn, m, batch_dim,
                                        devices=k, warmup=args.warmup)
      trace = step.Trace()
      step.Close()
      shares = overhead.OverheadShares(trace, m)
      print('%-28s %2d %7.1f%% %7.1f%% %9.1f%% %9.1f%% %7.1f%% %7.1f%% %7.1f%%' % (
          (name, k) + tuple(100 * shares[c] for c in overhead.SHARES)))


# --------------------------------------------------------------------------------------------------
# Memory (Table 1).


_PROFILES = {}


def AmoebaProfiles(num_cells, filters, shapes):
  """cost_model.Profiles of AmoebaNet-D (num_cells, filters), cached (they depend on no K, M)."""
  key = (num_cells, filters, str(shapes))
  if key not in _PROFILES:
    layers = amoebanet.AmoebaNetLayers('D', num_cells, filters, image_size=shapes[0][1])
    _PROFILES[key] = cost_model.Profiles(layers, shapes)
  return _PROFILES[key]


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
      d = capacity.LargestModel(functools.partial(AmoebaProfiles, num_cells, shapes=shapes), k, mm,
                                recompute, budget, lo=32, hi=1024, step=32)
      if d is None:
        continue
      profiles = AmoebaProfiles(num_cells, d, shapes)
      params = sum(p.params for p in profiles)
      if best is None or params > best[2]:
        best = (num_cells, d, params, capacity.PeakOfBestSplit(profiles, k, mm, recompute)[0])
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
  """cost_model.Profiles of Transformer-L with `num_layers` blocks (one block profiled, copied)."""
  if 'one' not in _TRANSFORMER_L:
    # Model 2048, feed-forward 8192, 32 heads, 32k vocabulary; ids [sequence 1024, batch 32].
    layers = workloads.TransformerStack(1, 2048, 8192, 32, 32000)
    _TRANSFORMER_L['one'] = cost_model.Profiles(layers, [[1024, 32]])
  embedding, block, softmax = _TRANSFORMER_L['one']
  return [embedding] + [block] * num_layers + [softmax]


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
    num_layers = capacity.LargestModel(TransformerLProfiles, k, mm, recompute, budget, lo=1,
                                       hi=8192, bytes_per_param=bytes_per_param)
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
  """In a child process: measured and estimated peaks of one training step of a small AmoebaNet.

  Measured per device: the variables placed on it plus its peak of step allocations, replayed from
  the allocation records of a traced step (profiling.Trace.PeakMemory). Measured for the process:
  the allocator's own peak, which the logical CPU devices share; the trace's all-device peak plus
  all variables is checked against it.
  """
  layers = amoebanet.AmoebaNetLayers('D', 6, spec['filters'], num_classes=10, image_size=32,
                                     stem_stride=1, num_stem_cells=0, stem_filters=16,
                                     aux_head=False)
  sizes = _CountSizes(layers, spec['k'])
  step = training_step.TrainingStep('mem', layers, sizes, _Images(spec['batch'], 32), spec['m'], 0,
                                    devices=spec['k'], recompute=spec['recompute'], warmup=1)
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
  print('\nCross-check on this machine: small AmoebaNet-D (6, F), 32x32, batch 64, one traced '
        'step. Per device: variables + peak of step allocations from the trace, against the '
        'estimate. Process: the shared allocator\'s peak against the trace\'s all-device peak + '
        'variables.')
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


def main(unused_argv):
  args = command_line.Args()
  if args.memory_child:
    print(json.dumps(_MemoryChild(json.loads(args.memory_child))))
    return 0
  sys.stdout.reconfigure(line_buffering=True)  # Each line of the tables as it is printed.
  print(machine.Line())
  start = time.time()
  sections = args.sections
  if 'throughput' in sections:
    # A line per step of a phase (interval 0): its configurations take seconds to minutes each.
    Throughput(args, progress_lib.Progress(lambda line: print(line, file=sys.stderr, flush=True),
                                           interval=0))
  if 'overhead' in sections:
    Overhead(args)
  if 'memory' in sections:
    Memory(args)
  print('\n(%.0f s)' % (time.time() - start))
  return 0


if __name__ == '__main__':
  command_line.Run(main, 'pipeline_tables')
