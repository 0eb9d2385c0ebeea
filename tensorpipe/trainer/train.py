r"""Launcher: Lingvo's trainer (all of its flags) plus what TensorPipe models need on CPU.

  python -m tensorpipe.trainer.train --model=digits.TinyConvPipeline --cpu_devices=4 --mode=sync \
      --run_locally=cpu --logdir=/tmp/digits                      # controller + trainer
  python -m tensorpipe.trainer.train --model=digits.TinyConvPipeline --cpu_devices=4 --mode=sync \
      --run_locally=cpu --logdir=/tmp/digits --job=evaler_test    # eval the final checkpoint
  python -m tensorpipe.trainer.train --list_models

Extra flags:
  --cpu_devices=K  gives this process K logical CPU devices: every TF server it starts (and every
                   in-process session) is created with ConfigProto(device_count={'CPU': K}); every
                   job spec of the cluster (controller, worker, ps, evaler, decoder, ...) gets
                   cpus_per_replica = K, and the jobs that build the model on one split (controller,
                   evaler, decoder) get devices_per_split = --worker_split_size, which defaults to
                   K. So a TensorPipeLayer with K partitions puts partition k on /device:CPU:k.
                   Without --cpu_devices nothing is changed: the stock flags apply (e.g. on GPUs
                   --worker_gpus=K --worker_split_size=K).
  --worker_tasks_per_replica=T (with --cluster_spec)
                   one worker replica spans T worker tasks of --cpu_devices devices each, so the
                   partitions of a TensorPipeLayer run in separate processes (see
                   tensorpipe.trainer.launch, which starts such a job on one machine).
  --startup_timeout_s=S (with --cluster_spec, default 120)
                   the controller and trainer client wait S seconds for every worker task to accept
                   connections, then stop with an error naming the unreachable task.
  --list_models    prints the registered models and exits.
  --tensorpipe_profile_every_n_steps=N (default 100; 0: off)
                   the trainer traces step 2 and every N-th step, and logs and summarises
                   per-partition forward/backward/re-computation times and per-device busy time and
                   peak step memory (tensorpipe/... scalars in TensorBoard).

Models are looked up in TensorPipe's top-level `params` package first (--model=digits.X imports
params.digits), then wherever Lingvo looks. Before any job starts, the launcher checks the model
name, the data directories of the datasets the jobs read, that the model's TensorPipeLayers fit the
devices of one model split, and (for eval-only jobs) that a checkpoint exists; a failed check prints
one line `tensorpipe.trainer.train: error: ...` and exits with status 2.
"""

import glob
import importlib
import os
import pkgutil
import re
import socket
import sys
import time

from absl import flags
from lingvo import model_imports
from lingvo import model_registry
from lingvo import trainer
import lingvo.compat as tf
from lingvo.core import base_model_params
from lingvo.core import hyperparams
from lingvo.core import py_utils

from tensorpipe import layer as layer_lib
from tensorpipe.trainer import trainer_profiling

flags.DEFINE_integer(
    'cpu_devices', None,
    'Give this process K logical CPU devices and configure every job of the cluster to use them '
    '(cpus_per_replica = K; devices_per_split = --worker_split_size, default K). Unset: the stock '
    'Lingvo behaviour.', lower_bound=1)
flags.DEFINE_bool('list_models', False, 'Print the registered models and exit.')
flags.DEFINE_integer(
    'worker_tasks_per_replica', None,
    'With --cluster_spec: one worker replica (a model split of --worker_split_size devices) spans '
    'this many worker tasks, each with --cpu_devices devices, so the partitions of a TensorPipeLayer run '
    'in separate processes; the worker tasks of --cluster_spec then hold (number of tasks) / N '
    'data-parallel replicas. Unset: Lingvo\'s default, one replica per worker task.', lower_bound=1)
flags.DEFINE_integer(
    'startup_timeout_s', 120,
    'With --cluster_spec: seconds the controller and trainer client wait for every worker task to '
    'accept connections before giving up with an error naming the task.',
    lower_bound=1)

