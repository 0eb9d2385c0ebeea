"""Scale-out: partitions in separate TensorFlow processes, and pipeline x data parallelism.

- K = 2 partitions on 2 worker processes (TensorFlow gRPC servers on 127.0.0.1, each on a port it picks itself), placed
  through a Lingvo cluster whose one replica spans both tasks: the same gradients as one process.
- Lingvo builds one tower per model split (base_model's _FPropSplitInputBatch: each under
  cluster_factory.SetModelSplit(s)); TensorPipeLayer's FProp places its partitions on the current
  split's devices. Checked with S = 2 splits of K = 2 partitions on 4 logical CPU devices of one
  process.
"""

import concurrent.futures
import os
import re
import subprocess
import sys

from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import test_utils

from tensorpipe.measure import profiling
from tensorpipe import placement
from tests import layer_helpers
from tests import server_helpers

NUM_DEVICES = 2


def _Run(num_splits, traced=False):
  """Gradients ({var: value}) of mean(square(out)) over the whole batch, the batch split over
  `num_splits` towers as Lingvo's trainer splits it; with `traced`, also the step's RunMetadata."""
  graph = tf.Graph()
  num_devices = NUM_DEVICES * num_splits
  with graph.as_default(), cluster_factory.ForTestingWorker(cpus=num_devices,
                                                            split_size=NUM_DEVICES) as cluster:
    tf.random.set_seed(1234)
    net = server_helpers.ScaleOutPipeline(NUM_DEVICES).Instantiate()
    self_devices = net.devices
    pieces = tf.split(tf.constant(server_helpers.ScaleOutInput()), num_splits)
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


# A TensorFlow gRPC server that picks its own free port and prints it. It boots as job 'boot', so
# that a session can name it task k of job 'worker' through the cluster it carries (TensorFlow's
# cluster-spec propagation): no port is chosen, released and bound again by another process.
_SERVER = """
import tensorflow as tf
import lingvo.core.ops  # Lingvo's custom ops, which graphs built with Lingvo may use.
server = tf.distribute.Server(tf.train.ClusterSpec({'boot': ['127.0.0.1:0']}), job_name='boot',
                              task_index=0,
                              config=tf.compat.v1.ConfigProto(device_count={'CPU': 1}))
print('ready', server.target.rsplit(':', 1)[1], flush=True)
server.join()
"""
_START_TIMEOUT_S = 60


class MultiProcessTest(test_utils.TestCase):
  """K = 2 partitions in 2 worker processes."""

  def _StartWorkers(self, num_tasks):
    """Starts the servers (stopped by pid when the test ends); returns their addresses once every
    server has reported the port it listens on (at most _START_TIMEOUT_S)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
    procs = []
    for _ in range(num_tasks):
      proc = subprocess.Popen([sys.executable, '-c', _SERVER], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env=env)
      self.addCleanup(self._Stop, proc)
      procs.append(proc)
    with concurrent.futures.ThreadPoolExecutor(num_tasks) as pool:
      lines = [pool.submit(p.stdout.readline) for p in procs]
      try:
        ready = [line.result(timeout=_START_TIMEOUT_S).split() for line in lines]
      except concurrent.futures.TimeoutError:
        for p in procs:  # Unblocks the readers, so that the pool can end.
          p.kill()
        self.fail('a worker server did not start within %d s' % _START_TIMEOUT_S)
    for words, proc in zip(ready, procs):
      self.assertEqual(words[:1], ['ready'], 'server pid %d: %r' % (proc.pid, words))
    return ['127.0.0.1:%s' % words[1] for words in ready]

  @staticmethod
  def _Stop(proc):
    if proc.poll() is None:
      proc.kill()
    proc.wait(timeout=30)
    proc.stdout.close()

  def testPartitionsInTwoProcessesGiveTheOneProcessGradients(self):
    addresses = self._StartWorkers(NUM_DEVICES)
    remote, meta = server_helpers.RemotePipelineGradients(addresses)
    reference, _, _ = _Run(1)
    self.assertLess(layer_helpers.MaxRelativeError(remote, reference), 1e-6)
    # Each partition's calls ran in its own process.
    tasks = {}
    for dev in meta.step_stats.dev_stats:
      for node in dev.node_stats:
        partition = re.search(r'partition(\d+)_mb\d+/(forward|backward)$', node.node_name)
        if partition:
          tasks.setdefault(int(partition.group(1)), set()).add(
              re.search(r'task:(\d+)', dev.device).group(1))
    self.assertEqual(tasks, {k: {str(k)} for k in range(NUM_DEVICES)})


class DataParallelTest(test_utils.TestCase):

  def testTwoSplitsEqualOnePipelineOnTheWholeBatch(self):
    reference, _, _ = _Run(1)
    grads, _, _ = _Run(2)
    self.assertLess(layer_helpers.MaxRelativeError(grads, reference), 1e-5)

  def testEachSplitRunsOnItsOwnDevices(self):
    _, meta, built_on = _Run(2, traced=True)
    self.assertEqual([d.split('/')[-1] for d in built_on], ['device:CPU:0', 'device:CPU:1'])
    calls = {}  # (split, partition) -> devices its call ops ran on
    for dev in meta.step_stats.dev_stats:
      for node in dev.node_stats:
        tower = re.search(r'tower_(\d+)/', node.node_name)
        # Call ops.
        partition = re.search(r'partition(\d+)_mb\d+/(forward|backward)$', node.node_name)
        if tower and partition:
          calls.setdefault((int(tower.group(1)), int(partition.group(1))), set()).add(
              dev.device.split('/')[-1].upper())
    self.assertEqual(sorted(calls), [(s, k) for s in range(2) for k in range(NUM_DEVICES)])
    for (s, k), devices in calls.items():
      # Split s's partition k on device NUM_DEVICES * s + k of the worker.
      self.assertEqual(devices, {'DEVICE:CPU:%d' % (NUM_DEVICES * s + k)}, (s, k))


if __name__ == '__main__':
  tf.test.main()
