"""Deep vs wide on the num2words corpus: the runs' commands and files, and their scores compared.

The GPipe paper compares a deep and a wide Transformer of about the same parameter count and finds
the deeper one better on low-resource languages and similar on high-resource ones. This module holds
that experiment's logic, apart from running it (tools/deep_vs_wide.py runs it): the trainer commands
that train a model and decode its final checkpoint, where their checkpoint and score files land,
the split of the corpus's languages by training examples, and the per-model and paired summaries of
the decoder's per-language BLEU.
"""

import os
import re
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

CPU_DEVICES = 2  # Logical CPU devices of every run: the models' K.

SummaryRow = Tuple[str, int, float, float, float]  # (model, parameters, overall, high, low)


def TrainerCommand(model: str, logdir: str, steps: int, job: Optional[str] = None,
                   python: str = sys.executable) -> List[str]:
  """The tensorpipe.trainer.train command line that trains (job None) or runs `job` for `model`."""
  cmd = [python, '-m', 'tensorpipe.trainer.train', '--model=%s' % model,
         '--cpu_devices=%d' % CPU_DEVICES, '--mode=sync', '--run_locally=cpu',
         '--logdir=%s' % logdir,
         # The trainer and the decoder stop at the model's train.max_steps (Lingvo copies it from
         # task.train.max_steps before overrides apply; set both so the two agree).
         '--model_params_override=train.max_steps:%d;task.train.max_steps:%d' % (steps, steps)]
  if job:
    cmd.append('--job=%s' % job)
  return cmd


def CheckpointPath(logdir: str, step: int) -> str:
  """The index file of the trainer's checkpoint at `step`."""
  return os.path.join(logdir, 'train', 'ckpt-%08d.index' % step)


def ScorePath(logdir: str, step: int) -> str:
  """The decoder_test job's score file for the checkpoint at `step`."""
  return os.path.join(logdir, 'decoder_test', 'score-%08d.txt' % step)


def ReadScores(path: str) -> Dict[str, float]:
  """{metric: value} from a score file of `name: value` lines (BLEU on Lingvo's 0-1 scale)."""
  metrics = {}
  with open(path, encoding='utf-8') as f:
    for num, line in enumerate(f, 1):
      if not line.strip():
        continue
      m = re.match(r'^\s*([^\s:]+)\s*:\s*(\S+)\s*$', line)
      if not m:
        raise ValueError('%s:%d: expected "name: value", got %r' % (path, num, line.rstrip()))
      metrics[m.group(1)] = float(m.group(2))
  return metrics


def SplitByResource(train_sizes: Mapping[str, int],
                    num_extreme: int) -> Tuple[List[str], List[str]]:
  """(high, low): the `num_extreme` languages with the most and with the fewest training examples.

  train_sizes maps language -> training examples; ties are broken by language code so the split is
  deterministic. The two groups must not overlap.
  """
  if num_extreme < 1 or 2 * num_extreme > len(train_sizes):
    raise ValueError('num_extreme must be in [1, %d] for %d languages, got %d' %
                     (len(train_sizes) // 2, len(train_sizes), num_extreme))
  ranked = sorted(train_sizes, key=lambda lang: (-train_sizes[lang], lang))
  return ranked[:num_extreme], ranked[-num_extreme:]


def Summarize(metrics: Mapping[str, float], high: Sequence[str],
              low: Sequence[str]) -> Tuple[float, float, float]:
  """(overall, mean high-resource, mean low-resource) BLEU on a 0-100 scale from decoder metrics."""
  missing = [lang for lang in list(high) + list(low) if 'corpus_bleu_' + lang not in metrics]
  if 'corpus_bleu' not in metrics or missing:
    raise ValueError('score file lacks corpus_bleu%s' %
                     ('' if not missing else ' for languages %s' % ', '.join(missing)))

  def Mean(langs):
    return 100.0 * sum(metrics['corpus_bleu_' + lang] for lang in langs) / len(langs)

  return 100.0 * metrics['corpus_bleu'], Mean(high), Mean(low)


def PairedDifference(metrics_a: Mapping[str, float], metrics_b: Mapping[str, float],
                     langs: Sequence[str]) -> Tuple[float, float, int]:
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


def FormatTable(rows: Sequence[SummaryRow]) -> str:
  """A Markdown table of (model, parameters, overall, high, low) rows, with high - low per model.

  For two or more rows, a last row gives the first model minus the second.
  """
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
