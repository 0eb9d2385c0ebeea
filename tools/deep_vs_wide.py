"""Deep vs wide at about the same parameter count on the num2words corpus (the GPipe paper's
T(24, 8192, 16) vs T(12, 16384, 32) comparison, issue 6), through the trainer.

  python -m tools.deep_vs_wide --logdir_root=/tmp/dvw --steps=1000

For each model (default mt.Num2WordsDeepT and mt.Num2WordsWideT, one after the other) it runs
`python -m tensorpipe.trainer.train --model=M --cpu_devices=2 --mode=sync --run_locally=cpu` to train for
--steps steps into LOGDIR_ROOT/<model>, then the same command with --job=decoder_test to decode the
final checkpoint greedily, and reads per-language BLEU from LOGDIR/decoder_test/score-<step>.txt.
Training is skipped when the final-step checkpoint already exists, decoding when its score file does,
so the table can be re-printed without re-running anything.

The table gives per model its parameters, overall corpus BLEU, and the mean per-language BLEU over
the --num_extreme languages with the most training examples (high-resource) and with the fewest
(low-resource), ranked by the corpus manifest's train_sizes; a last row gives first model minus second,
and for each group the per-language differences' mean, standard error and count of languages won.
The paper's claim is that the deeper model is better on the low-resource languages and similar on the
high-resource ones.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

from tensorpipe.tasks.mt import num2words_corpus
from tensorpipe.trainer import param_count
from tensorpipe.trainer import train

DEFAULT_MODELS = ('mt.Num2WordsDeepT', 'mt.Num2WordsWideT')
CPU_DEVICES = 2


def TrainerCommand(model, logdir, steps, job=None, python=sys.executable):
  """The tensorpipe.trainer.train command line that trains (job None) or runs `job` for `model`."""
  cmd = [python, '-m', 'tensorpipe.trainer.train', '--model=%s' % model, '--cpu_devices=%d' % CPU_DEVICES,
         '--mode=sync', '--run_locally=cpu', '--logdir=%s' % logdir,
         # The trainer stops at the model's train.max_steps, the decoder at task.train.max_steps.
         '--model_params_override=train.max_steps:%d;task.train.max_steps:%d' % (steps, steps)]
  if job:
    cmd.append('--job=%s' % job)
  return cmd


def CheckpointPath(logdir, step):
  """The index file of the trainer's checkpoint at `step`."""
  return os.path.join(logdir, 'train', 'ckpt-%08d.index' % step)


def ScorePath(logdir, step):
  """The decoder_test job's score file for the checkpoint at `step`."""
  return os.path.join(logdir, 'decoder_test', 'score-%08d.txt' % step)


def ReadScores(path):
  """{metric: value} from a score file of `name: value` lines (BLEU on Lingvo's 0-1 scale)."""
  metrics = {}
  with open(path) as f:
    for num, line in enumerate(f, 1):
      if not line.strip():
        continue
      m = re.match(r'^\s*([^\s:]+)\s*:\s*(\S+)\s*$', line)
      if not m:
        raise ValueError('%s:%d: expected "name: value", got %r' % (path, num, line.rstrip()))
      metrics[m.group(1)] = float(m.group(2))
  return metrics


