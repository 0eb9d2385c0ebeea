"""TensorFlow servers in processes of their own for the TensorPipe multi-process tests, and the
scale-out gradient check that runs a pipeline across them."""

import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np
from lingvo import compat as tf
from lingvo.core import cluster_factory

from tensorpipe.measure import profiling
from tests import layer_helpers

# A TensorFlow server, task TASK of job JOB of the cluster CLUSTER (JSON), as Lingvo's trainer
# starts one for --job=JOB --task=TASK: it binds the port of its own address on every interface.
# It ends by itself if the test process dies without stopping it (e.g. a crash in C++).
_TF_SERVER = """
import json, os, sys, threading, time
import tensorflow as tf
cluster, job, task = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
parent = os.getppid()
def EndWithParent():
  while os.getppid() == parent:
    time.sleep(1)
  os._exit(0)
threading.Thread(target=EndWithParent, daemon=True).start()
server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=task,
                              config=tf.compat.v1.ConfigProto(device_count={'CPU': 2}))
print('ready', flush=True)
server.join()
"""
TF_SERVER_START_S = 60  # Bound on a server's start (importing TensorFlow on a loaded machine).


def StartTfServer(test, cluster, job, task):
  """Starts a TensorFlow server with 2 CPU devices, task `task` of `job` of `cluster` ({job:
  [HOST:PORT, ...]}), in a process of its own, which `test` (a TestCase) kills by pid when it
  ends; returns once the server serves (at most TF_SERVER_START_S, else the test fails)."""
  proc = subprocess.Popen([sys.executable, '-c', _TF_SERVER, json.dumps(cluster), job, str(task)],
                          stdout=subprocess.PIPE, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))

  def Stop():
    if proc.poll() is None:
      os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

  test.addCleanup(proc.stdout.close)
  test.addCleanup(Stop)
  timer = threading.Timer(TF_SERVER_START_S, Stop)  # Hang guard: readline returns at the kill.
  timer.start()
  test.addCleanup(timer.cancel)
  test.assertEqual(proc.stdout.readline(), 'ready\n', 'no TensorFlow server within %d s' %
                   TF_SERVER_START_S)
  timer.cancel()


SCALE_OUT_DIM = 8  # Width of the dense layers of the scale-out gradient checks.


def ScaleOutInput():
  """The [16, SCALE_OUT_DIM] input of the scale-out gradient checks."""
  return np.random.RandomState(5).normal(size=[16, SCALE_OUT_DIM]).astype(np.float32)


def ScaleOutPipeline(num_devices):
  """4 dense layers in a TensorPipeLayer on `num_devices` devices, M = 4."""
  return layer_helpers.Pipeline(layer_helpers.DenseLayers(4, dim=SCALE_OUT_DIM), num_devices, 4)


def RemoteSessionConfig(addresses, timeout_s=60, **kwargs):
  """A session config naming the TF servers at `addresses` tasks 0.. of job 'worker'."""
  cluster = tf.train.ClusterSpec({'worker': addresses})
  return tf.compat.v1.ConfigProto(cluster_def=cluster.as_cluster_def(),
                                  operation_timeout_in_ms=timeout_s * 1000, **kwargs)


def RemotePipelineGradients(addresses):
  """Gradients ({var: value}) of mean(square(out)) of ScaleOutPipeline on ScaleOutInput, partition
  k on worker task k of the TF servers at `addresses` (one replica spanning them, a device each,
  as Lingvo's trainer client sees it), and the step's RunMetadata."""
  p = cluster_factory.Current().params.Copy()
  p.mode, p.job = 'sync', 'trainer_client'
  p.worker.name = '/job:worker'
  p.worker.replicas = 1
  p.worker.cpus_per_replica = len(addresses)
  p.worker.devices_per_split = len(addresses)
  cluster = p.Instantiate()
  with tf.Session('grpc://' + addresses[0], config=RemoteSessionConfig(addresses)) as sess:
    cluster.InitDevices(sess)
  graph = tf.Graph()
  with graph.as_default(), cluster:
    devices = [cluster.WorkerDeviceInModelSplit(k) for k in range(len(addresses))]
    assert devices == ['/job:worker/replica:0/task:%d/device:CPU:0' % k
                       for k in range(len(addresses))], devices
    tf.random.set_seed(1234)
    net = ScaleOutPipeline(len(addresses)).Instantiate()
    loss = tf.reduce_mean(tf.square(net.FPropDefaultTheta(tf.constant(ScaleOutInput()))))
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    config = RemoteSessionConfig(addresses, allow_soft_placement=False)
    with tf.Session('grpc://' + addresses[0], graph=graph, config=config) as sess:
      sess.run(tf.global_variables_initializer())
      values, meta = profiling.TracedRun(sess, grads)
  return {v.op.name: g for v, g in zip(variables, values)}, meta
