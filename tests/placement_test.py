"""Placement: each partition's ops, gradients and variables on its own device (in step stats)."""

import re

from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import test_utils

from tensorpipe import placement
from tests import layer_helpers
from tests import trace_helpers

K = 4


def _IsTransfer(name, op_type):
  """Nodes TF adds: Send/Recv between devices (run on the consumer), the no-ops that carry control
  edges between devices (run on the source), and fetch/feed nodes."""
  return (op_type.startswith(('_Send', '_Recv', '_HostSend', '_HostRecv')) or
          name.startswith(('edge_', '_retval', '_arg', 'GroupCrossDeviceControlEdges')) or
          re.search(r'/_\d+$', name) is not None)


class PlacementTest(test_utils.TestCase):

  def testPartitionsAndTheirVariablesRunOnTheirDevices(self):
    with tf.Graph().as_default() as g, layer_helpers.Cluster(K):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(8), K, 4).Instantiate()
      out = net.FPropDefaultTheta(tf.ones([8, 8]))
      variables = tf.trainable_variables()
      grads = tf.gradients(tf.reduce_mean(out), variables, colocate_gradients_with_ops=True)
      layer_partition = {
          name: k for k, names in enumerate(net.partition_layer_names) for name in names}
      self.assertEqual(sorted(set(layer_partition.values())), list(range(K)))
      for v in variables:
        k = layer_partition[v.op.name.split('/')[1]]
        self.assertEqual(tf.DeviceSpec.from_string(v.device).device_index, k, v.op.name)
      with layer_helpers.Session(g, K) as sess:
        placement.CheckSessionDevices(sess, net.devices)
        sess.run(tf.global_variables_initializer())
        _, nodes = trace_helpers.TracedStep(sess, [out, grads])
    seen = set()
    for device, name, op_type, _, _ in nodes:
      if _IsTransfer(name, op_type):
        continue
      index = int(device.rsplit(':', 1)[1])
      task = re.search(r'partition(\d+)_mb\d+/(forward|backward|zeros)$', name)
      if task:  # A call op of a task.
        self.assertEqual(index, int(task.group(1)), '%s ran on %s' % (name, device))
        seen.add((index, task.group(2)))
      # Ops inside the functions' bodies: a layer's forward pass, its re-computation, its gradients.
      inner = re.match(r'(?:gradients(?:_\d+)?/)?(recompute/)?(layer\d+)/', name)
      if inner:
        self.assertEqual(index, layer_partition[inner.group(2)], '%s ran on %s' % (name, device))
        seen.add((index, 'backward body' if inner.group(1) else 'forward body'))
      layer = re.match(r'pipe/(layer\d+)/', name)
      if layer and op_type.startswith(('ReadVariableOp', 'VarHandleOp')):
        self.assertEqual(index, layer_partition[layer.group(1)], '%s ran on %s' % (name, device))
        seen.add((index, 'var'))
    self.assertEqual(seen, {(k, kind) for k in range(K) for kind in (
        'forward', 'backward', 'zeros', 'forward body', 'backward body', 'var')})

  def testSessionWithoutTheDeviceIsReported(self):
    with tf.Graph().as_default() as g, layer_helpers.Cluster(K):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(4), K, 1).Instantiate()
      with layer_helpers.Session(g, 2) as sess:
        with self.assertRaisesRegex(ValueError, 'The session has no device .*CPU:2.*CPU:3'):
          placement.CheckSessionDevices(sess, net.devices)

  def testDefaultDevicesComeFromTheCluster(self):
    with tf.Graph().as_default(), layer_helpers.Cluster(2):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(2), 2, 1).Instantiate()
      self.assertEqual(net.devices, ['/job:localhost/replica:0/task:0/device:CPU:0',
                                     '/job:localhost/replica:0/task:0/device:CPU:1'])

  def testJobsThatOnlyBuildTheModelShareDevices(self):
    """With stock GPU flags the controller/evaler get one device per split; training jobs refuse."""
    for job in ('controller', 'evaler', 'decoder'):
      with tf.Graph().as_default(), cluster_factory.ForTestingWorker(job=job, cpus=1):
        net = layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 4, 1).Instantiate()
        self.assertLen(set(net.devices), 1, job)
    with tf.Graph().as_default(), cluster_factory.ForTestingWorker(job='trainer', cpus=1):
      with self.assertRaisesRegex(ValueError, "cluster \\(job 'trainer'\\) has 1"):
        layer_helpers.Pipeline(layer_helpers.DenseLayers(4), 4, 1).Instantiate()

  def testExplicitDevices(self):
    with tf.Graph().as_default(), layer_helpers.Cluster(2):
      net = layer_helpers.Pipeline(layer_helpers.DenseLayers(2), 2, 1,
                             devices=['/device:CPU:1', '/device:CPU:0']).Instantiate()
      self.assertEqual(net.devices, ['/device:CPU:1', '/device:CPU:0'])
      self.assertEqual([tf.DeviceSpec.from_string(v.device).device_index
                        for v in tf.global_variables()], [1, 0])

  def testCheckDevice(self):
    cluster_devices = ['/job:localhost/replica:0/task:0/device:CPU:0']
    self.assertEqual(placement.CheckDevice('/device:CPU:0', cluster_devices), '/device:CPU:0')
    self.assertEqual(placement.CheckDevice('/gpu:3', []), '/gpu:3')
    with self.assertRaisesRegex(ValueError, "device '' is not a device string"):
      placement.CheckDevice('', cluster_devices)
    with self.assertRaisesRegex(ValueError, "unknown device '/job:worker'"):
      placement.CheckDevice('/job:worker', cluster_devices)


if __name__ == '__main__':
  test_utils.main()