FLAGS = flags.FLAGS

PARAMS_PACKAGE = 'params'
ERROR_EXIT_CODE = 2

# Job spec names of a Lingvo cluster (cluster.Params()).
_ALL_JOB_SPECS = ('controller', 'train_summaries', 'worker', 'ps', 'input', 'evaler', 'decoder')
# Jobs that build the model on one split of their own devices.
_SINGLE_SPLIT_JOB_SPECS = ('controller', 'train_summaries', 'evaler', 'decoder')
_TRAIN_JOBS = ('controller', 'trainer', 'trainer_client', 'train_summaries', 'executor_tpu',
               'host_driven_executor_tpu')


class UsageError(Exception):
  """A problem with the command line or the model's configuration, reported in one line."""


def _Log(msg, *args):
  tf.logging.info('TensorPipe: ' + msg, *args)


# --------------------------------------------------------------------------------------------------
# Model registry: TensorPipe's `params` package first.
# --------------------------------------------------------------------------------------------------


def _ImportIfPresent(module_name):
  """Imports `module_name`; False if it (or a parent package) does not exist. Other errors propagate."""
  try:
    importlib.import_module(module_name)
    return True
  except ModuleNotFoundError as e:
    if e.name and module_name.startswith(e.name):
      return False
    raise


def ImportAllParams():
  """Imports every module of the `params` package (registering its models)."""
  try:
    package = importlib.import_module(PARAMS_PACKAGE)
  except ModuleNotFoundError:
    return
  for info in pkgutil.walk_packages(package.__path__, PARAMS_PACKAGE + '.'):
    importlib.import_module(info.name)


def RegisteredModels():
  """{key: params class} of every registered model, after importing the `params` package."""
  ImportAllParams()
  return dict(model_registry._ModelRegistryHelper.GetAllRegisteredClasses())  # pylint: disable=protected-access


def ImportModel(model_name):
  """Imports the module that registers `model_name` (`params.<module>` first, then Lingvo's paths).

  Raises:
    UsageError: if no registered model has that name.
  """
  if not model_name or '.' not in model_name:
    raise UsageError('--model=%r is not a registered model name such as digits.TinyConvPipeline '
                     '(see --list_models)' % (model_name or ''))
  known = model_registry._ModelRegistryHelper._MODEL_PARAMS  # pylint: disable=protected-access
  if model_name not in known:
    module = model_name.rpartition('.')[0]
    _ImportIfPresent('%s.%s' % (PARAMS_PACKAGE, module))
  if model_name not in known:
    try:
      model_imports.ImportParams(model_name, require_success=False)
    except ModuleNotFoundError:
      pass
  if model_name not in known:
    names = sorted(RegisteredModels())
    raise UsageError('unknown --model=%s; registered models: %s' %
                     (model_name, ', '.join(names) if names else '(none)'))


class ModelRegistry:
  """Stands in for the `lingvo.model_registry` module in RunnerManager (see ImportModel)."""

  @staticmethod
  def GetAllRegisteredClasses():
    return RegisteredModels()

  @staticmethod
  def GetClass(class_key):
    ImportModel(class_key)
    return model_registry._ModelRegistryHelper.GetClass(class_key)  # pylint: disable=protected-access

  @staticmethod
  def GetParams(class_key, dataset_name):
    ImportModel(class_key)
    return model_registry._ModelRegistryHelper.GetParams(class_key, dataset_name)  # pylint: disable=protected-access

  @staticmethod
  def GetProgramSchedule(class_key):
    ImportModel(class_key)
    return model_registry._ModelRegistryHelper.GetProgramSchedule(class_key)  # pylint: disable=protected-access


# --------------------------------------------------------------------------------------------------
# K logical CPU devices.
# --------------------------------------------------------------------------------------------------


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


