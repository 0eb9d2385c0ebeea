"""Every registered model in `params/` builds and runs a step on small shapes."""

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo import datasets
from lingvo import model_registry
from lingvo.core import test_utils

from tensorpipe import nested_params
from tensorpipe import placement
from tensorpipe.trainer import preflight
from tensorpipe.trainer import registry
from tests import layer_helpers
from tests import trainer_helpers

SMALL_BATCH_PER_MICRO_BATCH = 2




def _Shrink(cfg):
  """Small batches: SMALL_BATCH_PER_MICRO_BATCH examples per micro-batch of every pipeline."""
  micro = 1
  for _, p in nested_params.Walk(cfg):
    if 'num_micro_batches' in p and p.Get('micro_batch_size') is None:
      micro = max(micro, p.num_micro_batches)
  if cfg.input is not None and 'batch_size' in cfg.input:
    cfg.input.batch_size = SMALL_BATCH_PER_MICRO_BATCH * micro
  return cfg


class RegisteredParamsTest(test_utils.TestCase):

  def testTheDigitsModelIsRegistered(self):
    self.assertIn('digits.TinyConvPipeline', registry.TensorPipeModels())

  @pytest.mark.slow
  def testEveryModelBuildsAndRunsAStepOnEveryDataset(self):
    """Builds and steps each model on each of its datasets. An eval dataset whose model params
    (after _Shrink) have the same text as one already run (Dev returning Test()) would build the
    same graph and run the same step again, so it is not rerun."""
    models = registry.TensorPipeModels()
    self.assertNotEmpty(models)
    for key, cls in sorted(models.items()):
      if not getattr(cls, 'SMOKE_TEST', True):
        continue  # Too large for a CPU step, or a stepped model's code at other sizes; the model's
        # own tests check it (e.g. param counts).
      ran = set()  # Params texts of the eval datasets already run.
      for dataset in datasets.GetDatasets(cls):
        with self.subTest(model=key, dataset=dataset):
          # pylint: disable=protected-access
          cfg = _Shrink(model_registry._ModelRegistryHelper.GetParamsFromModelParamsObject(
              cls(), dataset))
          # pylint: enable=protected-access
          text = cfg.ToText()
          if dataset != 'Train' and text in ran:
            continue  # The same graph and step as an eval dataset already run.
          self._BuildAndRun(cfg, dataset)
          if dataset != 'Train':
            ran.add(text)

  def _BuildAndRun(self, cfg, dataset):
    num_devices = max([1] + [k for _, _, k in preflight.PipelineDevices(cfg)])
    is_train = dataset == 'Train'
    graph, task = trainer_helpers.TrainerGraph(cfg, num_devices, train=is_train)
    with graph.as_default():
      init = tf.global_variables_initializer()
    # Values only: grappler's rewrites would take most of the step's time on these graphs (up to
    # 14k ops); it is the graph Lingvo builds and its values that the test checks.
    config = layer_helpers.ValuesOnlyConfig(num_devices)
    with tf.Session(graph=graph, config=config) as sess:
      sess.run(init)
      task.input.Initialize(sess)
      fetches = [task.eval_metrics] + ([task.train_op] if is_train else [])
      metrics = sess.run(fetches)[0]
    loss = metrics['loss'][0]
    self.assertTrue(np.isfinite(loss), loss)
    if 'accuracy' in metrics:
      self.assertBetween(metrics['accuracy'][0], 0.0, 1.0)
    self.assertGreater(metrics['num_samples_in_batch'][0], 0)


class DigitsScheduleTest(test_utils.TestCase):
  """The digits model with task.pipeline.schedule = '1f1b' (its cross-entropy then runs in the
  pipeline's last partition) takes the same training step as with 'gpipe'."""

  def _Step(self, schedule):
    cfg = registry.ModelParams('digits.TinyConvPipeline', 'Train')
    cfg.task.pipeline.schedule = schedule
    graph, task = trainer_helpers.TrainerGraph(cfg, 4)
    with graph.as_default():
      variables = tf.trainable_variables()
      init = tf.global_variables_initializer()
    with tf.Session(graph=graph, config=placement.SessionConfig(4)) as sess:
      sess.run(init)
      task.input.Initialize(sess)
      loss = sess.run([task.eval_metrics, task.train_op])[0]['loss'][0]
      return loss, {v.op.name: value for v, value in zip(variables, sess.run(variables))}

  def testOneFOneBTakesTheGpipeStep(self):
    loss, after = self._Step('gpipe')
    loss_1f1b, after_1f1b = self._Step('1f1b')
    self.assertAllClose(loss_1f1b, loss, rtol=1e-6)
    self.assertEqual(sorted(after_1f1b), sorted(after))
    for name in after:
      self.assertAllClose(after_1f1b[name], after[name], rtol=1e-5, atol=1e-7, msg=name)


if __name__ == '__main__':
  tf.test.main()
