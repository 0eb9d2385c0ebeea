"""Checks the trainer makes before any job starts, so a bad setup fails in one line, not in a job.

The model's TensorPipeLayers (`Pipelines`, `PipelinePartitions`: how many devices a model split
needs), the data directories its inputs read (`CheckDataDirs`), and the worker tasks of a
multi-process job (`ParseClusterSpec`, `WaitForWorkers`). Failures are `registry.UsageError`s.
"""

import os
import socket
import time

from lingvo.core import hyperparams

from tensorpipe import layer as layer_lib
from tensorpipe.trainer import registry


def _Walk(params, path=''):
  """Yields (path, Params) for `params` and every Params nested in it (also inside lists/dicts)."""
  yield path, params
  for name, value in params.IterParams():
    for sub_path, sub in _WalkValue(value, path + '.' + name if path else name):
      yield sub_path, sub


def _WalkValue(value, path):
  if isinstance(value, hyperparams.Params):
    yield from _Walk(value, path)
  elif isinstance(value, (list, tuple)):
    for i, v in enumerate(value):
      yield from _WalkValue(v, '%s[%d]' % (path, i))
  elif isinstance(value, dict):
    for k, v in value.items():
      yield from _WalkValue(v, '%s[%r]' % (path, k))


def Pipelines(cfg):
  """[(path, Params)] of every TensorPipeLayer in model params `cfg`."""
  out = []
  for path, p in _Walk(cfg):
    cls = p.Get('cls') if 'cls' in p else None
    if isinstance(cls, type) and issubclass(cls, layer_lib.TensorPipeLayer):
      out.append((path, p))
  return out


def PipelinePartitions(cfg):
  """[(path, name, K)] for every TensorPipeLayer in model params `cfg` (K: its partitions)."""
  out = []
  for path, p in Pipelines(cfg):
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
  for path, p in _Walk(cfg.input, 'input'):
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
