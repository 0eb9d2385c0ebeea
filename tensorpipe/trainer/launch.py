r"""Starts a whole distributed training job on this machine: one process per task, on 127.0.0.1.

  python -m tensorpipe.trainer.launch --model=digits.TinyConvPipeline --logdir=/tmp/digits4 \
      --worker_tasks=4                                 # its K = 4 partitions in 4 worker processes
  python -m tensorpipe.trainer.launch --model=digits.TinyConvPipeline --logdir=/tmp/digits22 \
      --worker_tasks=4 --tasks_per_replica=2 --cpu_devices=2   # S = 2 replicas x K = 4 partitions

It picks free ports below the kernel's ephemeral range (so no outgoing connection takes one before
its task binds it), writes Lingvo's --cluster_spec (controller, trainer_client, W worker tasks) and
runs `python -m tensorpipe.trainer.train` once per task with --mode=sync --job=JOB --task=I, so
every process is TensorFlow's own distributed runtime driven by Lingvo's trainer. A replica (one
model split of --tasks_per_replica x --cpu_devices devices) spans --tasks_per_replica worker tasks:
partition k of replica r runs on worker task r * tasks_per_replica + k // cpu_devices. Any other
flag (e.g. --model_params_override) is passed to every process.

It prints each process's pid and log file, and stops every process it started, by pid, when training
ends, when any process fails, or when no training step has been logged for --stall_timeout_s
seconds; the message names the task. Running the same command again resumes from the last checkpoint
in --logdir. On several hosts run `python -m tensorpipe.trainer.train` with the same --cluster_spec
(real addresses) and --job/--task on each host (see docs/guide.md, "Scale-out").
"""

import argparse
import dataclasses
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from typing import List, Optional

_STEP = re.compile(r'step: *(\d+),')
_REPORT_EVERY_S = 30  # How often the latest training step is printed.
EXIT_FAILED = 1


@dataclasses.dataclass
class Task:
  """One process of the job."""
  job: str
  index: int
  argv: List[str]
  log: str
  proc: Optional[subprocess.Popen] = None

  @property
  def name(self):
    return '%s task %d' % (self.job, self.index)


_EPHEMERAL_RANGE = '/proc/sys/net/ipv4/ip_local_port_range'
_LOWEST_PORT = 10000  # Below this, ports are commonly assigned to services.


