"""Pipeline x data parallelism: S replicas of a K-cell pipeline, each split on its own devices.

Lingvo builds one tower per model split (base_model's _FPropSplitInputBatch: each under
cluster_factory.SetModelSplit(s)); TensorPipeLayer's FProp places its cells on the current split's
devices. Checked here with S = 2 splits of K = 2 cells on 4 logical CPU devices of one process.
"""

import re

import numpy as np
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import test_utils

from tensorpipe import placement
from tensorpipe import profiling
from tests import helpers

BATCH = 16
DIM = 8
NUM_CELLS = 2


def _Input():
  return np.random.RandomState(5).normal(size=[BATCH, DIM]).astype(np.float32)


def _Layers():
  return helpers.DenseLayers(4, dim=DIM)


def _Run(num_splits, traced=False):
  """Gradients ({var: value}) of mean(square(out)) over the whole batch, the batch split over
  `num_splits` towers as Lingvo's trainer splits it; with `traced`, also the step's RunMetadata."""
  graph = tf.Graph()
  num_devices = NUM_CELLS * num_splits
  with graph.as_default(), cluster_factory.ForTestingWorker(cpus=num_devices,
                                                            split_size=NUM_CELLS) as cluster:
    tf.random.set_seed(1234)
    net = helpers.Pipeline(_Layers(), NUM_CELLS, 4).Instantiate()
    self_devices = net.devices
    pieces = tf.split(tf.constant(_Input()), num_splits)
    outs = []
    for s, piece in enumerate(pieces):
      with cluster_factory.SetModelSplit(s) as c, tf.name_scope('tower_%d' % s):
        with tf.device(c.WorkerDeviceInModelSplit(0)):
          outs.append(net.FPropDefaultTheta(piece))
    loss = tf.reduce_mean(tf.square(tf.concat(outs, 0)))
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    assert cluster.num_splits_per_client == num_splits
    with tf.Session(graph=graph, config=placement.SessionConfig(num_devices, 1, 2)) as sess:
      sess.run(tf.global_variables_initializer())
      meta = None
      if traced:
        values, meta = profiling.TracedRun(sess, grads)
      else:
        values = sess.run(grads)
  return {v.op.name: g for v, g in zip(variables, values)}, meta, self_devices


class DataParallelTest(test_utils.TestCase):

  def testTwoSplitsEqualOnePipelineOnTheWholeBatch(self):
    reference, _, _ = _Run(1)
    grads, _, _ = _Run(2)
    self.assertLess(helpers.MaxRelativeError(grads, reference), 1e-5)

  def testEachSplitRunsOnItsOwnDevices(self):
    _, meta, built_on = _Run(2, traced=True)
    self.assertEqual([d.split('/')[-1] for d in built_on], ['device:CPU:0', 'device:CPU:1'])
    calls = {}  # (split, cell) -> devices its call ops ran on
    for dev in meta.step_stats.dev_stats:
      for node in dev.node_stats:
        tower = re.search(r'tower_(\d+)/', node.node_name)
        cell = re.search(r'cell(\d+)_mb\d+/(forward|backward)$', node.node_name)  # Call ops.
        if tower and cell:
          calls.setdefault((int(tower.group(1)), int(cell.group(1))), set()).add(
              dev.device.split('/')[-1].upper())
    self.assertEqual(sorted(calls), [(s, k) for s in range(2) for k in range(NUM_CELLS)])
    for (s, k), devices in calls.items():
      # Split s's cell k on device NUM_CELLS * s + k of the worker.
      self.assertEqual(devices, {'DEVICE:CPU:%d' % (NUM_CELLS * s + k)}, (s, k))


if __name__ == '__main__':
  tf.test.main()