def SplitByResource(train_sizes, num_extreme):
  """(high, low): the `num_extreme` languages with the most and with the fewest training examples.

  train_sizes maps language -> training examples; ties are broken by language code so the split is
  deterministic. The two groups must not overlap.
  """
  if num_extreme < 1 or 2 * num_extreme > len(train_sizes):
    raise ValueError('num_extreme must be in [1, %d] for %d languages, got %d' %
                     (len(train_sizes) // 2, len(train_sizes), num_extreme))
  ranked = sorted(train_sizes, key=lambda lang: (-train_sizes[lang], lang))
  return ranked[:num_extreme], ranked[-num_extreme:]


def Summarize(metrics, high, low):
  """(overall, mean high-resource, mean low-resource) BLEU on a 0-100 scale from decoder metrics."""
  missing = [lang for lang in list(high) + list(low) if 'corpus_bleu_' + lang not in metrics]
  if 'corpus_bleu' not in metrics or missing:
    raise ValueError('score file lacks corpus_bleu%s' %
                     ('' if not missing else ' for languages %s' % ', '.join(missing)))

  def Mean(langs):
    return 100.0 * sum(metrics['corpus_bleu_' + lang] for lang in langs) / len(langs)

  return 100.0 * metrics['corpus_bleu'], Mean(high), Mean(low)


def PairedDifference(metrics_a, metrics_b, langs):
  """(mean, standard error, languages where a is higher) of a's minus b's BLEU (0-100) per language.

  The standard error is over languages (test-set variation only, not seed variation); it needs at
  least two languages.
  """
  if len(langs) < 2:
    raise ValueError('need at least 2 languages for a standard error, got %r' % (list(langs),))
  diffs = [100.0 * (metrics_a['corpus_bleu_' + l] - metrics_b['corpus_bleu_' + l]) for l in langs]
  mean = sum(diffs) / len(diffs)
  var = sum((d - mean)**2 for d in diffs) / (len(diffs) - 1)
  return mean, (var / len(diffs))**0.5, sum(d > 0 for d in diffs)


def FormatTable(rows):
  """A Markdown table of (model, parameters, overall, high, low) rows, with high - low per model and,
  for two or more rows, a last row of the first model minus the second."""
  lines = ['| model | parameters | BLEU | high-resource | low-resource | high - low |',
           '|---|---:|---:|---:|---:|---:|']
  for model, params, overall, high, low in rows:
    lines.append('| %s | %s | %.1f | %.1f | %.1f | %.1f |' %
                 (model, '{:,}'.format(params), overall, high, low, high - low))
  if len(rows) >= 2:
    a, b = rows[0], rows[1]
    lines.append('| %s - %s | %+d | %+.1f | %+.1f | %+.1f | |' %
                 (a[0].split('.')[-1], b[0].split('.')[-1], a[1] - b[1], a[2] - b[2], a[3] - b[3],
                  a[4] - b[4]))
  return '\n'.join(lines)


def _Run(cmd, log_path):
  """Runs `cmd` with its output in log_path; returns wall seconds; exits naming the log on failure."""
  start = time.time()
  print('$ %s  (log: %s)' % (' '.join(cmd), log_path), flush=True)
  with open(log_path, 'a') as log:
    rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if rc != 0:
    raise SystemExit('deep_vs_wide: %s exited with %d; see %s' % (cmd[3], rc, log_path))
  return time.time() - start


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--logdir_root', required=True, help='One logdir per model is made under it.')
  parser.add_argument('--steps', type=int, default=1000, help='Training steps per model.')
  parser.add_argument('--models', default=','.join(DEFAULT_MODELS),
                      help='Comma-separated registered models, trained in this order.')
  parser.add_argument('--num_extreme', type=int, default=10,
                      help='Languages in each of the high- and low-resource groups.')
  args = parser.parse_args(argv)
  if args.steps < 1:
    raise SystemExit('deep_vs_wide: --steps must be positive, got %d' % args.steps)
  models = [m for m in args.models.split(',') if m]

  registered = train.RegisteredModels()
  unknown = [m for m in models if m not in registered]
  if unknown:
    raise SystemExit('deep_vs_wide: unregistered models %s' % ', '.join(unknown))
  _, manifest = num2words_corpus.EnsureCorpus()
  high, low = SplitByResource(dict(zip(manifest['languages'], manifest['train_sizes'])),
                              args.num_extreme)

  rows, scores = [], []
  for model in models:
    logdir = os.path.join(args.logdir_root, model.replace('.', '_'))
    os.makedirs(logdir, exist_ok=True)
    times_path = os.path.join(logdir, 'wall_times.json')
    times = json.load(open(times_path)) if os.path.exists(times_path) else {}
    if not os.path.exists(CheckpointPath(logdir, args.steps)):
      times['train_s'] = _Run(TrainerCommand(model, logdir, args.steps),
                              os.path.join(logdir, 'train.log'))
      times.pop('decode_s', None)
    if not os.path.exists(ScorePath(logdir, args.steps)):
      times['decode_s'] = _Run(TrainerCommand(model, logdir, args.steps, job='decoder_test'),
                               os.path.join(logdir, 'decode.log'))
    with open(times_path, 'w') as f:
      json.dump(times, f)
    params = param_count.CountParameters(registered[model]().Task())
    scores.append(ReadScores(ScorePath(logdir, args.steps)))
    rows.append((model, params) + Summarize(scores[-1], high, low))
    print('%s: train %s s, decode %s s' % (model, *(
        '%.0f' % times[k] if k in times else '?' for k in ('train_s', 'decode_s'))), flush=True)

  print('\nstep %d; high-resource: the %d languages with the most training examples (%s), '
        'low-resource: the %d with the fewest (%s); BLEU 0-100, means over languages\n' %
        (args.steps, len(high), ', '.join(high), len(low), ', '.join(low)))
  print(FormatTable(rows))
  if len(rows) >= 2:
    for name, langs in (('high-resource', high), ('low-resource', low)):
      mean, stderr, wins = PairedDifference(scores[0], scores[1], langs)
      print('%s: %s - %s per language %+.1f +- %.1f BLEU (mean +- standard error over %d languages);'
            ' higher in %d of %d' % (name, rows[0][0], rows[1][0], mean, stderr, len(langs), wins,
                                     len(langs)))


if __name__ == '__main__':
  main(sys.argv[1:])
