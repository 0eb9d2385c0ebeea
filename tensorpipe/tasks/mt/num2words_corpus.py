"""The built-in multilingual corpus: numbers in ~45 languages (by `num2words`) -> English words.

A deterministic stand-in for the paper's 102-languages-to-English setup that trains on a CPU in
minutes. Every language gets a disjoint train/test split of the integers 0..max_number; train sizes
are deliberately imbalanced (geometric, from `max_train` examples for the highest-resource language
down to `min_train` for the lowest), so temperature sampling and per-language BLEU behave as in the
paper. The language ranking is a fixed permutation (seeded), so the corpus is byte-identical on
every machine with the pinned num2words.

Files written to a directory:
  <lang>.train.tsv, <lang>.test.tsv   'source<TAB>english' lines;
  spm.model, spm.vocab                a shared SentencePiece vocabulary over sources and targets
                                      (pad 0, unk 1, bos 2, eos 3);
  manifest.json                       languages, sizes and the generation settings.

`EnsureCorpus(dir)` generates it there unless a complete copy with the same settings exists; writing
goes to a temporary sibling directory renamed into place, so concurrent jobs do not see half a
corpus.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

VERSION = 1
# num2words converters whose output is not a foreign language (en*), duplicates a base language
# (regional variants), or fails on small integers ('am' in 0.5.14).
_EXCLUDED = ('en', 'am')
DEFAULTS = dict(max_number=999, num_test=40, max_train=900, min_train=20, vocab_size=2000,
                seed=1234)


def DefaultDir():
  """$TENSORPIPE_DATA/num2words-v<VERSION>, or ~/.cache/tensorpipe/num2words-v<VERSION>."""
  root = os.environ.get('TENSORPIPE_DATA') or os.path.join(os.path.expanduser('~'), '.cache',
                                                           'tensorpipe')
  return os.path.join(root, 'num2words-v%d' % VERSION)


def Languages():
  """The source languages: num2words' base (non-regional) converters, minus English and 'am'."""
  from num2words import CONVERTER_CLASSES  # pylint: disable=g-import-not-at-top
  return sorted(l for l in CONVERTER_CLASSES if '_' not in l and l not in _EXCLUDED)


def TrainSizes(num_languages, max_train, min_train):
  """Geometric sizes from max_train down to min_train (integers, non-increasing)."""
  if num_languages == 1:
    return [max_train]
  ratio = (min_train / max_train)**(1.0 / (num_languages - 1))
  return [int(round(max_train * ratio**i)) for i in range(num_languages)]


def _English(n):
  from num2words import num2words  # pylint: disable=g-import-not-at-top
  return num2words(n, lang='en').replace(',', '')


def _Clean(text):
  return ' '.join(text.replace('\t', ' ').split())


def Generate(out_dir, max_number=999, num_test=40, max_train=900, min_train=20, vocab_size=2000,
             seed=1234):
  """Writes the corpus and its SentencePiece vocab to `out_dir` (created); returns the manifest."""
  from num2words import num2words  # pylint: disable=g-import-not-at-top
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  if max_train + num_test > max_number + 1:
    raise ValueError('Generate: max_train %d + num_test %d exceed the %d numbers 0..max_number=%d' %
                     (max_train, num_test, max_number + 1, max_number))
  if not 0 < min_train <= max_train:
    raise ValueError('Generate: need 0 < min_train <= max_train, got min_train=%r max_train=%r' %
                     (min_train, max_train))
  os.makedirs(out_dir, exist_ok=True)
  rng = np.random.RandomState(seed)
  langs = Languages()
  ranking = [langs[i] for i in rng.permutation(len(langs))]
  sizes = dict(zip(ranking, TrainSizes(len(ranking), max_train, min_train)))
  english = [_English(n) for n in range(max_number + 1)]
  text_for_vocab = []
  for lang in langs:
    numbers = rng.permutation(max_number + 1)
    splits = {'test': numbers[:num_test], 'train': numbers[num_test:num_test + sizes[lang]]}
    for split, nums in splits.items():
      lines = []
      for n in nums:
        src = _Clean(num2words(int(n), lang=lang))
        lines.append('%s\t%s\n' % (src, english[n]))
        if split == 'train':
          text_for_vocab.append(src)
      with open(os.path.join(out_dir, '%s.%s.tsv' % (lang, split)), 'w', encoding='utf-8') as f:
        f.writelines(lines)
  text_for_vocab.extend(english)
  vocab_input = os.path.join(out_dir, 'vocab_input.txt')
  with open(vocab_input, 'w', encoding='utf-8') as f:
    f.write('\n'.join(text_for_vocab) + '\n')
  spm.SentencePieceTrainer.Train(
      input=vocab_input, model_prefix=os.path.join(out_dir, 'spm'), vocab_size=vocab_size,
      model_type='unigram', character_coverage=1.0, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
      hard_vocab_limit=False, num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
      minloglevel=2)
  os.remove(vocab_input)
  manifest = dict(version=VERSION, languages=langs, train_sizes=[sizes[l] for l in langs],
                  num_test=num_test, settings=dict(max_number=max_number, num_test=num_test,
                                                   max_train=max_train, min_train=min_train,
                                                   vocab_size=vocab_size, seed=seed))
  with open(os.path.join(out_dir, 'manifest.json'), 'w', encoding='utf-8') as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
  return manifest


def GenerateInSubprocess(out_dir, **settings):
  """Generate() in a fresh Python process: SentencePiece training crashes in a process that has
  imported TensorFlow (conflicting native libraries), and every TensorPipe job has."""
  code = ('import json, sys; from tensorpipe.tasks.mt import num2words_corpus as c; '
          'c.Generate(sys.argv[1], **json.loads(sys.argv[2]))')
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join([root] + [x for x in [env.get('PYTHONPATH')] if x])
  subprocess.run([sys.executable, '-c', code, out_dir, json.dumps(settings)], check=True, env=env)


def ReadManifest(data_dir):
  """The manifest of the corpus in `data_dir`, or None if there is no complete corpus there."""
  path = os.path.join(data_dir, 'manifest.json')
  if not os.path.isfile(path) or not os.path.isfile(os.path.join(data_dir, 'spm.model')):
    return None
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def EnsureCorpus(data_dir=None, **settings):
  """Returns (data_dir, manifest), generating the corpus in data_dir (or DefaultDir()) if needed."""
  data_dir = data_dir or DefaultDir()
  wanted = dict(DEFAULTS, **settings)
  manifest = ReadManifest(data_dir)
  if manifest is not None and manifest.get('settings') == wanted:
    return data_dir, manifest
  if manifest is not None:
    raise ValueError('EnsureCorpus: %r holds a corpus generated with %r, not %r; use another '
                     'directory' % (data_dir, manifest.get('settings'), wanted))
  parent = os.path.dirname(os.path.abspath(data_dir))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix='.num2words-', dir=parent)
  try:
    GenerateInSubprocess(tmp, **wanted)
    try:
      os.rename(tmp, data_dir)
    except OSError:  # Another job finished first.
      if ReadManifest(data_dir) is None:
        raise
  finally:
    if os.path.isdir(tmp):
      shutil.rmtree(tmp)
  return data_dir, ReadManifest(data_dir)
