r"""Starts a whole distributed training job on this machine: one process per task, on 127.0.0.1.

  tensorpipe-launch --model=digits.TinyConvPipeline --logdir=/tmp/digits4 \
      --worker_tasks=4                                 # its K = 4 partitions in 4 worker processes
  tensorpipe-launch --model=digits.TinyConvPipeline --logdir=/tmp/digits22 \
      --worker_tasks=4 --tasks_per_replica=2 --cpu_devices=2   # S = 2 replicas x K = 4 partitions

`tensorpipe-launch FLAGS` is the same command as `python -m tensorpipe.trainer.launch FLAGS` (in a
checkout set up by scripts/setup.sh: .venv/bin/tensorpipe-launch FLAGS). --help lists the launcher's
flags, --helpfull every flag; a bad or missing launcher flag ends it with one line
`tensorpipe.trainer.launch: error: ...` (status 2).

It picks free ports below the kernel's ephemeral range (so no outgoing connection takes one before
its task binds it), writes Lingvo's --cluster_spec (controller, trainer_client, W worker tasks) and
runs `python -m tensorpipe.trainer.train` once per task with --mode=sync --job=JOB --task=I, so
every process is TensorFlow's own distributed runtime driven by Lingvo's trainer. A replica (one
model split of --tasks_per_replica x --cpu_devices devices) spans --tasks_per_replica worker tasks:
partition k of replica r runs on worker task r * tasks_per_replica + k // cpu_devices. Any other
flag (e.g. --model_params_override, or absl's logging flags such as --v) is passed to every
process, which checks it.

It prints each process's pid and log file, and stops every process it started, by pid, when training
ends, when any process fails, or when no training step has been logged for --stall_timeout_s
seconds; the message names the task. SIGTERM, SIGHUP or SIGINT (Ctrl-C) to the launcher stop the
job as a preemption does (see `Stop`): the trainer client saves a checkpoint of its current step,
then every task ends, and the last line names the checkpoint and the step the same command resumes
at. Running the same command again resumes from the last checkpoint in --logdir. On several hosts
run `tensorpipe-train` (`python -m tensorpipe.trainer.train`) with the same --cluster_spec (real
addresses) and --job/--task on each host (see docs/guide.md, "Scale-out").
"""

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

from absl import app
from absl import flags

from tensorpipe.trainer import command_line

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


def _UnassignedPorts():
  """The ports the kernel never hands out on its own: from _LOWEST_PORT up to its ephemeral range
  (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default), and above that range."""
  try:
    with open(_EPHEMERAL_RANGE, encoding='ascii') as f:
      low, high = (int(v) for v in f.read().split()[:2])
  except (OSError, ValueError):
    low, high = 32768, 60999
  return list(range(_LOWEST_PORT, low)) + list(range(max(_LOWEST_PORT, high + 1), 65536))


def FreePorts(count, host='127.0.0.1', rng=None):
  """`count` distinct free TCP ports on `host`, outside the kernel's ephemeral port range.

  The tasks bind their ports only once they have started, so the ports are free when picked and
  bound later by other processes. Ports outside the ephemeral range are never handed out for
  outgoing connections or port-0 binds, so the job's own connections (and most other processes')
  cannot take one meanwhile; in a network namespace of its own the job is the only one that binds
  them. The search starts at a random port (`rng`: a random.Random), so two launchers rarely probe
  the same.
  """
  candidates = _UnassignedPorts()
  if not candidates:
    raise RuntimeError('no port from %d up lies outside the ephemeral range in %s; narrow that '
                       'range (e.g. sysctl net.ipv4.ip_local_port_range="32768 60999")' %
                       (_LOWEST_PORT, _EPHEMERAL_RANGE))
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
    raise RuntimeError('fewer than %d free ports on %s outside the ephemeral range in %s' %
                       (count, host, _EPHEMERAL_RANGE))
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
            '--startup_timeout_s=%d' % args.startup_timeout_s,
            '--sigterm_grace_s=%d' % args.sigterm_grace_s] + list(extra)
  logs = os.path.join(args.logdir, 'launch')
  tasks = [Task('worker', i, common + ['--job=worker', '--task=%d' % i],
                os.path.join(logs, 'worker.%d.log' % i)) for i in range(args.worker_tasks)]
  for job in ('controller', 'trainer_client'):
    tasks.append(Task(job, 0, common + ['--job=%s' % job, '--task=0'],
                      os.path.join(logs, '%s.log' % job)))
  return tasks