class RunnerManager(trainer.RunnerManager):
  """Lingvo's RunnerManager with TensorPipe's model lookup and the --cpu_devices cluster layout."""

  model_registry = ModelRegistry

  @property
  def Trainer(self):
    return trainer_profiling.ProfilingTrainer if not py_utils.IsEagerMode() else super().Trainer

  def UpdateClusterParamsFromFlags(self, cluster, job_name):
    super().UpdateClusterParamsFromFlags(cluster, job_name)
    if FLAGS.cpu_devices:
      ConfigureCpuCluster(cluster, FLAGS.cpu_devices, FLAGS.worker_split_size)
    if FLAGS.worker_tasks_per_replica and FLAGS.cluster_spec:
      SpreadReplicas(cluster, len(ClusterSpecDict()['worker']), FLAGS.worker_tasks_per_replica,
                     FLAGS.cpu_devices or 1)


# --------------------------------------------------------------------------------------------------
# Checks before any job starts.
# --------------------------------------------------------------------------------------------------


def _Jobs():
  """The jobs this process will run (Lingvo's defaults for --run_locally)."""
  if FLAGS.job:
    return [j for j in FLAGS.job.split(',') if j]
  if FLAGS.run_locally == 'tpu':
    return ['trainer_client']
  if FLAGS.run_locally:
    return ['controller', 'trainer'] if FLAGS.mode == 'async' else ['controller', 'trainer_client']
  return []


def _DatasetOfJob(job):
  """The dataset a job reads ('Train', 'Test', ...), or None for server-only jobs."""
  if job in _TRAIN_JOBS:
    return 'Train'
  m = re.match(r'(?:evaler_once|evaler|decoder)_([^@]+)', job)
  if m:
    return m.group(1)
  return None


def _IsEvalOnlyJob(job):
  return job.startswith('evaler_') or job.startswith('decoder_')


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
  """[(path, name, K)] for every TensorPipeLayer in model params `cfg` (K = number of partitions)."""
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
  """Raises UsageError for a data directory of the input params of `cfg` that does not exist."""
  if cfg.Get('input') is None:
    return
  for path, p in _Walk(cfg.input, 'input'):
    if 'synthetic' in p and p.synthetic:
      continue  # Generates its data: a data directory it names is never read.
    if 'data_dir' in p:
      data_dir = p.data_dir
      if isinstance(data_dir, str) and data_dir and not os.path.isdir(data_dir):
        raise UsageError('data directory %r of dataset %s (%s.data_dir) does not exist' %
                         (data_dir, dataset, path))
    cls = p.Get('cls') if 'cls' in p else None
    check = getattr(cls, 'CheckDataSource', None)
    if check is not None:
      try:
        check(p)
      except (ValueError, OSError) as e:
        raise UsageError('dataset %s: %s' % (dataset, e)) from e


def ModelParams(model_name, dataset):
  """The registered model's params for `dataset`; UsageError with a one-line message if it fails."""
  try:
    return ModelRegistry.GetParams(model_name, dataset)
  except base_model_params.DatasetError:
    try:
      return ModelRegistry.GetParams(model_name, dataset.title())
    except base_model_params.DatasetError as e:
      raise UsageError('model %s has no dataset %r: %s' % (model_name, dataset, e)) from e
  except (AttributeError, ValueError, TypeError) as e:
    # E.g. a --model_params_override naming a param that does not exist.
    raise UsageError('cannot configure model %s for dataset %s: %s' %
                     (model_name, dataset, str(e).strip().splitlines()[0] if str(e) else
                      type(e).__name__)) from e