def FreePorts(count, host='127.0.0.1', rng=None):
  """`count` distinct free TCP ports on `host`, below the kernel's ephemeral port range.

  The tasks bind their ports only once they have started, so the ports are free when picked and
  bound later by other processes. Ports below the ephemeral range are never handed out for outgoing
  connections or port-0 binds, so the job's own connections (and most other processes') cannot take
  one meanwhile; in a network namespace of its own the job is the only one that binds them. The
  search starts at a random port (`rng`: a random.Random), so two launchers rarely probe the same.
  """
  try:
    with open(_EPHEMERAL_RANGE, encoding='ascii') as f:
      ephemeral_low = int(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    ephemeral_low = 32768
  candidates = list(range(_LOWEST_PORT, ephemeral_low))
  start = (rng or random.Random()).randrange(len(candidates))
  socks = []
  try:
    for port in candidates[start:] + candidates[:start]:
      s = socket.socket()
      try:
        s.bind((host, port))
      except OSError:
        s.close()
        continue
      socks.append(s)
      if len(socks) == count:
        return [s.getsockname()[1] for s in socks]
    raise RuntimeError('fewer than %d free ports between %d and %d on %s' %
                       (count, _LOWEST_PORT, ephemeral_low, host))
  finally:
    for s in socks:
      s.close()


def ClusterSpec(num_workers, host='127.0.0.1'):
  """Lingvo's --cluster_spec for a controller, a trainer client and `num_workers` worker tasks."""
  ports = FreePorts(2 + num_workers, host)
  addr = ['%s:%d' % (host, p) for p in ports]
  return 'controller=%s@trainer_client=%s@worker=%s' % (addr[0], addr[1], ','.join(addr[2:]))


def Tasks(args, extra):
  """The job's tasks: workers first (they serve), then the controller and the trainer client."""
  spec = ClusterSpec(args.worker_tasks)
  common = [sys.executable, '-m', 'tensorpipe.trainer.train', '--model=%s' % args.model,
            '--logdir=%s' % args.logdir, '--mode=sync', '--cluster_spec=%s' % spec,
            '--cpu_devices=%d' % args.cpu_devices,
            '--worker_split_size=%d' % (args.tasks_per_replica * args.cpu_devices),
            '--worker_tasks_per_replica=%d' % args.tasks_per_replica,
            '--startup_timeout_s=%d' % args.startup_timeout_s] + list(extra)
  logs = os.path.join(args.logdir, 'launch')
  tasks = [Task('worker', i, common + ['--job=worker', '--task=%d' % i],
                os.path.join(logs, 'worker.%d.log' % i)) for i in range(args.worker_tasks)]
  for job in ('controller', 'trainer_client'):
    tasks.append(Task(job, 0, common + ['--job=%s' % job, '--task=0'],
                      os.path.join(logs, '%s.log' % job)))
  return tasks


def _LastStep(path):
  """The last training step logged in `path`, or None."""
  try:
    with open(path, 'rb') as f:
      f.seek(max(0, os.path.getsize(path) - 65536))
      steps = _STEP.findall(f.read().decode('utf-8', 'replace'))
  except OSError:
    return None
  return int(steps[-1]) if steps else None


def Stop(tasks, grace_s=30.0):
  """Stops every started process by pid: SIGTERM (the trainer client saves its current step, see
  tensorpipe.trainer.train), then SIGKILL after `grace_s` seconds."""
  alive = [t for t in tasks if t.proc is not None and t.proc.poll() is None]
  for t in alive:
    t.proc.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + grace_s
  for t in alive:
    try:
      t.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      t.proc.kill()
      t.proc.wait()


def Supervise(tasks, stall_timeout_s, poll_s=1.0, out=sys.stdout, clock=time.monotonic,
              sleep=time.sleep):
  """Waits until the trainer client and the controller end; returns (exit status, message).

  Fails as soon as any process exits with an error or a worker exits at all (workers serve until
  they are stopped), or when the trainer client has logged no new step for `stall_timeout_s`.
  `clock` and `sleep` measure and spend the time (a fake clock in tests).
  """
  trainer = [t for t in tasks if t.job == 'trainer_client'][0]
  last_step, last_change, last_report = None, clock(), clock()
  while True:
    for t in tasks:
      status = t.proc.poll()
      if status is None:
        continue
      # A worker ends by itself, with status 0, only once training is done.
      if status != 0 or (t.job == 'worker' and any(u.proc.poll() is None for u in tasks
                                                    if u.job != 'worker')):
        return EXIT_FAILED, ('%s (pid %d) exited with status %d; its log: %s. Run the same command '
                             'again to resume from the last checkpoint.' %
                             (t.name, t.proc.pid, status, t.log))
    if all(t.proc.poll() == 0 for t in tasks if t.job != 'worker'):
      return 0, 'training done (last step %s); logs in %s' % (
          _LastStep(trainer.log), os.path.dirname(trainer.log))
    step = _LastStep(trainer.log)
    if step != last_step:
      last_step, last_change = step, clock()
      if clock() - last_report >= _REPORT_EVERY_S:
        out.write('  step %d\n' % step)
        out.flush()
        last_report = clock()
    elif clock() - last_change > stall_timeout_s:
      return EXIT_FAILED, ('no training step for %d s (last: %s); stopping every task. Logs: %s' %
                           (stall_timeout_s, last_step, os.path.dirname(trainer.log)))
    sleep(poll_s)


def ParseArgs(argv):
  """(the launcher's flags, the other arguments) from `argv`, which lacks the program name."""
  parser = argparse.ArgumentParser(prog='tensorpipe.trainer.launch',
                                   description=__doc__.split('\n\n', maxsplit=1)[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--model', required=True, help='Registered model (see --list_models of '
                      'tensorpipe.trainer.train).')
  parser.add_argument('--logdir', required=True, help='Checkpoints, summaries and launch/ logs.')
  parser.add_argument('--worker_tasks', type=int, default=2, help='Worker processes W.')
  parser.add_argument('--tasks_per_replica', type=int, default=None,
                      help='Worker tasks one replica spans (default W: one replica, no data '
                      'parallelism); must divide W.')
  parser.add_argument('--cpu_devices', type=int, default=1,
                      help='Logical CPU devices per worker process.')
  parser.add_argument('--stall_timeout_s', type=int, default=300,
                      help='Stop the job when the trainer client logs no new step for this long.')
  parser.add_argument('--startup_timeout_s', type=int, default=120,
                      help='Seconds the controller and trainer client wait for every worker '
                      'task to accept connections.')
  args, extra = parser.parse_known_args(argv)
  if args.tasks_per_replica is None:
    args.tasks_per_replica = args.worker_tasks
  for name in ('worker_tasks', 'tasks_per_replica', 'cpu_devices', 'stall_timeout_s',
               'startup_timeout_s'):
    if getattr(args, name) < 1:
      parser.error('--%s must be at least 1, got %d' % (name, getattr(args, name)))
  if args.worker_tasks % args.tasks_per_replica:
    parser.error('--tasks_per_replica=%d must divide --worker_tasks=%d' %
                 (args.tasks_per_replica, args.worker_tasks))
  args.logdir = os.path.abspath(args.logdir)
  return args, extra


def main(argv=None):
  args, extra = ParseArgs(sys.argv[1:] if argv is None else argv)
  tasks = Tasks(args, extra)
  os.makedirs(os.path.dirname(tasks[0].log), exist_ok=True)
  replicas = args.worker_tasks // args.tasks_per_replica
  print('tensorpipe.trainer.launch: %s, %d worker tasks x %d CPU devices, %d replica%s of %d '
        'devices; logdir %s' % (args.model, args.worker_tasks, args.cpu_devices, replicas,
                                '' if replicas == 1 else 's',
                                args.tasks_per_replica * args.cpu_devices, args.logdir),
        flush=True)
  status, message = EXIT_FAILED, 'interrupted'
  try:
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    for t in tasks:
      with open(t.log, 'ab') as log:
        log.write(('# %s\n' % shlex.join(t.argv)).encode('utf-8'))  # To run it on another host.
        log.flush()
        # The task outlives this block: Supervise waits for it and stops it.
        t.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            t.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
      print('  %-18s pid %-7d log %s' % (t.name, t.proc.pid, t.log), flush=True)
    status, message = Supervise(tasks, args.stall_timeout_s)
  except KeyboardInterrupt:
    pass
  finally:
    Stop(tasks)
  print('tensorpipe.trainer.launch: %s%s' % ('' if status == 0 else 'error: ', message), flush=True)
  return status


if __name__ == '__main__':
  sys.exit(main())
