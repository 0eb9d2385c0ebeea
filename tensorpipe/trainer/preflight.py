"""Checks the trainer makes before any job starts, so a bad setup fails in one line, not in a job.

The model's TensorPipeLayers (`PipelinePartitions`: how many devices a model split needs), the data
directories its inputs read (`CheckDataDirs`), `--model_params_override` keys the trainer never
reads (`UnusedTaskTrainOverrides`), and the worker tasks of a multi-process job (`ParseClusterSpec`,
`WaitForWorkers`). Failures are `registry.UsageError`s.
"""

import os
import re
import time

from tensorpipe import layer as layer_lib
from tensorpipe import nested_params
from tensorpipe.trainer import liveness
from tensorpipe.trainer import registry


def PipelinePartitions(cfg):
  """[(path, name, K)] for every TensorPipeLayer in model params `cfg` (K: its partitions)."""
  out = []
  for path, p in layer_lib.Pipelines(cfg):
    if p.partitions is not None:
      k = len(p.partitions) // p.virtual_stages
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


# The model-level train params that Lingvo's SingleTaskModel copies from `task.train` when the
# params are built (base_model.SingleTaskModel.CopyTaskParams, lingvo 0.14.0). The runners (the
# trainer's loop, checkpoint saving, the evaler's and decoder's stopping step) read only these
# copies, so an override of `task.train.<key>`, applied after the copy, changes nothing they do.
MODEL_LEVEL_TRAIN_KEYS = (
    'start_up_delay_steps', 'max_steps', 'tpu_steps_per_loop', 'tpu_device_order_mode',
    'tpu_computation_shape', 'early_stop', 'enqueue_max_steps', 'save_interval_seconds',
    'save_interval_steps', 'save_max_to_keep', 'save_keep_checkpoint_every_n_hours',
    'summary_interval_steps', 'async_checkpointing', 'checkpoint_finite_check', 'ema_decay',
    'ema_decay_moving_vars', 'ema_schedule')


def OverrideKeys(text):
  """The keys a --model_params_override value sets, in order ('a.b: 1; c: 2' -> ['a.b', 'c'])."""
  keys = []
  for line in (text or '').replace(';', '\n').split('\n'):
    m = re.match(r'\s*([^\s:#][^:]*?)\s*:', line)
    if m and m.group(1) not in keys:
      keys.append(m.group(1))
  return keys


def UnusedTaskTrainOverrides(cfg, override_text):
  """Warnings for overrides of `task.train.<key>` that the runners never read.

  An override `task.train.max_steps: 750` is applied after Lingvo copied task.train.max_steps to
  the model-level train.max_steps, which is what the trainer's loop, the evaler and the decoder
  stop at: the run goes on to the model's own max_steps. Only keys whose model-level value then
  differs from the overridden one are reported (setting both, as `train.max_steps: 750;
  task.train.max_steps: 750`, is fine).

  Args:
    cfg: the model params, built with the overrides applied.
    override_text: the --model_params_override value.

  Returns:
    One message per such key, naming the key, both values and the override to use instead.
  """
  if cfg.Get('task') is None or cfg.Get('train') is None:
    return []  # A multi-task model: no single task.train shadowed by the model's.
  messages = []
  for key in OverrideKeys(override_text):
    name = key[len('task.train.'):] if key.startswith('task.train.') else None
    if name not in MODEL_LEVEL_TRAIN_KEYS:
      continue
    task_value, model_value = cfg.task.train.Get(name), cfg.train.Get(name)
    if task_value != model_value:
      messages.append(
          '--model_params_override sets %s: %s, which the trainer does not read: Lingvo copies '
          'task.train.%s to train.%s when the params are built, before the override, and the '
          'trainer, evaler and decoder read train.%s (still %s). Set train.%s instead, e.g. '
          '--model_params_override="train.%s: %s"' %
          (key, task_value, name, name, name, model_value, name, name, task_value))
  return messages


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
      while True:
        ok, why = liveness.CanConnect(address, poll_s)
        if ok:
          break
        if clock() > deadline:
          raise registry.UsageError(
              'task %s:%d at %s is not reachable after %d s (%s); start it, or fix its address '
              'in --cluster_spec' % (job, task, address, timeout_s, why))
        sleep(poll_s)
