"""Checks the trainer makes before any job starts, so a bad setup fails in one line, not in a job.

The model's TensorPipeLayers (`PipelineDevices`: how many devices a model split needs), the data
directories its inputs read (`CheckDataDirs`), `--model_params_override` keys the trainer never
reads (`UnusedTaskTrainOverrides`), and the tasks of a multi-process job: the --cluster_spec, --job
and --task flags (`CheckClusterSpec`, `CheckClusterTask`), that this host can write the checkpoint
directory (`CheckWritable`) and bind this task's port (`CheckPortFree`), all before any TensorFlow
server starts, and the worker tasks answering (`WaitForWorkers`). Failures are
`registry.UsageError`s.
"""

import difflib
import errno
import os
import re
import socket
import time
from typing import Any, Dict, Tuple

import lingvo.compat as tf

from tensorpipe import layer as layer_lib
from tensorpipe import nested_params
from tensorpipe import placement
from tensorpipe.trainer import liveness
from tensorpipe.trainer import registry


def PipelineDevices(cfg):
  """[(path, name, K)] for every TensorPipeLayer in model params `cfg` (K: its devices)."""
  out = []
  for path, p in layer_lib.Pipelines(cfg):
    if p.partitions is not None:
      k = len(p.partitions) // p.virtual_stages
    elif placement.NumDevices(p) is not None:
      k = placement.NumDevices(p)
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


# The job names Lingvo 0.14.0's trainer runs (trainer.RunnerManager._CreateRunner) and so the names
# a --cluster_spec may hold: sync mode's controller, trainer_client and worker; async mode's trainer
# and ps; the input and train_summaries jobs; the TPU executors; evaler_DATASET and decoder_DATASET.
CLUSTER_JOBS = ('controller', 'trainer_client', 'worker', 'trainer', 'ps', 'input',
                'train_summaries', 'executor_tpu', 'host_driven_executor_tpu')
CLUSTER_JOB_PREFIXES = ('evaler_', 'decoder_')
# Sync-mode jobs whose steps run on the worker tasks (Lingvo reads the spec's worker job for them).
SYNC_JOBS = ('controller', 'trainer_client', 'worker')
_HOST = re.compile(r'^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])$')


def SplitAddress(address, where):
  """(host, port) of `address` (HOST:PORT, an IPv6 host in brackets); `where` names the task in
  the error ('task worker:1').

  Raises:
    registry.UsageError: naming the address and the fix, for a missing or malformed host or port,
      or a port outside 1-65535.
  """
  if not address:
    raise registry.UsageError('--cluster_spec: the address of %s is empty (a stray "," or "@"?); '
                              'write HOST:PORT' % where)
  host, colon, port = address.rpartition(':')
  if not colon or not port:
    raise registry.UsageError('--cluster_spec: address %r of %s has no port; write HOST:PORT, e.g. '
                              '%s:7000' % (address, where, host or address))
  if not host:
    raise registry.UsageError('--cluster_spec: address %r of %s has no host; write HOST:PORT, e.g. '
                              '127.0.0.1%s' % (address, where, address))
  if not _HOST.match(host):
    raise registry.UsageError('--cluster_spec: address %r of %s: %r is not a host name or IP '
                              'address; write HOST:PORT (an IPv6 address in brackets: [::1]:7000)'
                              % (address, where, host))
  if not port.isdigit():
    raise registry.UsageError('--cluster_spec: address %r of %s: port %r is not a number; write '
                              'HOST:PORT with PORT in 1-65535' % (address, where, port))
  if not 1 <= int(port) <= 65535:
    raise registry.UsageError('--cluster_spec: address %r of %s: port %d is outside 1-65535; pick '
                              'a port in that range' % (address, where, int(port)))
  return host, int(port)


def CheckClusterSpec(text):
  """Parses and checks a --cluster_spec value; returns it as {job: [address, ...]}.

  Lingvo would accept what it can split and fail later, or never: a worker address without a port
  waits the whole --startup_timeout_s before "not reachable"; two tasks given one address (or a job
  named twice, whose first tasks Lingvo drops) loop on "unknown device" errors; an unknown job name
  ends in a traceback.

  Raises:
    registry.UsageError: naming the offending part, job or address and the fix.
  """
  jobs = [part.partition('=')[0] for part in text.split('@')]
  spec = ParseClusterSpec(text)
  for job in jobs:
    if jobs.count(job) > 1:
      raise registry.UsageError('--cluster_spec names job %s %d times; list all its tasks in one '
                                'part: %s=HOST:PORT,HOST:PORT,...' % (job, jobs.count(job), job))
  seen: Dict[Tuple[str, Any], str] = {}  # (host, port) -> the task at that address
  for job, addresses in spec.items():
    if job not in CLUSTER_JOBS and not (job.startswith(CLUSTER_JOB_PREFIXES) and
                                        job.partition('_')[2]):
      close = difflib.get_close_matches(job, CLUSTER_JOBS, n=1)
      raise registry.UsageError(
          '--cluster_spec has unknown job %r;%s Lingvo\'s jobs are controller, trainer_client, '
          'worker (sync mode), trainer, ps (async mode), evaler_DATASET, decoder_DATASET, input, '
          'train_summaries, executor_tpu, host_driven_executor_tpu' %
          (job, ' did you mean %s?' % close[0] if close else ''))
    for task, address in enumerate(addresses):
      where = 'task %s:%d' % (job, task)
      host, port = SplitAddress(address, where)
      key = (host.lower(), port)
      if key in seen:
        raise registry.UsageError('--cluster_spec gives %s and %s the same address %s; every task '
                                  'needs an address of its own (another port, or another host)' %
                                  (seen[key], where, address))
      seen[key] = where
  return spec


