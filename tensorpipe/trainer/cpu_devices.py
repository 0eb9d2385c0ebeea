"""K logical CPU devices in one process, and the cluster layouts that put partition k on device k.

On CPU, `--cpu_devices=K` gives every TF server and in-process session of the trainer K CPU devices
(`InstallCpuDevices`) and sets Lingvo's cluster so that a TensorPipeLayer's partition k lands on
/device:CPU:k of its model split (`ConfigureCpuCluster`), or, across worker processes, on device k
of a replica that spans several worker tasks (`SpreadReplicas`).
"""

from lingvo import compat as tf
from lingvo.core import py_utils

# Job spec names of a Lingvo cluster (cluster.Params()).
_ALL_JOB_SPECS = ('controller', 'train_summaries', 'worker', 'ps', 'input', 'evaler', 'decoder')
# Jobs that build the model on one split of their own devices.
_SINGLE_SPLIT_JOB_SPECS = ('controller', 'train_summaries', 'evaler', 'decoder')


def WithCpuDevices(config, num_cpus):
  """A copy of ConfigProto `config` (or a new one) with device_count {'CPU': num_cpus}."""
  out = tf.compat.v1.ConfigProto()
  if config is not None:
    out.CopyFrom(config)
  out.device_count['CPU'] = num_cpus
  return out


_PATCHED = {}


def InstallCpuDevices(num_cpus):
  """Makes every TF server and Lingvo session of this process have `num_cpus` CPU devices.

  Wraps tf.distribute.Server.__init__ (used by Lingvo's --run_locally and --cluster_spec paths;
  a server ignores tf.config's logical device settings) and py_utils.SessionConfig (in-process
  sessions created with an empty master). Idempotent; the last `num_cpus` wins.
  """
  _PATCHED['num_cpus'] = num_cpus
  server_cls = tf.distribute.Server
  if 'server_init' not in _PATCHED:
    original_init = server_cls.__init__

    def ServerInit(self, server_or_cluster_def, job_name=None, task_index=None, protocol=None,
                   config=None, start=True):
      config = WithCpuDevices(config, _PATCHED['num_cpus'])
      original_init(self, server_or_cluster_def, job_name=job_name, task_index=task_index,
                    protocol=protocol, config=config, start=start)

    _PATCHED['server_init'] = original_init
    server_cls.__init__ = ServerInit
  if 'session_config' not in _PATCHED:
    original_config = py_utils.SessionConfig

    def SessionConfig(*args, **kwargs):
      return WithCpuDevices(original_config(*args, **kwargs), _PATCHED['num_cpus'])

    _PATCHED['session_config'] = original_config
    py_utils.SessionConfig = SessionConfig


def UninstallCpuDevices():
  """Undoes InstallCpuDevices (for tests)."""
  if 'server_init' in _PATCHED:
    tf.distribute.Server.__init__ = _PATCHED.pop('server_init')
  if 'session_config' in _PATCHED:
    py_utils.SessionConfig = _PATCHED.pop('session_config')
  _PATCHED.pop('num_cpus', None)


def ConfigureCpuCluster(cluster_params, num_cpus, split_size):
  """Sets cpus_per_replica = num_cpus on every job spec and the split size of single-split jobs."""
  for name in _ALL_JOB_SPECS:
    if name in cluster_params:
      cluster_params.Get(name).cpus_per_replica = num_cpus
  cluster_params.worker.devices_per_split = split_size
  for name in _SINGLE_SPLIT_JOB_SPECS:
    if name in cluster_params:
      cluster_params.Get(name).devices_per_split = split_size


def SpreadReplicas(cluster_params, num_worker_tasks, tasks_per_replica, devices_per_task):
  """Makes each worker replica span `tasks_per_replica` worker tasks of `devices_per_task` devices.

  Lingvo lists a replica's devices in (task, device) order, so device k of replica r (partition k of
  its pipelines) is device k % devices_per_task of task r * tasks_per_replica + k //
  devices_per_task.
  """
  worker = cluster_params.worker
  worker.replicas = num_worker_tasks // tasks_per_replica
  worker.cpus_per_replica = tasks_per_replica * devices_per_task
  # The controller (and other jobs that only build the model) have their own process's devices;
  # their partitions share them (see placement).
  for name in _SINGLE_SPLIT_JOB_SPECS:
    if name in cluster_params:
      cluster_params.Get(name).devices_per_split = devices_per_task
