"""The check, on the first step of every run, that each partition keeps examples apart along
batch_dim."""

from unittest import mock

import numpy as np
import pytest
from lingvo import compat as tf
from lingvo.core import bn_layers
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import batch_norm
from tensorpipe import check_failure
from tests import layer_helpers

T, B, DIM = 6, 4, 8


class MixesAxisZero(layer_helpers.Dense):
  """tanh(x w) plus its mean over axis 0: with [T, B, D] inputs, every time step sees the others
  (like attention), and examples along axis 1 stay apart."""

  def FProp(self, theta, x):
    h = tf.tanh(tf.einsum('...i,ij->...j', x, theta.w))
    return h + tf.reduce_mean(h, axis=0, keepdims=True)


class NormedDense(layer_helpers.Dense):
  """tanh(x w), then batch norm over every axis but the last (mixes examples on purpose)."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('bn', batch_norm.BatchNorm.Params().Set(name='bn', dim=self.params.dim))

  def FProp(self, theta, x):
    return self.bn.FProp(theta.bn, tf.tanh(tf.einsum('...i,ij->...j', x, theta.w)))


class Centre(layer_helpers.Dense):
  """x minus its mean over axis 1, the examples of [T, B, D] inputs: a layer that mixes examples
  by accident (it meant to centre each example over time)."""

  def FProp(self, theta, x):
    return x - tf.reduce_mean(x, axis=1, keepdims=True)


def _Step(layers, batch_dim, num_micro_batches=2, plain=False, **kwargs):
  """A graph with a global step, the pipeline (or the plain layers) on [T, B, D] inputs and its
  gradients; returns (graph, the gradients, the global step variable)."""
  graph = tf.Graph()
  with graph.as_default(), layer_helpers.Cluster(2):
    step = py_utils.GetOrCreateGlobalStepVar()
    net = (layer_helpers.Plain(layers) if plain else
           layer_helpers.Pipeline(layers, 2, num_micro_batches, batch_dim=batch_dim, **kwargs))
    x = np.random.RandomState(0).normal(size=[T, B, DIM]).astype(np.float32)
    out = net.Instantiate().FPropDefaultTheta(tf.constant(x))
    grads = [g for g in tf.gradients(tf.reduce_mean(out), tf.trainable_variables())
             if g is not None]
  return graph, grads, step


def _Layers(cls=MixesAxisZero):
  return [cls.Params().Set(name='layer%d' % i, dim=DIM, seed=i) for i in range(4)]


def _TimeMajorBatchNorm():
  """FC layers that mix time steps (like a conv front-end or attention) each followed by Lingvo's
  BatchNormLayer: every partition has batch norm."""
  layers = []
  for i in range(2):
    layers += [MixesAxisZero.Params().Set(name='fc%d' % i, dim=DIM, seed=i),
               bn_layers.BatchNormLayer.Params().Set(name='bn%d' % i, dim=DIM, decay=0.9)]
  return layers


def _Flag(graph):
  """The pipeline's run flag (batch_dim_check.RunFlag)."""
  flags = [v for v in graph.get_collection(tf.GraphKeys.LOCAL_VARIABLES)
           if 'batch_dim_checked' in v.name]
  assert len(flags) == 1, flags
  return flags[0]


