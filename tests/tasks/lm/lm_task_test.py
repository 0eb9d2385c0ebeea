"""PipelinedTransformerLm (Transformer-L): pipelined gradients equal plain ones; synthetic input."""

import zlib

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import builder_layers
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe.tasks.lm import lm_task
from tests import layer_helpers


def _Params(num_devices, num_micro_batches=1, pipelined=True):
  p = lm_task.TransformerLmParams(3, model_dim=16, ffn_dim=32, num_heads=2, head_dim=8,
                                  vocab_size=30, num_devices=num_devices,
                                  num_micro_batches=num_micro_batches, dropout_keep_prob=0.8)
  if not pipelined:
    p.stack = builder_layers.SequentialLayer.Params().Set(name='stack', sub=p.stack.layers)
  return p


def _Gradients(params, num_devices):
  graph = tf.Graph()
  with graph.as_default(), layer_helpers.Cluster(num_devices):
    py_utils.GetOrCreateGlobalStepVar()
    task = params.Instantiate()
    gen = lm_task.SyntheticLmInput.Params().Set(
        vocab_size=30, seq_len=6, batch_size=4).Instantiate()
    loss = task.FPropDefaultTheta(gen.GetPreprocessedInputBatch())[0]['loss'][0]
    variables = tf.trainable_variables()
    grads = [tf.convert_to_tensor(g) for g in
             tf.gradients(loss, variables, colocate_gradients_with_ops=True)]
    config = layer_helpers.ValuesOnlyConfig(num_devices)  # Build speed only.
    with tf.Session(graph=graph, config=config) as sess:
      sess.run(tf.global_variables_initializer())
      for v in variables:
        rng = np.random.RandomState(zlib.crc32(v.op.name.encode()))
        v.load((rng.normal(size=v.shape.as_list()) * 0.3).astype(np.float32), sess)
      values, loss_value = sess.run([grads, loss])
  return {v.op.name: g for v, g in zip(variables, values)}, loss_value


class PipelinedTransformerLmTest(test_utils.TestCase):

  @pytest.mark.slow
  def testPipelinedGradientsMatchPlainWithDropout(self):
    reference, ref_loss = _Gradients(_Params(1, pipelined=False), 4)
    for k, m in ((2, 2), (4, 4)):
      grads, loss = _Gradients(_Params(k, m), 4)
      self.assertAllClose(loss, ref_loss, rtol=1e-6, msg='K=%d M=%d' % (k, m))
      self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-5, 'K=%d M=%d' % (k, m))

  def testSyntheticInputShiftsLabels(self):
    with self.session(graph=tf.Graph()) as sess:
      py_utils.GetOrCreateGlobalStepVar()
      gen = lm_task.SyntheticLmInput.Params().Set(
          vocab_size=7, seq_len=5, batch_size=3).Instantiate()
      batch = gen.GetPreprocessedInputBatch()
      sess.run(tf.global_variables_initializer())
      b = sess.run(batch)
    self.assertEqual(b.ids.shape, (3, 5))
    self.assertAllEqual(b.ids[:, 1:], b.labels[:, :-1])
    self.assertBetween(int(b.ids.max()), 0, 6)

  def testMissingStackRaises(self):
    with self.assertRaisesRegex(ValueError, 'set `stack`'):
      lm_task.PipelinedTransformerLm.Params().Set(name='lm').Instantiate()


if __name__ == '__main__':
  tf.test.main()