def Validate():
  """Checks the command line before any job starts; raises UsageError with a one-line message."""
  if FLAGS.mode not in ('sync', 'async'):
    return  # inspect_* / shell / write_inference_graph modes: Lingvo handles them.
  if not FLAGS.model:
    raise UsageError('--model is required (see --list_models)')
  ImportModel(FLAGS.model)
  if not FLAGS.logdir:
    raise UsageError('--logdir is required')
  if not (FLAGS.run_locally or FLAGS.cluster_spec or FLAGS.tpu or FLAGS.use_eager or
          FLAGS.tf_master.startswith('localhost')):
    raise UsageError('say where the jobs run: --run_locally=cpu (all jobs in this process) or '
                     '--cluster_spec=JOB=HOST:PORT,...@...')
  num_cpus = FLAGS.cpu_devices
  split = FLAGS.worker_split_size or 1
  tasks_per_replica = FLAGS.worker_tasks_per_replica or 1
  if FLAGS.worker_tasks_per_replica:
    _CheckSpreadReplicas()
  if num_cpus:
    if FLAGS.worker_gpus or FLAGS.run_locally in ('gpu', 'tpu') or FLAGS.worker_tpus:
      raise UsageError('--cpu_devices is for CPU runs; with GPUs use the stock flags '
                       '(--worker_gpus=K --worker_split_size=K) without --cpu_devices')
    replica_devices = num_cpus * tasks_per_replica
    if split > replica_devices or replica_devices % split:
      raise UsageError('--worker_split_size=%d must divide the %d devices of a replica '
                       '(--cpu_devices=%d%s)' % (
                           split, replica_devices, num_cpus,
                           ' x --worker_tasks_per_replica=%d' % tasks_per_replica
                           if FLAGS.worker_tasks_per_replica else ''))
    num_cpus = replica_devices
  jobs = _Jobs()
  datasets = []
  for job in jobs:
    dataset = _DatasetOfJob(job)
    if dataset and dataset not in datasets:
      datasets.append(dataset)
  for dataset in datasets:
    cfg = ModelParams(FLAGS.model, dataset)
    CheckDataDirs(cfg, dataset)
    for path, name, k in PipelinePartitions(cfg):
      if k > split:
        if num_cpus:
          raise UsageError(
              'model %s needs %d devices per model split (TensorPipeLayer %r at %s has %d partitions) '
              'but --cpu_devices=%d with --worker_split_size=%d gives %d; run with '
              '--cpu_devices=%d' % (FLAGS.model, k, name, path, k, FLAGS.cpu_devices, split, split,
                                    k))
        raise UsageError(
            'model %s needs %d devices per model split (TensorPipeLayer %r at %s has %d partitions) but '
            '--worker_split_size=%d; use --cpu_devices=%d on CPU, or --worker_gpus=%d '
            '--worker_split_size=%d on GPUs' % (FLAGS.model, k, name, path, k, split, k, k, k))
  if jobs and all(_IsEvalOnlyJob(j) for j in jobs):
    train_dir = os.path.join(FLAGS.logdir, 'train')
    latest = tf.train.latest_checkpoint(train_dir)
    if not latest:
      raise UsageError('no checkpoint in %s to evaluate; train first (same --logdir)' % train_dir)
    step = int(tf.train.load_checkpoint(latest).get_tensor('global_step'))
    max_steps = cfg.train.max_steps
    if step < max_steps and any(not j.startswith('evaler_once_') for j in jobs):
      tf.logging.warning(
          'TensorPipe: the latest checkpoint %s is at step %d of %d: %s evaluates it, then keeps '
          'waiting for newer checkpoints until training reaches step %d; to evaluate just one '
          'checkpoint use --job=evaler_once_%s@%d', latest, step, max_steps, ','.join(jobs),
          max_steps, _DatasetOfJob(jobs[0]), step)
    for job in jobs:
      m = re.match(r'evaler_once_[^@]+@(\d+)$', job)
      if m and not glob.glob(os.path.join(train_dir, 'ckpt-%08d.index' % int(m.group(1)))):
        raise UsageError('no checkpoint ckpt-%08d in %s for --job=%s' %
                         (int(m.group(1)), train_dir, job))


def ClusterSpecDict():
  """--cluster_spec as {job: [address, ...]} (Lingvo's syntax: job=host:port,...@job=...)."""
  spec = {}
  for part in FLAGS.cluster_spec.split('@'):
    job, _, addresses = part.partition('=')
    if not job or not addresses:
      raise UsageError('--cluster_spec part %r is not JOB=HOST:PORT[,HOST:PORT...]' % part)
    spec[job] = addresses.split(',')
  return spec


