"""Benchmarks TensorPipeLayer training steps against the plain model and Lingvo's GPipe, on CPU.

Every configuration is a full training step (forward, `tf.gradients(...,
colocate_gradients_with_ops=True)` and a plain SGD update with `assign_sub`) built in its own
tf.Graph and tf.Session inside `cluster_factory.ForTestingWorker(cpus=D, split_size=D)`, so
partition k of a pipeline runs on logical CPU device k. All sessions share one ConfigProto (D
logical CPU devices, intra_op=1, inter_op=2, no soft placement): TF fixes its thread pools with the
first session of a process, so every configuration of one run sees the same pools.

Timing is interleaved: after building and warming up every configuration (warm-up runs the very
fetches that are timed, so no executor is built during timing), each round runs `--steps_per_round`
(dense) or `--tr_steps_per_round` (transformer) steps of every configuration in turn, the starting
configuration rotating from round to round. The machine may be shared, so each timed step also
records how much CPU time other processes used meanwhile (/proc/stat minus this process's
getrusage); a step is "quiet" when that is at most `--max_foreign_cpu` CPU-seconds per second. After
`--rounds` rounds, more rounds run until every configuration has `--min_clean` quiet steps or
`--max_timing_s` is spent. The reported step time is the median over the quiet steps (over all
steps, marked *, for a configuration with too few), and every ratio is a ratio of those medians; the
all-step median and the minimum are printed too.

FLOP rates: the report starts with each configuration's FLOP rate beside this machine's float32
matmul rate, measured in the same process through the same session config and timed in the same
interleaved rounds (quiet runs, median): `--inter_op_threads` chains (the ops a session runs at
once) of `--matmul_chain` dependent [n, n] @ [n, n] matmuls, n = `--matmul_size`, chain i on
logical device i; a run's FLOPs are chains x chain x 2 n^3. A configuration's FLOPs per step come
from its layers' shapes (tensorpipe.measure.step_flops): forward FLOPs F = the layers' FPropMeta
FLOPs for the mini-batch (dense: per FCLayer 2 B n m for its matmul, plus B m for the ReLU and m
for the bias); model FLOPs = 3 F (forward once, backward twice the forward); hardware FLOPs =
(3 + r) F, with r the forward passes re-run: 1 for recompute='always' and for Lingvo's GPipe (its
backward pass re-runs each cell's forward), 0 for 'never' and the plain model (1 - the last
micro-batch's share for 'except_last'; for 'selective', the share of F outside the kept matmuls,
cost_model.SelectiveShare). FLOP
rate = FLOPs per step / median step time; its fraction of the matmul rate is the model (or
hardware) FLOPs utilisation, MFU (or HFU).

Peak memory is measured in a separate process per configuration (this script with `--memory_child`),
so that no other graph's tensors are in the allocator:
tf.config.experimental.reset_memory_stats('CPU:0') before a step, get_memory_info('CPU:0')['peak']
after it. The CPU allocator is shared by all logical CPU devices of the process, so this is the
process-wide peak of the step. It needs the BFC CPU allocator (oneDNN builds use it by default;
TF_CPU_ALLOCATOR_USE_BFC=true is set below, before TensorFlow is imported, so that it is also used
with TF_ENABLE_ONEDNN_OPTS=0).

Usage:
  python -m tools.benchmark_pipeline             # full run (8-10 minutes on 2 cores)
  python -m tools.benchmark_pipeline --quick     # smoke run (a minute or two)
  python -m tools.benchmark_pipeline --trace     # also: per-device busy time from one
                                                 # traced step
  python -m tools.benchmark_pipeline --diagnose  # also: TensorPipe K=1,M=8,'never'
                                                 # (micro-batching alone) on both stacks
  python -m tools.benchmark_pipeline --suites=dense --skip_memory  # dense speed (~3 min)

Results measured with it, and how to read them: docs/benchmarks.md.
"""

import os

# Must be set before TensorFlow is imported.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# The working directory of sub-runs: the repository root.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')

import collections  # pylint: disable=g-import-not-at-top
import contextlib
import dataclasses
import json
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf2
from absl import flags
from lingvo import compat as tf
from lingvo.core import builder_layers
from lingvo.core import cluster_factory
from lingvo.core import gpipe
from lingvo.core import layers
from lingvo.core import py_utils

from tensorpipe import layer as tensorpipe_layer
from tensorpipe import matmul_gradient
from tensorpipe import micro_batching
from tensorpipe.measure import machine
from tensorpipe.measure import profiling
from tensorpipe.measure import step_flops
from tensorpipe.measure import workloads
from tensorpipe.partitioner import cost_model
from tensorpipe.partitioner import partitioning
from tensorpipe import placement
from tensorpipe import schedule_builders
from tensorpipe.trainer import command_line

flags.DEFINE_integer('layers', None, 'dense stack: number of FCLayers (default 16; 8 with --quick)')
flags.DEFINE_integer('width', 512, 'dense stack: input = output dim')
flags.DEFINE_integer('batch', 2048, 'dense stack: batch size')
flags.DEFINE_integer('tr_layers', None,
                     'transformer stack: number of blocks (default 8; 2 with --quick)')
flags.DEFINE_integer('tr_dim', 256, 'transformer: model dim')
flags.DEFINE_integer('tr_heads', 4, 'transformer: attention heads')
flags.DEFINE_integer('tr_hidden', 1024, 'transformer: feed-forward dim')
flags.DEFINE_integer('tr_seq', 64, 'transformer: sequence length')
flags.DEFINE_integer('tr_batch', 64,
                     'transformer: batch (sequences); M=8 gives micro-batches of 8 x 64 tokens')
