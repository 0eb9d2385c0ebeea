"""A small num2words corpus for the TensorPipe tests, generated once per process."""

import os
import tempfile

from tensorpipe.tasks.mt import num2words_corpus

_NUM2WORDS_DIR = None  # Num2WordsCorpus's directory, once generated.


def Num2WordsCorpus():
  """The directory of a small num2words corpus, generated once per process.

  Imbalanced: 200 .. 10 train examples per language, and 10 test examples each.
  """
  global _NUM2WORDS_DIR
  if _NUM2WORDS_DIR is None:
    _NUM2WORDS_DIR = os.path.join(tempfile.mkdtemp(), 'corpus')
    num2words_corpus.EnsureCorpus(_NUM2WORDS_DIR, max_number=299, num_test=10, max_train=200,
                                  min_train=10, vocab_size=400)
  return _NUM2WORDS_DIR
