r"""Scale-out on one machine: the digits model in one process against its partitions in workers.

Trains the registered digits.TinyConvPipeline (K = 4 partitions, M = 8) for --steps steps three
ways, each through Lingvo's trainer:

  1 process     tensorpipe.trainer.train --run_locally=cpu --cpu_devices=4 (4 logical devices)
  2 processes   tensorpipe.trainer.launch --worker_tasks=2 --cpu_devices=2 (2 partitions per worker)
  4 processes   tensorpipe.trainer.launch --worker_tasks=4 --cpu_devices=1 (a partition per worker)

and prints, per way: examples/sec (median over the second half of the steps, from Lingvo's step
lines) and the ratio to one process, and from the trainer's last traced step (TensorPipe's profile,
--tensorpipe_profile_every_n_steps) the step time and the share of it that the device with the most
transfer time spends receiving tensors from other devices and processes (a cross-process receive
counts from its request, so waiting for the sender is included). Worker processes on one machine
talk over loopback gRPC and share its cores: this measures what process boundaries cost, not what
separate hosts would gain.

  .venv/bin/python -m tools.scale_out              # about 4 minutes on 2 cores
  .venv/bin/python -m tools.scale_out --steps 200

Results: docs/benchmarks.md.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

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


def _TrainerLog(way, logdir, output):
  if way == 1:
    return output
  with open(os.path.join(logdir, 'launch', 'trainer_client.log')) as f:
    return f.read()


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
    proc = subprocess.run(_Command(way, logdir, steps, profile_every), cwd=_REPO,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    seconds = time.perf_counter() - start
    if proc.returncode:
      raise SystemExit('scale_out: %d process(es) failed (exit %d):\n%s' % (
          way, proc.returncode, (proc.stdout + proc.stderr)[-3000:]))
    log = _TrainerLog(way, logdir, proc.stdout + proc.stderr)
  rates = [(int(s), float(r)) for s, r in _STEP.findall(log)]
  rates = [r for s, r in rates if s > steps // 2 and r > 0]
  profiles = _PROFILE_STEP.findall(log)
  if not rates or not profiles:
    raise SystemExit('scale_out: no step rates or traced step in the %d-process log' % way)
  _, step_ms, table = profiles[-1]
  transfer_ms, device = _Transfers(table)
  return statistics.median(rates), float(step_ms), transfer_ms, device, seconds


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--steps', type=int, default=400, help='Training steps per way.')
  parser.add_argument('--profile_every', type=int, default=100, help='Traced step interval.')
  parser.add_argument('--timeout', type=int, default=600, help='Seconds per way.')
  args = parser.parse_args(argv)
  print('%s (K = 4 partitions, M = 8) for %d steps through Lingvo\'s trainer; one machine' %
        (MODEL, args.steps), flush=True)
  print('%-12s %12s %9s %10s %13s %-16s %8s' % ('way', 'examples/s', 'vs 1', 'step ms',
                                                 'transfer %', 'busiest device', 'wall s'))
  base = None
  for way in (1, 2, 4):
    rate, step_ms, transfer_ms, device, seconds = Run(way, args.steps, args.profile_every,
                                                      args.timeout)
    base = base or rate
    print('%-12s %12.0f %8.2fx %10.1f %12.1f%% %-16s %8.0f' % (
        '%d process%s' % (way, '' if way == 1 else 'es'), rate, rate / base, step_ms,
        100.0 * transfer_ms / step_ms, device, seconds), flush=True)


if __name__ == '__main__':
  main()
