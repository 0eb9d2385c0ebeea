r"""Bubble of every schedule: simulated, textbook and traced.

1. Task times: one partition of a dense stack (--layers / K tanh layers of --width, the last
   partition also a per-example squared-norm loss) run as a one-device pipeline with schedule
   'zero_bubble', M micro-batches, one op at a time (intra_op = inter_op = 1), one traced step: the
   mean forward F, input-gradient B, weight-gradient W and re-computation R time per task
   (`profiling`).
2. The simulator plays each schedule (schedule_builders.NAMES; 'interleaved_1f1b' and 'zbv' with
   v = 2 partitions per device, each half a device's layers and half its task times) on K separate
   devices with equal partitions, for K in {4, 8} and M in {8, 32}: (a) with F = B = W = 1 per
   device's share of the layers and no re-computation, against the textbook bubbles (fill-drain
   and 1F1B (K-1)/(M+K-1), ZB-H1 (K-1)/(3M+K-1) for M >= K, interleaved 1F1B (K-1)/(vM+K-1), ZB-V
   (K-1)/(6M+K-1) for M >= 2K-1); (b) with the measured times, where a backward task of
   'gpipe'/'1f1b'/'interleaved_1f1b' takes R + B + W and 'zero_bubble'/'zbv' run R + B and, later,
   their weight-gradient task as traced: W plus whatever that task re-runs (nothing for these
   layers: it re-creates only the ops that read weights, see layer_gradients.WeightReads).
3. Timelines: one real traced training step per schedule (K = 4 logical CPU devices, M = 8) and
   the simulator's step from the measured times, one PNG each, in --out_dir.

  python -m tools.schedule_bubble --out_dir /tmp/schedules   # about 1 minute

Results: docs/benchmarks.md.
"""

import collections
import dataclasses
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import flags  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
from lingvo import compat as tf  # pylint: disable=g-import-not-at-top
from lingvo.core import cluster_factory  # pylint: disable=g-import-not-at-top
from lingvo.core import layers  # pylint: disable=g-import-not-at-top

from tensorpipe import layer as layer_lib  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import machine  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import profiling  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import simulator  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import timeline  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import workloads  # pylint: disable=g-import-not-at-top
from tensorpipe import placement  # pylint: disable=g-import-not-at-top
from tensorpipe import schedule_builders  # pylint: disable=g-import-not-at-top
from tensorpipe.trainer import command_line  # pylint: disable=g-import-not-at-top

flags.DEFINE_string('out_dir', None, 'Folder for the timeline PNGs, created if missing.',
                    required=True)
flags.register_validator('out_dir', command_line.WritableDir)
flags.DEFINE_integer('layers', 8, 'Dense layers of the K = 4 stack.')
flags.DEFINE_integer('width', 512, 'Width of every layer.')
flags.DEFINE_integer('micro_batches', 8, 'M of the traced steps.')
flags.DEFINE_integer('micro_batch_size', 128, 'Examples per micro-batch.')
FLAGS = flags.FLAGS

KS = (4, 8)
MS = (8, 32)


def _Stack(num_layers, width):
  return [layers.FCLayer.Params().Set(name='fc%d' % i, input_dim=width, output_dim=width,
                                      activation='TANH') for i in range(num_layers)
         ] + [workloads.SquaredNorm.Params().Set(name='loss')]


def TracedStep(stack, num_devices, num_micro, micro_batch_size, width, name, inter_op, warmup=3):
  """profiling.Trace of one SGD step of `stack` as a pipeline on K = `num_devices` devices with
  schedule `name` (with the fewest partitions per device it runs,
  schedule_builders.LeastVirtualStages)."""
  with tf.Graph().as_default() as graph, cluster_factory.ForTestingWorker(
      cpus=num_devices, split_size=num_devices):
    net = layer_lib.TensorPipeLayer.Params().Set(
        name='pipe', layers=stack, num_devices=num_devices, num_micro_batches=num_micro,
        schedule=name, virtual_stages=schedule_builders.LeastVirtualStages(name),
        forward_overlap=False).Instantiate()
    x = tf.constant(np.random.RandomState(0).normal(
        size=[num_micro * micro_batch_size, width]).astype(np.float32))
    loss = tf.reduce_mean(net.FPropDefaultTheta(x))
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    step = tf.group(*[v.assign_sub(1e-3 * g) for v, g in zip(variables, grads)])
    config = placement.SessionConfig(num_devices, 1, inter_op)
    with tf.Session(graph=graph, config=config) as sess:
      sess.run(tf.global_variables_initializer())
      for _ in range(warmup):
        sess.run(step)
      _, meta = profiling.TracedRun(sess, step)
  return profiling.Trace(meta, pipeline_scope='pipe')


def MeasuredCost(args):
  """Task times of one partition (mean per task) of a traced one-device ZB step:
  (simulator.TaskTimes for the schedules whose backward task is R + B + W; the same for those that
  split it, with the input-gradient task R + B and the weight-gradient task as traced,
  re-computation in it included; the mean re-computation span of the weight-gradient tasks)."""
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

  split_cost = dataclasses.replace(cost, backward=Mean('backward'), weight=Mean('weight'),
                                   recompute=0.0)
  rerun = sum(simulator.UnionLength(s) for s in recomputed.values()) / args.micro_batches
  return cost, split_cost, rerun


