"""MultilingualInput on a small num2words corpus: temperature sampling frequencies, batch contents.

The corpus (6 languages, imbalanced 200 .. 10 examples) is generated once into a temporary directory
by num2words_corpus (in a subprocess, as the input generator would).
"""

import os

import numpy as np
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.tasks.mt import mt_input
from tensorpipe.tasks.mt import temperature_sampling
from tests import corpus_helpers

LANGS = ['de', 'fr', 'ja', 'ru', 'tr', 'vi']


def _Params(split, temperature=5.0, batch=256):
  p = mt_input.MultilingualInput.Params().Set(data_dir=corpus_helpers.Num2WordsCorpus(),
                                              split=split,
                                              languages=LANGS, temperature=temperature)
  p.batch_size = batch
  return p


class MultilingualInputTest(test_utils.TestCase):

  def testTemperatureSamplingFrequenciesMatchFormula(self):
    for temperature in (1.0, 5.0):
      with self.session(graph=tf.Graph()) as sess:
        gen = _Params('train', temperature).Instantiate()
        batch = gen.GetPreprocessedInputBatch()
        gen.Initialize(sess)
        counts = np.zeros(len(LANGS))
        num_batches = 40
        for _ in range(num_batches):
          counts += np.bincount(sess.run(batch.lang), minlength=len(LANGS))
      n = counts.sum()
      expected = temperature_sampling.LanguageProbabilities(gen.sizes, temperature)
      self.assertAllClose(gen.probabilities, expected)
      # Binomial standard error; 4 sigma.
      sigma = np.sqrt(expected * (1 - expected) / n)
      self.assertLess(np.max(np.abs(counts / n - expected) / sigma), 4.0,
                      (temperature, counts / n, expected))
    # The corpus is imbalanced, so T = 5 and T = 1 really differ.
    sizes = np.array(gen.sizes, np.float64)
    self.assertGreater(sizes.max() / sizes.min(), 5)

  def testStartAtStepReadsTheBatchesOfARunFromStepZero(self):

    def Batches(first_step, count):
      with self.session(graph=tf.Graph()) as sess:
        gen = _Params('train', batch=8).Instantiate()
        batch = gen.GetPreprocessedInputBatch()
        gen.Initialize(sess)
        gen.StartAtStep(sess, first_step)
        return [sess.run(batch.src.ids) for _ in range(count)]

    through = Batches(0, 6)
    self.assertFalse(np.array_equal(through[0], through[1]))
    self.assertAllEqual(Batches(4, 2), through[4:])

  def testTestSplitCoversEveryExampleOnceInOrder(self):
    with self.session(graph=tf.Graph()) as sess:
      gen = _Params('test', batch=16).Instantiate()
      batch = gen.GetPreprocessedInputBatch()
      gen.Initialize(sess)
      langs, refs = [], []
      try:
        while True:
          b = sess.run(batch)
          real = b.weight > 0
          langs += list(b.lang[real])
          for ids, pad in zip(b.tgt.labels[real], b.tgt.paddings[real]):
            refs.append(gen.IdsToText(ids[:int(np.sum(1 - pad))]))
          self.assertAllEqual(b.tgt.ids[real][:, 0], np.full(int(real.sum()), mt_input.BOS_ID))
      except tf.errors.OutOfRangeError:
        pass
    self.assertEqual(langs, [i for i in range(len(LANGS)) for _ in range(10)])
    with open(os.path.join(corpus_helpers.Num2WordsCorpus(), 'de.test.tsv'), encoding='utf-8') as f:
      expected = [line.rstrip('\n').split('\t')[1] for line in f]
    self.assertEqual(refs[:10], expected)

  def testBadInput(self):
    with self.assertRaisesRegex(ValueError, "language 'xx' has no file"):
      _Params('train').Set(languages=['de', 'xx']).Instantiate()
    with self.assertRaisesRegex(ValueError, 'temperature must be > 0, got -1'):
      _Params('train', temperature=-1).Instantiate()


if __name__ == '__main__':
  tf.test.main()
