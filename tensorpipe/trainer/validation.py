"""The trainer's command line checked before any job starts (`Validate`): the flags together, and
preflight's checks of the model, its data, the cluster and this host applied to them.

Failures are registry.UsageError, one line; warnings (overrides no runner reads, an evaluation
that would wait without end) are logged.
"""

import glob
import os
import re

import lingvo.compat as tf

from tensorpipe.trainer import eval_wait
from tensorpipe.trainer import flags as trainer_flags
from tensorpipe.trainer import jobs as jobs_lib
from tensorpipe.trainer import preflight
from tensorpipe.trainer import registry
from tensorpipe.trainer import startup_plan

FLAGS = trainer_flags.FLAGS


def Validate():
  """Checks the command line before any job starts; raises registry.UsageError (one line)."""
  if FLAGS.mode not in ('sync', 'async'):
    return  # inspect_* / shell / write_inference_graph modes: Lingvo handles them.
  if not FLAGS.model:
    raise registry.UsageError('--model is required (see --list_models)')
  registry.ImportModel(FLAGS.model)
  if not FLAGS.logdir:
    raise registry.UsageError('--logdir is required')
  if not (FLAGS.run_locally or FLAGS.cluster_spec or FLAGS.tpu or FLAGS.use_eager or
          FLAGS.tf_master.startswith('localhost')):
    raise registry.UsageError(
        'say where the jobs run: --run_locally=cpu (all jobs in this process) or '
        '--cluster_spec=JOB=HOST:PORT,...@...')
  _CheckClusterFlags()
  num_cpus = FLAGS.cpu_devices
  split = FLAGS.worker_split_size or 1
  tasks_per_replica = FLAGS.worker_tasks_per_replica or 1
  if FLAGS.worker_tasks_per_replica:
    _CheckSpreadReplicas()
  if num_cpus:
    if FLAGS.worker_gpus or FLAGS.run_locally in ('gpu', 'tpu') or FLAGS.worker_tpus:
      raise registry.UsageError('--cpu_devices is for CPU runs; with GPUs use the stock flags '
                                '(--worker_gpus=K --worker_split_size=K) without --cpu_devices')
    replica_devices = num_cpus * tasks_per_replica
    if split > replica_devices or replica_devices % split:
      spread = (' x --worker_tasks_per_replica=%d' % tasks_per_replica
                if FLAGS.worker_tasks_per_replica else '')
      raise registry.UsageError('--worker_split_size=%d must divide the %d devices of a replica '
                                '(--cpu_devices=%d%s)' % (split, replica_devices, num_cpus, spread))
    num_cpus = replica_devices
  jobs = jobs_lib.Jobs()
  datasets = []
  for job in jobs:
    dataset = jobs_lib.DatasetOfJob(job)
    if dataset and dataset not in datasets:
      datasets.append(dataset)
  for i, dataset in enumerate(datasets):
    cfg = registry.ModelParams(FLAGS.model, dataset)
    if i == 0:
      for message in preflight.UnusedTaskTrainOverrides(cfg, FLAGS.model_params_override):
        tf.logging.warning('TensorPipe: %s', message)
    preflight.CheckDataDirs(cfg, dataset)
    for path, name, k in preflight.PipelineDevices(cfg):
      if k > split:
        if num_cpus:
          if tasks_per_replica > 1:
            fix = ('--cpu_devices=%d --worker_split_size=%d (with --worker_tasks_per_replica=%d)' %
                   (-(-k // tasks_per_replica), -(-k // tasks_per_replica) * tasks_per_replica,
                    tasks_per_replica))
          else:
            fix = '--cpu_devices=%d' % k
          raise registry.UsageError(
              'model %s needs %d devices per model split (TensorPipeLayer %r at %s has %d '
              'partitions) but --cpu_devices=%d with --worker_split_size=%d gives %d; run with '
              '%s' % (FLAGS.model, k, name, path, k, FLAGS.cpu_devices, split, split, fix))
        raise registry.UsageError(
            'model %s needs %d devices per model split (TensorPipeLayer %r at %s has %d '
            'partitions) but --worker_split_size=%d; use --cpu_devices=%d on CPU, or '
            '--worker_gpus=%d --worker_split_size=%d on GPUs' %
            (FLAGS.model, k, name, path, k, split, k, k, k))
  _CheckThisHost(jobs)
  if jobs and all(jobs_lib.IsEvalOnlyJob(j) for j in jobs):
    _CheckEvalCheckpoints(jobs, cfg)
  if FLAGS.tensorpipe_plan and datasets:
    startup_plan.LogModelPlan(registry.ModelParams(FLAGS.model, 'Train'), FLAGS.model)


def _CheckEvalCheckpoints(jobs, cfg):
  """For eval-only jobs: the checkpoint they read exists; a job that will wait for newer ones is
  told how to evaluate just the checkpoints there are (model params `cfg`, overrides applied)."""
  train_dir = os.path.join(FLAGS.logdir, 'train')
  fixed = cfg.task.eval.load_checkpoint_from if cfg.Get('task') is not None else None
  if fixed:
    if not (glob.glob(fixed + '.index') or tf.train.latest_checkpoint(fixed)):
      raise registry.UsageError('task.eval.load_checkpoint_from: %s is no checkpoint (PATH.index) '
                                'and no directory with one; see %s' % (fixed, train_dir))
    return  # The job evaluates that checkpoint once and exits.
  latest = tf.train.latest_checkpoint(train_dir)
  if not latest:
    raise registry.UsageError('no checkpoint in %s to evaluate; train first (same --logdir)' %
                              train_dir)
  for job in jobs:
    m = re.match(r'evaler_once_[^@]+@(\d+)$', job)
    if m and not glob.glob(os.path.join(train_dir, 'ckpt-%08d.index' % int(m.group(1)))):
      raise registry.UsageError('no checkpoint ckpt-%08d in %s for --job=%s' %
                                (int(m.group(1)), train_dir, job))
  step = int(tf.train.load_checkpoint(latest).get_tensor('global_step'))
  for job in jobs:
    if not job.startswith('evaler_once_') and step < cfg.train.max_steps:
      tf.logging.warning('TensorPipe: %s',
                         eval_wait.WaitMessage(job, latest, step, cfg.train.max_steps))



def _CheckClusterFlags():
  """--cluster_spec is well-formed, and --job and --task name one of its tasks."""
  if FLAGS.cluster_spec:
    spec = preflight.CheckClusterSpec(FLAGS.cluster_spec)
    if jobs_lib.StartsServer():
      preflight.CheckClusterTask(spec, FLAGS.job, FLAGS.task, FLAGS.mode)


def _CheckThisHost(jobs):
  """After the flags' checks, before any server starts: this host can write LOGDIR/train for a job
  that writes there, and this task's port (with --cluster_spec) is free."""
  task = 'task %s:%d' % (FLAGS.job, FLAGS.task) if jobs_lib.StartsServer() else None
  if any(job in jobs_lib.WRITING_JOBS for job in jobs):
    preflight.CheckWritable(os.path.join(FLAGS.logdir, 'train'), task or 'this process')
  if task:
    preflight.CheckPortFree(preflight.ParseClusterSpec(FLAGS.cluster_spec)[FLAGS.job][FLAGS.task],
                            task)


def _CheckSpreadReplicas():
  if not FLAGS.cluster_spec:
    raise registry.UsageError(
        '--worker_tasks_per_replica needs --cluster_spec (worker tasks to spread over)')
  workers = preflight.ParseClusterSpec(FLAGS.cluster_spec).get('worker')
  if not workers:
    raise registry.UsageError('--worker_tasks_per_replica needs worker tasks in --cluster_spec')
  if len(workers) % FLAGS.worker_tasks_per_replica:
    raise registry.UsageError('--worker_tasks_per_replica=%d must divide the %d worker tasks of '
                              '--cluster_spec' % (FLAGS.worker_tasks_per_replica, len(workers)))