class StepLog:
  """The last training step a task's log shows, read incrementally.

  The first read looks at the log's last 64 KiB (a log appended to by earlier runs may be long);
  later reads only at new bytes, so a long stretch of other output (retries, warnings) after a step
  never hides it. A log that shrank (rotated or truncated) is read again from its start; a
  step lower than the last (a restarted task) is taken as it is. `step` stays None until a step is
  logged, and a later poll never loses it.
  """

  def __init__(self, path):
    self.path = path
    self.step = None
    self._offset = max(0, self._Size() - 65536)
    self._partial = b''  # A line not yet ended by a newline.

  def _Size(self):
    try:
      return os.path.getsize(self.path)
    except OSError:
      return 0

  def Read(self):
    """The last step logged so far (None before the first)."""
    size = self._Size()
    if size < self._offset:
      self._offset, self._partial = 0, b''
    if size == self._offset:
      return self.step
    try:
      with open(self.path, 'rb') as f:
        f.seek(self._offset)
        data = f.read(size - self._offset)
    except OSError:
      return self.step
    self._offset += len(data)
    lines = (self._partial + data).split(b'\n')
    self._partial = lines.pop()
    steps = _STEP.findall(b'\n'.join(lines).decode('utf-8', 'replace'))
    if steps:
      self.step = int(steps[-1])
    return self.step


_CHECKPOINT_PATH = re.compile(r'^model_checkpoint_path: *"(.*)"', re.M)
_CHECKPOINT_STEP = re.compile(r'ckpt-(\d+)$')


def LatestCheckpoint(train_dir):
  """(path, step) of the checkpoint a restart loads from `train_dir` (its `checkpoint` file, as
  TensorFlow's saver writes it), or None."""
  try:
    with open(os.path.join(train_dir, 'checkpoint'), encoding='utf-8') as f:
      match = _CHECKPOINT_PATH.search(f.read())
  except OSError:
    return None
  if not match:
    return None
  path = os.path.join(train_dir, match.group(1))
  step = _CHECKPOINT_STEP.search(path)
  return path, int(step.group(1)) if step else None


class Signals:
  """SIGTERM, SIGHUP and SIGINT sent to the launcher, recorded in order.

  The handler only records the signal: the supervision loop and `Stop` look at `received` between
  polls, so no process start or wait is cut in half (a task started but not yet recorded would be
  left running).
  """

  HANDLED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

  def __init__(self):
    self.received = []

  def Install(self):
    for signum in self.HANDLED:
      signal.signal(signum, self._Record)

  def _Record(self, signum, unused_frame):
    self.received.append(signum)

  @property
  def first(self):
    """The name of the first signal received, e.g. 'SIGTERM', or None."""
    return signal.Signals(self.received[0]).name if self.received else None


# After SIGTERM the trainer client saves its current step within --sigterm_grace_s (or gives up and
# exits); this much longer is left for the processes to end.
_EXIT_MARGIN_S = 15


def Stop(tasks, grace_s, kill_now=lambda: False, clock=time.monotonic, sleep=time.sleep,
         poll_s=0.2):
  """Stops every started process by pid, the way a preemption does; returns 'killed' (the names of
  the tasks that had to be killed) or ''.

  (1) SIGTERM to the trainer client first: it saves a checkpoint of its current step and ends
      (tensorpipe.trainer.runners, CheckpointsBetweenSteps); then to the controller, which then
      writes nothing more; then to the workers, which keep serving until the trainer client has
      ended.
  (2) Wait until every task has ended, at most `grace_s` seconds.
  (3) SIGKILL whatever still runs. Once `kill_now()` is true (e.g. a second Ctrl-C), the rest
      of (2) is skipped.
  """
  order = {'trainer_client': 0, 'controller': 1}
  alive = sorted((t for t in tasks if t.proc is not None and t.proc.poll() is None),
                 key=lambda t: order.get(t.job, 2))
  for t in alive:  # (1)
    t.proc.send_signal(signal.SIGTERM)
  deadline = clock() + grace_s
  while any(t.proc.poll() is None for t in alive):  # (2)
    if clock() >= deadline or kill_now():
      break
    sleep(poll_s)
  killed = []
  for t in alive:  # (3)
    if t.proc.poll() is None:
      t.proc.kill()
      t.proc.wait()
      killed.append(t.name)
  return ', '.join(killed)


