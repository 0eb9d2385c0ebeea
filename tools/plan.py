r"""Plans a registered model: S replicas x K partitions, M, schedule and re-computation, ranked.

For each TensorPipeLayer of the model's training params, every configuration on N devices of a
device profile is predicted (step time, examples/s, bubble, per-device peak memory) and ranked,
those that do not fit the device memory marked with what they need (`tensorpipe.measure.planner`).
The last line gives the trainer flags that apply the best one.

  .venv/bin/python -m tools.plan --model=digits.TinyConvPipeline --devices=4
  .venv/bin/python -m tools.plan --model=amoebanet.AmoebaNetDPipeline8 --devices=8 \
      --device=TPUv2-core --device_memory=8GiB
  .venv/bin/python -m tools.plan --list_devices

--device=cpu (the default) measures this machine's CPU devices first (under a second), then each
distinct layer within --measure_budget seconds per pipeline (--quick: none, costs from flops).
What it builds and measures is cached in --cache_dir for the next run. Progress goes to stderr,
the table to stdout.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import argparse  # pylint: disable=g-import-not-at-top

from absl import flags  # pylint: disable=g-import-not-at-top

from tensorpipe import disk_cache  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import device_profiles  # pylint: disable=g-import-not-at-top
from tensorpipe import progress as progress_lib  # pylint: disable=g-import-not-at-top
from tensorpipe.trainer import model_plan  # pylint: disable=g-import-not-at-top
from tensorpipe.trainer import registry  # pylint: disable=g-import-not-at-top
from tensorpipe import units  # pylint: disable=g-import-not-at-top


def ParseArgs(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--model', help='A registered model, e.g. digits.TinyConvPipeline.')
  parser.add_argument('--devices', type=int, default=None,
                      help='N: devices to plan for (S replicas x K partitions <= N).')
  parser.add_argument('--device', default=device_profiles.CPU,
                      help='Device profile: cpu (measured now) or one of --list_devices.')
  parser.add_argument('--device_memory', default=None,
                      help='Memory per device, e.g. 16GiB (default: the profile\'s).')
  parser.add_argument('--batch', type=int, default=None,
                      help='Global mini-batch (default: the model\'s cost_input_shapes batch).')
  parser.add_argument('--rows', type=int, default=20, help='Table rows to print (0: all).')
  parser.add_argument('--quick', action='store_true',
                      help='Measure no layer on --device=cpu: costs from flops and the profile, '
                      'an answer in seconds (less faithful than measured times).')
  parser.add_argument('--measure_budget', type=float, default=model_plan.MEASURE_BUDGET,
                      help='About how many seconds measuring each pipeline\'s layers may take on '
                      '--device=cpu; more measures at batches closer to the model\'s.')
  parser.add_argument('--cache_dir', default='',
                      help='Where built and measured layers are kept for the next run (default: '
                      '$XDG_CACHE_HOME/tensorpipe or ~/.cache/tensorpipe); none: no cache, build '
                      'and measure everything.')
  parser.add_argument('--list_devices', action='store_true',
                      help='Print the device profiles with their sources and exit.')
  return parser.parse_args(argv)


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


def main(argv=None):
  args = ParseArgs(argv)
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
  sys.exit(main())
