"""Benchmarks the partitioner: predicted imbalance of each algorithm, and the step time it buys.

Part 1, imbalance (max/mean estimated partition cost, by FPropMeta flops) of AmoebaNet-D (18, 256)
at 224x224 and of a Transformer-48 stack (token embedding, 48 Transformer layers with model
dimension 2048, feed-forward 8192, 32 heads, and a 32k-vocabulary softmax, as in the paper's Table
2) for K = 2, 4, 8, side by side: partitions of equal layer count, the paper's min-variance
heuristic, and the exact min-max split. The min-max split is the least imbalance of any contiguous
split of these
layers (tests/partitioner/balancing_test.py checks it against brute force): where it is above 1.05,
the layers are too coarse for any split to do better.

Part 2, step time: a training step (forward, backward, SGD update) of a TensorPipeLayer with K = 2
on 2 logical CPU devices (intra_op=1, inter_op=2), M = 4, for a dense stack with its work up front,
a small transformer stack whose softmax is expensive, and a small AmoebaNet-D; each model cut by
layer count, by flops and by measured layer time (all with the optimal algorithm). Configurations
are timed interleaved, in rounds, in one process (see benchmark_pipeline for why); ratios are of
median step times.

Usage:
  python -m tools.benchmark_partitioning               # both parts, about 5 minutes
  python -m tools.benchmark_partitioning --skip_timing # part 1 only, about 4 s

Run time on a 2-core CPU: both parts about 5 minutes (docs/benchmarks.md), part 1 alone about 4 s.
Part 2 prints each model's rows when its timing ends; progress goes to stderr: a line when each
model's build and timing start and one with its time when each ends.

Results and the command that produced them: docs/benchmarks.md.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import sys
import time

import numpy as np  # pylint: disable=g-import-not-at-top
from absl import flags
from lingvo import compat as tf

from tensorpipe import progress as progress_lib
from tensorpipe.measure import machine
from tensorpipe.measure import training_step
from tensorpipe.measure import workloads
from tensorpipe.partitioner import balancing
from tensorpipe.partitioner import partitioning
from tensorpipe.tasks.image import amoebanet
from tensorpipe.trainer import command_line

flags.DEFINE_bool('skip_timing', False, 'Only part 1.')
flags.DEFINE_integer('k', 2, 'K, the logical CPU devices of part 2 (one partition each).')
flags.DEFINE_integer('micro_batches', 4, 'M in part 2.')
flags.DEFINE_integer('rounds', 12, 'Interleaved timing rounds.')
flags.DEFINE_integer('steps_per_round', 5, 'Timed steps per round.')
flags.DEFINE_integer('warmup', 3, 'Untimed steps first.')
flags.DEFINE_integer('intra_op_threads', 1, 'Session intra-op threads.')
flags.DEFINE_integer('inter_op_threads', 2, 'Session inter-op threads.')
FLAGS = flags.FLAGS


def ImbalanceModels():
  """(name, layer Params, first-layer input shapes) of the models of part 1."""
  return [
      ('AmoebaNet-D (18, 256), 224x224', amoebanet.AmoebaNetLayers('D', 18, 256, image_size=224),
       [[128, 224, 224, 3]]),
      ('Transformer-48 (2048, 8192, 32 heads, 32k vocab)',
       workloads.TransformerStack(48, 2048, 8192, 32, 32000), [[1024, 32]]),
  ]


def ImbalanceTable(models, ks=(2, 4, 8)):
  """Rows of (model, K, layers, count, min_variance, optimal) imbalances."""
  rows = []
  for name, layers, shapes in models:
    flops = partitioning.MakePlan(layers, 1, shapes).cost
    for k in ks:
      by_count = partitioning.MakePlan(layers, k, None)
      row = [name, k, len(layers), balancing.Imbalance(flops.Partitions(by_count.sizes))]
      for algorithm in balancing.ALGORITHMS:
        row.append(partitioning.MakePlan(layers, k, shapes, algorithm=algorithm).Imbalance())
      rows.append(tuple(row))
  return rows


def PrintImbalance(rows):
  print('Part 1: imbalance, max/mean estimated partition cost (FPropMeta flops); 1.000 is perfect')
  print('%-50s %2s %6s  %7s  %12s  %7s' % ('model', 'K', 'layers', 'count', 'min_variance',
                                          'optimal'))
  for name, k, num_layers, count, variance, optimal in rows:
    print('%-50s %2d %6d  %7.3f  %12.3f  %7.3f' % (name, k, num_layers, count, variance, optimal),
          flush=True)


# --------------------------------------------------------------------------------------------------
# Part 2: step time.


def _TimingModels(args):
  """(name, layers, input_fn, first-layer shapes, batch_dim) of the models of part 2."""
  t, b = 32, 16
  rng = np.random.RandomState(0)

  def Ids():
    return (tf.constant(rng.randint(0, 8000, size=[t, b]).astype(np.int32)),)

  def Images():
    return (tf.constant(rng.uniform(size=[32, 32, 32, 3]).astype(np.float32)),)

  def Vectors():
    return (tf.constant(rng.uniform(size=[256, 512]).astype(np.float32)),)

  front_heavy = [workloads.RepeatedDense.Params().Set(name='dense%d' % i, repeats=r)
                 for i, r in enumerate([6, 6, 6, 1, 1, 1, 1, 1])]
  transformer = workloads.TransformerStack(6, 128, 512, 4, 8000)
  amoeba = amoebanet.AmoebaNetLayers('D', 6, 16, num_classes=10, image_size=32, stem_stride=1,
                                     num_stem_cells=0, stem_filters=16)
  return [('dense, 3 heavy layers then 5 light (512 wide)', front_heavy, Vectors, [[256, 512]], 0),
          ('transformer (6 blocks, dim 128, 8k-vocab softmax)', transformer, Ids, [[t, b]], 1),
          ('AmoebaNet-D (6, 16), 32x32 inputs', amoeba, Images, [[32, 32, 32, 3]], 0)]


def TimeSplits(args, progress=progress_lib.QUIET):
  """Per model, as its timing ends: the rows (model, split, imbalance, median step seconds,
  speed-up over the count split) of its count, flops and measured splits (interleaved rounds)."""
  models = _TimingModels(args)
  for i, (name, layers, inputs_fn, shapes, batch_dim) in enumerate(models):
    which = 'benchmark_partitioning: part 2, model %d of %d, %s' % (i + 1, len(models), name)
    with progress.Phase(which + ': measuring its layers, building its splits\' steps'):
      plans = [
          partitioning.MakePlan(layers, args.k, None, cost='count'),
          partitioning.MakePlan(layers, args.k, shapes, cost='flops'),
          partitioning.MakePlan(layers, args.k, shapes, cost='measured', device='/device:CPU:0',
                                input_fn=inputs_fn),
      ]
      seconds = plans[-1].cost
      steps = []
      for plan in plans:
        if any(s.sizes == plan.sizes for s in steps):
          print('  %s: the %s split %s is the same as an earlier one' %
                (name, plan.cost_source, plan.sizes), flush=True)
          continue
        steps.append(training_step.TrainingStep(
            '%s split %s' % (plan.cost_source, plan.sizes), layers, plan.sizes, inputs_fn,
            args.micro_batches, batch_dim, args.devices, intra_op_threads=args.intra_op_threads,
            inter_op_threads=args.inter_op_threads, warmup=args.warmup))
    with progress.Phase(which + ': timing rounds', args.rounds) as phase:
      for r in range(args.rounds):
        for s in steps[r % len(steps):] + steps[:r % len(steps)]:
          s.Time(args.steps_per_round)
        phase.Step()
    base = steps[0].Median()
    rows = []
    for s in steps:
      rows.append((name, s.name, balancing.Imbalance(seconds.Partitions(s.sizes)), s.Median(),
                   base / s.Median()))
      s.Close()
    yield rows


def main(unused_argv):
  args = command_line.Args()
  print(machine.Line(), flush=True)
  args.devices = args.k
  start = time.time()
  PrintImbalance(ImbalanceTable(ImbalanceModels()))
  if not args.skip_timing:
    print('\nPart 2: step time, K=%d, M=%d on %d logical CPU devices; imbalance by measured layer '
          'time; speed-up over the count split' % (args.k, args.micro_batches, args.devices),
          flush=True)
    progress = progress_lib.Progress(lambda line: print(line, file=sys.stderr, flush=True))
    for rows in TimeSplits(args, progress):
      for model, name, imbalance, median, speedup in rows:
        print('%-50s %-28s imbalance %.3f  step %.1f ms  speed-up %.2fx' %
              (model, name, imbalance, 1e3 * median, speedup), flush=True)
  print('\n(%.0f s)' % (time.time() - start))


if __name__ == '__main__':
  command_line.Run(main, 'benchmark_partitioning')