def Supervise(tasks, stall_timeout_s, poll_s=1.0, out=sys.stdout, clock=time.monotonic,
              sleep=time.sleep, signals=None):
  """Waits until the trainer client and the controller end; returns (exit status, message), or
  (None, signal name) as soon as the launcher has received a signal (`signals`, a Signals).

  Fails as soon as any process exits with an error or a worker exits at all (workers serve until
  they are stopped), or when the trainer client has logged no new step for `stall_timeout_s`.
  `clock` and `sleep` measure and spend the time (a fake clock in tests).
  """
  trainer = [t for t in tasks if t.job == 'trainer_client'][0]
  steps = StepLog(trainer.log)
  last_step, last_change, last_report = None, clock(), clock()
  while True:
    if signals and signals.received:
      return None, signals.first
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
      return 0, 'training done (last step %s); logs in %s' % (steps.Read(),
                                                               os.path.dirname(trainer.log))
    step = steps.Read()
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


def SignalledOutcome(name, before, after, killed):
  """The launcher's last line after signal `name` stopped the job: what was saved, how to resume.

  `before` and `after`: LatestCheckpoint(train dir) when the signal came and once every task had
  ended; `killed`: what Stop returned.
  """
  if after and after != before and after[1] is not None:
    saved = 'the trainer client saved a checkpoint of step %d: %s' % (after[1], after[0])
    resume = 'at step %d' % (after[1] + 1)
  else:
    saved = 'the current step was not saved'
    if killed:
      saved += ' (killed: %s)' % killed
    if after:
      resume = 'from the last checkpoint, %s' % after[0]
      if after[1] is not None:
        resume += ', at step %d' % (after[1] + 1)
    else:
      resume = 'from step 1 (no checkpoint yet)'
  return 'stopped by %s: %s. Run the same command again to resume %s.' % (name, saved, resume)


def DefineFlags():
  """Defines the launcher's flags; Run calls it.

  Not at import: the trainer (tensorpipe.trainer.train, through Lingvo's trainer) defines flags of
  the same names (--model, --logdir, --cpu_devices, ...) for its own meaning, and a process may
  import both modules (the tests do); absl allows one definition per name.
  """
  flags.DEFINE_string('model', None, 'Registered model (see `tensorpipe-train --list_models`).')
  flags.DEFINE_string('logdir', None, 'Checkpoints, summaries and launch/ logs.')
  flags.DEFINE_integer('worker_tasks', 2, 'Worker processes W.', lower_bound=1)
  flags.DEFINE_integer('tasks_per_replica', None,
                       'Worker tasks one replica spans (default W: one replica, no data '
                       'parallelism); must divide W.', lower_bound=1)
  flags.DEFINE_integer('cpu_devices', 1, 'Logical CPU devices per worker process.', lower_bound=1)
  flags.DEFINE_integer('stall_timeout_s', 300,
                       'Stop the job when the trainer client logs no new step for this long.',
                       lower_bound=1)
  flags.DEFINE_integer('startup_timeout_s', 120,
                       'Seconds the controller and trainer client wait for every worker task to '
                       'accept connections.', lower_bound=1)
  flags.DEFINE_integer('sigterm_grace_s', 60,
                       'After SIGTERM, SIGHUP or SIGINT to the launcher: seconds the trainer '
                       'client has to save a checkpoint of its current step before every task is '
                       'killed; set it below the time your scheduler waits between SIGTERM and '
                       'SIGKILL. A second signal kills every task at once.', lower_bound=1)
  flags.mark_flags_as_required(['model', 'logdir'])
  flags.register_validator('logdir', command_line.WritableDir)
  flags.register_multi_flags_validator(
      ['worker_tasks', 'tasks_per_replica'],
      lambda v: v['worker_tasks'] % (v['tasks_per_replica'] or 1) == 0,
      message='--tasks_per_replica must divide --worker_tasks')


FLAGS = flags.FLAGS
PROG = 'tensorpipe.trainer.launch'