flags.DEFINE_string('suites', 'dense,transformer', 'comma list: dense,transformer')
flags.DEFINE_integer('devices', 4,
                     'logical CPU devices of every session (4 so that K=4 runs; fewer drops the '
                     'K=4 configurations)')
flags.DEFINE_integer('intra_op_threads', 1, 'session intra-op threads')
flags.DEFINE_integer('inter_op_threads', 2, 'session inter-op threads')
flags.DEFINE_integer('matmul_size', 1024,
                     'n of the [n, n] @ [n, n] float32 matmuls that measure this machine\'s '
                     'matmul rate', lower_bound=1)
flags.DEFINE_integer('matmul_chain', 8,
                     'dependent matmuls per chain and run (one chain per inter-op thread); more '
                     'amortises the run\'s overhead', lower_bound=1)
flags.DEFINE_integer('warmup', 2, 'untimed steps per configuration')
flags.DEFINE_integer('rounds', 8, 'interleaved timing rounds (at least)')
flags.DEFINE_integer('steps_per_round', 3, 'timed steps per dense configuration per round')
flags.DEFINE_integer('tr_steps_per_round', 1,
                     'timed steps per transformer configuration per round')
flags.DEFINE_bool('diagnose', False,
                  "also time TensorPipe K=1,M=8,'never' on both stacks (micro-batching alone, no "
                  'pipelining or re-computation); not part of any target')
flags.DEFINE_integer('min_clean', 8,
                     'keep adding rounds (up to --max_timing_s) until every config has this many '
                     'quiet steps')
flags.DEFINE_float('max_timing_s', 240, 'no extra rounds once timing has taken this long')
flags.DEFINE_float('max_foreign_cpu', 0.15,
                   'a step is quiet if other processes used at most this many CPU-seconds per '
                   'second of the step')
flags.DEFINE_integer('memory_steps', 5, 'steps measured per memory config')
flags.DEFINE_float('learning_rate', 1e-4, 'SGD learning rate of every configuration')
flags.DEFINE_bool('skip_memory', False, 'skip the peak-memory processes')
flags.DEFINE_bool('trace', False,
                  'after timing, trace one step per config and print device busy time')
flags.DEFINE_bool('quick', False,
                  'smoke run (1-3 minutes): 8 dense layers, 2 transformer blocks, 3 rounds of 1 '
                  'step; its numbers are not the benchmark\'s')
flags.DEFINE_string('memory_child', None,
                    'internal: measure the peak memory of this config in a process of its own')

MIB = 1024.0 * 1024.0
HARDWARE_FRACTION_TARGET = 0.9  # TensorPipe's hardware FLOP rate / the matmul rate, at least.
GPIPE_SPEED_TARGET = 1.4  # TensorPipe's step rate / Lingvo GPipe's at the same K and M, at least.
PEAK_MEMORY_TARGET = 0.4  # TensorPipe's peak memory / Lingvo GPipe's, dense K=2,M=8, at most.
# recompute='selective''s peak memory above the resident memory / 'never''s, dense K=2,M=8, at most.
SELECTIVE_MEMORY_TARGET = 0.6


# --------------------------------------------------------------------------------------------------
# Models.


def _DenseLayers(args):
  return [
      layers.FCLayer.Params().Set(name='fc%d' % i, input_dim=args.width, output_dim=args.width)
      for i in range(args.layers)
  ]


def _TransformerLayers(args):
  return [
      workloads.TransformerBlock.Params().Set(
          name='block%d' % i, model_dim=args.tr_dim, num_heads=args.tr_heads,
          hidden_dim=args.tr_hidden) for i in range(args.tr_layers)
  ]


def _Layers(suite, args):
  """The layer Params of the suite's stack, in order."""
  return _DenseLayers(args) if suite == 'dense' else _TransformerLayers(args)


def _InputShapes(suite, args):
  """The shapes of the stack's inputs (the mini-batch): dense [B, n]; transformer [T, B, D] and
  [T, B]."""
  if suite == 'dense':
    return [[args.batch, args.width]]
  return [[args.tr_seq, args.tr_batch, args.tr_dim], [args.tr_seq, args.tr_batch]]


def _Partitions(layer_params, k):
  """Cuts the layer list into k equal consecutive partitions (one cut for TensorPipe and Lingvo)."""
  n = len(layer_params)
  if n % k:
    raise ValueError('%d layers cannot be cut into %d equal partitions' % (n, k))
  return [[lp.Copy() for lp in partition]
          for partition in partitioning.SplitLayers(layer_params, k)]


@dataclasses.dataclass(frozen=True)
class Config:
  """One timed or memory-measured configuration: a stack, an implementation and its settings."""
  suite: str  # 'dense' or 'transformer'
  kind: str  # 'plain', 'plain_2d' (plain with matmul_gradient.Scope()), 'tensorpipe' or 'gpipe'
  k: int = 1
  m: int = 1
  recompute: str = 'always'
  overlap: bool = True  # TensorPipeLayer.forward_overlap

  @property
  def name(self):
    if self.kind == 'plain':
      return '%s/plain' % self.suite
    if self.kind == 'plain_2d':
      return '%s/plain, 2-D weight grads' % self.suite
    if self.kind == 'gpipe':
      return '%s/lingvo_gpipe K=%d,M=%d' % (self.suite, self.k, self.m)
    return '%s/tensorpipe K=%d,M=%d,%s%s' % (self.suite, self.k, self.m, self.recompute,
                                            '' if self.overlap else ',no_overlap')