def _CheckSpreadReplicas():
  if not FLAGS.cluster_spec:
    raise UsageError('--worker_tasks_per_replica needs --cluster_spec (worker tasks to spread over)')
  workers = ClusterSpecDict().get('worker')
  if not workers:
    raise UsageError('--worker_tasks_per_replica needs worker tasks in --cluster_spec')
  if len(workers) % FLAGS.worker_tasks_per_replica:
    raise UsageError('--worker_tasks_per_replica=%d must divide the %d worker tasks of '
                     '--cluster_spec' % (FLAGS.worker_tasks_per_replica, len(workers)))


def WaitForWorkers(spec, timeout_s, poll_s=0.5):
  """Waits until every worker task of `spec` ({job: [address]}) accepts TCP connections.

  The controller and the trainer client run their training steps on the worker tasks' servers (the
  two start their own servers only once they run).

  Raises:
    UsageError: naming the first worker task still unreachable after `timeout_s` seconds.
  """
  deadline = time.time() + timeout_s
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
          if time.time() > deadline:
            raise UsageError('task %s:%d at %s is not reachable after %d s (%s); start it, or fix '
                             'its address in --cluster_spec' % (job, task, address, timeout_s,
                                                               e)) from e
          time.sleep(poll_s)


# --------------------------------------------------------------------------------------------------
# Progress lines.
# --------------------------------------------------------------------------------------------------


