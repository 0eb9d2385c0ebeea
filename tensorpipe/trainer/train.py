r"""Launcher: Lingvo's trainer (all of its flags) plus what TensorPipe models need on CPU.

  tensorpipe-train --model=digits.TinyConvPipeline --cpu_devices=4 --mode=sync \
      --run_locally=cpu --logdir=/tmp/digits                                # controller + trainer
  tensorpipe-train --model=digits.TinyConvPipeline --cpu_devices=4 --mode=sync \
      --run_locally=cpu --logdir=/tmp/digits --job=evaler_test              # evaluate
  tensorpipe-train --list_models

`tensorpipe-train FLAGS` is the same command as `python -m tensorpipe.trainer.train FLAGS` (in a
checkout set up by scripts/setup.sh: .venv/bin/tensorpipe-train FLAGS). --help lists the flags
below and the Lingvo flags every run sets; --helpfull lists every flag.

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
                   tensorpipe.trainer.launch, which starts such a job on one machine); then
                   --worker_split_size defaults to T x K, one model split per replica.
  --startup_timeout_s=S (with --cluster_spec, default 120)
                   the controller and trainer client wait S seconds for every worker task to accept
                   connections, then stop with an error naming the unreachable task; any task ends
                   the same way when another has not answered S seconds after this one started.
  --lost_task_timeout_s=S (with --cluster_spec, default 60)
                   every task (controller, trainer client, workers) asks every other task for an
                   answer each second (a TCP connection, then gRPC's handshake); one that stops
                   answering for S seconds (host, network or process gone, or the process stopped
                   or hung) ends this task with an error naming it and its address. So after a
                   fault every task ends by itself; start them all again to resume from the last
                   checkpoint. A worker that finds the last checkpoint at train.max_steps ends with
                   status 0 instead (training is done).
  --step_timeout_s=S (default 600; 0: off)
                   the trainer ends the job when the global step does not advance for S seconds
                   (checkpoint saves and restores not counted; the first step of a run, which also
                   starts the graph on every task, gets 3 x S), with an error naming the step and
                   the tasks that give no answer to a status request within 5 s, or saying that
                   every task answers and the step is stuck inside TensorFlow; with --cluster_spec
                   every other task of the job ends with the same line. A step of a tiny model
                   takes well under a second on 2 CPU cores; for paper-scale models on slow devices
                   set S above the slowest step, or 0.
  --sigterm_grace_s=S (with --cluster_spec, default 60)
                   on SIGTERM (preemption) the trainer client saves a checkpoint of its current step
                   and ends; the controller and workers keep serving until it has ended, at most S
                   seconds.
  --list_models    prints the registered models and exits: each marked tiny (trains on 2 CPU cores
                   in about a minute: the digits demo, 800 steps of digits.TinyConvPipeline and its
                   evaluation, took 44 s) or paper-scale, with its K and its description. Models a
                   user's module registers are listed too when --model names one of them or
                   --params_module=MODULE names the module.
  --tensorpipe_plan=N (with --tensorpipe_plan_device, --tensorpipe_plan_memory,
                   --tensorpipe_plan_cache_dir, --tensorpipe_plan_quick)
                   logs the planner's ranked configurations of the model for N devices at
                   start-up, and the flags that apply the best (the guide's "Planning"), with a
                   progress line per phase ('planning: ...'); what it built and measured is cached.
  --tensorpipe_profile_every_n_steps=N (default 100; 0: off)
                   the trainer traces step 2 and every N-th step, and logs and summarises
                   per-partition forward/backward/re-computation times and per-device busy time and
                   peak step memory (tensorpipe/... scalars in TensorBoard).

Models are looked up in TensorPipe's registered models first (--model=digits.X imports
tensorpipe.params.digits; in a checkout, its params/digits.py), then wherever Lingvo looks. Before
any job starts, the launcher checks the model name, the data directories of the datasets the jobs
read, that the model's TensorPipeLayers fit the devices of one model split, and (for eval-only jobs)
that a checkpoint exists; with --cluster_spec, also the spec's jobs and HOST:PORT addresses, that
--job and --task name one of its tasks, that this host can write LOGDIR/train, and that this task's
port is free, all before any server starts. A failed check prints one line
`tensorpipe.trainer.train: error: ...` and exits with status 2. So does a TensorPipe check that
fails inside a step (tensorpipe.check_failure; runners.EndOnCheckFailure), and a step that does not
finish within --step_timeout_s (runners.WatchedSteps), in every task of the job: the trainer records
its line in LOGDIR (ending.EndJob) and the other tasks end with it (cluster_task.ClusterTask). With
--cluster_spec a task at an address the spec gives another task (--task swapped between two hosts)
ends every task of the job with a line naming both. The job that saves checkpoints (the trainer
client in sync mode) removes what killed saves left in LOGDIR/train before it restores
(tensorpipe.trainer.stale_checkpoints).
"""

# This module is the entry point (Run, main); --help prints its docstring. The rest is one module
# per job, in tensorpipe/trainer/: flags (the flags above), validation (the checks before any job
# starts), jobs (which jobs this process runs), runners (Lingvo's runners with TensorPipe's
# mixins), eval_wait (evaluation jobs waiting for a checkpoint), cluster_task (this process's task
# of a --cluster_spec job), ending (the error line and status 2), model_listing (--list_models)
# and run_summary (the progress lines before and after a run).

