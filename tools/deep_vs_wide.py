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

Run time with the default models and --steps=1000: about 14 minutes on a 2-core CPU (the trainer's
table in docs/benchmarks.md, the same commands: mt.Num2WordsDeepT trains in 464 s and decodes in
21 s, mt.Num2WordsWideT 329 s and 17 s). Progress goes to stderr: a line when each run starts,
the latest training step every 30 s while a model trains (elapsed time every 30 s while it
decodes), and a line with its time when each run ends.
"""

import os

# TensorFlow's C++ start-up lines neither here nor in the training runs' logs (as the other tools).
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=wrong-import-position
import json
import re
import subprocess
import sys
import time

from absl import flags

from tensorpipe import progress as progress_lib
from tensorpipe.measure import machine
from tensorpipe.tasks.mt import deep_vs_wide
from tensorpipe.tasks.mt import num2words_corpus
from tensorpipe.trainer import command_line
from tensorpipe.trainer import param_count
from tensorpipe.trainer import registry
# pylint: enable=wrong-import-position

DEFAULT_MODELS = ('mt.Num2WordsDeepT', 'mt.Num2WordsWideT')

flags.DEFINE_string('logdir_root', None, 'One logdir per model is made under it (created if '
                    'missing).', required=True)
flags.register_validator('logdir_root', command_line.WritableDir)
flags.DEFINE_integer('steps', 1000, 'Training steps per model.', lower_bound=1)
flags.DEFINE_list('models', list(DEFAULT_MODELS),
                  'Comma-separated registered models, trained in this order.')
flags.DEFINE_integer('num_extreme', 10, 'Languages in each of the high- and low-resource groups.')
FLAGS = flags.FLAGS

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STEP = re.compile(r'step: *(\d+), steps/sec')  # Lingvo's line for every training step.
_REPORT_EVERY_S = 30  # How often a running command's latest step (or time) is reported.


class _LogSteps:
  """The latest training step in the lines appended to a log from its current end on."""

  def __init__(self, path):
    self._path = path
    self._offset = os.path.getsize(path) if os.path.exists(path) else 0
    self.step = 0

  def Read(self):
    with open(self._path, 'rb') as f:
      f.seek(self._offset)
      text = f.read()
    text = text[:text.rfind(b'\n') + 1]  # Whole lines only: the rest is read next time.
    self._offset += len(text)
    steps = _STEP.findall(text.decode('utf-8', 'replace'))
    if steps:
      self.step = int(steps[-1])
    return self.step


def _Run(cmd, log_path, progress, what, steps=None):
  """Runs `cmd`, output appended to log_path, as the progress phase `what` (of `steps` training
  steps, whose latest logged one it reports every 30 s; None: its time so far); returns wall
  seconds; exits naming the log on failure."""
  start = time.time()
  print('$ %s  (log: %s)' % (' '.join(cmd), log_path), flush=True)
  log_steps = _LogSteps(log_path)
  with open(log_path, 'a', encoding='utf-8') as log, progress.Phase(what, steps or 0) as phase:
    with subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=_REPO) as proc:
      try:
        while True:
          try:
            rc = proc.wait(timeout=_REPORT_EVERY_S)
            break
          except subprocess.TimeoutExpired:
            if steps:
              phase.Step(max(0, log_steps.Read() - phase.done))
            else:
              progress.Say('%s: %s so far' % (what, progress_lib.Seconds(phase.Elapsed())))
      except BaseException:  # E.g. Ctrl-C: the command ends with this one (as subprocess.call).
        proc.kill()
        raise
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

  progress = progress_lib.Progress(lambda line: print(line, file=sys.stderr, flush=True))
  rows, scores = [], []
  for i, model in enumerate(models):
    which = '%s (model %d of %d)' % (model, i + 1, len(models))
    logdir = os.path.join(args.logdir_root, model.replace('.', '_'))
    os.makedirs(logdir, exist_ok=True)
    times_path = os.path.join(logdir, 'wall_times.json')
    times = json.load(open(times_path)) if os.path.exists(times_path) else {}
    if os.path.exists(deep_vs_wide.CheckpointPath(logdir, args.steps)):
      progress.Say('deep_vs_wide: %s: its step-%d checkpoint exists, not trained again' %
                   (which, args.steps))
    else:
      times['train_s'] = _Run(deep_vs_wide.TrainerCommand(model, logdir, args.steps),
                              os.path.join(logdir, 'train.log'), progress,
                              'deep_vs_wide: training %s, steps' % which, args.steps)
      times.pop('decode_s', None)
    if os.path.exists(deep_vs_wide.ScorePath(logdir, args.steps)):
      progress.Say('deep_vs_wide: %s: its step-%d score file exists, not decoded again' %
                   (which, args.steps))
    else:
      times['decode_s'] = _Run(
          deep_vs_wide.TrainerCommand(model, logdir, args.steps, job='decoder_test'),
          os.path.join(logdir, 'decode.log'), progress,
          'deep_vs_wide: decoding %s (greedy, the test split)' % which)
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
