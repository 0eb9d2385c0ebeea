"""Placement: which device runs each partition, checked against the cluster's and session's devices.

By default partition k runs on `cluster.WorkerDeviceInModelSplit(k)`, so the same params run on
logical CPU devices, GPUs or TPU cores. Lingvo wraps that index around when the split has fewer
devices than partitions; in jobs that run the training step TensorPipe refuses instead of silently
stacking partitions on one device. Jobs that only build the model for checkpoints, summaries or
evaluation (controller, evaler, decoder) often get one device with the stock flags; there partitions
share the devices round-robin, with a warning. Variables are placed once, at construction (step (0)
of docs/design.md); FProp places the partitions' calls on the devices of the model split it runs in.
"""

from typing import Any, List, Optional, Sequence

from lingvo import compat as tf

from tensorpipe import tf_internals

_DEVICE_TYPES = ('CPU', 'GPU', 'TPU')
_SHARING_JOBS = ('controller', 'evaler', 'decoder', 'train_summaries')


def _ClusterDevices(cluster):
  try:
    devices = cluster.ListDevices(cluster.job_spec)
  except (AssertionError, ValueError, AttributeError):
    return []
  return [d for d in devices.reshape([-1]).tolist() if d]


def _Matches(spec, full):
  """True if every field `spec` names equals that field of the fully specified device `full`."""
  return all(
      getattr(spec, f) is None or str(getattr(spec, f)).upper() == str(getattr(full, f)).upper()
      for f in ('job', 'replica', 'task', 'device_type', 'device_index'))


def CheckDevice(device: str, cluster_devices: Sequence[str], where: str = 'TensorPipeLayer') -> str:
  """Checks one explicit device string; returns it unchanged."""
  if not isinstance(device, str) or not device:
    raise ValueError('%s: device %r is not a device string such as "/device:CPU:1"' %
                     (where, device))
  try:
    spec = tf.DeviceSpec.from_string(device)
  except ValueError as e:
    raise ValueError('%s: cannot parse device %r: %s' % (where, device, e)) from e
  if spec.device_type is None or spec.device_type.upper() not in _DEVICE_TYPES:
    raise ValueError('%s: unknown device %r: its device type must be one of %s' %
                     (where, device, ', '.join(_DEVICE_TYPES)))
  if cluster_devices:
    fulls = [tf.DeviceSpec.from_string(d) for d in cluster_devices]
    if not any(_Matches(spec, f) for f in fulls):
      raise ValueError('%s: unknown device %r: the cluster has only %s' %
                       (where, device, ', '.join(cluster_devices)))
  return device


def NumDevices(p: Any, where: Optional[str] = None) -> Optional[int]:
  """K, the number of devices a TensorPipeLayer's Params `p` give: `num_devices`, or its deprecated
  old name `num_partitions` (None if neither is set).

  With `where` (the pipeline's name in messages), the old name gets a one-line deprecation
  warning. Both names set to different values raise ValueError.
  """
  old = p.Get('num_partitions') if 'num_partitions' in p else None
  if old is None:
    return p.num_devices
  if p.num_devices is not None and p.num_devices != old:
    raise ValueError('%s: num_devices=%r and num_partitions=%r (its deprecated old name) disagree; '
                     'set only num_devices' % (where or 'TensorPipeLayer', p.num_devices, old))
  if where is not None:
    tf.logging.warning('%s: the Param num_partitions is deprecated; it is K, the number of '
                       'devices: set num_devices=%r instead', where, old)
  return old


