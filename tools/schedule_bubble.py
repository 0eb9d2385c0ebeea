r"""Bubble of the 'gpipe', '1f1b' and 'zero_bubble' schedules: simulated, textbook and traced.

1. Task times: one partition of a dense stack (--layers / K tanh layers of --width, the last
   partition also a per-example squared-norm loss) run as a one-device pipeline with schedule
   'zero_bubble', M micro-batches, one op at a time (intra_op = inter_op = 1), one traced step: the
   mean forward F, input-gradient B, weight-gradient W and re-computation R time per task
   (`profiling`).
2. The simulator plays each schedule on K separate devices with K equal partitions, for K in {2, 4,
   8} and M in {4, 8, 32}: (a) with F = B = W = 1 and no re-computation, against the textbook
   bubbles (fill-drain and 1F1B (K-1)/(M+K-1), ZB-H1 (K-1)/(3M+K-1) for M >= K: a third of 1F1B's);
   (b) with the measured times, where a backward task of 'gpipe'/'1f1b' takes R + B + W and
   'zero_bubble' runs R + B and, later, its weight-gradient task as traced: W plus whatever that
   task re-runs (nothing for these layers: it re-creates only the ops that read weights, see
   layer_gradients.WeightReads).
3. Timelines: one real traced training step per schedule (K = 4 logical CPU devices, M = 8) and
   the simulator's step from the measured times, one PNG each, in --out_dir.

  .venv/bin/python -m tools.schedule_bubble --out_dir /tmp/schedules   # about 1 minute

Results: docs/benchmarks.md.
"""

import argparse
import collections
import dataclasses
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
from lingvo import compat as tf  # pylint: disable=g-import-not-at-top
from lingvo.core import cluster_factory  # pylint: disable=g-import-not-at-top
from lingvo.core import layers  # pylint: disable=g-import-not-at-top

from tensorpipe import layer as layer_lib  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import profiling  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import simulator  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import timeline  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import workloads  # pylint: disable=g-import-not-at-top
from tensorpipe import placement  # pylint: disable=g-import-not-at-top
from tensorpipe import schedule  # pylint: disable=g-import-not-at-top

KS = (2, 4, 8)
MS = (4, 8, 32)


def _Stack(num_layers, width):
  return [layers.FCLayer.Params().Set(name='fc%d' % i, input_dim=width, output_dim=width,
                                      activation='TANH') for i in range(num_layers)
         ] + [workloads.SquaredNorm.Params().Set(name='loss')]


def TracedStep(stack, num_partitions, num_micro, micro_batch_size, width, name, inter_op, warmup=3):
  """profiling.Trace of one SGD step of `stack` as a K-partition pipeline with schedule `name`."""
  with tf.Graph().as_default() as graph, cluster_factory.ForTestingWorker(
      cpus=num_partitions, split_size=num_partitions):
    net = layer_lib.TensorPipeLayer.Params().Set(
        name='pipe', layers=stack, num_partitions=num_partitions, num_micro_batches=num_micro,
        schedule=name, forward_overlap=False).Instantiate()
    x = tf.constant(np.random.RandomState(0).normal(
        size=[num_micro * micro_batch_size, width]).astype(np.float32))
    loss = tf.reduce_mean(net.FPropDefaultTheta(x))
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    step = tf.group(*[v.assign_sub(1e-3 * g) for v, g in zip(variables, grads)])
    config = placement.SessionConfig(num_partitions, 1, inter_op)
    with tf.Session(graph=graph, config=config) as sess:
      sess.run(tf.global_variables_initializer())
      for _ in range(warmup):
        sess.run(step)
      _, meta = profiling.TracedRun(sess, step)
  return profiling.Trace(meta, pipeline_scope='pipe')