def _LayerParams(config, args):
  """The Params of the network of `config`."""
  layer_list = _Layers(config.suite, args)
  batch_dim = 0 if config.suite == 'dense' else 1
  if config.kind in ('plain', 'plain_2d'):
    return builder_layers.SequentialLayer.Params().Set(name='net', sub=layer_list)
  if config.kind == 'tensorpipe':
    return tensorpipe_layer.TensorPipeLayer.Params().Set(
        name='net', partitions=_Partitions(layer_list, config.k), num_micro_batches=config.m,
        recompute=config.recompute, forward_overlap=config.overlap, batch_dim=batch_dim)
  if config.kind == 'gpipe':
    if config.k < 2:
      raise ValueError("Lingvo's PipeliningLayer only pipelines with K > 1 partitions")
    partitions = [
        gpipe.FeatureExtractionLayer.Params().Set(name='partition%d' % i, sub=sub)
        for i, sub in enumerate(_Partitions(layer_list, config.k))
    ]
    return gpipe.PipeliningLayer.Params().Set(
        name='net', cell_tpl=partitions, num_micro_batches=config.m, batch_dim=batch_dim)
  raise ValueError(config.kind)


def ForwardFlops(suite, args):
  """FLOPs of one forward pass of the suite's stack over the mini-batch: the sum of its layers'
  FPropMeta FLOPs (the loss, mean(square(output)), left out)."""
  return cost_model.ChainFlops(_Layers(suite, args), _InputShapes(suite, args))[0]


def RecomputedForwards(config, args):
  """Forward passes of the mini-batch a step of `config` runs again (step_flops.RecomputedForwards).

  The plain model: none. TensorPipe: by its layer's schedule and recompute Params. Lingvo's
  PipeliningLayer: as recompute='always', since recurrent.StackedRecurrent's default cell gradient
  re-runs each cell's forward pass for its micro-batch before differentiating it.
  """
  if config.kind in ('plain', 'plain_2d'):
    return 0.0
  if config.kind == 'gpipe':
    schedule = schedule_builders.FillDrainSchedule(config.k, config.m, recompute='always')
  else:
    p = _LayerParams(config, args)
    schedule = schedule_builders.Build(p.schedule, config.k, config.m, recompute=p.recompute)
  batch = args.batch if config.suite == 'dense' else args.tr_batch
  share = 1.0
  if schedule.recompute == 'selective':  # The FLOPs outside the kept matmuls, by layer.
    profiles = cost_model.Profiles(_Layers(config.suite, args), _InputShapes(config.suite, args))
    total = sum(p.flops for p in profiles)
    share = sum(p.flops * cost_model.SelectiveShare(p) for p in profiles) / total if total else 1.0
  return step_flops.RecomputedForwards(schedule, micro_batching.Sizes(batch, config.m), share)


class Timed:
  """A session and the fetches every run of it runs, timed in the interleaved rounds.

  Subclasses build `graph`, `sess` and `fetches` (the last fetch a float scalar: a step's loss).
  """

  def __init__(self, name, steps_per_round):
    self.name = name
    self.steps_per_round = steps_per_round
    self.times, self.clean_times, self.foreign = [], [], []
    self.graph = self.sess = self.fetches = None
    self.warmup_s = self.warmup_value = None

  def Run(self):
    """One run; returns the last fetch's value.

    Always the same fetches: a new fetch set makes TF build (and grappler optimise) another
    executor, which for the largest graphs here takes about a minute.
    """
    return self.sess.run(self.fetches)[-1]

  def Warmup(self, steps):
    t0 = time.perf_counter()
    value = None
    for _ in range(steps):
      value = self.Run()
    if not np.isfinite(value):
      raise ValueError('%s: the last fetch is %r after warm-up' % (self.name, value))
    self.warmup_s = time.perf_counter() - t0
    self.warmup_value = float(value)

  def Time(self, steps, max_foreign):
    """Times `steps` runs, recording each one's wall time and the CPU others used meanwhile."""
    for _ in range(steps):
      cpu0, busy0 = _OwnCpu(), _MachineBusy()
      t0 = time.perf_counter()
      self.Run()
      wall = time.perf_counter() - t0
      foreign = (_MachineBusy() - busy0) - (_OwnCpu() - cpu0)
      self.times.append(wall)
      self.foreign.append(foreign)
      if foreign <= max_foreign * wall:
        self.clean_times.append(wall)

  def Median(self, min_clean):
    """(median run time, whether it is over clean runs only)."""
    if self.clean_times and len(self.clean_times) >= min_clean:
      return statistics.median(self.clean_times), True
    return statistics.median(self.times), False

  def Close(self):
    self.sess.close()


