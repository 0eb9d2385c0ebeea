r"""Step memory of every schedule, per device, from a traced step.

A stack whose boundary activations dominate (wide micro-batches, narrow cheap layers: --layers dense
tanh layers of --width, a per-example squared-norm loss as the last layer), K = --devices
logical CPU devices (one partition each), M = --micro_batches micro-batches of --micro_batch_size
examples, trained one step (forward, gradients, SGD update) with each schedule in its own process.
Per device: the peak of memory allocated during the step (profiling.Trace.PeakMemory: what the step
adds above the resident variables and inputs), and the ratio 1f1b / gpipe. Fill-drain keeps every
micro-batch's boundary input on device k until its backward pass (M of them); 1F1B keeps at most K -
k, so the predicted stash ratio on device k is min(K - k, M) / M. The rest of a peak (one
micro-batch's re-computed activations and gradients, the weight-gradient sums) is the same for both:
the tool takes it as fill-drain's peak less M boundary inputs, and 1F1B's stash as its peak less
that. 'zero_bubble' is shown beside them (no target): it stashes as 1F1B does, and a micro-batch
whose weight-gradient task waits keeps its layers' inputs and output gradients on device k until
then. 'interleaved_1f1b' and 'zbv' run with v = 2 partitions per device (the same layers cut in 2K
partitions); their stash is estimated the same way, against the schedule's own count of the
(partition, micro-batch) pairs in flight on the device (`schedule.Schedule.InFlight`), each
holding one boundary input of the same size here.

  python -m tools.schedule_memory                   # K = 4, M = 32; about 1 minute
  python -m tools.schedule_memory --devices 4 --micro_batches 8

Results: docs/benchmarks.md.
"""

import json
import os
import subprocess
import sys

from absl import flags

from tensorpipe import progress as progress_lib
from tensorpipe import schedule_builders  # No TensorFlow: the parent process stays light.
from tensorpipe.trainer import command_line

flags.DEFINE_integer('devices', 4, 'K, the devices (one partition each; two each for '
                     'interleaved_1f1b and zbv).')
flags.DEFINE_integer('micro_batches', 32, 'M.')
flags.DEFINE_integer('micro_batch_size', 512, 'Examples per micro-batch.')
flags.DEFINE_integer('width', 64, 'Width of every layer.')
flags.DEFINE_integer('layers', 8, 'Dense layers (K must divide them+1 with the loss layer, or they '
                     'are balanced by count).')
flags.DEFINE_integer('timeout', 600, 'Seconds per child.')
flags.DEFINE_bool('child', False, 'Internal: run one schedule\'s traced step (the tool runs it).')
flags.DEFINE_string('schedule', None, 'Internal: the schedule of a --child run.')
FLAGS = flags.FLAGS

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# The working directory of sub-runs: the repository root.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_RESULT = 'SCHEDULE_MEMORY '
KIB = 1024.0


