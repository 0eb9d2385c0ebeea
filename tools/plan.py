r"""Plans a registered model: S replicas x K devices, M, schedule and re-computation, ranked.

For each TensorPipeLayer of the model's training params, every configuration on N devices of a
device profile is predicted (step time, examples/s, bubble, per-device peak memory) and ranked,
those that do not fit the device memory marked with what they need (`tensorpipe.measure.planner`).
The last line gives the trainer flags that apply the best one.

  python -m tools.plan --model=digits.TinyConvPipeline --devices=4
  python -m tools.plan --model=amoebanet.AmoebaNetDPipeline8 --devices=8 \
      --device=TPUv2-core --device_memory=8GiB
  python -m tools.plan --list_devices

--device=cpu (the default) measures this machine's CPU devices first (under a second), then each
distinct layer within --measure_budget seconds per pipeline (--quick: none, costs from flops).
What it builds and measures is cached in --cache_dir for the next run. Progress goes to stderr,
the table to stdout.

Run time on a 2-core CPU (docs/benchmarks.md, "Run time: tools.plan"): a first run on the paper's
models (amoebanet.AmoebaNetD18x256K8M32 on 8 devices, mt.T64H16384A32 on 16) 36 s on
--device=cpu and 15-20 s on TPUv2-core; --quick 15-26 s; digits.TinyConvPipeline on 4 devices 7 s;
a second run, which reads the cache, about 5 s.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import flags  # pylint: disable=g-import-not-at-top

from tensorpipe import disk_cache  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import device_profiles  # pylint: disable=g-import-not-at-top
from tensorpipe import progress as progress_lib  # pylint: disable=g-import-not-at-top
from tensorpipe.trainer import command_line  # pylint: disable=g-import-not-at-top
from tensorpipe.trainer import model_plan  # pylint: disable=g-import-not-at-top
from tensorpipe.trainer import registry  # pylint: disable=g-import-not-at-top
from tensorpipe import units  # pylint: disable=g-import-not-at-top


flags.DEFINE_string('model', None, 'A registered model, e.g. digits.TinyConvPipeline.')
flags.DEFINE_integer('devices', None, 'N: devices to plan for (S replicas x K devices <= N).')
flags.DEFINE_string('device', device_profiles.CPU,
                    'Device profile: cpu (measured now) or one of --list_devices.')
flags.DEFINE_string('device_memory', None,
                    'Memory per device, e.g. 16GiB (default: the profile\'s).')
flags.DEFINE_integer('batch', None,
                     'Global mini-batch (default: the model\'s cost_input_shapes batch).')
flags.DEFINE_integer('rows', 20, 'Table rows to print (0: all).')
flags.DEFINE_bool('quick', False,
                  'Measure no layer on --device=cpu: costs from flops and the profile, an answer '
                  'in seconds (less faithful than measured times).')
flags.DEFINE_float('measure_budget', model_plan.MEASURE_BUDGET,
                   'About how many seconds measuring each pipeline\'s layers may take on '
                   '--device=cpu; more measures at batches closer to the model\'s.')
flags.DEFINE_string('cache_dir', '',
                    'Where built and measured layers are kept for the next run (default: '
                    '$XDG_CACHE_HOME/tensorpipe or ~/.cache/tensorpipe); none: no cache, build and '
                    'measure everything.')
flags.DEFINE_bool('list_devices', False, 'Print the device profiles with their sources and exit.')
FLAGS = flags.FLAGS


def ListDevices():
  print('%-16s %12s %10s %12s  %s' % ('profile', 'peak Tflop/s', 'memory', 'link GB/s', 'source'))
  print('%-16s %12s %10s %12s  %s' % (device_profiles.CPU, 'measured', 'RAM', 'measured',
                                      'this machine, measured when planning'))
  for name in sorted(device_profiles.PROFILES):
    p = device_profiles.PROFILES[name]
    print('%-16s %12.1f %10s %12.1f  %s' % (name, p.peak_flops / 1e12, units.FormatBytes(p.memory),
                                            p.link_bandwidth / 1e9, p.source))


def _Say(line):
  sys.stderr.write('tools.plan: %s\n' % line)
  sys.stderr.flush()


def _Cache(args):
  try:
    return disk_cache.Open(args.cache_dir)
  except ValueError as e:
    raise ValueError('--cache_dir: %s; give a writable directory, or --cache_dir=none' %
                     e) from None


def main(unused_argv):
  args = command_line.Args()
  if args.list_devices:
    ListDevices()
    return 0
  try:
    if not args.model or not args.devices:
      raise ValueError('give --model=REGISTERED and --devices=N (see --help)')
    if not args.measure_budget >= 0:
      raise ValueError('--measure_budget=%r: give seconds >= 0' % args.measure_budget)
    memory = None if args.device_memory is None else units.ParseBytes(args.device_memory)
    cache = _Cache(args)
    progress = progress_lib.Progress(_Say)
    device = device_profiles.Profile(args.device, cache, progress)
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()  # Lingvo's registry reads its override flags: the defaults.
    registry.ImportModel(args.model)
    cfg = registry.ModelParams(args.model, 'Train')
    plans = model_plan.PlanModel(cfg, args.devices, device, memory, args.batch, args.model,
                                 quick=args.quick, budget=args.measure_budget, cache=cache,
                                 progress=progress, exact=args.rows or None)
  except (ValueError, registry.UsageError) as e:
    sys.stderr.write('tools.plan: error: %s\n' % e)
    return 2
  print(model_plan.Text(plans, args.rows or None))
  return 0


if __name__ == '__main__':
  command_line.Run(main, 'tools.plan')
