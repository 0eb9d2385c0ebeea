"""The num2words corpus: byte-identical when generated again, imbalanced, train/test disjoint."""

import os
import tempfile

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.tasks.mt import num2words_corpus
from tests import corpus_helpers


class CorpusTest(test_utils.TestCase):

  def testDeterministicAndImbalanced(self):
    manifest = num2words_corpus.ReadManifest(corpus_helpers.Num2WordsCorpus())
    self.assertGreaterEqual(len(manifest['languages']), 40)
    self.assertEqual(max(manifest['train_sizes']), 200)
    self.assertEqual(min(manifest['train_sizes']), 10)
    other = os.path.join(tempfile.mkdtemp(), 'again')
    num2words_corpus.EnsureCorpus(other, **manifest['settings'])
    for name in ('de.train.tsv', 'ja.test.tsv', 'spm.vocab'):
      with (open(os.path.join(corpus_helpers.Num2WordsCorpus(), name), 'rb') as a,
            open(os.path.join(other, name), 'rb') as b):
        self.assertEqual(a.read(), b.read(), name)
    with open(os.path.join(corpus_helpers.Num2WordsCorpus(), 'de.test.tsv'), encoding='utf-8') as f:
      test_numbers = {line.split('\t')[1] for line in f}
    with open(os.path.join(corpus_helpers.Num2WordsCorpus(), 'de.train.tsv'),
              encoding='utf-8') as f:
      train_numbers = {line.rstrip('\n').split('\t')[1] for line in f}
    self.assertFalse({t.rstrip('\n') for t in test_numbers} & train_numbers)


if __name__ == '__main__':
  tf.test.main()
