"""Deep vs wide at about the same parameter count on the num2words corpus, through the trainer.

The GPipe paper's T(24, 8192, 16) vs T(12, 16384, 32) comparison, at CPU size:

  python -m tools.deep_vs_wide --logdir_root=/tmp/dvw --steps=1000

For each model (default mt.Num2WordsDeepT and mt.Num2WordsWideT, one after the other) it runs
`tensorpipe.trainer.train --model=M --cpu_devices=2 --mode=sync --run_locally=cpu` (with this
process's Python) to train for --steps steps into LOGDIR_ROOT/<model>, then the same command with
--job=decoder_test to decode the final checkpoint greedily, and reads per-language BLEU from
LOGDIR/decoder_test/score-<step>.txt. Training is skipped when the final-step checkpoint already
exists, decoding when its score file does, so the table can be re-printed without re-running
anything.

The table gives per model its parameters, overall corpus BLEU, and the mean per-language BLEU over
the --num_extreme languages with the most training examples (high-resource) and with the fewest
(low-resource), ranked by the corpus manifest's train_sizes; a last row gives first model minus
second, and for each group the per-language differences' mean, standard error and count of
languages won. The paper's claim is that the deeper model is better on the low-resource languages
and similar on the high-resource ones. The commands, files and score analysis are
tensorpipe.tasks.mt.deep_vs_wide; this tool runs them.
"""

import json
import os
import subprocess
import time

from absl import flags

from tensorpipe.measure import machine
from tensorpipe.tasks.mt import deep_vs_wide
from tensorpipe.tasks.mt import num2words_corpus
from tensorpipe.trainer import command_line
from tensorpipe.trainer import param_count
from tensorpipe.trainer import registry

DEFAULT_MODELS = ('mt.Num2WordsDeepT', 'mt.Num2WordsWideT')

flags.DEFINE_string('logdir_root', None, 'One logdir per model is made under it.', required=True)
flags.DEFINE_integer('steps', 1000, 'Training steps per model.', lower_bound=1)
flags.DEFINE_list('models', list(DEFAULT_MODELS),
                  'Comma-separated registered models, trained in this order.')
flags.DEFINE_integer('num_extreme', 10, 'Languages in each of the high- and low-resource groups.')
FLAGS = flags.FLAGS


def _Run(cmd, log_path):
  """Runs `cmd`, output to log_path; returns wall seconds; exits naming the log on failure."""
  start = time.time()
  print('$ %s  (log: %s)' % (' '.join(cmd), log_path), flush=True)
  with open(log_path, 'a') as log:
    rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if rc != 0:
    raise SystemExit('deep_vs_wide: %s exited with %d; see %s' % (cmd[3], rc, log_path))
  return time.time() - start


def main(unused_argv):
  args = command_line.Args()
  print(machine.Line(), flush=True)
  models = [m for m in args.models if m]

  registered = registry.RegisteredModels()
  unknown = [m for m in models if m not in registered]
  if unknown:
    raise SystemExit('deep_vs_wide: unregistered models %s' % ', '.join(unknown))
  _, manifest = num2words_corpus.EnsureCorpus()
  high, low = deep_vs_wide.SplitByResource(
      dict(zip(manifest['languages'], manifest['train_sizes'])), args.num_extreme)

  rows, scores = [], []
  for model in models:
    logdir = os.path.join(args.logdir_root, model.replace('.', '_'))
    os.makedirs(logdir, exist_ok=True)
    times_path = os.path.join(logdir, 'wall_times.json')
    times = json.load(open(times_path)) if os.path.exists(times_path) else {}
    if not os.path.exists(deep_vs_wide.CheckpointPath(logdir, args.steps)):
      times['train_s'] = _Run(deep_vs_wide.TrainerCommand(model, logdir, args.steps),
                              os.path.join(logdir, 'train.log'))
      times.pop('decode_s', None)
    if not os.path.exists(deep_vs_wide.ScorePath(logdir, args.steps)):
      times['decode_s'] = _Run(
          deep_vs_wide.TrainerCommand(model, logdir, args.steps, job='decoder_test'),
                               os.path.join(logdir, 'decode.log'))
    with open(times_path, 'w') as f:
      json.dump(times, f)
    params = param_count.CountParameters(registered[model]().Task())
    scores.append(deep_vs_wide.ReadScores(deep_vs_wide.ScorePath(logdir, args.steps)))
    rows.append((model, params) + deep_vs_wide.Summarize(scores[-1], high, low))
    print('%s: train %s s, decode %s s' % (model, *(
        '%.0f' % times[k] if k in times else '?' for k in ('train_s', 'decode_s'))), flush=True)

  print('\nstep %d; high-resource: the %d languages with the most training examples (%s), '
        'low-resource: the %d with the fewest (%s); BLEU 0-100, means over languages\n' %
        (args.steps, len(high), ', '.join(high), len(low), ', '.join(low)))
  print(deep_vs_wide.FormatTable(rows))
  if len(rows) >= 2:
    for name, langs in (('high-resource', high), ('low-resource', low)):
      mean, stderr, wins = deep_vs_wide.PairedDifference(scores[0], scores[1], langs)
      print('%s: %s - %s per language %+.1f +- %.1f BLEU (mean +- standard error over %d '
            'languages); higher in %d of %d' % (name, rows[0][0], rows[1][0], mean, stderr,
                                                len(langs), wins, len(langs)))


if __name__ == '__main__':
  command_line.Run(main, 'deep_vs_wide')
