r"""Scale-out on one machine: the digits model in one process against its partitions in workers.

Trains the registered digits.TinyConvPipeline (K = 4 partitions, M = 8) for --steps steps four
ways, each through Lingvo's trainer:

  1 process     tensorpipe.trainer.train --run_locally=cpu --cpu_devices=4 (4 logical devices)
  2 processes   tensorpipe.trainer.launch --worker_tasks=2 --cpu_devices=2 (2 partitions per worker)
  4 processes   tensorpipe.trainer.launch --worker_tasks=4 --cpu_devices=1 (a partition per worker)
  4 hosts       the 4-process job's per-host commands (docs/guide.md, "Several hosts"), each worker
                in a host of its own and the controller and trainer client in a fifth: Linux network
                namespaces with their own addresses, linked by veth pairs to a bridge
                (tests/hosts.py; needs root, else the row is skipped with the reason)

and prints, per way: examples/sec (median over the second half of the steps, from Lingvo's step
lines) and the ratio to one process, and from the trainer's last traced step (TensorPipe's profile,
--tensorpipe_profile_every_n_steps) the step time and the share of it that the device with the most
transfer time spends receiving tensors from other devices and processes (a cross-process receive
counts from its request, so waiting for the sender is included). Worker processes on one machine
talk over loopback gRPC (or veth) and share its cores: this measures what process boundaries cost,
not what separate hosts would gain. With --repeats R the ways run R rounds, interleaved, and each
column is the median over the rounds.

  python -m tools.scale_out              # about 5 minutes on 2 cores
  python -m tools.scale_out --steps 200 --repeats 3

Run time: a way's wall seconds, start-up included, are the table's last column; at --steps 300 on
a 2-core CPU a way took 28-64 s (docs/benchmarks.md, three sittings). Progress goes to stderr: a
line when each way of each round starts and one with its time and examples/s when it ends.

Results: docs/benchmarks.md.
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags

from tensorpipe import progress as progress_lib
from tensorpipe.measure import machine
from tensorpipe.trainer import command_line
from tests import hosts

flags.DEFINE_integer('steps', 400, 'Training steps per way.', lower_bound=1)
flags.DEFINE_integer('profile_every', 100, 'Traced step interval.')
flags.DEFINE_integer('timeout', 600, 'Seconds per way.')
flags.DEFINE_integer('repeats', 1, 'Rounds of all ways, interleaved; each column is the median.',
                     lower_bound=1)
FLAGS = flags.FLAGS

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = 'digits.TinyConvPipeline'
_STEP = re.compile(r'\] step: *(\d+), steps/sec: [\d.]+, examples/sec: ([\d.]+)')
_PROFILE_STEP = re.compile(
    r'TensorPipe profile of step (\d+).*\n\s*step ([\d.]+) ms\n(.*?)\npartition', re.S)


def _Command(way, logdir, steps, profile_every):
  override = '--model_params_override=train.max_steps: %d' % steps
  profile = '--tensorpipe_profile_every_n_steps=%d' % profile_every
  if way == 1:
    return [sys.executable, '-m', 'tensorpipe.trainer.train', '--model=%s' % MODEL,
            '--cpu_devices=4', '--mode=sync', '--run_locally=cpu', '--logdir=%s' % logdir, override,
            profile]
  return [sys.executable, '-m', 'tensorpipe.trainer.launch', '--model=%s' % MODEL,
          '--logdir=%s' % logdir, '--worker_tasks=%d' % way, '--cpu_devices=%d' % (4 // way),
          override, profile]


HOSTS_WAY = '4 hosts'
_HOST_WORKERS = 4
_PORT = 7000  # Each host is a network namespace of its own: no other process binds its ports.


def _TrainerLog(way, logdir, output):
  if way == 1:
    return output
  name = 'trainer_client.log' if way == HOSTS_WAY else os.path.join('launch', 'trainer_client.log')
  with open(os.path.join(logdir, name)) as f:
    return f.read()


def _RunOnHosts(logdir, steps, profile_every, timeout):
  """The 4-process job's per-host commands on network-namespace hosts; a CompletedProcess-like
  (returncode, stdout, stderr) of the trainer client."""
  workers = ['w%d' % i for i in range(_HOST_WORKERS)]
  with hosts.Hosts(['h0'] + workers) as net:
    spec = 'controller=%s:%d@trainer_client=%s:%d@worker=%s' % (
        net.Address('h0'), _PORT, net.Address('h0'), _PORT + 1,
        ','.join('%s:%d' % (net.Address(w), _PORT) for w in workers))
    common = [sys.executable, '-m', 'tensorpipe.trainer.train', '--model=%s' % MODEL,
              '--logdir=%s' % logdir, '--mode=sync', '--cluster_spec=%s' % spec,
              '--cpu_devices=1', '--worker_split_size=%d' % _HOST_WORKERS,
              '--worker_tasks_per_replica=%d' % _HOST_WORKERS,
              '--model_params_override=train.max_steps: %d' % steps,
              '--tensorpipe_profile_every_n_steps=%d' % profile_every]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', PYTHONPATH=_REPO, PYTHONUNBUFFERED='1')
    tasks = [(w, 'worker', i) for i, w in enumerate(workers)]
    tasks += [('h0', 'controller', 0), ('h0', 'trainer_client', 0)]
    procs = {job: net.Run(host, common + ['--job=%s' % job, '--task=%d' % i],
                          os.path.join(logdir, '%s.log' % job if job != 'worker' else
                                       'worker.%d.log' % i), env=env)
             for host, job, i in tasks}
    try:
      status = procs['trainer_client'].wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      status = 'timeout'
    # The workers end by themselves once training is done; Close stops them by pid.
  return subprocess.CompletedProcess([], status, '', '' if status == 0 else _TrainerLog(
      HOSTS_WAY, logdir, '')[-3000:])


def _Transfers(table):
  """(busiest device's transfer ms, its name) from a profile table's device rows."""
  header, rows = None, []
  for line in table.splitlines():
    fields = line.split()
    if fields and fields[0] == 'device':
      header = fields
    elif header and len(fields) >= len(header):
      rows.append(fields)
  column = header.index('transfer')
  best = max(rows, key=lambda r: float(r[column].rstrip('ms')))
  return float(best[column].rstrip('ms')), best[0]


def Run(way, steps, profile_every, timeout):
  """(examples/sec, step ms of the last traced step, busiest transfer ms, its device, seconds)."""
  with tempfile.TemporaryDirectory(prefix='tensorpipe-scale-out.') as logdir:
    start = time.perf_counter()
    if way == HOSTS_WAY:
      proc = _RunOnHosts(logdir, steps, profile_every, timeout)
    else:
      proc = subprocess.run(_Command(way, logdir, steps, profile_every), cwd=_REPO,
                            capture_output=True, text=True, timeout=timeout, check=False,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    seconds = time.perf_counter() - start
    if proc.returncode:
      raise SystemExit('scale_out: way %r failed (exit %s):\n%s' % (
          way, proc.returncode, (proc.stdout + proc.stderr)[-3000:]))
    log = _TrainerLog(way, logdir, proc.stdout + proc.stderr)
  rates = [(int(s), float(r)) for s, r in _STEP.findall(log)]
  rates = [r for s, r in rates if s > steps // 2 and r > 0]
  profiles = _PROFILE_STEP.findall(log)
  if not rates or not profiles:
    raise SystemExit('scale_out: no step rates or traced step in the log of way %r' % way)
  _, step_ms, table = profiles[-1]
  transfer_ms, device = _Transfers(table)
  return statistics.median(rates), float(step_ms), transfer_ms, device, seconds


def _Name(way):
  return way if way == HOSTS_WAY else '%d process%s' % (way, '' if way == 1 else 'es')


def main(unused_argv):
  args = command_line.Args()
  print(machine.Line(), flush=True)
  ways = [1, 2, 4]
  available, why = hosts.Available()
  if available:
    ways.append(HOSTS_WAY)
  else:
    print('scale_out: no %r row: %s' % (HOSTS_WAY, why), flush=True)
  print('%s (K = 4 partitions, M = 8) for %d steps through Lingvo\'s trainer; one machine; '
        '%d round%s' % (MODEL, args.steps, args.repeats, '' if args.repeats == 1 else 's'),
        flush=True)
  progress = progress_lib.Progress(lambda line: print(line, file=sys.stderr, flush=True))
  results = {way: [] for way in ways}
  runs = len(ways) * args.repeats
  for r in range(args.repeats):
    for way in ways:
      done = sum(len(v) for v in results.values())
      with progress.Phase('scale_out: run %d of %d, %s, round %d of %d' % (
          done + 1, runs, _Name(way), r + 1, args.repeats)) as phase:
        results[way].append(Run(way, args.steps, args.profile_every, args.timeout))
        phase.End('%.0f examples/s' % results[way][-1][0])
  print('%-12s %12s %9s %10s %13s %-16s %8s' % ('way', 'examples/s', 'vs 1', 'step ms',
                                                 'transfer %', 'busiest device', 'wall s'))
  base = statistics.median(r[0] for r in results[1])
  for way in ways:
    rate, step_ms, seconds = (statistics.median(r[i] for r in results[way]) for i in (0, 1, 4))
    share = statistics.median(100.0 * r[2] / r[1] for r in results[way])
    device = results[way][-1][3]
    print('%-12s %12.0f %8.2fx %10.1f %12.1f%% %-16s %8.0f' % (
        _Name(way), rate, rate / base, step_ms, share, device, seconds), flush=True)


if __name__ == '__main__':
  command_line.Run(main, 'scale_out')
