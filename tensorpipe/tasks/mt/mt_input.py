"""Multilingual translation input: per-language parallel files, temperature-sampled train batches.

`MultilingualInput` reads `<data_dir>/<lang>.<split>.tsv` ('source<TAB>target' lines) for every
language of `languages`, tokenises both sides with one shared SentencePiece model, and keeps the ids
in host memory (fed to an initializable tf.data iterator, so the graph holds no copy of the data).

  train split: an endless stream; each example's language l is drawn with probability
               temperature_sampling.LanguageProbabilities(D, temperature)[l] (D_l = examples of l),
               then an example of l uniformly; stateless random ops seeded by `seed` and the
               batch's place in the stream, so runs repeat, and StartAtStep(sess, step) starts
               at the batch step + 1 reads (the trainer calls it after every restore).
  other splits: every example of every language once, in file order, the last batch padded with
               weight 0 (set resettable=True for the evaler / decoder).

Batches (b = InfeedBatchSize(), S = source_max_length, T = target_max_length):
  src.ids [b, S] int32 (pieces + eos), src.paddings [b, S] float32;
  tgt.ids [b, T] (bos + pieces), tgt.labels [b, T] (pieces + eos), tgt.paddings, tgt.weights [b, T];
  lang [b] int32 (index into `languages`), weight [b] float32 (0 for padding examples).
With `data_dir` empty the built-in num2words corpus is generated on first use (num2words_corpus).
"""

import os
from typing import Any, Dict, List

import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils

