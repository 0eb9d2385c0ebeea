"""Registered translation params (params/mt.py): the paper's configurations, built and counted.

Every registered mt.* model's params are checked against the paper's settings; the smaller ones are
instantiated (variables declared in a graph, never allocated) and their parameter count must equal
the closed-form count of the architecture, which then gives the counts of the larger ones (also
printed, from built models, by tools/param_counts.py). Counts are compared with the paper's labels.
"""

import pytest
from lingvo import compat as tf
from lingvo import model_registry
from lingvo.core import optimizer
from lingvo.core import test_utils

from params import mt
from tensorpipe.trainer import model_plan
from tensorpipe.trainer import param_count
from tests import helpers

T_ROWS = {  # class: (L, H, A, partitions, paper's parameter label)
    mt.T6H8192A16: (6, 8192, 16, 1, 400e6),
    mt.T24H8192A16: (24, 8192, 16, 4, 1.3e9),
    mt.T12H16384A32: (12, 16384, 32, 2, 1.3e9),
    mt.T32H16384A32: (32, 16384, 32, 8, 3e9),
    mt.T64H16384A32: (64, 16384, 32, 16, 6e9),
}
TRANSFORMER_L = {  # class: (L, partitions, paper's Table 1 parameter count)
    mt.TransformerL3Naive1: (3, 1, 282.2e6),
    mt.TransformerL13Pipeline1: (13, 1, 785.8e6),
    mt.TransformerL103Pipeline8: (103, 8, 5.3e9),
    mt.TransformerL415Pipeline32: (415, 32, 21.0e9),
    mt.TransformerL1663Pipeline128: (1663, 128, 83.9e9),
}


def _Learner(cls):
  return cls().Task().train.learner


class MtParamsTest(test_utils.TestCase):

  def testEveryMtModelIsRegistered(self):
    keys = set(model_registry.GetAllRegisteredClasses())
    for cls in list(T_ROWS) + list(TRANSFORMER_L) + [
        mt.TransformerBig, mt.TransformerBase, mt.LargeBatch260K, mt.LargeBatch1M,
        mt.LargeBatch4M, mt.Num2WordsTinyT]:
      self.assertIn('mt.' + cls.__name__, keys)

  def testThePlannerGetsEachStacksInputShapes(self):
    p = mt.T64H16384A32().Task()
    b, s, t, d = 4096, 128, 128, 1024
    self.assertEqual(p.encoder.cost_input_shapes, [dict(vec=[b, s, d], paddings=[b, s])])
    self.assertEqual(p.decoder.cost_input_shapes, [dict(vec=[b, t, d], paddings=[b, t],
                                                        aux_vec=[b, s, d], aux_paddings=[b, s])])
    # The stacks stay split by layer count, as before they had shapes.
    self.assertEqual((p.encoder.partition_cost, p.decoder.partition_cost), ('count', 'count'))
    [(enc_path, _, _, batch, enc), (dec_path, _, _, _, dec)] = model_plan.PipelineInputs(p)
    self.assertEqual((enc_path, dec_path, batch, len(enc), len(dec)),
                     ('encoder', 'decoder', b, 65, 65))
    attention, ffn, norm = 4 * d * 32 * 64, 2 * d * 16384 + 16384 + d, 2 * d
    self.assertEqual((enc[0].params, dec[0].params),
                     (attention + ffn + 2 * norm, 2 * attention + ffn + 3 * norm))
    self.assertEqual(enc[0].in_elements, b * s * d + b * s)

  def testTRowsAndRecipe(self):
    for cls, (layers, ffn, heads, k, _) in T_ROWS.items():
      p = cls().Task()
      self.assertEqual((p.model_dim, p.vocab_size), (1024, 64000), cls.__name__)
      self.assertEqual(len(p.encoder.layers), layers + 1)  # + the final layer norm.
      self.assertEqual(len(p.decoder.layers), layers + 1)
      self.assertEqual(p.encoder.num_devices, k)
      self.assertEqual(p.decoder.num_devices, k)
      first = p.decoder.layers[0]
      self.assertEqual((first.ffn_dim, first.num_heads, first.head_dim), (ffn, heads, 64))
      self.assertAllClose(first.ffn_init_scale, layers**-0.5)
      self.assertEqual(p.logits_abs_max, 30.0)
      lp = p.train.learner
      self.assertIs(lp.optimizer.cls, optimizer.XLAShardingAdafactor)
      self.assertTrue(lp.optimizer.factored)
      self.assertEqual((lp.learning_rate, lp.lr_schedule.warmup_steps), (3.0, 40000))
      self.assertEqual(lp.clip_gradient_single_norm_to_value, 1.0)
      self.assertEqual(cls().Train().temperature, 5.0)

  def testBaselinesAndLargeBatch(self):
    for cls in (mt.TransformerBig, mt.TransformerBase):
      lp = _Learner(cls)
      self.assertEqual((lp.learning_rate, lp.lr_schedule.warmup_steps), (2.0, 8000))
      self.assertEqual(cls().Task().vocab_size, 32000)
    for cls, tokens in ((mt.LargeBatch260K, 260e3), (mt.LargeBatch1M, 1e6),
                        (mt.LargeBatch4M, 4e6)):
      train = cls().Train()
      self.assertAllClose(train.batch_size * train.source_max_length, tokens, rtol=0.06)
      self.assertEqual(train.languages, ['de'])

  @pytest.mark.slow
  def testTransformerLConfigs(self):
    for cls, (layers, k, _) in TRANSFORMER_L.items():
      p = cls().Task()
      self.assertEqual(len(p.stack.layers), layers + 1)
      self.assertEqual(p.stack.num_devices, k)
      self.assertEqual((p.model_dim, p.vocab_size), (2048, 32000))
      first = p.stack.layers[0]
      self.assertEqual((first.ffn_dim, first.num_heads, first.causal, first.is_decoder),
                       (8192, 32, True, False))
      train = cls().Train()
      self.assertEqual((train.batch_size, train.seq_len), (32, 1024))
    self.assertEqual(mt.TransformerL3Naive1().Task().stack.recompute, 'never')

  def testBuiltCountsEqualClosedFormAndPaperLabels(self):
    built = {
        mt.T6H8192A16: helpers.TransformerParameterCount(6, 1024, 8192, 16, 64000),
        mt.TransformerBase: helpers.TransformerParameterCount(6, 512, 2048, 8, 32000),
        mt.TransformerL3Naive1: helpers.TransformerParameterCount(3, 2048, 8192, 32, 32000,
                                                                  lm=True),
    }
    for cls, expected in built.items():
      self.assertEqual(param_count.CountParameters(cls().Task()), expected, cls.__name__)
    for cls, (layers, ffn, heads, _, label) in T_ROWS.items():
      self.assertAllClose(helpers.TransformerParameterCount(layers, 1024, ffn, heads, 64000), label,
                          rtol=0.1, msg=cls.__name__)
    for cls, (layers, _, label) in TRANSFORMER_L.items():
      self.assertAllClose(helpers.TransformerParameterCount(layers, 2048, 8192, 32, 32000, lm=True),
                          label, rtol=0.01, msg=cls.__name__)


if __name__ == '__main__':
  tf.test.main()