def CheckClusterTask(spec, job, task, mode):
  """Checks that --job=`job` --task=`task` name a task of the checked --cluster_spec `spec`.

  Lingvo starts this task's server with that job name and index, and fails with a traceback (or
  an "unknown device" loop) otherwise. In --mode=sync, the controller, trainer client and workers
  need the spec's worker job, and the trainer client sends its steps to worker task --task.

  Raises:
    registry.UsageError: naming the flag's value, the spec's jobs or task count, and the fix.
  """
  names = ', '.join(spec)
  if not job:
    raise registry.UsageError('--cluster_spec needs --job and --task: the task this process runs, '
                              'one of the spec\'s jobs (%s)' % names)
  if ',' in job:
    raise registry.UsageError('--job=%s: with --cluster_spec a process runs one task: give one job '
                              'of the spec (%s) and its --task' % (job, names))
  if job not in spec:
    raise registry.UsageError('--job=%s is not a job of --cluster_spec (its jobs: %s); give one of '
                              'them, or add %s=HOST:PORT to the spec' % (job, names, job))
  count = len(spec[job])
  if not 0 <= task < count:
    raise registry.UsageError('--task=%d is out of range for job %s: --cluster_spec gives it %d '
                              'task%s, so --task=0..%d' %
                              (task, job, count, '' if count == 1 else 's', count - 1))
  if mode == 'sync' and job in SYNC_JOBS:
    workers = len(spec.get('worker', ()))
    if not workers:
      raise registry.UsageError('--mode=sync runs the training steps on worker tasks, but '
                                '--cluster_spec has no worker job; add worker=HOST:PORT[,...]')
    if job == 'trainer_client' and task >= workers:
      raise registry.UsageError('--task=%d of trainer_client: Lingvo\'s trainer client sends its '
                                'steps to worker task --task, and --cluster_spec has %d worker '
                                'task%s; use --task=0' %
                                (task, workers, '' if workers == 1 else 's'))


def CheckWritable(directory, who):
  """Checks that this host can create files in `directory` (created if missing) by creating and
  removing a probe file; `who` names this task in the error ('task worker:1').

  Every training task writes there: the controller and the trainer client save checkpoints, and
  each worker writes the shards of the variables it holds. A task that cannot would otherwise train
  on and never save (one read-only host is enough), while the other hosts blame the controller.

  Raises:
    registry.UsageError: naming the directory, the file system's reason and the fix.
  """
  probe = os.path.join(directory, '.tensorpipe-write-probe-%s-%d' % (socket.gethostname(),
                                                                     os.getpid()))
  try:
    tf.io.gfile.makedirs(directory)
    with tf.io.gfile.GFile(probe, 'w') as f:
      f.write('TensorPipe checks that this host can write here; remove me.\n')
    tf.io.gfile.remove(probe)
  except tf.errors.OpError as e:
    raise registry.UsageError(
        'cannot write to %s from this host (%s: %s): checkpoints go there, and the controller, '
        'the trainer client and every worker write their part; make --logdir writable on every '
        'host (with several hosts: one shared file system, mounted read-write)' %
        (directory, who, e.message)) from e


def CheckPortFree(address, where):
  """Checks that this task's server could listen on the port of its `address` (HOST:PORT).

  TensorFlow's gRPC server listens on the port on every interface, with SO_REUSEADDR; where another
  process holds the port, it fails with 'Could not start gRPC server', naming neither the port nor
  the address. This binds the same way and releases the port at once.

  Raises:
    registry.UsageError: naming the address and the likely cause.
  """
  _, port = SplitAddress(address, where)
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      s.bind(('0.0.0.0', port))
    except OSError as e:
      raise registry.UsageError(PortTakenMessage(address, where, e)) from e


def PortTakenMessage(address, where, error=None):
  """Why the server of `where` ('task controller:0') cannot listen on `address`, and the fix."""
  if error is not None and error.errno == errno.EACCES:
    return ('%s cannot listen on %s (%s): ports below 1024 need root; pick a port from 1024 up in '
            '--cluster_spec' % (where, address, error.strerror))
  reason = ' (%s)' % error.strerror if error is not None else ''
  return ('%s cannot listen on %s%s: another process, e.g. a task of an earlier run, holds %s; '
          'stop it or pick another port in --cluster_spec' % (where, address, reason, address))


def WaitForWorkers(spec, timeout_s, poll_s=0.5, clock=time.monotonic, sleep=time.sleep,
                   log=tf.logging.info):
  """Waits until every worker task of `spec` ({job: [address]}) accepts TCP connections.

  The controller and the trainer client run their training steps on the worker tasks' servers (the
  two start their own servers only once they run). A worker that does not answer at once is named
  in one `log` line when the wait for it begins and in one when it answers. `clock` and `sleep`
  measure and spend the wait (a fake clock in tests).

  Raises:
    registry.UsageError: naming the first worker task still unreachable after `timeout_s` seconds.
  """
  start = clock()
  deadline = start + timeout_s
  for job, addresses in sorted(spec.items()):
    if job != 'worker':
      continue
    for task, address in enumerate(addresses):
      waited = False
      while True:
        ok, why = liveness.CanConnect(address, poll_s)
        if ok:
          break
        if clock() > deadline:
          raise registry.UsageError(
              'task %s:%d at %s is not reachable after %d s (%s); start it, or fix its address '
              'in --cluster_spec' % (job, task, address, timeout_s, why))
        if not waited:
          waited = True
          log('TensorPipe: waiting up to %d s (--startup_timeout_s) for task %s:%d at %s (%s)',
              max(0, int(deadline - clock())), job, task, address, why)
        sleep(poll_s)
      if waited:
        log('TensorPipe: task %s:%d at %s answers after %.1f s', job, task, address,
            clock() - start)