class Step(Timed):
  """One configuration's training step, built in its own graph and session."""

  def __init__(self, config, args):
    super().__init__(config.name, (args.steps_per_round if config.suite == 'dense' else
                                   args.tr_steps_per_round))
    self.config = config
    t0 = time.perf_counter()
    self.graph = tf.Graph()
    with self.graph.as_default(), cluster_factory.ForTestingWorker(
        cpus=args.devices, split_size=args.devices) as cluster:
      # Lingvo's PipeliningLayer reads the global step; each step advances it, as training does
      # (TensorPipe's first-step batch_dim check then runs in the warm-up step only).
      global_step = py_utils.GetOrCreateGlobalStepVar()
      rng = np.random.RandomState(1234)
      with tf.device(cluster.WorkerDeviceInModelSplit(0)):
        if config.suite == 'dense':
          x = tf.Variable(rng.normal(size=[args.batch, args.width]).astype(np.float32),
                          trainable=False, name='x')
          inputs = (x.read_value(),)
        else:
          t, b, d = args.tr_seq, args.tr_batch, args.tr_dim
          v = tf.Variable(rng.normal(size=[t, b, d]).astype(np.float32), trainable=False, name='x')
          # The last eighth of every sequence is padding.
          pad = np.zeros([t, b], np.float32)
          pad[t - t // 8:, :] = 1.0
          paddings = tf.Variable(pad, trainable=False, name='paddings')
          inputs = (v.read_value(), paddings.read_value())
      self.net = _LayerParams(config, args).Instantiate()
      with (matmul_gradient.Scope() if config.kind == 'plain_2d' else contextlib.nullcontext()):
        out = self.net.FPropDefaultTheta(*inputs)
      if isinstance(out, (tuple, list)):
        out = out[0]
      with tf.device(out.device):
        self.loss = tf.reduce_mean(tf.square(out))
      variables = tf.trainable_variables()
      grads = tf.gradients(self.loss, variables, colocate_gradients_with_ops=True)
      updates = []
      for var, grad in zip(variables, grads):
        if grad is None:
          raise ValueError('%s: no gradient for %s' % (config.name, var.name))
        with tf.compat.v1.colocate_with(var):
          updates.append(var.assign_sub(args.learning_rate * grad).op)
      with tf.control_dependencies(updates):
        updates.append(tf.compat.v1.assign_add(global_step, 1).op)
      self.train_op = tf.group(*updates)
      self.fetches = [self.train_op, self.loss]
      self.num_ops = len(self.graph.get_operations())
      self.num_variables = len(variables)
      init = tf.global_variables_initializer()
    self.sess = tf.Session(graph=self.graph, config=placement.SessionConfig(
        args.devices, args.intra_op_threads, args.inter_op_threads))
    self.sess.run(init)
    self.build_s = time.perf_counter() - t0

  def Trace(self):
    """One traced step: (wall seconds, {device: busy seconds}, Counter of op types)."""
    t0 = time.perf_counter()
    _, meta = profiling.TracedRun(self.sess, self.fetches)
    wall = time.perf_counter() - t0
    trace = profiling.Trace(meta)
    busy = {device: seconds for device, seconds in trace.Busy().items() if device.startswith('CPU')}
    op_types = collections.Counter(op.op_type for op in trace.ops if op.op_type)
    return wall, busy, op_types


class Matmuls(Timed):
  """This machine's float32 matmul rate through the configurations' session config and devices.

  `--inter_op_threads` chains (as many ops as a session runs at once) of `--matmul_chain` dependent
  x @ w matmuls of [n, n] by [n, n], n = `--matmul_size`; chain i runs on logical CPU device i mod
  D with its own x and w. w is orthogonal, so the values keep their size along a chain.
  """

  def __init__(self, args):
    n = args.matmul_size
    chains = args.inter_op_threads
    super().__init__('float32 matmuls: %d chains of %d x %d^3' % (chains, args.matmul_chain, n),
                     args.steps_per_round)
    self.flops = chains * args.matmul_chain * step_flops.MatmulFlops(n, n, n)
    rng = np.random.RandomState(1234)
    self.graph = tf.Graph()
    self.devices = []
    with self.graph.as_default(), cluster_factory.ForTestingWorker(
        cpus=args.devices, split_size=args.devices) as cluster:
      sums = []
      for i in range(chains):
        device = cluster.WorkerDeviceInModelSplit(i % args.devices)
        self.devices.append(device)
        with tf.device(device):
          x = tf.Variable(rng.normal(size=[n, n]).astype(np.float32), trainable=False, name='x')
          w = tf.Variable(np.linalg.qr(rng.normal(size=[n, n]))[0].astype(np.float32),
                          trainable=False, name='w')
          y = x.read_value()
          for _ in range(args.matmul_chain):
            y = tf.matmul(y, w)
          sums.append(tf.reduce_sum(y))
      self.fetches = [tf.add_n(sums)]
      init = tf.global_variables_initializer()
    self.sess = tf.Session(graph=self.graph, config=placement.SessionConfig(
        args.devices, args.intra_op_threads, args.inter_op_threads))
    self.sess.run(init)


# --------------------------------------------------------------------------------------------------
# Configurations and targets.


def TimingConfigs(args):
  """The configurations timed, by --suites, --devices and --diagnose."""
  configs = []
  if 'dense' in args.suites:
    configs += [
        Config('dense', 'plain'),
        Config('dense', 'tensorpipe', 1, 1, 'never'),
        Config('dense', 'tensorpipe', 1, 4, 'always'),
        Config('dense', 'tensorpipe', 2, 1, 'always'),
        Config('dense', 'tensorpipe', 2, 8, 'always'),
        Config('dense', 'gpipe', 2, 8),
        Config('dense', 'tensorpipe', 2, 8, 'always', overlap=False),
        Config('dense', 'tensorpipe', 2, 8, 'selective'),
        Config('dense', 'tensorpipe', 2, 8, 'never'),
    ]
    if args.devices >= 4:
      configs += [Config('dense', 'tensorpipe', 4, 8, 'always'), Config('dense', 'gpipe', 4, 8)]
    if args.diagnose:
      configs.append(Config('dense', 'tensorpipe', 1, 8, 'never'))
  if 'transformer' in args.suites:
    configs += [
        Config('transformer', 'plain'),
        Config('transformer', 'plain_2d'),
        Config('transformer', 'tensorpipe', 2, 8, 'always'),
        Config('transformer', 'gpipe', 2, 8),
        Config('transformer', 'tensorpipe', 2, 8, 'selective'),
        Config('transformer', 'tensorpipe', 2, 8, 'never'),
    ]
    if args.diagnose:
      configs.append(Config('transformer', 'tensorpipe', 1, 8, 'never'))
  return configs


def MemoryConfigs():
  return [
      Config('dense', 'tensorpipe', 2, 8, 'always'),
      Config('dense', 'tensorpipe', 2, 8, 'never'),
      Config('dense', 'gpipe', 2, 8),
      Config('dense', 'tensorpipe', 2, 8, 'always', overlap=False),
      Config('dense', 'tensorpipe', 2, 8, 'selective'),
      Config('transformer', 'tensorpipe', 2, 8, 'always'),
      Config('transformer', 'tensorpipe', 2, 8, 'never'),
      Config('transformer', 'tensorpipe', 2, 8, 'selective'),
  ]


def HeadlineConfigs():
  """(TensorPipe config, Lingvo GPipe config at the same K and M): the pairs the FLOP report's
  targets read."""
  return [(Config('dense', 'tensorpipe', 2, 8, 'always'), Config('dense', 'gpipe', 2, 8)),
          (Config('dense', 'tensorpipe', 4, 8, 'always'), Config('dense', 'gpipe', 4, 8)),
          (Config('transformer', 'tensorpipe', 2, 8, 'always'),
           Config('transformer', 'gpipe', 2, 8))]


def SpeedTargets():
  """(description, numerator config, denominator config, minimum speed ratio)."""
  tp = lambda k, m, r='always': Config('dense', 'tensorpipe', k, m, r)
  return [
      ('K=1,M=1,never >= 0.97x plain', tp(1, 1, 'never'), Config('dense', 'plain'), 0.97),
      ('K=1,M=4,always >= 0.72x plain', tp(1, 4), Config('dense', 'plain'), 0.72),
      ('K=2,M=8 >= 1.45x K=2,M=1', tp(2, 8), tp(2, 1), 1.45),
      ('TensorPipe >= %.1fx Lingvo GPipe, K=2,M=8' % GPIPE_SPEED_TARGET, tp(2, 8),
       Config('dense', 'gpipe', 2, 8), GPIPE_SPEED_TARGET),
      ('TensorPipe >= %.1fx Lingvo GPipe, K=4,M=8' % GPIPE_SPEED_TARGET, tp(4, 8),
       Config('dense', 'gpipe', 4, 8), GPIPE_SPEED_TARGET),
      ('transformer TensorPipe K=2,M=8 >= 0.7x plain',
       Config('transformer', 'tensorpipe', 2, 8, 'always'), Config('transformer', 'plain'), 0.7),
      # Issue 43's targets for recompute='selective'.
      ("K=2,M=8 selective >= 0.91x 'never' (time <= 1.1x)", tp(2, 8, 'selective'),
       tp(2, 8, 'never'), 1 / 1.1),
      ('K=2,M=8 selective >= 0.9x plain', tp(2, 8, 'selective'), Config('dense', 'plain'), 0.9),
      ('K=2,M=8 selective >= 1.3x Lingvo GPipe', tp(2, 8, 'selective'),
       Config('dense', 'gpipe', 2, 8), 1.3),
      ("transformer K=2,M=8 selective >= 0.91x 'never'",
       Config('transformer', 'tensorpipe', 2, 8, 'selective'),
       Config('transformer', 'tensorpipe', 2, 8, 'never'), 1 / 1.1),
      ('transformer K=2,M=8 selective >= 0.9x plain',
       Config('transformer', 'tensorpipe', 2, 8, 'selective'), Config('transformer', 'plain'), 0.9),
      ('transformer K=2,M=8 selective >= 1.3x Lingvo GPipe',
       Config('transformer', 'tensorpipe', 2, 8, 'selective'), Config('transformer', 'gpipe', 2, 8),
       1.3),
      # Not targets (need None): the no-overlap replay order, and the plain model with the 2-D
      # weight gradients TensorPipe's partitions use.
      ('  no_overlap K=2,M=8 / K=2,M=1', Config('dense', 'tensorpipe', 2, 8, overlap=False),
       tp(2, 1), None),
      ('  no_overlap K=2,M=8 / Lingvo GPipe K=2,M=8',
       Config('dense', 'tensorpipe', 2, 8, overlap=False), Config('dense', 'gpipe', 2, 8), None),
      ('  transformer TensorPipe K=2,M=8 / plain 2-D grads',
       Config('transformer', 'tensorpipe', 2, 8, 'always'), Config('transformer', 'plain_2d'),
       None),
  ]


# --------------------------------------------------------------------------------------------------
# Memory (child process).


def MemoryChild(args, name):
  """In a child process: prints the peak memory of the steps of memory config `name`."""
  config = [c for c in MemoryConfigs() if c.name == name][0]
  step = Step(config, args)  # Creates the first session, so its thread settings are the process's.
  step.Warmup(args.warmup)
  peaks, bases = [], []
  for _ in range(args.memory_steps):
    tf2.config.experimental.reset_memory_stats('CPU:0')
    base = tf2.config.experimental.get_memory_info('CPU:0')['current']
    step.Run()
    peaks.append(tf2.config.experimental.get_memory_info('CPU:0')['peak'])
    bases.append(base)
  print('MEMORY_RESULT ' + json.dumps({
      'name': name, 'peak': max(peaks), 'peaks': peaks, 'base': min(bases), 'num_ops': step.num_ops
  }))


def MeasureMemory(args):
  """{config name: peak memory result} of each of MemoryConfigs, one child process each."""
  results = {}
  for config in MemoryConfigs():
    cmd = [sys.executable, '-m', 'tools.benchmark_pipeline', '--memory_child', config.name]
    proc = subprocess.run(cmd + _ModelFlags(args), capture_output=True, text=True, check=False,
                          cwd=_REPO)
    lines = [l for l in proc.stdout.splitlines() if l.startswith('MEMORY_RESULT ')]
    if proc.returncode or not lines:
      print('memory child for %s failed (rc %d):\n%s' % (config.name, proc.returncode,
                                                        proc.stderr[-3000:]))
      continue
    results[config.name] = json.loads(lines[-1][len('MEMORY_RESULT '):])
  return results


def _ModelFlags(args):
  flags = []
  for name in ('layers', 'width', 'batch', 'devices', 'intra_op_threads', 'inter_op_threads',
               'warmup', 'memory_steps', 'learning_rate'):
    flags.append('--%s=%s' % (name, getattr(args, name)))
  return flags


# --------------------------------------------------------------------------------------------------
# Main.


def _OwnCpu():
  """CPU seconds used by this process (all its threads) so far."""
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def _MachineBusy():
  """CPU seconds the whole machine has not been idle (or has lost to steal) since boot."""
  with open('/proc/stat', encoding='ascii') as f:
    fields = [int(v) for v in f.readline().split()[1:]]
  idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
  return (sum(fields[:8]) - idle) / float(os.sysconf('SC_CLK_TCK'))


def _Load():
  return '%.2f %.2f %.2f' % os.getloadavg()


def _Pct(values, q):
  return float(np.percentile(values, q))


def Verdict(ok):
  return 'PASS' if ok else 'FAIL'


def _MedianText(timed, median, clean):
  """Text such as '0.163 s (median of 24 quiet runs of 26)' of one timed thing's median."""
  name = timed.name
  return '%.3f s%s (median of %s)' % (
      median[name], '' if clean[name] else '*',
      '%d quiet runs of %d' % (len(timed.clean_times), len(timed.times)) if clean[name] else
      'all %d runs: too few quiet' % len(timed.times))


@dataclasses.dataclass(frozen=True)
class FlopRate:
  """A configuration's FLOP rates: FLOPs per step / median step time."""
  recomputed: float  # r: forward passes of the mini-batch run again.
  model: float  # Model FLOPs (3 F) per second.
  hardware: float  # Hardware FLOPs ((3 + r) F) per second.


def FlopRates(args, steps, median):
  """{config name: FlopRate} of every timed configuration."""
  forward = {suite: ForwardFlops(suite, args) for suite in args.suites}
  rates = {}
  for s in steps:
    r = RecomputedForwards(s.config, args)
    model = step_flops.ModelFlops(forward[s.config.suite])
    hardware = step_flops.HardwareFlops(forward[s.config.suite], r)
    rates[s.name] = FlopRate(r, model / median[s.name], hardware / median[s.name])
  return rates


def PrintFlops(args, matmuls, steps, median, clean, rates):
  """The report's first part: the model FLOPs utilisation of the headline TensorPipe configs, the
  matmul rate, how FLOPs are counted, and every configuration's FLOP rates and fractions."""
  peak = matmuls.flops / median[matmuls.name]
  star = lambda name: '' if clean[name] else '*'
  headline = [tp.name for tp, _ in HeadlineConfigs() if tp.name in rates]
  print("model FLOPs utilisation (model FLOP rate / this machine's matmul rate): %s" %
        ('; '.join('%s %.3f%s' % (name, rates[name].model / peak, star(name)) for name in headline)
         or 'no TensorPipe K=2 or K=4, M=8 configuration was timed'))
  print("matmul rate %.1f GFLOP/s%s: %s, %.1f GFLOP per run in %s, on %s, in the configurations' "
        'session config' % (peak / 1e9, star(matmuls.name), matmuls.name, matmuls.flops / 1e9,
                            _MedianText(matmuls, median, clean),
                            ', '.join(profiling.ShortDevice(d) for d in matmuls.devices)))
  print("FLOPs per step, from the layers' FPropMeta for the mini-batch: F = forward FLOPs (%s); "
        'model = 3 F (forward once, backward twice the forward); hardware = (3 + r) F, r = '
        "forward passes re-run (1: recompute 'always' and Lingvo GPipe; 0: 'never' and plain). "
        'FLOP rate = FLOPs per step / median step time; MFU, HFU = model, hardware FLOP rate / '
        'matmul rate. * marks medians over all steps.' % '; '.join(
            '%s %.2f GFLOP%s' % (suite, ForwardFlops(suite, args) / 1e9,
                                 ': per FCLayer 2 B n m matmul + B m ReLU + m bias'
                                 if suite == 'dense' else '') for suite in args.suites))
  print('%-44s %8s %4s %9s %6s %9s %6s' % ('config', 'step ms', 'r', 'model', 'MFU', 'hardware',
                                           'HFU'))
  print('%-44s %8s %4s %9s %6s %9s %6s' % ('', '', '', 'GFLOP/s', '', 'GFLOP/s', ''))
  for s in steps:
    rate = rates[s.name]
    print('%-44s %7.1f%1s %4.2f %9.1f %6.3f %9.1f %6.3f' % (
        s.name, 1e3 * median[s.name], star(s.name), rate.recomputed, rate.model / 1e9,
        rate.model / peak, rate.hardware / 1e9, rate.hardware / peak))


def PrintUtilisationTargets(args, peak, rates, median, clean, mem):
  """The targets the FLOP report reads, each measured value beside its target (no verdict)."""
  star = lambda *names: '' if all(clean[n] for n in names) else ' *'
  pairs = [(tp, lingvo) for tp, lingvo in HeadlineConfigs() if tp.name in rates]
  print('targets (measured beside target; * marks medians over all steps):')
  for tp, _ in pairs:
    print('  %-58s %7.3f  >= %.2f%s' % (
        'hardware FLOPs fraction, TensorPipe %s K=%d,M=%d' % (tp.suite, tp.k, tp.m),
        rates[tp.name].hardware / peak, HARDWARE_FRACTION_TARGET, star(tp.name)))
  for tp, lingvo in pairs:
    if lingvo.name in median:
      print('  %-58s %6.2fx  >= %.2fx%s' % (
          'step rate TensorPipe / Lingvo GPipe, %s K=%d,M=%d' % (tp.suite, tp.k, tp.m),
          median[lingvo.name] / median[tp.name], GPIPE_SPEED_TARGET, star(tp.name, lingvo.name)))
  tp_mem, lingvo_mem = mem.get(MemoryConfigs()[0].name), mem.get(MemoryConfigs()[2].name)
  print('  %-58s %s' % ('peak memory TensorPipe / Lingvo GPipe, dense K=2,M=8', (
      '%6.2fx  <= %.2fx' % (tp_mem['peak'] / lingvo_mem['peak'], PEAK_MEMORY_TARGET)
      if tp_mem and lingvo_mem else
      'not measured' + (' (--skip_memory)' if args.skip_memory else ''))))


def PrintStepTimes(args, steps, median, clean):
  """The table of step times: quiet-step median, counts, all-step median, minimum, vs plain."""
  print('Step times. "quiet" steps: other processes used <= %.2f CPU-s per step-second while it '
        'ran (from /proc/stat minus this process\'s own CPU time); medians are over quiet steps '
        'when a config has >= %d of them, else over all steps (marked *).' %
        (args.max_foreign_cpu, args.min_clean))
  print('%-44s %9s %7s %9s %9s %9s' % ('config', 'median s', 'quiet', 'all: med', 'min s',
                                          'vs plain'))
  for s in steps:
    name = s.config.name
    plain = median.get('%s/plain' % s.config.suite)
    print('%-44s %8.3f%1s %3d/%-3d %9.3f %9.3f %9s' %
          (name, median[name], '' if clean[name] else '*', len(s.clean_times), len(s.times),
           statistics.median(s.times), min(s.times),
           '%.2fx' % (plain / median[name]) if plain else '-'))


def PrintTraces(traces):
  """Per config: the traced step's wall time, device busy times and matmul op counts."""
  print('one traced step per config (device busy = time with >= 1 op running on it):')
  for name, (wall, busy, op_types) in traces.items():
    mm = {k: v for k, v in op_types.items() if 'MatMul' in k}
    print('  %-44s wall %.3f s  busy %s  matmul ops %s' %
          (name, wall, ' '.join('%s=%.3f' % kv for kv in sorted(busy.items())),
           dict(sorted(mm.items()))))


def PrintSpeedTargets(args, median, clean):
  """The step-time ratios of SpeedTargets, each beside its target."""
  if args.quick:
    print('--quick: smaller models and few steps; the verdicts below are a smoke test only.')
  print('%-56s %9s %9s %s' % ('target', 'measured', 'needed', ''))
  for desc, num, den, need in SpeedTargets():
    if num.name not in median or den.name not in median:
      continue
    ratio = median[den.name] / median[num.name]
    noisy = '' if clean[num.name] and clean[den.name] else '  (* medians over all steps: noisy)'
    if need is None:
      print('%-56s %8.2fx   (not a target)%s' % (desc, ratio, noisy))
    else:
      print('%-56s %8.2fx %8.2fx %s%s' % (desc, ratio, need, Verdict(ratio >= need), noisy))


def PrintMemory(args, mem):
  """The peak-memory table and its ratios."""
  tp_always = mem.get(MemoryConfigs()[0].name)
  tp_never = mem.get(MemoryConfigs()[1].name)
  lingvo = mem.get(MemoryConfigs()[2].name)
  print('Peak memory of one training step (one process per config, %d steps each): '
        'the CPU allocator peak (all logical devices), max and median over the steps, and the '
        'max minus what was allocated before the step (variables, inputs).' % args.memory_steps)
  print('%-44s %9s %9s %12s' % ('config', 'peak MiB', 'median', 'above resid.'))
  for name, r in mem.items():
    print('%-44s %9.1f %9.1f %12.1f' % (name, r['peak'] / MIB,
                                        statistics.median(r['peaks']) / MIB,
                                        (r['peak'] - r['base']) / MIB))
  print()
  tp_strict = mem.get(MemoryConfigs()[3].name)
  for label, tp in (('', tp_always), (', no_overlap', tp_strict)):
    if tp and lingvo:
      ratio = tp['peak'] / lingvo['peak']
      print('%-56s %8.2fx %8.2fx %s' % (
          'peak TensorPipe K=2,M=8%s <= %.1fx Lingvo GPipe' % (label, PEAK_MEMORY_TARGET), ratio,
          PEAK_MEMORY_TARGET, Verdict(ratio <= PEAK_MEMORY_TARGET)))
      print('%-56s %8.2fx   (not a target)' % (
          '  same, above resident memory only', (tp['peak'] - tp['base']) /
          (lingvo['peak'] - lingvo['base'])))
  if tp_always and tp_never:
    print('%-56s %8.2fx   (not a target)' % ("peak TensorPipe K=2,M=8 'always' / 'never'",
                                             tp_always['peak'] / tp_never['peak']))
  configs = MemoryConfigs()
  for suite, always, never, selective in (('', *configs[0:2], configs[4]),
                                          ('transformer ', *configs[5:8])):
    always, never, selective = (mem.get(c.name) for c in (always, never, selective))
    if selective and never:
      ratio = (selective['peak'] - selective['base']) / (never['peak'] - never['base'])
      print('%-56s %8.2fx %8.2fx %s' % (
          "%speak K=2,M=8 'selective' / 'never', above resident" % suite, ratio,
          SELECTIVE_MEMORY_TARGET, Verdict(ratio <= SELECTIVE_MEMORY_TARGET)))
    if selective and always and never and suite:
      print('%-56s %8.2fx   (not a target)' % (
          "  %s'always' / 'never', above resident" % suite,
          (always['peak'] - always['base']) / (never['peak'] - never['base'])))


def BuildSteps(args):
  """The matmuls and every timing configuration's step, each built and warmed up."""
  matmuls = Matmuls(args)
  matmuls.Warmup(args.warmup)
  print('  built %-44s  warm-up %5.1f s' % (matmuls.name, matmuls.warmup_s), flush=True)
  steps = []
  for config in TimingConfigs(args):
    step = Step(config, args)
    step.Warmup(args.warmup)
    print('  built %-44s %6d ops  build %5.1f s  warm-up %5.1f s  loss %.4g' %
          (config.name, step.num_ops, step.build_s, step.warmup_s, step.warmup_value), flush=True)
    steps.append(step)
  return matmuls, steps


def TimeRounds(args, timed, t_start):
  """Interleaved rounds of every timed thing until each has --min_clean quiet runs (or until
  --max_timing_s)."""
  print('timing: at least %d rounds, each running %d (dense and matmuls) / %d (transformer) steps '
        'of every configuration in turn; load average %s' %
        (args.rounds, args.steps_per_round, args.tr_steps_per_round, _Load()), flush=True)
  t_timing = time.perf_counter()
  r = 0
  while True:
    shift = r % len(timed)
    for t in timed[shift:] + timed[:shift]:
      t.Time(t.steps_per_round, args.max_foreign_cpu)
    r += 1
    short = [t for t in timed if len(t.clean_times) < args.min_clean]
    elapsed = time.perf_counter() - t_timing
    print('  round %d done (%.0f s; load average %s; %d configs with fewer than %d quiet steps)' %
          (r, time.perf_counter() - t_start, _Load(), len(short), args.min_clean), flush=True)
    if r >= args.rounds and (not short or elapsed >= args.max_timing_s):
      break


def Main(args):
  """Builds, times (and traces) every configuration, measures peak memory, then reports."""
  print('TensorPipe benchmark: %s, python %s' % (platform.platform(), platform.python_version()))
  print(machine.Line(), flush=True)
  print('sessions: %d logical CPU devices, intra_op=%d, inter_op=%d; dense %d x FC %d, batch %d; '
        'transformer %d x (d=%d, heads=%d, hidden=%d), seq %d, batch %d; matmuls %d x %d^3' %
        (args.devices, args.intra_op_threads, args.inter_op_threads, args.layers, args.width,
         args.batch, args.tr_layers, args.tr_dim, args.tr_heads, args.tr_hidden, args.tr_seq,
         args.tr_batch, args.matmul_chain, args.matmul_size))
  t_start = time.perf_counter()
  matmuls, steps = BuildSteps(args)
  TimeRounds(args, [matmuls] + steps, t_start)
  median, clean = {}, {}
  for t in [matmuls] + steps:
    median[t.name], clean[t.name] = t.Median(args.min_clean)
  traces = {s.name: s.Trace() for s in steps} if args.trace else {}
  for t in [matmuls] + steps:
    t.Close()
  mem = {} if args.skip_memory else MeasureMemory(args)

  rates = FlopRates(args, steps, median)
  print()
  PrintFlops(args, matmuls, steps, median, clean, rates)
  PrintUtilisationTargets(args, matmuls.flops / median[matmuls.name], rates, median, clean, mem)
  print()
  PrintStepTimes(args, steps, median, clean)
  if traces:
    print()
    PrintTraces(traces)
  print()
  PrintSpeedTargets(args, median, clean)
  if mem:
    print()
    PrintMemory(args, mem)
  print()
  print('total %.0f s' % (time.perf_counter() - t_start))


def ParseArgs():
  """The parsed flags, with --quick's and the defaults' sizes filled in."""
  args = command_line.Args()
  args.suites = [s.strip() for s in args.suites.split(',') if s.strip()]
  if args.layers is None:
    args.layers = 8 if args.quick else 16
  if args.tr_layers is None:
    args.tr_layers = 2 if args.quick else 8
  if args.quick:
    args.rounds, args.steps_per_round, args.tr_steps_per_round = 3, 1, 1
    args.min_clean, args.max_timing_s = 2, 60
    args.warmup, args.memory_steps = 2, 2
  return args


def main(unused_argv):
  parsed = ParseArgs()
  if parsed.memory_child:
    MemoryChild(parsed, parsed.memory_child)
  else:
    Main(parsed)


if __name__ == '__main__':
  command_line.Run(main, 'benchmark_pipeline')
