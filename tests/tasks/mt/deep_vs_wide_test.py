"""Deep vs wide without training: the high/low-resource split, score parsing, the summary table,
the trainer command; and the two registered models it compares, built and counted."""

import os
import tempfile

from lingvo import compat as tf
from lingvo.core import test_utils

from params import mt
from tensorpipe.tasks.mt import deep_vs_wide
from tensorpipe.trainer import param_count
from tests import helpers


class DeepVsWideTest(test_utils.TestCase):

  def testSplitRanksByTrainingExamples(self):
    sizes = {'a': 900, 'b': 20, 'c': 400, 'd': 45, 'e': 100, 'f': 45}
    high, low = deep_vs_wide.SplitByResource(sizes, 2)
    self.assertEqual(high, ['a', 'c'])
    self.assertEqual(low, ['f', 'b'])  # d and f tie at 45: ranked by code, so d stays out.
    with self.assertRaisesRegex(ValueError, r'num_extreme must be in \[1, 3\].*got 4'):
      deep_vs_wide.SplitByResource(sizes, 4)

  def testSummaryAndTableFromAScoreFile(self):
    with tempfile.TemporaryDirectory() as d:
      path = os.path.join(d, 'score-00000800.txt')
      with open(path, 'w') as f:
        f.write('corpus_bleu: 0.9\ncorpus_bleu_a: 1\ncorpus_bleu_c: 0.8\n'
                'corpus_bleu_b: 0.5\ncorpus_bleu_d: 0.7\nexamples/sec: 84.6\n')
      metrics = deep_vs_wide.ReadScores(path)
      self.assertEqual((metrics['corpus_bleu_a'], metrics['examples/sec']), (1.0, 84.6))
      overall, high, low = deep_vs_wide.Summarize(metrics, ['a', 'c'], ['d', 'b'])
      self.assertAllClose((overall, high, low), (90.0, 90.0, 60.0))
      with self.assertRaisesRegex(ValueError, 'for languages zz'):
        deep_vs_wide.Summarize(metrics, ['a', 'c'], ['zz'])
      with open(path, 'a') as f:
        f.write('not a score line\n')
      with self.assertRaisesRegex(ValueError, r'score-00000800.txt:7: expected'):
        deep_vs_wide.ReadScores(path)
    table = deep_vs_wide.FormatTable([('mt.Deep', 1000, 90.0, 95.0, 80.0),
                                      ('mt.Wide', 990, 88.0, 96.0, 70.0)])
    lines = table.splitlines()
    self.assertEqual(len(lines), 5)
    self.assertEqual(lines[2], '| mt.Deep | 1,000 | 90.0 | 95.0 | 80.0 | 15.0 |')
    self.assertEqual(lines[4], '| Deep - Wide | +10 | +2.0 | -1.0 | +10.0 | |')

  def testPairedDifference(self):
    a = {'corpus_bleu_x': 0.9, 'corpus_bleu_y': 0.7, 'corpus_bleu_z': 0.5}
    b = {'corpus_bleu_x': 0.8, 'corpus_bleu_y': 0.8, 'corpus_bleu_z': 0.2}
    # Differences 10, -10, 30.
    mean, stderr, wins = deep_vs_wide.PairedDifference(a, b, ['x', 'y', 'z'])
    self.assertAllClose((mean, stderr), (10.0, (400.0 / 3)**0.5))
    self.assertEqual(wins, 2)
    with self.assertRaisesRegex(ValueError, r"at least 2 languages.*\['x'\]"):
      deep_vs_wide.PairedDifference(a, b, ['x'])

  def testTrainerCommandAndPaths(self):
    cmd = deep_vs_wide.TrainerCommand('mt.Num2WordsDeepT', '/l', 800, job='decoder_test',
                                      python='py')
    self.assertEqual(cmd[:3], ['py', '-m', 'tensorpipe.trainer.train'])
    for flag in ('--model=mt.Num2WordsDeepT', '--cpu_devices=2', '--mode=sync', '--run_locally=cpu',
                 '--logdir=/l',
                 '--model_params_override=train.max_steps:800;task.train.max_steps:800',
                 '--job=decoder_test'):
      self.assertIn(flag, cmd)
    self.assertNotIn('--job=decoder_test', deep_vs_wide.TrainerCommand('m', '/l', 800))
    self.assertEqual(deep_vs_wide.CheckpointPath('/l', 800), '/l/train/ckpt-00000800.index')
    self.assertEqual(deep_vs_wide.ScorePath('/l', 800), '/l/decoder_test/score-00000800.txt')

  def testRegisteredModelsMatchInParametersNotInShape(self):
    counts = {}
    for cls, (layers, ffn) in ((mt.Num2WordsDeepT, (6, 256)), (mt.Num2WordsWideT, (3, 704))):
      p = cls().Task()
      self.assertEqual(len(p.encoder.layers), layers + 1)  # + the final layer norm.
      self.assertEqual(len(p.decoder.layers), layers + 1)
      self.assertEqual(p.encoder.num_devices, 2)
      self.assertEqual(p.decoder.layers[0].ffn_dim, ffn)
      self.assertEqual((p.model_dim, p.decoder.layers[0].num_heads), (64, 4))
      counts[cls] = param_count.CountParameters(p)
      self.assertEqual(counts[cls], helpers.TransformerParameterCount(
          layers, 64, ffn, 4, p.vocab_size, head_dim=16))
    self.assertEqual(counts, {mt.Num2WordsDeepT: 954064, mt.Num2WordsWideT: 952912})
    self.assertAllClose(counts[mt.Num2WordsDeepT], counts[mt.Num2WordsWideT], rtol=0.05)
    self.assertEqual(mt.Num2WordsDeepT.MAX_STEPS, mt.Num2WordsWideT.MAX_STEPS)


if __name__ == '__main__':
  tf.test.main()
