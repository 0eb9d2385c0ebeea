r"""Checks the planner against measured steps on this machine's logical CPU devices.

For each model (--models, registered), the planner ranks the configurations of its TensorPipeLayer
on --devices logical CPU devices (S = 1 replica: the measured step is one pipeline; K in --ks, M in
--ms, re-computation 'always' and 'never', schedules --schedules; the CPU profile measured now).
Each of those configurations is then built as a `measure.training_step.TrainingStep` with the
planner's partition sizes and schedule (plain SGD: 8 bytes per parameter, weight and gradient, which
the planner is told; the last partition ends with a per-example loss layer, so that the '1f1b' and
'zero_bubble' schedules can run), and timed interleaved: --rounds rounds, each running every
configuration --steps steps in a rotated order, so that the load of the shared machine hits all
alike; the median step counts. One traced step per configuration gives each device's peak memory
(its variables plus the peak of step allocations replayed from the trace,
`profiling.Trace.PeakMemory`).

Printed per model: predicted and measured step times and ranks, predicted and measured per-device
peak memory; the Spearman rank correlation of predicted and measured step times, how far the
planner's first choice is from the fastest measured, and the largest memory errors.

  python -m tools.plan_check --recomputes='amoebanet.TinyAmoebaNetD=always'  # 20 min
  python -m tools.plan_check --models=digits.TinyConvPipeline --rounds=3

Run time on a 2-core CPU (docs/benchmarks.md, shared with other jobs): digits.TinyConvPipeline
54 s (60 configurations), amoebanet.TinyAmoebaNetD with --recomputes=always 18 minutes (36
configurations): about 19 minutes for the first command above. The default run (both models, both
re-computation modes: more AmoebaNet configurations than those 36) was not timed; it takes longer.
Progress goes to stderr: a line when each phase (measuring the layers, building, timing rounds,
tracing) starts, one at most every 10 s while it runs, and one with its time when it ends.

Results: docs/benchmarks.md.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import collections
import subprocess
import sys
import time

import numpy as np  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top
from lingvo import compat as tf  # pylint: disable=g-import-not-at-top

from tensorpipe import progress as progress_lib  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import machine  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import profiling  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import training_step  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import device_profiles  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import planner  # pylint: disable=g-import-not-at-top
from tensorpipe.trainer import command_line  # pylint: disable=g-import-not-at-top
from tensorpipe.trainer import model_plan  # pylint: disable=g-import-not-at-top
from tensorpipe.trainer import registry  # pylint: disable=g-import-not-at-top

flags.DEFINE_string('models', 'digits.TinyConvPipeline,amoebanet.TinyAmoebaNetD',
                    'Registered models, comma-separated.')
flags.DEFINE_integer('devices', 4, 'Logical CPU devices to plan for.')
flags.DEFINE_list('ks', ['1', '2', '4'], 'K values to measure.')
flags.register_validator('ks', command_line.PositiveInts,
                         message='give comma-separated positive integers, e.g. 1,2,4')
flags.DEFINE_list('ms', ['1', '2', '4', '8'], 'M values to measure.')
flags.register_validator('ms', command_line.PositiveInts,
                         message='give comma-separated positive integers, e.g. 1,2,4,8')
flags.DEFINE_string('schedules', 'gpipe,1f1b,zero_bubble',
                    'Schedules to measure, comma-separated (zero_bubble with re-computation only).')
flags.DEFINE_string('recomputes', 'always,never',
                    'Re-computation modes to measure (model=modes;model=modes to differ, e.g. '
                    'amoebanet.TinyAmoebaNetD=always).')
flags.DEFINE_integer('rounds', 7, 'Interleaved timing rounds.')
flags.DEFINE_integer('steps', 3, 'Timed steps per config per round.')
flags.DEFINE_enum('cost', 'measured', ('measured', 'flops'),
                  'Task times from measured per-layer times or from flops and op counts.')
flags.DEFINE_integer('micro_batch_cost', 1,
                     '1: measure what a micro-batch costs beyond its layers and add it to the '
                     'predicted steps; 0: leave it out.', lower_bound=0, upper_bound=1)
flags.DEFINE_integer('warmup', 3, 'Untimed steps when a step is built.')
FLAGS = flags.FLAGS

MIB = 2.0**20


def Ranks(values):
  """Ranks 1..n of `values` (ties get their mean rank)."""
  values = np.asarray(values, dtype=float)
  order = np.argsort(values, kind='stable')
  ranks = np.empty(len(values))
  ranks[order] = np.arange(1, len(values) + 1)
  for v in np.unique(values):
    tied = values == v
    ranks[tied] = ranks[tied].mean()
  return ranks


def Spearman(a, b):
  """Spearman's rank correlation of two equally long sequences."""
  ra, rb = Ranks(a), Ranks(b)
  return float(np.corrcoef(ra, rb)[0, 1])


def _InputsFn(shapes):
  def Inputs():
    rng = np.random.RandomState(0)
    return tuple(tf.constant(rng.uniform(size=s).astype(np.float32)) for s in shapes)
  return Inputs


def _MeasuredMemory(step, k):
  """Per device: its variables plus the peak of the traced step's allocations."""
  with step.graph.as_default():
    variables = tf.global_variables()
  resident = collections.Counter()
  for v in variables:
    resident[profiling.ShortDevice(v.device)] += v.dtype.size * v.shape.num_elements()
  peaks = step.Trace().PeakMemory()
  return [peaks.get('CPU:%d' % i, 0) + resident['CPU:%d' % i] for i in range(k)]