import os
import sys

from absl import app
from absl import flags
import lingvo.compat as tf
from lingvo.core import py_utils

from tensorpipe.trainer import cluster_task
from tensorpipe.trainer import command_line
from tensorpipe.trainer import cpu_devices
from tensorpipe.trainer import ending
from tensorpipe.trainer import flags as trainer_flags
from tensorpipe.trainer import jobs as jobs_lib
from tensorpipe.trainer import model_listing
from tensorpipe.trainer import preflight
from tensorpipe.trainer import registry
from tensorpipe.trainer import run_summary
from tensorpipe.trainer import runners
from tensorpipe.trainer import stale_checkpoints
from tensorpipe.trainer import validation

FLAGS = trainer_flags.FLAGS
# --help lists the key flags of the main module: the trainer's, the --tensorpipe_plan flags and the
# Lingvo trainer flags every run sets (--helpfull lists every flag).
flags.adopt_module_key_flags(trainer_flags)


def main(unused_argv):
  try:
    if FLAGS.cpu_devices and not FLAGS['worker_split_size'].present:
      # One model split per replica: its devices may span several worker tasks.
      FLAGS.worker_split_size = FLAGS.cpu_devices * (FLAGS.worker_tasks_per_replica or 1)
    validation.Validate()
  except registry.UsageError as e:
    return ending.Fail(e)
  if FLAGS.cpu_devices:
    cpu_devices.InstallCpuDevices(FLAGS.cpu_devices)
  if FLAGS.mode == 'sync' and not FLAGS['checkpoint_in_trainer_cpu'].present:
    # Every task of the job decides alike: the trainer client saves, the controller does not.
    FLAGS.checkpoint_in_trainer_cpu = True  # See runners.CheckpointsBetweenSteps.
  jobs = jobs_lib.Jobs()
  run_summary.LogPlan(jobs)
  # The job that saves checkpoints cleans up, before it restores one.
  if ('trainer_client' if FLAGS.checkpoint_in_trainer_cpu else 'controller') in jobs:
    stale_checkpoints.RemoveStale(os.path.join(FLAGS.logdir, 'train'))
  task = None
  if (FLAGS.cluster_spec and FLAGS.mode == 'sync' and len(jobs) == 1 and
      jobs[0] in cluster_task.ClusterTask.JOBS):
    task = cluster_task.ClusterTask(jobs[0], FLAGS.task)
    task.InstallSigterm()
    task.WatchJobFailure()
    if task.job == 'worker':
      task.StartWatch()
  if FLAGS.cluster_spec and any(j in ('controller', 'trainer_client') for j in jobs):
    try:
      preflight.WaitForWorkers(preflight.ParseClusterSpec(FLAGS.cluster_spec),
                               FLAGS.startup_timeout_s)
    except registry.UsageError as e:
      return ending.Fail(e)
    if task:
      task.StartWatch()
  from lingvo.core import tpu_embedding_layers_v2  # pylint: disable=g-import-not-at-top
  from lingvo.core import tpu_embedding_manager  # pylint: disable=g-import-not-at-top
  tpu_embedding_layers_v2.TPU_EMBEDDING_MANAGER = tpu_embedding_manager.TPUEmbeddingManager()
  try:
    runners.RunnerManager(FLAGS.model).Start()
  except Exception:  # pylint: disable=broad-except
    line = ending.RecordedJobFailure() if task else None
    if line is None:
      raise
    # Another task ended the job (e.g. a worker at another worker's address) while this one
    # started: TensorFlow's error here follows from it; the line says what to do.
    ending.EndJob(line, record=False)
  if task:
    task.Finish()
  run_summary.LogOutcome(jobs)
  return 0


def Run(argv=None):
  """Parses flags like lingvo.trainer's __main__ and runs main (or --list_models)."""
  argv = list(sys.argv if argv is None else argv)
  try:
    FLAGS(argv, known_only=True)
  except flags.Error as e:
    return ending.Fail(str(e).strip().splitlines()[0])
  if FLAGS.list_models:
    try:
      model_listing.ListModels()
    except registry.UsageError as e:
      return ending.Fail(e)
    return 0
  if FLAGS.disable_tf2:
    tf.disable_v2_behavior()
  py_utils.SetEagerMode(FLAGS.use_eager)
  tf.config.run_functions_eagerly(FLAGS.run_functions_eagerly)
  if FLAGS.enable_tf_data_debug_mode:
    tf.data.experimental.enable_debug_mode()
  try:
    if FLAGS.model:
      # Model modules may define flags; import before the full parse.
      registry.ImportModel(FLAGS.model)
  except registry.UsageError as e:
    return ending.Fail(e)
  app.define_help_flags()  # --help, --helpshort, --helpfull (absl defines them in app.run).
  try:
    # Now every flag is defined: an unknown or bad one fails here, in one line.
    command_line.ParseArgv(argv)
  except flags.Error as e:
    return ending.Fail('%s (see --helpfull)' % str(e).strip().splitlines()[0])
  FLAGS.unparse_flags()
  tf.app.run(main, argv=argv)
  return 0


if __name__ == '__main__':
  sys.exit(Run())
