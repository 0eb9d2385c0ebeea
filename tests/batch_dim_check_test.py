"""The first step's check that each partition keeps examples apart along batch_dim."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import batch_norm
from tests import helpers

T, B, DIM = 6, 4, 8


class MixesAxisZero(helpers.Dense):
  """tanh(x w) plus its mean over axis 0: with [T, B, D] inputs, every time step sees the others
  (like attention), and examples along axis 1 stay apart."""

  def FProp(self, theta, x):
    h = tf.tanh(tf.einsum('...i,ij->...j', x, theta.w))
    return h + tf.reduce_mean(h, axis=0, keepdims=True)


class NormedDense(helpers.Dense):
  """tanh(x w), then batch norm over every axis but the last (mixes examples on purpose)."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('bn', batch_norm.BatchNorm.Params().Set(name='bn', dim=self.params.dim))

  def FProp(self, theta, x):
    return self.bn.FProp(theta.bn, tf.tanh(tf.einsum('...i,ij->...j', x, theta.w)))


def _Step(layers, batch_dim, num_micro_batches=2, **kwargs):
  """A graph with a global step, the pipeline on [T, B, D] inputs and its gradients; returns
  (graph, the gradients, the global step variable)."""
  graph = tf.Graph()
  with graph.as_default(), helpers.Cluster(2):
    step = py_utils.GetOrCreateGlobalStepVar()
    net = helpers.Pipeline(layers, 2, num_micro_batches, batch_dim=batch_dim, **kwargs)
    x = np.random.RandomState(0).normal(size=[T, B, DIM]).astype(np.float32)
    out = net.Instantiate().FPropDefaultTheta(tf.constant(x))
    grads = tf.gradients(tf.reduce_mean(out), tf.trainable_variables())
  return graph, grads, step


def _Layers(cls=MixesAxisZero):
  return [cls.Params().Set(name='layer%d' % i, dim=DIM, seed=i) for i in range(4)]


class BatchDimCheckTest(test_utils.TestCase):

  def _Run(self, graph, grads, step, value=0):
    with graph.as_default(), helpers.Session(graph, 2) as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(step.assign(value))
      return sess.run(grads)

  def testTimeMajorInputsWithBatchDimZeroFailTheFirstStep(self):
    graph, grads, step = _Step(_Layers(), batch_dim=0)
    with self.assertRaisesRegex(
        tf.errors.InvalidArgumentError,
        r'TensorPipeLayer pipe: on its first micro-batch, changing example 0 of the input of '
        r'partition 0 changed the outputs of other examples along batch_dim=0, .*Pipeline inputs: '
        r'args\[0\] \[6, 4, 8\]. If they are time-major .* set batch_dim=1') as failure:
      self._Run(graph, grads, step)
    # Both partitions mix examples; the checks run in partition order, so the error is always the
    # first one's: partition 1's check waits for partition 0's (by construction, not by luck).
    self.assertNotIn('input of partition 1', str(failure.exception))
    checks = [op for op in graph.get_operations() if op.type in ('If', 'StatelessIf')
              and '_batch_dim_check' in op.name]
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
    # Only the first step is checked.
    self.assertLen(self._Run(graph, grads, step, value=1), 4)

  def testTheRightBatchDimPasses(self):
    graph, grads, step = _Step(_Layers(), batch_dim=1)
    self.assertLen(self._Run(graph, grads, step), 4)

  def testSwitchedOffAndBatchNormPartitionsAreNotChecked(self):
    graph, grads, step = _Step(_Layers(), batch_dim=0, check_batch_dim=False)
    self.assertLen(self._Run(graph, grads, step), 4)
    graph, grads, step = _Step(_Layers(NormedDense), batch_dim=1)
    self.assertEmpty([op for op in graph.get_operations() if 'batch_dim_check' in op.name])
    self.assertLen(self._Run(graph, grads, step), 12)


if __name__ == '__main__':
  test_utils.main()
