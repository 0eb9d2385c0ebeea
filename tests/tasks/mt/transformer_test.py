"""transformer: causal decoder layers ignore the future, encoder layers do not; dropout masks are
per example and per use; bad params raise."""

import re

import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils
from lingvo.core import tshape

from tensorpipe import randomness
from tensorpipe.tasks.mt import transformer


def _Run(layer_params, vec, aux=None):
  graph = tf.Graph()
  with graph.as_default():
    tf.random.set_seed(1)
    layer = layer_params.Instantiate()
    b, t, _ = vec.shape
    inputs = py_utils.NestedMap(vec=tf.constant(vec), paddings=tf.zeros([b, t]))
    if aux is not None:
      inputs.aux_vec = tf.constant(aux)
      inputs.aux_paddings = tf.zeros(aux.shape[:2])
    out = layer.FPropDefaultTheta(inputs)
    with tf.Session(graph=graph) as sess:
      sess.run(tf.global_variables_initializer())
      return sess.run(out.vec)


class TransformerLayerTest(test_utils.TestCase):

  def _Params(self, **kwargs):
    return transformer.TransformerLayer.Params().Set(name='layer', model_dim=8, ffn_dim=16,
                                                     num_heads=2, head_dim=4, **kwargs)

  def testCausalityAndCrossAttention(self):
    rng = np.random.RandomState(0)
    vec = rng.normal(size=[2, 5, 8]).astype(np.float32)
    aux = rng.normal(size=[2, 3, 8]).astype(np.float32)
    changed = vec.copy()
    changed[:, 3:] += rng.normal(size=[2, 2, 8])  # Change positions 3 and 4 only.
    for kwargs, extra in ((dict(is_decoder=True), aux), (dict(causal=True), None)):
      a, b = _Run(self._Params(**kwargs), vec, extra), _Run(self._Params(**kwargs), changed, extra)
      self.assertAllClose(a[:, :3], b[:, :3])  # The past does not see the future.
      self.assertGreater(np.abs(a[:, 3:] - b[:, 3:]).max(), 1e-3)
    a, b = _Run(self._Params(), vec), _Run(self._Params(), changed)
    self.assertGreater(np.abs(a[:, :3] - b[:, :3]).max(), 1e-3)  # The encoder sees everything.
    other_aux = _Run(self._Params(is_decoder=True), vec, aux + 1.0)
    self.assertGreater(
        np.abs(other_aux - _Run(self._Params(is_decoder=True), vec, aux)).max(), 1e-3)

  def testDropoutMasksArePerExampleAndPerUse(self):
    vec = np.random.RandomState(0).normal(size=[4, 5, 8]).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
      tf.random.set_seed(1)
      layer = self._Params(is_decoder=True, dropout_keep_prob=0.5).Instantiate()

      def Run(x, aux):
        return layer.FPropDefaultTheta(py_utils.NestedMap(
            vec=x, paddings=tf.zeros(py_utils.GetShape(x)[:2]), aux_vec=aux,
            aux_paddings=tf.zeros(py_utils.GetShape(aux)[:2]))).vec

      x = tf.constant(vec)
      full = Run(x, x)
      halves = []
      for offset in (0, 2):
        with randomness.ExampleOffset(offset):
          halves.append(Run(x[offset:offset + 2], x[offset:offset + 2]))
      same_examples = Run(tf.concat([x[:2], x[:2]], 0), tf.concat([x[:2], x[:2]], 0))
      masks = [op for op in graph.get_operations() if re.search(r'dropout_mask(_\d+)?$', op.name)]
      with tf.Session(graph=graph) as sess:
        sess.run(tf.global_variables_initializer())
        full, halves, same_examples = sess.run([full, tf.concat(halves, 0), same_examples])
    self.assertLen(masks, 4 * 4)  # Self-attention, cross-attention, feed-forward hidden and output.
    self.assertAllClose(full, halves, rtol=1e-5, atol=1e-5)  # Same masks in any micro-batch.
    self.assertGreater(np.abs(same_examples[:2] - same_examples[2:]).max(), 1e-3)  # Per example.
    self.assertGreater(np.abs(full - _Run(self._Params(is_decoder=True), vec, vec)).max(), 1e-3)

  def testFPropMetaCountsTheMatmulsAndPassesTheShapesOn(self):
    def Meta(params, b=2, t=5, s=3):
      inputs = py_utils.NestedMap(vec=tshape.Shape([b, t, 8]), paddings=tshape.Shape([b, t]))
      if params.is_decoder:
        inputs.aux_vec, inputs.aux_paddings = tshape.Shape([b, s, 8]), tshape.Shape([b, s])
      meta = params.cls.FPropMeta(params, inputs)
      self.assertEqual(meta.out_shapes, (inputs,))
      return meta.flops

    encoder, decoder = self._Params(), self._Params(is_decoder=True)
    self.assertEqual(Meta(encoder, b=4), 2 * Meta(encoder))  # Per example.
    # A wider feed-forward adds two B x T x D x 1 matmuls of 2 flops per multiply-add per unit.
    self.assertEqual(Meta(self._Params().Set(ffn_dim=17)) - Meta(encoder), 4 * 2 * 5 * 8)
    # The decoder adds attention to S positions: projections of the query (B T D W) and output
    # (B T W D), of the keys and values (2 B S D W), logits and context (2 B T S W), a softmax.
    w = 2 * 4
    cross = 4 * 2 * 5 * 8 * w + 4 * 2 * 3 * 8 * w + 4 * 2 * 5 * 3 * w + 5 * 2 * 2 * 5 * 3
    self.assertEqual(Meta(decoder) - Meta(encoder), cross + 10 * 2 * 5 * 8)
    norm = transformer.FinalNorm.Params().Set(name='norm', model_dim=8)
    self.assertEqual(norm.cls.FPropMeta(norm, py_utils.NestedMap(
        vec=tshape.Shape([2, 5, 8]), paddings=tshape.Shape([2, 5]))).flops, 10 * 2 * 5 * 8)

  def testBadParams(self):
    with self.assertRaisesRegex(ValueError, 'dropout_keep_prob must be in \\(0, 1\\], got 0'):
      self._Params(dropout_keep_prob=0).Instantiate()
    with self.assertRaisesRegex(ValueError, 'ffn_dim must be positive, got 0'):
      self._Params().Set(ffn_dim=0).Instantiate()
    with self.assertRaisesRegex(ValueError, 'num_layers must be a positive integer, got 0'):
      transformer.StackLayers(0, 8, 16, 2, is_decoder=False)


if __name__ == '__main__':
  tf.test.main()
