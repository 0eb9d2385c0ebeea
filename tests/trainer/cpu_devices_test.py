"""K logical CPU devices: sessions and servers get them, and every job spec of the cluster too."""

from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe.trainer import cpu_devices


class CpuDevicesTest(test_utils.TestCase):

  def tearDown(self):
    cpu_devices.UninstallCpuDevices()
    super().tearDown()

  def testConfigureCpuClusterSetsEveryJobSpec(self):
    p = cluster_factory.Current().params.Copy()
    cpu_devices.ConfigureCpuCluster(p, 4, 4)
    for name in ('controller', 'train_summaries', 'worker', 'ps', 'input', 'evaler', 'decoder'):
      self.assertEqual(p.Get(name).cpus_per_replica, 4, name)
    for name in ('controller', 'worker', 'evaler', 'decoder'):
      self.assertEqual(p.Get(name).devices_per_split, 4, name)
    for job in ('controller', 'trainer_client', 'evaler', 'decoder'):
      q = p.Copy().Set(job=job, mode='sync')
      q.evaler.replicas = q.decoder.replicas = 1
      cluster = q.Instantiate()
      self.assertEqual(cluster.num_devices_per_split, 4, job)
      self.assertEqual([cluster.WorkerDeviceInModelSplit(k) for k in range(4)],
                       ['/job:localhost/replica:0/task:0/device:CPU:%d' % k for k in range(4)], job)

  def testInstallCpuDevicesGivesServersAndSessionsKDevices(self):
    self.assertNotIn('CPU', py_utils.SessionConfig().device_count)
    cpu_devices.InstallCpuDevices(3)
    self.assertEqual(py_utils.SessionConfig().device_count['CPU'], 3)
    self.assertTrue(py_utils.SessionConfig(soft_placement=False).device_count['CPU'] == 3)
    server = tf.distribute.Server.create_local_server()
    with tf.Session(server.target, graph=tf.Graph()) as sess:
      cpus = [d.name for d in sess.list_devices() if d.device_type == 'CPU']
    self.assertLen(cpus, 3)
    cpu_devices.UninstallCpuDevices()
    self.assertNotIn('CPU', py_utils.SessionConfig().device_count)

  def testWithCpuDevicesKeepsTheRestOfTheConfig(self):
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True, inter_op_parallelism_threads=2)
    out = cpu_devices.WithCpuDevices(config, 4)
    self.assertEqual(out.device_count['CPU'], 4)
    self.assertTrue(out.allow_soft_placement)
    self.assertEqual(out.inter_op_parallelism_threads, 2)
    self.assertNotIn('CPU', config.device_count)  # A copy.


if __name__ == '__main__':
  test_utils.main()
