"""Checks the trainer makes before any job starts, so a bad setup fails in one line, not in a job.

The model's TensorPipeLayers (`PipelinePartitions`: how many devices a model split needs), the data
directories its inputs read (`CheckDataDirs`), and the worker tasks of a multi-process job
(`ParseClusterSpec`, `WaitForWorkers`). Failures are `registry.UsageError`s.
"""

import os
import socket
import time

from tensorpipe import layer as layer_lib
from tensorpipe import nested_params
from tensorpipe.trainer import registry


def PipelinePartitions(cfg):
  """[(path, name, K)] for every TensorPipeLayer in model params `cfg` (K: its partitions)."""
  out = []
  for path, p in layer_lib.Pipelines(cfg):
    if p.partitions is not None:
      k = len(p.partitions)
    elif p.num_partitions is not None:
      k = p.num_partitions
    else:
      continue  # Misconfigured; the layer itself raises a clear error.
    out.append((path, p.name, int(k)))
  return out


def CheckDataDirs(cfg, dataset):
  """Raises registry.UsageError for a missing data directory of the input params of `cfg`."""
  if cfg.Get('input') is None:
    return
  for path, p in nested_params.Walk(cfg.input, 'input'):
    if 'synthetic' in p and p.synthetic:
      continue  # Generates its data: a data directory it names is never read.
    if 'data_dir' in p:
      data_dir = p.data_dir
      if isinstance(data_dir, str) and data_dir and not os.path.isdir(data_dir):
        raise registry.UsageError('data directory %r of dataset %s (%s.data_dir) does not exist' %
                         (data_dir, dataset, path))
    cls = p.Get('cls') if 'cls' in p else None
    check = getattr(cls, 'CheckDataSource', None)
    if check is not None:
      try:
        check(p)
      except (ValueError, OSError) as e:
        raise registry.UsageError('dataset %s: %s' % (dataset, e)) from e


def ParseClusterSpec(text):
  """A --cluster_spec value as {job: [address, ...]} (Lingvo's job=host:port,...@job=... syntax)."""
  spec = {}
  for part in text.split('@'):
    job, _, addresses = part.partition('=')
    if not job or not addresses:
      raise registry.UsageError('--cluster_spec part %r is not JOB=HOST:PORT[,HOST:PORT...]' %
                                part)
    spec[job] = addresses.split(',')
  return spec


def WaitForWorkers(spec, timeout_s, poll_s=0.5, clock=time.monotonic, sleep=time.sleep):
  """Waits until every worker task of `spec` ({job: [address]}) accepts TCP connections.

  The controller and the trainer client run their training steps on the worker tasks' servers (the
  two start their own servers only once they run). `clock` and `sleep` measure and spend the wait
  (a fake clock in tests).

  Raises:
    registry.UsageError: naming the first worker task still unreachable after `timeout_s` seconds.
  """
  deadline = clock() + timeout_s
  for job, addresses in sorted(spec.items()):
    if job != 'worker':
      continue
    for task, address in enumerate(addresses):
      host, _, port = address.rpartition(':')
      while True:
        try:
          with socket.create_connection((host, int(port)), timeout=poll_s):
            break
        except (OSError, ValueError) as e:
          if clock() > deadline:
            raise registry.UsageError(
                'task %s:%d at %s is not reachable after %d s (%s); start it, or fix its address '
                'in --cluster_spec' % (job, task, address, timeout_s, e)) from e
          sleep(poll_s)