def _LogPlan(jobs):
  logdir = FLAGS.logdir
  _Log('model %s, jobs %s, mode %s, logdir %s', FLAGS.model, ','.join(jobs) or '(none)', FLAGS.mode,
       logdir)
  if FLAGS.worker_tasks_per_replica and FLAGS.cluster_spec:
    tasks = len(ClusterSpecDict()['worker'])
    per = FLAGS.worker_tasks_per_replica
    _Log('%d worker tasks of %d CPU devices, %d per replica (%d data-parallel replica%s): partition k '
         'of replica r runs on worker task r*%d + k//%d', tasks, FLAGS.cpu_devices or 1, per,
         tasks // per, '' if tasks // per == 1 else 's', per, FLAGS.cpu_devices or 1)
  elif FLAGS.cpu_devices:
    splits = FLAGS.cpu_devices // FLAGS.worker_split_size
    _Log('%d logical CPU devices in this process; %d model split%s of %d devices (partition k of a '
         'TensorPipeLayer on /device:CPU:%sk)%s', FLAGS.cpu_devices, splits,
         '' if splits == 1 else 's', FLAGS.worker_split_size,
         '' if splits == 1 else '%d*s+' % FLAGS.worker_split_size,
         '' if splits == 1 else ', data parallel: split s gets 1/%d of each batch' % splits)
  if any(j in _TRAIN_JOBS for j in jobs):
    _Log('checkpoints and train summaries -> %s; params, model analysis and controller summaries '
         '-> %s', os.path.join(logdir, 'train'), os.path.join(logdir, 'control'))
    _Log('progress: Lingvo logs "step: N, steps/sec: .., examples/sec: .. loss:.." for every '
         'training step and "Save checkpoint done: PATH" for every checkpoint')
  for job in jobs:
    if _IsEvalOnlyJob(job):
      kind, dataset = ('eval', _DatasetOfJob(job)) if job.startswith('evaler') else (
          'decoder', _DatasetOfJob(job))
      out = os.path.join(logdir, '%s_%s' % (kind, dataset.lower()) if kind == 'eval' else
                         'decoder_%s' % dataset.lower())
      _Log('%s results -> %s (summaries and score-STEP.txt)', job, out)
  _Log('view with: tensorboard --logdir=%s', logdir)


def LatestScore(logdir, dataset='test'):
  """(step, {metric: value}) from the newest eval_<dataset>/score-STEP.txt, or None."""
  files = glob.glob(os.path.join(logdir, 'eval_%s' % dataset.lower(), 'score-*.txt'))
  if not files:
    return None
  path = max(files, key=lambda f: int(re.search(r'score-(\d+)\.txt$', f).group(1)))
  step = int(re.search(r'score-(\d+)\.txt$', path).group(1))
  metrics = {}
  with open(path) as f:
    for line in f:
      parts = line.replace(':', ' ').split()
      if len(parts) >= 2:
        try:
          metrics[parts[0]] = float(parts[-1])
        except ValueError:
          pass
  return step, metrics


def _LogOutcome(jobs):
  logdir = FLAGS.logdir
  if any(j in _TRAIN_JOBS for j in jobs):
    ckpt = tf.train.latest_checkpoint(os.path.join(logdir, 'train'))
    _Log('training done; latest checkpoint %s', ckpt)
  for job in jobs:
    if job.startswith('evaler_'):
      dataset = _DatasetOfJob(job)
      score = LatestScore(logdir, dataset)
      if score:
        step, metrics = score
        _Log('eval %s at step %d: %s', dataset, step,
             ', '.join('%s %.4f' % kv for kv in sorted(metrics.items())))


# --------------------------------------------------------------------------------------------------
# Entry points.
# --------------------------------------------------------------------------------------------------


def _Fail(message):
  sys.stderr.write('tensorpipe.trainer.train: error: %s\n' % message)
  sys.stderr.flush()
  return ERROR_EXIT_CODE


def main(unused_argv):
  try:
    if FLAGS.cpu_devices and not FLAGS['worker_split_size'].present:
      FLAGS.worker_split_size = FLAGS.cpu_devices
    Validate()
  except UsageError as e:
    return _Fail(e)
  if FLAGS.cpu_devices:
    InstallCpuDevices(FLAGS.cpu_devices)
  jobs = _Jobs()
  _LogPlan(jobs)
  if FLAGS.cluster_spec and any(j in ('controller', 'trainer_client') for j in jobs):
    try:
      WaitForWorkers(ClusterSpecDict(), FLAGS.startup_timeout_s)
    except UsageError as e:
      return _Fail(e)
  from lingvo.core import tpu_embedding_layers_v2  # pylint: disable=g-import-not-at-top
  from lingvo.core import tpu_embedding_manager  # pylint: disable=g-import-not-at-top
  tpu_embedding_layers_v2.TPU_EMBEDDING_MANAGER = tpu_embedding_manager.TPUEmbeddingManager()
  RunnerManager(FLAGS.model).Start()
  _LogOutcome(jobs)
  return 0


def Run(argv=None):
  """Parses flags like lingvo.trainer's __main__ and runs main (or --list_models)."""
  argv = list(sys.argv if argv is None else argv)
  try:
    FLAGS(argv, known_only=True)
  except flags.Error as e:
    return _Fail(str(e).strip().splitlines()[0])
  if FLAGS.list_models:
    for name, cls in sorted(RegisteredModels().items()):
      src = cls.__bases__[0] if cls.__name__ == cls.__bases__[0].__name__ else cls
      doc = (src.__doc__ or '').strip().splitlines()
      print('%s%s' % (name, '  -- ' + doc[0] if doc else ''))
    return 0
  if FLAGS.disable_tf2:
    tf.disable_v2_behavior()
  py_utils.SetEagerMode(FLAGS.use_eager)
  tf.config.run_functions_eagerly(FLAGS.run_functions_eagerly)
  if FLAGS.enable_tf_data_debug_mode:
    tf.data.experimental.enable_debug_mode()
  try:
    if FLAGS.model:
      ImportModel(FLAGS.model)  # Model modules may define flags; import before the full parse.
  except UsageError as e:
    return _Fail(e)
  FLAGS.unparse_flags()
  tf.app.run(main, argv=argv)
  return 0


if __name__ == '__main__':
  sys.exit(Run())