def CheckModel(model, args, device, progress=progress_lib.QUIET):
  """Prints the planner's predictions for `model` on `device` against its measured steps;
  `progress`: each phase's lines."""
  cfg = registry.ModelParams(model, 'Train')
  _, p, layers, batch, profiles = model_plan.PipelineInputs(cfg)[0]
  layer_times = None
  if args.cost == 'measured':
    layer_times = device_profiles.MeasureLayerTimes(layers, p.cost_input_shapes, p.batch_dim,
                                                    progress=progress)
  overhead = 0.0
  if layer_times is not None and args.micro_batch_cost:
    with progress.Phase('%s: measuring what a micro-batch adds beyond its layers (one-partition '
                        'steps at M = 1 and 2)' % model):
      overhead = model_plan.MeasureMicroBatchSeconds(layers, p.cost_input_shapes, layer_times,
                                                     device.call_overhead, p.batch_dim)
  print('%s: each micro-batch after the first costs %.3f ms more (measured)' %
        (model, 1e3 * overhead), flush=True)
  ranking = planner.PlanPipeline(profiles, batch, args.devices, device, schedules=args.schedules,
                                 recomputes=args.recomputes, micro_batches=args.ms,
                                 bytes_per_param=8, title=model, layer_times=layer_times,
                                 micro_batch_overhead=overhead)
  configs = [c for c in ranking.configurations
             if c.replicas == 1 and c.pipeline_devices in args.ks and c.fits]
  print('\n%s: batch %d, %d layers; %d configurations (S = 1) of %d ranked' %
        (model, batch, len(layers), len(configs), len(ranking.configurations)), flush=True)
  steps = []
  start = time.time()
  with progress.Phase('%s: building the configurations\' training steps' % model,
                      len(configs)) as phase:
    for c in configs:
      steps.append(training_step.TrainingStep(
          c.Label(), layers, c.sizes, _InputsFn(p.cost_input_shapes), c.micro_batches,
          p.batch_dim, devices=c.pipeline_devices, recompute=c.recompute, intra_op_threads=1,
          inter_op_threads=2, warmup=args.warmup, schedule=c.schedule, per_example_loss=True))
      phase.Step()
  print('built in %.0f s' % (time.time() - start), flush=True)
  with progress.Phase('%s: timing, %d rounds of %d steps per configuration' %
                      (model, args.rounds, args.steps), args.rounds) as phase:
    for r in range(args.rounds):
      shift = r % len(steps)
      for s in steps[shift:] + steps[:shift]:
        s.Time(args.steps)
      phase.Step()
  measured = [s.Median() for s in steps]
  memory = []
  with progress.Phase('%s: tracing a step per configuration for its memory' % model,
                      len(configs)) as phase:
    for s, c in zip(steps, configs):
      memory.append(_MeasuredMemory(s, c.pipeline_devices))
      phase.Step()
  for s in steps:
    s.Close()
  predicted = [c.step_time for c in configs]
  print('%-36s %9s %9s %6s %6s  %-28s %-28s %s' % (
      'configuration', 'pred ms', 'meas ms', 'p rank', 'm rank', 'pred MiB / device',
      'meas MiB / device', 'error, fullest'))
  pr, mr = Ranks(predicted), Ranks(measured)
  errors = []
  for i, c in enumerate(configs):
    err = c.peak_memory / max(memory[i]) - 1
    errors.append(err)
    print('%-36s %9.2f %9.2f %6.1f %6.1f  %-28s %-28s %+.0f%%' % (
        c.Label(), 1e3 * predicted[i], 1e3 * measured[i], pr[i], mr[i],
        ' '.join('%.2f' % (b / MIB) for b in c.device_memory),
        ' '.join('%.2f' % (b / MIB) for b in memory[i]), 100 * err))
  rho = Spearman(predicted, measured)
  first = int(np.argmin(predicted))
  gap = measured[first] / min(measured) - 1
  print('Spearman rank correlation predicted vs measured: %.3f (target >= 0.8)' % rho)
  print('planner\'s first choice %s: %.2f ms measured, %.1f%% above the fastest measured (%s, '
        '%.2f ms; target <= 10%%)' % (configs[first].Label(), 1e3 * measured[first], 100 * gap,
                                       configs[int(np.argmin(measured))].Label(),
                                       1e3 * min(measured)))
  print('per-device peak memory, fullest device: error %+.0f%% .. %+.0f%%, mean |error| %.0f%% '
        '(target within 25%%)' % (100 * min(errors), 100 * max(errors),
                                   100 * float(np.mean(np.abs(errors)))), flush=True)


def main(unused_argv):
  args = command_line.Args()
  print(machine.Line(), flush=True)
  args.ks = tuple(int(k) for k in args.ks)
  args.ms = tuple(int(m) for m in args.ms)
  args.schedules = tuple(args.schedules.split(','))
  default_modes, per_model = 'always,never', {}
  for part in args.recomputes.split(';'):
    if '=' in part:
      name, modes = part.split('=', 1)
      per_model[name] = modes
    else:
      default_modes = part
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True,
                          check=False).stdout.strip()
  print('commit %s; %s' % (commit, os.getloadavg()), flush=True)
  progress = progress_lib.Progress(
      lambda line: print('plan_check: ' + line, file=sys.stderr, flush=True))
  with progress.Phase("measuring this machine's CPU devices"):
    device = device_profiles.MeasureCpu(memory=2.0**40)
  print(device, flush=True)
  for model in args.models.split(','):
    registry.ImportModel(model)
    args.recomputes = tuple(per_model.get(model, default_modes).split(','))
    CheckModel(model, args, device, progress)
  print('load average at the end: %.2f %.2f %.2f' % os.getloadavg())
  return 0


if __name__ == '__main__':
  command_line.Run(main, 'plan_check')
