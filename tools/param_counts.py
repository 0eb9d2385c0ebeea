"""Prints the parameter count of every registered TensorPipe model (built, variables unallocated).

  python -m tools.param_counts                  # every model registered by params/
  python -m tools.param_counts --match '^mt\\.'  # only those whose key matches a regex

Each model's task is instantiated in a throwaway graph (tensorpipe.trainer.param_count), so counts
come from the variables the model really declares. Building the deepest configurations takes
minutes (Lingvo declares one variable at a time; Transformer-L 1663 has ~20k variables).

Run time on a 2-core CPU: more than 3 minutes for all 48 models. A run of all of them was stopped
after 200 s, in the build of mt.TransformerL1663Pipeline128 (the 44th of 48 in key order); the 43
before it had taken 176 s of building, 0.1-19 s each. Progress goes to stderr: a line when each
model's build starts, at most one every 10 s while it builds and one with its time when it ends;
the table's row of each model goes to stdout as it is counted.
"""

import re
import sys
import time

from absl import flags

from tensorpipe import progress as progress_lib
from tensorpipe.trainer import command_line
from tensorpipe.trainer import param_count
from tensorpipe.trainer import registry

flags.DEFINE_string('match', '', 'Regular expression the model key must match.')
FLAGS = flags.FLAGS


def _Human(n):
  for unit, scale in (('B', 1e9), ('M', 1e6), ('K', 1e3)):
    if n >= scale:
      return '%.1f%s' % (n / scale, unit)
  return str(n)


def main(unused_argv):
  args = command_line.Args()
  models = registry.TensorPipeModels()
  keys = sorted(k for k in models if re.search(args.match, k))
  if not keys:
    raise SystemExit('param_counts: no registered model matches %r' % args.match)
  # Progress on stderr (a line when a model starts, every 10 s while it builds, when it ends),
  # the table on stdout.
  progress = progress_lib.Progress(lambda line: print(line, file=sys.stderr, flush=True))
  print('%-34s %16s %8s %8s' % ('model', 'parameters', 'approx', 'seconds'), flush=True)
  for key in keys:
    start = time.time()
    n = param_count.CountParameters(models[key]().Task(), progress)
    print('%-34s %16d %8s %8.1f' % (key, n, _Human(n), time.time() - start), flush=True)


if __name__ == '__main__':
  command_line.Run(main, 'param_counts')