class BatchDimCheckTest(test_utils.TestCase):

  def _Run(self, graph, grads, step, value=0, flag=None):
    """One step from fresh variables at global step `value` (a new run: local variables
    initialised, so the run flag is False unless `flag` says otherwise)."""
    with graph.as_default(), layer_helpers.Session(graph, 2) as sess:
      sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
      sess.run(step.assign(value))
      if flag is not None:
        sess.run(_Flag(graph).assign(flag))
      values = check_failure.Run(sess, grads)
      return values, sess.run(_Flag(graph))

  def testTimeMajorInputsWithBatchDimZeroFailTheFirstStep(self):
    graph, grads, step = _Step(_Layers(), batch_dim=0)
    with self.assertRaises(check_failure.CheckFailure) as failure:
      self._Run(graph, grads, step)
    message = str(failure.exception)
    self.assertRegex(
        message,
        r"^TensorPipeLayer 'pipe': the batch_dim check failed: layer 'layer0' \(layer 0 of "
        r'partition 0\) mixes examples along batch_dim=0: .*Pipeline inputs: args\[0\] \[6, 4, 8\]\. '
        r'If they are time-major .* set batch_dim=1')
    self.assertNotIn('\n', message)
    # Both partitions mix examples; the checks run in partition order, so the error is always the
    # first one's: partition 1's check waits for partition 0's (by construction, not by luck).
    checks = [op for op in graph.get_operations() if op.type in ('If', 'StatelessIf')
              and '_batch_dim_check' in op.name and 'checked_this_run' not in op.name]
    self.assertLen(checks, 2)
    first, second = sorted(checks, key=lambda op: op.name)
    self.assertIn('partition0_', first.name)
    ancestors, todo = set(), [second]
    while todo:
      op = todo.pop()
      for before in [x.op for x in op.inputs] + list(op.control_inputs):
        if before not in ancestors:
          ancestors.add(before)
          todo.append(before)
    self.assertIn(first, ancestors)

  def testEveryRunChecksItsFirstStepOnce(self):
    graph, grads, step = _Step(_Layers(), batch_dim=0)
    # A session that initialises no local variables checks too (the flag reads False until set).
    with graph.as_default(), layer_helpers.Session(graph, 2) as sess:
      sess.run(tf.global_variables_initializer())
      with self.assertRaisesRegex(check_failure.CheckFailure, 'mixes examples along batch_dim=0'):
        check_failure.Run(sess, grads)
    # A run resumed at global step 5 is checked too.
    with self.assertRaisesRegex(check_failure.CheckFailure, 'mixes examples along batch_dim=0'):
      self._Run(graph, grads, step, value=5)
    # Once this run's flag is set, the check does not run again.
    values, _ = self._Run(graph, grads, step, value=5, flag=True)
    self.assertLen(values, 4)
    # The flag is a local variable: not checkpointed, initialised False by every run.
    with graph.as_default():
      self.assertNotIn(_Flag(graph), tf.global_variables())

  def testTheRightBatchDimPassesAndChangesNoGradient(self):
    graph, grads, step = _Step(_Layers(), batch_dim=1)
    values, flag = self._Run(graph, grads, step)
    self.assertTrue(flag)  # Checked: later steps of this run skip the check.
    with graph.as_default(), layer_helpers.Session(graph, 2) as sess:
      sess.run(tf.global_variables_initializer())  # No local-variable initialiser.
      sess.run(grads)
      self.assertTrue(sess.run(_Flag(graph)))
    graph, plain_grads, step = _Step(_Layers(), batch_dim=1, plain=True)
    with graph.as_default(), layer_helpers.Session(graph, 2) as sess:
      sess.run(tf.global_variables_initializer())
      plain = sess.run(plain_grads)
    self.assertLess(layer_helpers.MaxRelativeError(dict(enumerate(values)), dict(enumerate(plain))),
                    1e-5)

  @pytest.mark.slow
  def testBatchNormPartitionsAreCheckedWithMovingStatistics(self):
    with mock.patch.object(tf.logging, 'warning') as warning:
      graph, grads, step = _Step(_TimeMajorBatchNorm(), batch_dim=0)
    # What the probe cannot see is said when the graph is built, naming the partitions.
    said = [call.args[0] % call.args[1:] for call in warning.call_args_list]
    self.assertTrue([m for m in said if m.startswith(
        "TensorPipeLayer 'pipe': partition(s) 0, 1 have batch norm: the batch_dim check probes "
        "them with batch norm's moving statistics")], said)
    with self.assertRaises(check_failure.CheckFailure) as failure:
      self._Run(graph, grads, step)
    self.assertRegex(str(failure.exception),
                     r"^TensorPipeLayer 'pipe': the batch_dim check failed: layer 'fc0' \(layer "
                     r'0 of partition 0\) mixes examples along batch_dim=0 \(batch norm probed with its '
                     r'moving statistics\).* set batch_dim=1')
    # The right batch_dim passes, and the check changes no gradient.
    graph, grads, step = _Step(_TimeMajorBatchNorm(), batch_dim=1)
    checked, flag = self._Run(graph, grads, step)
    self.assertTrue(flag)
    graph, grads, step = _Step(_TimeMajorBatchNorm(), batch_dim=1, check_batch_dim=False)
    with graph.as_default(), layer_helpers.Session(graph, 2) as sess:
      sess.run(tf.global_variables_initializer())
      unchecked = sess.run(grads)
    self.assertLen(checked, 6)
    for a, b in zip(checked, unchecked):
      self.assertAllEqual(a, b)

  def testTheLayerThatMixesExamplesIsNamed(self):
    layers = _Layers(layer_helpers.Dense)
    layers[1] = Centre.Params().Set(name='centre', dim=DIM)
    graph, grads, step = _Step(layers, batch_dim=1)
    with self.assertRaisesRegex(
        check_failure.CheckFailure,
        r"^TensorPipeLayer 'pipe': the batch_dim check failed: layer 'centre' \(layer 1 of "
        r'partition 0\) mixes examples along batch_dim=1: .*If they are batch-major \[B, \.\.\.\], '
        r'set batch_dim=0 .*; if the layer should treat each example alone, make it reduce over '
        r'axes other than batch_dim=1'):
      self._Run(graph, grads, step)

  @pytest.mark.slow
  def testSwitchedOffIsNotChecked(self):
    graph, grads, step = _Step(_Layers(), batch_dim=0, check_batch_dim=False)
    self.assertEmpty([op for op in graph.get_operations() if 'batch_dim_check' in op.name])
    with graph.as_default(), layer_helpers.Session(graph, 2) as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(step.assign(0))
      self.assertLen(sess.run(grads), 4)
    graph, grads, step = _Step(_Layers(NormedDense), batch_dim=1)
    self.assertLen(self._Run(graph, grads, step)[0], 12)


if __name__ == '__main__':
  test_utils.main()
