"""The trainer's own flags (tensorpipe.trainer.train), and the flags its --help lists.

Defined here, imported by every trainer module that reads them, so each is defined before Lingvo's
trainer parses the command line. absl's --help lists the key flags of the main module: train.py
adopts this module's (`flags.adopt_module_key_flags`), which are the flags below, the
--tensorpipe_plan flags (startup_plan) and the Lingvo trainer flags every run sets.
"""

from absl import flags
from lingvo import trainer  # pylint: disable=unused-import  # Defines Lingvo's trainer flags.

from tensorpipe.trainer import startup_plan

flags.DEFINE_integer(
    'cpu_devices', None,
    'Give this process K logical CPU devices and configure every job of the cluster to use them '
    '(cpus_per_replica = K; devices_per_split = --worker_split_size, default K, or K x '
    '--worker_tasks_per_replica). Unset: the stock Lingvo behaviour.', lower_bound=1)
flags.DEFINE_bool(
    'list_models', False,
    'Print the registered models, each marked tiny (CPU-sized) or paper-scale, with its K, and '
    'exit. With --model or --params_module, also the models of that user\'s module.')
flags.DEFINE_string(
    'params_module', None,
    'With --list_models: a module on PYTHONPATH (e.g. mymodels) whose registered models are listed '
    'beside TensorPipe\'s own.')
flags.DEFINE_integer(
    'worker_tasks_per_replica', None,
    'With --cluster_spec: one worker replica (a model split of --worker_split_size devices, '
    'default N x --cpu_devices) spans this many worker tasks, each with --cpu_devices devices, so '
    'the partitions of a TensorPipeLayer run in separate processes; the worker tasks of '
    '--cluster_spec then hold (number of tasks) / N data-parallel replicas. Unset: Lingvo\'s '
    'default, one replica per worker task.', lower_bound=1)
flags.DEFINE_integer(
    'startup_timeout_s', 120,
    'With --cluster_spec: seconds the controller and trainer client wait for every worker task to '
    'accept connections before giving up with an error naming the task; any task also ends, naming '
    'it, when another task of the job has not answered this long after this task started.',
    lower_bound=1)
flags.DEFINE_integer(
    'lost_task_timeout_s', 60,
    'With --cluster_spec: a task of the job that stops answering (a TCP connection, then gRPC\'s '
    'handshake) for this many seconds (its host or network is gone, it died, or it is stopped or '
    'hung) ends every other task with an error naming '
    'it and its address; then start every task again with the same commands to resume from the '
    'last checkpoint. Lower it to notice faults sooner, raise it on a network with long outages.',
    lower_bound=1)
flags.DEFINE_integer(
    'step_timeout_s', 600,
    'End the job with an error naming the step, and the tasks that give no answer, when the '
    'global step does not advance for this many seconds (checkpoint saves and restores not '
    'counted; the first step of a run, which also starts the graph, gets 3 times as long). Steps '
    'of the tiny models take well under a second on CPU; for paper-scale models on slow devices '
    'set it above the slowest step (e.g. 3600), or 0 to turn it off.', lower_bound=0)
flags.DEFINE_integer(
    'sigterm_grace_s', 60,
    'With --cluster_spec: after SIGTERM (preemption), the trainer client saves a checkpoint of its '
    'current step and ends, and the other tasks keep serving until it has ended, at most this many '
    'seconds; set it below the time your scheduler waits between SIGTERM and SIGKILL.',
    lower_bound=1)

FLAGS = flags.FLAGS
# --help lists these beside the flags above (--helpfull lists every flag): the --tensorpipe_plan
# flags and the Lingvo trainer flags every run sets.
flags.adopt_module_key_flags(startup_plan)
for _name in ('model', 'logdir', 'mode', 'run_locally', 'job', 'task', 'cluster_spec',
              'worker_split_size', 'model_params_override'):
  flags.declare_key_flag(_name)
