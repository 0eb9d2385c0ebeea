"""Checks that pipelining leaves a registered model's gradients unchanged (the GPipe paper's test).

Takes one batch of the model's training input and computes the gradient of the task's loss with
respect to every trainable variable: once unpipelined (the reference) and once per K devices and
M micro-batches of the grid, each build on K logical CPU devices starting from the same weights.
Prints, per variable, the reference gradient's norm and each variant's difference divided by the
largest reference gradient norm, then the global gradient norm of each variant (the paper's
quantity). Where batch norm makes results depend on M, each variant with M > 1 is compared with
the same layers unpipelined, run on each of the M micro-batches of examples in turn (the input
split along its examples' axis): a wrong batch_dim, e.g. 0 for time-major [T, B, ...] inputs,
then differs and the last line names batch_dim. Where dropout masks without an example axis make
results depend on M, each K is compared with the smallest K at the same M; the output says why.
A variant that fails to run (e.g. a check inside the step) is listed as `K=.. M=.. failed to
run: <cause>`. `--example=paper` runs the paper's own test (supplementary Figure 1: 16
convolutions, 8 micro-batches, K = 1, 2, 4).

  python -m tools.consistency --model=digits.TinyConvPipeline
  python -m tools.consistency --model=digits.TinyConvPipeline --devices=1,2 \
      --micro_batches=1,2
  python -m tools.consistency --example=paper
  python -m tools.consistency --list_models --params_module=mymodels

Run time on a 2-core CPU with the default grid (6 variants; docs/benchmarks.md, measured beside
other jobs at a load average of about 10): 67-176 s for digits.TinyConvPipeline,
digits.TinyUNetPipeline, lm.TinyTiedLm, resnet.TinyResNet, mt.Num2WordsTinyT and
mt.Num2WordsWideT, 215-397 s for the tiny AmoebaNets and mt.Num2WordsDeepT; --example=paper 15 s.
Progress goes to stderr, a line when each run (a build and one step: the reference, a variant, a
micro-batch reference) starts and one with its time when it ends; the report goes to stdout.

Exit status: 0 if every variant agrees within --tolerance, 1 if one differs or fails to run (the
last line says PASS or FAIL and why), 2 for a usage error (one line on stderr).
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import flags  # pylint: disable=g-import-not-at-top

from tensorpipe import progress as progress_lib  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import consistency  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import consistency_cases  # pylint: disable=g-import-not-at-top
from tensorpipe.trainer import command_line  # pylint: disable=g-import-not-at-top
from tensorpipe.trainer import registry  # pylint: disable=g-import-not-at-top

EXAMPLES = ('paper',)
PAPER_MICRO_BATCHES = (8,)

flags.DEFINE_string('model', None,
                    'Registered model to check, e.g. digits.TinyConvPipeline (its Train input '
                    'gives the batch). Give this or --example.')
flags.DEFINE_enum('example', None, EXAMPLES,
                  "Run a built-in example instead of a model: 'paper' is the GPipe paper's test "
                  '(16 convolutions, default K = 1,2,4 and M = 8).')
flags.DEFINE_string('devices', None,
                    'Comma-separated K (devices of each pipeline) to compare, e.g. 1,2,4 (the '
                    'default). A K above a pipeline\'s number of layers is skipped with a note; '
                    'each K needs K logical CPU devices, which the tool creates.')
flags.DEFINE_string('micro_batches', None,
                    'Comma-separated M to compare, e.g. 1,4 (the default; 8 for '
                    '--example=paper). Each M must not exceed the batch size.')
flags.DEFINE_float('tolerance', None,
                   'Largest allowed gradient difference, relative to the largest gradient norm of '
                   'what a variant is compared with (default %g, %g for --example=paper): %s. '
                   'Raise it only if a deep model\'s rounding, shown in the table, exceeds it.' %
                   (consistency.DEFAULT_TOLERANCE, consistency.PAPER_TOLERANCE,
                    consistency.TOLERANCE_REASON))
flags.DEFINE_bool('list_models', False,
                  'Print the registered models (with --model or --params_module, also those of '
                  'that user\'s module) and exit.')
flags.DEFINE_string('params_module', None,
                    'A module on PYTHONPATH (e.g. mymodels) that registers models, imported '
                    'first: --list_models lists its models too.')
FLAGS = flags.FLAGS


class _UsageError(ValueError):
  """A bad flag value, reported in one line."""


def _Ints(flag, text):
  """The comma-separated positive integers of flag `flag`, or None if it was not given."""
  if text is None:
    return None
  try:
    values = [int(v) for v in text.split(',')]
  except ValueError:
    values = []
  if not values or any(v < 1 for v in values):
    raise _UsageError('%s=%s is not a comma-separated list of positive integers; write e.g. '
                      '%s=1,2,4' % (flag, text, flag))
  return values


def BuildCase(args):
  """The consistency.Case and tolerance the parsed flags `args` ask for."""
  devices = _Ints('--devices', args.devices)
  micro_batches = _Ints('--micro_batches', args.micro_batches)
  if args.tolerance is not None and not args.tolerance > 0:
    raise _UsageError('--tolerance=%r must be a positive number, e.g. --tolerance=%g' %
                      (args.tolerance, consistency.DEFAULT_TOLERANCE))
  if (args.model is None) == (args.example is None):
    raise _UsageError('give exactly one of --model=REGISTERED (e.g. '
                      '--model=digits.TinyConvPipeline) and --example=paper')
  if args.example == 'paper':
    case = consistency_cases.PaperExample(devices or consistency.DEFAULT_DEVICES,
                                          micro_batches or PAPER_MICRO_BATCHES)
    return case, args.tolerance or consistency.PAPER_TOLERANCE
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()  # Lingvo's registry reads its override flags; keep the defaults.
  registry.ImportUserModules(args.model, args.params_module)
  cfg = registry.ModelParams(args.model, 'Train')
  case = consistency_cases.TaskCase(cfg.task, devices or consistency.DEFAULT_DEVICES,
                                    micro_batches or consistency.DEFAULT_MICRO_BATCHES,
                                    input_params=cfg.input, title=args.model)
  return case, args.tolerance or consistency.DEFAULT_TOLERANCE


def ListModels(args, out=None):
  """Prints one line per registered model, `name  [tiny|paper-scale]  description`: TensorPipe's own
  and those of the user's module named by --model or --params_module."""
  out = out or sys.stdout
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  registry.ImportUserModules(args.model, args.params_module)
  for name, cls in sorted(registry.RegisteredModels().items()):
    out.write('%s  [%s]  %s\n' % (name, 'tiny' if registry.IsTiny(cls) else 'paper-scale',
                                  registry.Description(cls)))


def main(unused_argv):
  args = command_line.Args()
  try:
    if args.list_models:
      ListModels(args)
      return 0
    case, tolerance = BuildCase(args)
    report = consistency.Compare(
        case, tolerance,
        progress=progress_lib.Progress(lambda line: print(line, file=sys.stderr, flush=True)))
  except (ValueError, registry.UsageError) as e:
    lines = str(e).strip().splitlines()
    print('consistency: error: %s' % (lines[0] if lines else type(e).__name__), file=sys.stderr)
    return 2
  print(report.Format())
  return 0 if report.ok else 1


if __name__ == '__main__':
  command_line.Run(main, 'consistency')