@dataclasses.dataclass
class Args:
  """The launcher's settings, from its flags."""
  model: str
  logdir: str  # Absolute.
  worker_tasks: int
  tasks_per_replica: int
  cpu_devices: int
  stall_timeout_s: int
  startup_timeout_s: int
  sigterm_grace_s: int

  @classmethod
  def FromFlags(cls):
    return cls(model=FLAGS.model, logdir=os.path.abspath(FLAGS.logdir),
               worker_tasks=FLAGS.worker_tasks,
               tasks_per_replica=FLAGS.tasks_per_replica or FLAGS.worker_tasks,
               cpu_devices=FLAGS.cpu_devices, stall_timeout_s=FLAGS.stall_timeout_s,
               startup_timeout_s=FLAGS.startup_timeout_s, sigterm_grace_s=FLAGS.sigterm_grace_s)


def ParseFlags(argv):
  """The launcher's flags_parser for absl.app.run: parses its flags from `argv` (program name
  first); returns [program name] + the arguments passed on to every task.

  Those are the flags no module of the launcher defines (the trainer's and Lingvo's) and any other
  argument, in their order, then absl's logging flags given on the command line (--v,
  --alsologtostderr, ...): the launcher parses those too, and they mean the same to every task.
  A bad value of the launcher's own flags, or a missing one, ends it with one line.
  """
  rest = command_line.FlagsParser(PROG, known_only=True)(argv)
  logging_flags = FLAGS.flags_by_module_dict().get('absl.logging', [])
  return rest + [f.serialize() for f in logging_flags if f.present]


def main(argv):
  """Runs the job; `argv`: what ParseFlags returns."""
  args, extra = Args.FromFlags(), argv[1:]
  signals = Signals()
  signals.Install()  # Before any task starts: from here on no signal leaves a task behind.
  tasks = Tasks(args, extra)
  os.makedirs(os.path.dirname(tasks[0].log), exist_ok=True)
  replicas = args.worker_tasks // args.tasks_per_replica
  print('tensorpipe.trainer.launch: %s, %d worker tasks x %d CPU devices, %d replica%s of %d '
        'devices; logdir %s' % (args.model, args.worker_tasks, args.cpu_devices, replicas,
                                '' if replicas == 1 else 's',
                                args.tasks_per_replica * args.cpu_devices, args.logdir),
        flush=True)
  train_dir = os.path.join(args.logdir, 'train')
  # The exit status, or None while the launcher stops the tasks after a signal.
  status: Optional[int] = EXIT_FAILED
  message = 'the launcher failed'
  try:
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    for t in tasks:
      if signals.received:
        break
      with open(t.log, 'ab') as log:
        log.write(('# %s\n' % shlex.join(t.argv)).encode('utf-8'))  # To run it on another host.
        log.flush()
        # The task outlives this block: Supervise waits for it and Stop stops it.
        t.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            t.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
      print('  %-18s pid %-7d log %s' % (t.name, t.proc.pid, t.log), flush=True)
    if signals.received:
      status, message = None, signals.first
    else:
      status, message = Supervise([t for t in tasks if t.proc], args.stall_timeout_s,
                                  signals=signals)
  finally:
    before = LatestCheckpoint(train_dir)
    if status is None:
      print('tensorpipe.trainer.launch: %s: the trainer client saves its current step (at most '
            '--sigterm_grace_s=%d s; a second signal kills every task now)' %
            (message, args.sigterm_grace_s), flush=True)
    # A signal more than the one that began the stop (if one did) kills at once.
    signalled = 1 if status is None else 0
    killed = Stop(tasks, args.sigterm_grace_s + _EXIT_MARGIN_S,
                  kill_now=lambda: len(signals.received) > signalled)
    if status is None:
      status = 128 + signals.received[0]  # The shell's status for a process ended by that signal.
      message = SignalledOutcome(message, before, LatestCheckpoint(train_dir), killed)
  print('tensorpipe.trainer.launch: %s%s' % ('' if status == 0 else 'error: ', message), flush=True)
  return status


def Run(argv=None):
  """Parses the flags in `argv` (default sys.argv), runs the job and exits with its status."""
  DefineFlags()
  app.run(main, argv=argv, flags_parser=ParseFlags)


if __name__ == '__main__':
  Run()