def Child(args):
  """Builds and traces one step with schedule `args.schedule`; prints {device: peak bytes}."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from lingvo import compat as tf  # pylint: disable=g-import-not-at-top
  from lingvo.core import cluster_factory  # pylint: disable=g-import-not-at-top
  from lingvo.core import layers  # pylint: disable=g-import-not-at-top
  from tensorpipe import layer as layer_lib  # pylint: disable=g-import-not-at-top
  from tensorpipe import placement  # pylint: disable=g-import-not-at-top
  from tensorpipe.measure import profiling  # pylint: disable=g-import-not-at-top
  from tensorpipe.measure import workloads  # pylint: disable=g-import-not-at-top

  k, m = args.devices, args.micro_batches
  stack = [layers.FCLayer.Params().Set(name='fc%d' % i, input_dim=args.width,
                                       output_dim=args.width, activation='TANH')
           for i in range(args.layers)] + [workloads.SquaredNorm.Params().Set(name='loss')]
  batch = m * args.micro_batch_size
  with tf.Graph().as_default() as graph, cluster_factory.ForTestingWorker(cpus=k, split_size=k):
    net = layer_lib.TensorPipeLayer.Params().Set(
        name='pipe', layers=stack, num_devices=k, num_micro_batches=m,
        schedule=args.schedule,
        virtual_stages=schedule_builders.LeastVirtualStages(args.schedule)).Instantiate()
    x = tf.Variable(np.random.RandomState(0).normal(size=[batch, args.width]).astype(np.float32),
                    trainable=False, name='inputs')
    loss = tf.reduce_mean(net.FPropDefaultTheta(tf.identity(x)))
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    updates = []
    for v, g in zip(variables, grads):
      with tf.ops.colocate_with(v):
        updates.append(v.assign_sub(1e-3 * g).op)
    step = tf.group(*updates)
    with tf.Session(graph=graph, config=placement.SessionConfig(k, 1, 2)) as sess:
      sess.run(tf.global_variables_initializer())
      for _ in range(2):
        sess.run(step)
      _, meta = profiling.TracedRun(sess, step)
  trace = profiling.Trace(meta)
  print(_RESULT + json.dumps(trace.PeakMemory()), flush=True)


def _Measure(args, schedule):
  cmd = [sys.executable, '-m', 'tools.schedule_memory', '--child', '--schedule', schedule] + [
      '--%s=%s' % (n, getattr(args, n)) for n in
      ('devices', 'micro_batches', 'micro_batch_size', 'width', 'layers')]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False,
                        cwd=_REPO)
  for line in proc.stdout.splitlines():
    if line.startswith(_RESULT):
      return json.loads(line[len(_RESULT):])
  raise SystemExit('schedule_memory: the %s child failed (exit %d):\n%s' %
                   (schedule, proc.returncode, proc.stderr[-3000:]))


def main(unused_argv):
  args = command_line.Args()
  if args.child:
    return Child(args)
  # TensorFlow is imported here only to say which kernels the children run.
  from tensorpipe.measure import machine  # pylint: disable=g-import-not-at-top
  print(machine.Line(), flush=True)
  k, m = args.devices, args.micro_batches
  boundary = args.micro_batch_size * args.width * 4 / KIB
  print('%d dense tanh layers of width %d + a per-example loss, K = %d, M = %d micro-batches of %d '
        '(a boundary activation: %.0f KiB); one traced training step per schedule' %
        (args.layers, args.width, k, m, args.micro_batch_size, boundary), flush=True)
  progress = progress_lib.Progress(lambda line: print(line, file=sys.stderr, flush=True))
  peaks = {}
  with progress.Phase('tracing one step per schedule, each in a process of its own',
                      len(schedule_builders.NAMES)) as phase:
    for name in schedule_builders.NAMES:
      peaks[name] = _Measure(args, name)
      phase.Step()
  print('%-8s %11s %10s %9s %14s %12s %16s %10s %8s' % (
      'device', 'gpipe KiB', '1f1b KiB', '1f1b/gp', '1f1b stash KiB', 'stash ratio',
      'predicted ratio', 'zb KiB', 'zb/gp'))
  worst = 0.0
  for i, device in enumerate(sorted(peaks['gpipe'])):
    g, o = peaks['gpipe'][device] / KIB, peaks['1f1b'].get(device, 0) / KIB
    z = peaks['zero_bubble'].get(device, 0) / KIB
    # What both schedules hold besides the stash: fill-drain's peak less its M boundary inputs.
    fixed = max(0.0, g - m * boundary)
    stash = max(0.0, o - fixed)
    ratio = stash / (m * boundary)
    if i < k - 1:  # The last partition's stash is its forward outputs, not boundary inputs.
      worst = max(worst, ratio)
    print('%-8s %11.0f %10.0f %8.2fx %14.0f %11.2fx %15.2fx %10.0f %7.2fx' % (
        device, g, o, o / g, stash, ratio, min(k - i, m) / float(m), z, z / g))
  limit = (k + 1) / float(m)
  print('\n1f1b stash <= (K + 1)/M = %.3f of gpipe\'s on every device but the last: %.3f  %s' %
        (limit, worst, 'PASS' if worst <= limit else 'FAIL'))
  print('\nv = 2 partitions per device (stash: peak less what gpipe holds besides its stash, in '
        'boundary inputs; predicted: the schedule\'s pairs in flight)')
  print('%-8s %11s %9s %13s %10s %11s %9s %13s %10s' % (
      'device', 'il KiB', 'il/gp', 'il stash', 'predicted', 'zbv KiB', 'zbv/gp', 'zbv stash',
      'predicted'))
  in_flight = {name: schedule_builders.Build(name, k, m, 2).InFlight()
               for name in ('interleaved_1f1b', 'zbv')}
  for i, device in enumerate(sorted(peaks['gpipe'])):
    g = peaks['gpipe'][device] / KIB
    fixed = max(0.0, g - m * boundary)
    cells = []
    for name in ('interleaved_1f1b', 'zbv'):
      peak = peaks[name].get(device, 0) / KIB
      cells.append('%11.0f %8.2fx %13.1f %10d' % (peak, peak / g, max(0.0, peak - fixed) / boundary,
                                                  in_flight[name][i]))
    print('%-8s %s' % (device, ' '.join(cells)))


if __name__ == '__main__':
  command_line.Run(main, 'schedule_memory')