def MeasuredCost(args):
  """Task times of one partition (mean per task) of a traced one-device ZB step: (simulator.TaskTimes
  for 'gpipe' and '1f1b', whose backward task is R + B + W; the same for 'zero_bubble' with its
  input-gradient task R + B and its weight-gradient task as traced, re-computation in it
  included; the mean re-computation span of the weight-gradient tasks)."""
  per_partition = max(1, args.layers // 4)
  trace = TracedStep(_Stack(per_partition, args.width)[:per_partition], 1, args.micro_batches,
                     args.micro_batch_size, args.width, 'zero_bubble', inter_op=1)
  (cost,) = trace.PartitionTimes()
  spans = collections.defaultdict(list)  # (task, micro-batch) -> spans of its ops
  recomputed = collections.defaultdict(list)  # micro-batch -> spans of re-computation in W
  for op in trace.compute_ops:
    if op.partition == 0 and op.task in ('backward', 'weight'):
      spans[(op.task, op.micro_batch)].append((op.start, op.end))
      if op.task == 'weight' and op.category == 'recompute':
        recomputed[op.micro_batch].append((op.start, op.end))

  def Mean(task):
    lengths = [simulator.UnionLength(s) for (t, _), s in spans.items() if t == task]
    return sum(lengths) / len(lengths)

  zb_cost = dataclasses.replace(cost, backward=Mean('backward'), weight=Mean('weight'),
                                recompute=0.0)
  rerun = sum(simulator.UnionLength(s) for s in recomputed.values()) / args.micro_batches
  return cost, zb_cost, rerun


def _CostOf(name, cost, zb_cost):
  return zb_cost if name == 'zero_bubble' else cost


def BubbleTable(cost, zb_cost):
  """Rows (K, M, textbook FD/1F1B, textbook ZB, simulated bubbles with unit and measured costs,
  step time zero_bubble / 1f1b with measured costs; `zb_cost` for 'zero_bubble')."""
  unit = simulator.TaskTimes(forward=1.0, backward=1.0, weight=1.0)
  rows = []
  for k in KS:
    for m in MS:
      sims = {}
      for name, make in schedule.SCHEDULES.items():
        sims[('unit', name)] = simulator.Simulate([unit] * k, make(k, m))
        sims[('measured', name)] = simulator.Simulate([_CostOf(name, cost, zb_cost)] * k,
                                                      make(k, m))
      rows.append(dict(
          k=k, m=m, fill_drain=schedule.BubbleFraction(k, m),
          zb_h1=schedule.ZeroBubbleFraction(k, m) if m >= k else None,
          unit={n: sims[('unit', n)].idle_fraction for n in schedule.SCHEDULES},
          measured={n: sims[('measured', n)].idle_fraction for n in schedule.SCHEDULES},
          zb_time=(sims[('measured', 'zero_bubble')].step_time /
                   sims[('measured', '1f1b')].step_time)))
  return rows


def _Pct(x):
  return '   -  ' if x is None else '%5.1f%%' % (100 * x)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--out_dir', required=True, help='Folder for the timeline PNGs.')
  parser.add_argument('--layers', type=int, default=8, help='Dense layers of the K = 4 stack.')
  parser.add_argument('--width', type=int, default=512, help='Width of every layer.')
  parser.add_argument('--micro_batches', type=int, default=8, help='M of the traced steps.')
  parser.add_argument('--micro_batch_size', type=int, default=128, help='Examples per micro-batch.')
  args = parser.parse_args(argv)
  os.makedirs(args.out_dir, exist_ok=True)
  cost, zb_cost, rerun = MeasuredCost(args)
  print('task times of one partition (%d layers of %d, micro-batch %d), mean per task: F %.2f ms, '
        'B %.2f ms, W %.2f ms, R %.2f ms; zero-bubble weight-gradient task as traced %.2f ms '
        '(re-computation %.2f ms of it)' % (
            max(1, args.layers // 4), args.width, args.micro_batch_size, 1e3 * cost.forward,
            1e3 * cost.backward, 1e3 * cost.weight, 1e3 * cost.recompute, 1e3 * zb_cost.weight,
            1e3 * rerun))
  print('\nbubble (idle share of K separate devices, equal partitions)')
  print('%3s %3s | %9s %9s | %23s | %23s | %8s' % (
      'K', 'M', 'FD, 1F1B', 'ZB-H1', 'F=B=W: gpipe 1f1b zb', 'measured: gpipe 1f1b zb',
      'zb/1f1b'))
  failures = []
  for r in BubbleTable(cost, zb_cost):
    print('%3d %3d | %9s %9s | %7s %7s %7s | %7s %7s %7s | %7.2fx' % (
        r['k'], r['m'], _Pct(r['fill_drain']), _Pct(r['zb_h1']),
        *[_Pct(r['unit'][n]) for n in ('gpipe', '1f1b', 'zero_bubble')],
        *[_Pct(r['measured'][n]) for n in ('gpipe', '1f1b', 'zero_bubble')], r['zb_time']))
    for n in ('gpipe', '1f1b'):
      if abs(r['unit'][n] - r['fill_drain']) > 1e-9:
        failures.append('%s K=%d M=%d' % (n, r['k'], r['m']))
    if r['zb_h1'] is not None and abs(r['unit']['zero_bubble'] - r['zb_h1']) > 1e-9:
      failures.append('zero_bubble K=%d M=%d' % (r['k'], r['m']))
  print('(zb/1f1b: simulated step time with the measured task times)')
  print('\nsimulated with F = B = W equals the textbook bubble (ZB-H1 where M >= K): %s' %
        ('PASS' if not failures else 'FAIL: ' + ', '.join(failures)))

  k, m = 4, args.micro_batches
  stack = _Stack(args.layers, args.width)
  for name, make in schedule.SCHEDULES.items():
    trace = TracedStep(stack, k, m, args.micro_batch_size, args.width, name, inter_op=2)
    path = os.path.join(args.out_dir, 'traced_%s.png' % name)
    timeline.DrawTrace(trace, path, '%s: one traced training step (K = %d, M = %d, %d cores)' %
                       (name, k, m, os.cpu_count() or 1))
    result = simulator.Simulate([_CostOf(name, cost, zb_cost)] * k, make(k, m))
    sim_path = os.path.join(args.out_dir, 'simulated_%s.png' % name)
    timeline.DrawSimulated(result, sim_path, '%s: simulated (K = %d separate devices, M = %d, '
                           'measured task times); bubble %.1f%%' %
                           (name, k, m, 100 * result.idle_fraction))
    print('%-12s traced step %6.1f ms  -> %s; simulated %6.1f ms -> %s' % (
        name, 1e3 * trace.step_time, path, 1e3 * result.step_time, sim_path))
  return 1 if failures else 0


if __name__ == '__main__':
  sys.exit(main())