def _CostOf(name, cost, split_cost):
  """The measured task times schedule `name` runs: `split_cost` where it splits backward passes."""
  v = schedule_builders.LeastVirtualStages(name)
  return split_cost if schedule_builders.SplitsBackward(name, v) else cost


def Textbook(name, k, m):
  """The textbook bubble of schedule `name` (idle share with equal costs), None where its formula
  does not hold."""
  if name in ('gpipe', '1f1b'):
    return schedule_builders.FillDrainBubbleFraction(k, m)
  if name == 'zero_bubble':
    return schedule_builders.ZeroBubbleFraction(k, m) if m >= k else None
  if name == 'interleaved_1f1b':
    return schedule_builders.InterleavedBubbleFraction(k, m,
                                                       schedule_builders.LeastVirtualStages(name))
  return schedule_builders.ZeroBubbleVFraction(k, m) if m >= 2 * k - 1 else None


def _Share(cost, v):
  """The task times of one of v equal partitions that together take `cost`."""
  return dataclasses.replace(cost, forward=cost.forward / v, backward=cost.backward / v,
                             recompute=cost.recompute / v, weight=cost.weight / v)


def BubbleTable(cost, split_cost):
  """Rows (K, M, schedule, textbook bubble, simulated bubbles with unit and measured costs, step
  time / 1f1b's with measured costs); `cost` and `split_cost` (see MeasuredCost) are one device's
  share of the layers."""
  unit = simulator.TaskTimes(forward=1.0, backward=1.0, weight=1.0)
  rows = []
  for k in KS:
    for m in MS:
      sims = {}
      for name in schedule_builders.NAMES:
        v = schedule_builders.LeastVirtualStages(name)
        sched = schedule_builders.Build(name, k, m, v)
        for label, c in (('unit', unit), ('measured', _CostOf(name, cost, split_cost))):
          sims[(label, name)] = simulator.Simulate([_Share(c, v)] * (k * v), sched)
      for name in schedule_builders.NAMES:
        rows.append(dict(
            k=k, m=m, name=name, textbook=Textbook(name, k, m),
            unit=sims[('unit', name)].idle_fraction,
            measured=sims[('measured', name)].idle_fraction,
            time=sims[('measured', name)].step_time / sims[('measured', '1f1b')].step_time))
  return rows


def _Pct(x):
  return '   -  ' if x is None else '%5.1f%%' % (100 * x)


def main(unused_argv):
  args = command_line.Args()
  print(machine.Line(), flush=True)
  cost, split_cost, rerun = MeasuredCost(args)
  print('task times of one partition (%d layers of %d, micro-batch %d), mean per task: F %.2f ms, '
        'B %.2f ms, W %.2f ms, R %.2f ms; zero-bubble weight-gradient task as traced %.2f ms '
        '(re-computation %.2f ms of it)' % (
            max(1, args.layers // 4), args.width, args.micro_batch_size, 1e3 * cost.forward,
            1e3 * cost.backward, 1e3 * cost.weight, 1e3 * cost.recompute,
            1e3 * split_cost.weight, 1e3 * rerun))
  print('\nbubble (idle share of K separate devices, equal partitions; v partitions per device)')
  print('%3s %3s  %-16s %2s | %8s | %8s | %8s | %12s' % (
      'K', 'M', 'schedule', 'v', 'textbook', 'F=B=W', 'measured', 'step / 1f1b'))
  failures = []
  for r in BubbleTable(cost, split_cost):
    print('%3d %3d  %-16s %2d | %8s | %8s | %8s | %11.2fx' % (
        r['k'], r['m'], r['name'], schedule_builders.LeastVirtualStages(r['name']),
        _Pct(r['textbook']), _Pct(r['unit']), _Pct(r['measured']), r['time']))
    if r['textbook'] is not None and abs(r['unit'] - r['textbook']) > 1e-9:
      failures.append('%s K=%d M=%d' % (r['name'], r['k'], r['m']))
  print('(step / 1f1b: simulated step time with the measured task times)')
  print('\nsimulated with F = B = W equals the textbook bubble where its formula holds: %s' %
        ('PASS' if not failures else 'FAIL: ' + ', '.join(failures)))

  k, m = 4, args.micro_batches
  stack = _Stack(args.layers, args.width)
  for name in schedule_builders.NAMES:
    v = schedule_builders.LeastVirtualStages(name)
    trace = TracedStep(stack, k, m, args.micro_batch_size, args.width, name, inter_op=2)
    path = os.path.join(args.out_dir, 'traced_%s.png' % name)
    timeline.DrawTrace(trace, path, '%s: one traced training step (K = %d, v = %d, M = %d, %d '
                       'cores)' % (name, k, v, m, os.cpu_count() or 1))
    result = simulator.Simulate([_Share(_CostOf(name, cost, split_cost), v)] * (k * v),
                                schedule_builders.Build(name, k, m, v))
    sim_path = os.path.join(args.out_dir, 'simulated_%s.png' % name)
    timeline.DrawSimulated(result, sim_path, '%s: simulated (K = %d separate devices, v = %d, '
                           'M = %d, measured task times); bubble %.1f%%' %
                           (name, k, v, m, 100 * result.idle_fraction))
    print('%-16s traced step %6.1f ms  -> %s; simulated %6.1f ms -> %s' % (
        name, 1e3 * trace.step_time, path, 1e3 * result.step_time, sim_path))
  return 1 if failures else 0


if __name__ == '__main__':
  command_line.Run(main, 'schedule_bubble')