from tensorpipe.tasks import fed_input
from tensorpipe.tasks.mt import num2words_corpus
from tensorpipe.tasks.mt import temperature_sampling

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class MultilingualInput(fed_input.FedInput):
  """Translation batches from per-language files, languages sampled with temperature T."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.name = 'multilingual_input'
    p.batch_size = 64
    p.Define('data_dir', '',
             'Directory of <lang>.<split>.tsv files; empty: the built-in num2words corpus, '
             'generated on first use under num2words_corpus.DefaultDir().')
    p.Define('vocab_file', '', 'SentencePiece model; empty: <data_dir>/spm.model.')
    p.Define('languages', None, 'Language codes to read (list); None: every <lang>.<split>.tsv.')
    p.Define('split', 'train', "'train' (temperature-sampled, endless) or another file split "
             "(e.g. 'test', read once in order).")
    p.Define('temperature', 5.0, 'T of the language sampling p_l^(1/T) (1: proportional, large: '
             'uniform); the paper uses 5.')
    p.Define('source_max_length', 32, 'S: source pieces + eos per example; longer train examples '
             'are dropped, longer eval examples truncated.')
    p.Define('target_max_length', 16, 'T: target pieces + bos/eos per example (same rule).')
    p.Define('seed', 1234, 'Seed of the language and example sampling.')
    return p

  @classmethod
  def CheckDataSource(cls, p):
    """Raises ValueError naming the directory if data_dir is set but holds no files of the split."""
    if p.data_dir and not os.path.isdir(p.data_dir):
      raise ValueError('MultilingualInput: data_dir %r does not exist' % p.data_dir)

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    where = 'MultilingualInput %r' % p.name
    if not p.temperature > 0:
      raise ValueError('%s: temperature must be > 0, got %r' % (where, p.temperature))
    data_dir = p.data_dir or num2words_corpus.EnsureCorpus()[0]
    self.CheckDataSource(p)
    self._data_dir = data_dir
    langs = list(p.languages) if p.languages else sorted(
        f[:-len('.%s.tsv' % p.split)] for f in os.listdir(data_dir)
        if f.endswith('.%s.tsv' % p.split))
    if not langs:
      raise ValueError('%s: no <lang>.%s.tsv files in %r' % (where, p.split, data_dir))
    for lang in langs:
      if not os.path.isfile(self._Path(lang)):
        raise ValueError('%s: language %r has no file %s' % (where, lang, self._Path(lang)))
    self._languages = langs
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    vocab = p.vocab_file or os.path.join(data_dir, 'spm.model')
    if not os.path.isfile(vocab):
      raise ValueError('%s: vocab_file %r does not exist' % (where, vocab))
    self._sp = spm.SentencePieceProcessor(model_file=vocab)
    self._arrays = self._Load()
    self.sizes = [int(np.sum(self._arrays['lang'] == i)) for i in range(len(langs))]
    for lang, n in zip(langs, self.sizes):
      if n == 0:
        raise ValueError('%s: language %r has no usable %s examples in %s' %
                         (where, lang, p.split, self._Path(lang)))
    self.probabilities = temperature_sampling.LanguageProbabilities(self.sizes, p.temperature)
    tf.logging.info('%s: %d languages, %d %s examples from %s', where, len(langs),
                    sum(self.sizes), p.split, data_dir)
    self._feeds: Dict[str, Any] = {}  # Per array its placeholder, made with the input batch.

  @property
  def languages(self):
    return list(self._languages)

  @property
  def vocab_size(self):
    return self._sp.GetPieceSize()

  def _Path(self, lang):
    return os.path.join(self._data_dir, '%s.%s.tsv' % (lang, self.params.split))

  def IdsToText(self, ids):
    """Detokenised text of a list of piece ids (pad/bos/eos dropped)."""
    return self._sp.DecodeIds([int(i) for i in ids if int(i) > EOS_ID])

  def _Load(self):
    """Padded id arrays of all languages: src, tgt_ids, tgt_labels, src_len, tgt_len, lang."""
    p = self.params
    s_max, t_max = p.source_max_length, p.target_max_length
    cols: Dict[str, List[Any]] = {
        k: [] for k in ('src', 'tgt_ids', 'tgt_labels', 'src_len', 'tgt_len', 'lang')}
    dropped = 0
    for li, lang in enumerate(self._languages):
      with open(self._Path(lang), encoding='utf-8') as f:
        for line_no, line in enumerate(f, 1):
          line = line.rstrip('\n')
          if not line:
            continue
          if line.count('\t') != 1:
            raise ValueError('MultilingualInput: %s line %d is not "source<TAB>target": %r' %
                             (self._Path(lang), line_no, line[:80]))
          src_text, tgt_text = line.split('\t')
          src = self._sp.EncodeAsIds(src_text) + [EOS_ID]
          tgt = self._sp.EncodeAsIds(tgt_text)
          if len(src) > s_max or len(tgt) + 1 > t_max:
            if p.split == 'train':
              dropped += 1
              continue
            src, tgt = src[:s_max], tgt[:t_max - 1]
          cols['src'].append(src + [PAD_ID] * (s_max - len(src)))
          cols['tgt_ids'].append([BOS_ID] + tgt + [PAD_ID] * (t_max - 1 - len(tgt)))
          cols['tgt_labels'].append(tgt + [EOS_ID] + [PAD_ID] * (t_max - 1 - len(tgt)))
          cols['src_len'].append(len(src))
          cols['tgt_len'].append(len(tgt) + 1)
          cols['lang'].append(li)
    if dropped:
      tf.logging.warning('MultilingualInput: dropped %d train examples longer than %d/%d pieces',
                         dropped, s_max, t_max)
    return {k: np.asarray(v, np.int32) for k, v in cols.items()}

  def _InputBatch(self):
    p = self.params
    b = self.InfeedBatchSize()
    feeds = {k: tf.placeholder(tf.int32, [None] + list(v.shape[1:]), name=k)
             for k, v in self._arrays.items()}
    self._feeds = feeds
    if p.split == 'train':
      starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
      log_q = tf.constant(np.log(self.probabilities)[None, :], tf.float32)
      sizes = tf.constant(self.sizes, tf.int64)
      starts = tf.constant(starts, tf.int64)

      def Sample(i):
        lang = tf.random.stateless_categorical(log_q, b, seed=[p.seed, i])[0]
        u = tf.random.stateless_uniform([b], seed=[p.seed + 1, i])
        size = tf.gather(sizes, lang)
        idx = tf.gather(starts, lang) + tf.minimum(
            tf.cast(u * tf.cast(size, tf.float32), tf.int64), size - 1)
        out = {k: tf.gather(v, idx) for k, v in feeds.items()}
        out['weight'] = tf.ones([b], tf.float32)
        return out

      # Batch i draws from the stateless seeds (seed, i) alone: StartAtStep starts at any batch.
      self._first = tf.placeholder(tf.int64, [], name='first_batch')
      ds = tf.data.Dataset.range(self._first, 1 << 62).map(Sample)
    else:
      ds = tf.data.Dataset.from_tensor_slices(feeds).batch(b)

      def Pad(x):
        n = tf.shape(x['lang'])[0]
        out = {k: tf.pad(v, [[0, b - n]] + [[0, 0]] * (v.shape.rank - 1)) for k, v in x.items()}
        out['weight'] = tf.pad(tf.ones([n], tf.float32), [[0, b - n]])
        return out

      ds = ds.map(Pad)
    ds = ds.prefetch(2)
    self._iterator = tf.data.make_initializable_iterator(ds)
    x = self._iterator.get_next()
    s_max, t_max = p.source_max_length, p.target_max_length

    def Paddings(lengths, size):
      return 1.0 - tf.sequence_mask(lengths, size, dtype=tf.float32)

    src = py_utils.NestedMap(ids=x['src'], paddings=Paddings(x['src_len'], s_max))
    tgt_pad = Paddings(x['tgt_len'], t_max)
    tgt = py_utils.NestedMap(ids=x['tgt_ids'], labels=x['tgt_labels'], paddings=tgt_pad,
                             weights=(1.0 - tgt_pad) * x['weight'][:, None])
    batch = py_utils.NestedMap(src=src, tgt=tgt, lang=x['lang'], weight=x['weight'])
    for t, shape in ((src.ids, [b, s_max]), (src.paddings, [b, s_max]), (tgt.ids, [b, t_max]),
                     (tgt.labels, [b, t_max]), (tgt.paddings, [b, t_max]),
                     (tgt.weights, [b, t_max]), (batch.lang, [b]), (batch.weight, [b])):
      t.set_shape(shape)
    return batch

  def _Feeds(self):
    return {self._feeds[k]: v for k, v in self._arrays.items()}

  def _Position(self, global_step):
    """The train split: training step `global_step` + 1's batch (its batches are numbered from 0);
    another split starts at its beginning (it has no start placeholder)."""
    return global_step