def SplitDevices(cluster: Any, num_devices: int, devices: Optional[Sequence[str]] = None,
                 where: str = 'TensorPipeLayer') -> List[str]:
  """Returns the K device strings of the model split the partitions run on (per partition, its
  device is one of them: schedule_builders.PartitionDevices gives its index).

  Args:
    cluster: Lingvo cluster (the layer's `self.cluster`).
    num_devices: K, the devices the partitions run on.
    devices: optional explicit list of K device strings; each must be one of the cluster's devices.
    where: name used in error messages.

  Raises:
    ValueError: for a list of the wrong length, an unknown device, or a model split with fewer
      devices than num_devices.
  """
  cluster_devices = _ClusterDevices(cluster)
  if devices is not None:
    listed = isinstance(devices, (list, tuple))
    if not listed or len(devices) != num_devices:
      raise ValueError('%s: `devices` has %s entries for num_devices=%d devices; give one device '
                       'string per device' % (where, len(devices) if listed else repr(devices),
                                              num_devices))
    return [CheckDevice(d, cluster_devices, where) for d in devices]
  split = cluster.num_devices_per_split
  if num_devices > 1 and split < num_devices:
    message = (
        '%s: num_devices=%d needs %d devices per model split, but the cluster (job %r) has %d' %
        (where, num_devices, num_devices, cluster.job, split))
    if cluster.job not in _SHARING_JOBS:
      raise ValueError(
          '%s; set --worker_split_size=%d with that many devices per replica '
          '(`tensorpipe.trainer.train --cpu_devices=%d` on CPU), use '
          'cluster_factory.ForTestingWorker(cpus=%d, split_size=%d) in tests, or list `devices` '
          'explicitly' %
          (message, num_devices, num_devices, num_devices, num_devices))
    tf.logging.warning('%s; job %r only builds the model, so its partitions share those devices '
                       'round-robin', message, cluster.job)
  return [cluster.WorkerDeviceInModelSplit(k) for k in range(num_devices)]


def VariableDevices(cluster: Any, num_devices: int,
                    devices: Optional[Sequence[str]] = None,
                    where: str = 'TensorPipeLayer') -> List[str]:
  """The K devices that hold the partitions' variables: the partition devices of model split 0.

  Every job that builds the model must put a variable in the same place, since in a multi-process
  job (Lingvo's --cluster_spec) the controller initialises and checkpoints the variables the trainer
  client's steps use. A job that builds the model on devices of its own (the controller's) but sees
  the worker tasks in its session therefore takes split 0 of the worker job, as the trainer client
  does; everywhere else (one process, or an evaler on its own) these are the devices
  `SplitDevices` returns.
  """
  if devices is None and cluster.job_spec.name != cluster.params.worker.name:
    listed = tf_internals.SessionDevices(cluster)
    worker_job = cluster.params.worker.name + '/'
    if any(d.startswith(worker_job) for d in listed):
      workers = cluster.ListDevices(cluster.params.worker).reshape([-1]).tolist()
      if len(workers) >= num_devices:
        return workers[:num_devices]
  return SplitDevices(cluster, num_devices, devices, where)


def SessionConfig(num_cpu_devices: int, intra_op_threads: Optional[int] = None,
                  inter_op_threads: Optional[int] = None) -> tf.compat.v1.ConfigProto:
  """A ConfigProto: K logical CPU devices, soft placement off (a missing device is an error)."""
  config = tf.compat.v1.ConfigProto(device_count={'CPU': num_cpu_devices},
                                    allow_soft_placement=False)
  if intra_op_threads is not None:
    config.intra_op_parallelism_threads = intra_op_threads
  if inter_op_threads is not None:
    config.inter_op_parallelism_threads = inter_op_threads
  return config


def CheckSessionDevices(sess: tf.Session, devices: Sequence[str]) -> None:
  """Raises ValueError naming each of `devices` that session `sess` does not have."""
  have = [tf.DeviceSpec.from_string(d.name) for d in sess.list_devices()]
  missing = [d for d in devices
             if d and not any(_Matches(tf.DeviceSpec.from_string(d), h) for h in have)]
  if missing:
    raise ValueError('The session has no device %s; it has %s' %
                     (', '.join(missing), ', '.join(d.name for d in sess.list_devices())))
