"""Decode speed: pipelined incremental decoding against the full-prefix and unpipelined decodes.

The model is the tied-embedding language model of tensorpipe/tasks/lm/decoder_lm.py (Lingvo's
causal TransformerLayers, time-major) at a size set by the flags, cut into K partitions on K logical
CPU devices. Each configuration greedily continues a batch of one-token prompts by N new tokens
(DecoderLm.Generate) in one session.run:

  pipelined    the pipeline's ExtendStep: each layer's cache on its partition's device, the batch
               split into --micro_batches micro-batches per decode step (decode_micro_batches);
  unpipelined  ExtendStep with unpipelined=True: partition k's layers on device k one after the
               other, no micro-batches, no partition functions (the same devices);
  full_prefix  the pipeline (as `pipelined`, M micro-batches) re-run on the whole prefix, N + 1
               positions, at every step: what decoding did before incremental decoding.

Tokens/s = batch x N / the median wall time of a decode (the lines printed per (K, N) also give
the median CPU seconds the process used per decode: on a shared machine, when the wall time
is about the CPU time, the decode got one core). The three configurations of one (K, N) are
built, warmed up (the first run instantiates the functions), then timed in --rounds rounds, one run
of each per round in rotating order, so that a busy machine slows them alike (the full-prefix
decode, whose runs take up to minutes, only in the first --full_prefix_rounds). Every session shares
one ConfigProto (the most devices of any K, TensorFlow's default thread pools unless set), since
TensorFlow fixes its pools with the first session of a process. The report also gives each
device's decoding states for the largest N (bytes of the caches, from their static shapes), the
machine (CPU model, cores, oneDNN on or off, load average before and after) and the commit.

  python -m tools.benchmark_decode                    # 16/64/128 tokens, K in {1, 2, 4}
  python -m tools.benchmark_decode --new_tokens=16 --devices=2 --rounds=2  # smoke

Run time of the default run on a 2-core CPU beside other jobs (load average 3-8;
docs/benchmarks.md): 6 min 54 s with oneDNN on, 9 min 3 s with TF_ENABLE_ONEDNN_OPTS=0. A line per
(K, N) is printed, flushed, once its three configurations are built, warmed up and timed (the
slowest, K = 4 and N = 128, has a full-prefix decode of 53 s, run twice).

Results: docs/benchmarks.md, "Decoding".
"""

import os
import resource
import subprocess
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=wrong-import-position
import numpy as np
from absl import flags
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils

from tensorpipe import decode_state
from tensorpipe import placement
from tensorpipe.measure import machine
from tensorpipe.tasks.lm import decoder_lm
from tensorpipe.trainer import command_line
# pylint: enable=wrong-import-position

flags.DEFINE_list('new_tokens', ['16', '64', '128'], 'N values.')
flags.register_validator('new_tokens', command_line.PositiveInts,
                         message='give comma-separated positive integers, e.g. 16,64')
flags.DEFINE_list('devices', ['1', '2', '4'], 'K values: the devices, one partition each.')
flags.register_validator('devices', command_line.PositiveInts,
                         message='give comma-separated positive integers, e.g. 1,2,4')
flags.DEFINE_integer('micro_batches', 2, 'M of a pipelined decode step (decode_micro_batches).')
flags.DEFINE_integer('batch', 32, 'Prompts decoded at once.')
flags.DEFINE_integer('model_dim', 256, 'Model width D.')
flags.DEFINE_integer('hidden_dim', 1024, 'Feed-forward width.')
flags.DEFINE_integer('num_heads', 4, 'Attention heads.')
flags.DEFINE_integer('num_layers', 4, 'Transformer layers.')
flags.DEFINE_integer('rounds', 5, 'Timed runs of each incremental configuration.')
flags.DEFINE_integer('full_prefix_rounds', 1,
                     'Timed runs of the full-prefix configuration (the first rounds): a run of it '
                     'takes up to minutes.')
flags.DEFINE_integer('intra_op_threads', None, "Session intra-op threads (default: TensorFlow's).")
flags.DEFINE_integer('inter_op_threads', None, "Session inter-op threads (default: TensorFlow's).")

MODES = ('pipelined', 'unpipelined', 'full_prefix')




def _Params(args, k, n, mode):
  p = decoder_lm.DecoderLmParams(
      model_dim=args.model_dim, hidden_dim=args.hidden_dim, num_heads=args.num_heads,
      num_layers=args.num_layers, num_partitions=k, num_micro_batches=1, dropout_prob=0.0,
      name='lm')
  p.pipeline.decode_micro_batches = args.micro_batches
  p.pipeline.unpipelined = mode == 'unpipelined'
  p.decode_new_tokens = n
  p.incremental_decode = mode != 'full_prefix'
  return p


class _Config:
  """One configuration's graph and session, built and warmed up."""

  def __init__(self, args, k, n, mode, config):
    self.mode = mode
    self.graph = tf.Graph()
    with self.graph.as_default(), cluster_factory.ForTestingWorker(cpus=k, split_size=k,
                                                                   do_eval=True):
      py_utils.GetOrCreateGlobalStepVar()
      task = _Params(args, k, n, mode).Instantiate()
      prompt = tf.fill([args.batch, 1], decoder_lm.VOCABULARY.index(decoder_lm.BOS))
      start = time.time()
      self.ids = task.Generate(task.theta, prompt, 'greedy').ids
      self.build_s = time.time() - start
      # Each device's states for the whole decode (static shapes; nothing runs).
      states = task.pipeline.InitStates(task.pipeline.theta, args.batch, 1 + n)
      self.state_bytes = {}
      for device, per_partition in zip(task.pipeline.devices, states):
        self.state_bytes[device] = self.state_bytes.get(device, 0) + decode_state.Bytes(
            per_partition)
      self.session = tf.Session(graph=self.graph, config=config)
      self.session.run(tf.global_variables_initializer())
    start = time.time()
    self.session.run(self.ids)
    self.warmup_s = time.time() - start
    self.times = []
    self.cpu_times = []

  def Time(self):
    cpu, start = _OwnCpu(), time.time()
    self.session.run(self.ids)
    self.times.append(time.time() - start)
    self.cpu_times.append(_OwnCpu() - cpu)


def _OwnCpu():
  """CPU seconds this process has used (all its threads)."""
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def _Commit():
  try:
    return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True,
                          check=True,
                          cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return '?'


def _Load():
  return '%.2f %.2f %.2f' % os.getloadavg()


def main(unused_argv):
  args = command_line.Args()
  args.new_tokens = [int(n) for n in args.new_tokens]
  args.devices = [int(k) for k in args.devices]
  print('commit %s; %s' % (_Commit(), machine.Line()), flush=True)
  print('model: D=%d, hidden %d, %d heads, %d layers, vocabulary %d; batch %d one-token prompts; '
        'pipelined M=%d' % (args.model_dim, args.hidden_dim, args.num_heads, args.num_layers,
                            decoder_lm.VOCAB_SIZE, args.batch, args.micro_batches))
  print('load average at the start: %s' % _Load())
  config = placement.SessionConfig(max(args.devices), args.intra_op_threads,
                                   args.inter_op_threads)
  rows = []
  memory = {}
  for k in args.devices:
    for n in args.new_tokens:
      configs = [_Config(args, k, n, mode, config) for mode in MODES]
      for r in range(args.rounds):
        for i in range(len(configs)):
          config_i = configs[(i + r) % len(configs)]
          if config_i.mode != 'full_prefix' or r < args.full_prefix_rounds:
            config_i.Time()
      median = {c.mode: float(np.median(c.times)) for c in configs}
      rows.append((k, n, median, {c.mode: (c.build_s, c.warmup_s) for c in configs}))
      memory[k] = configs[0].state_bytes
      for c in configs:
        c.session.close()
      tokens = args.batch * n
      cpu = {c.mode: float(np.median(c.cpu_times)) for c in configs}
      print('K=%d N=%d: %s (load %s)' % (
          k, n, ', '.join('%s %.3f s (CPU %.3f s), %.0f tokens/s' % (
              m, median[m], cpu[m], tokens / median[m]) for m in MODES), _Load()), flush=True)
  print()
  print('| K | new tokens | pipelined incremental | unpipelined incremental | full prefix | '
        'incremental / full prefix | pipelined time / unpipelined time |')
  print('|---|---|---|---|---|---|---|')
  for k, n, median, _ in rows:
    tokens = args.batch * n
    print('| %d | %d | %.0f tokens/s (%.3f s) | %.0f tokens/s (%.3f s) | %.0f tokens/s (%.3f s) | '
          '%.1fx | %.2f |' % (
              k, n, tokens / median['pipelined'], median['pipelined'],
              tokens / median['unpipelined'], median['unpipelined'],
              tokens / median['full_prefix'], median['full_prefix'],
              median['full_prefix'] / median['pipelined'],
              median['pipelined'] / median['unpipelined']))
  print()
  print('Decoding states per device, %d prompts x %d positions:' %
        (args.batch, 1 + max(args.new_tokens)))
  for k in args.devices:
    print('  K=%d: %s' % (k, ', '.join('%s %.2f MiB' % (placement_name, b / 2.0**20)
                                       for placement_name, b in sorted(memory[k].items()))))
  print()
  for k, n, median, _ in rows:
    if n == 64:
      print('N=64, K=%d: incremental %.1fx the full-prefix tokens/s (goal >= 10x): %s' % (
          k, median['full_prefix'] / median['pipelined'],
          'PASS' if median['full_prefix'] >= 10 * median['pipelined'] else 'FAIL'))
      if k == 2:
        print('N=64, K=2: pipelined %.2fx the unpipelined time (goal <= 1.3x): %s' % (
            median['pipelined'] / median['unpipelined'],
            'PASS' if median['pipelined'] <= 1.3 * median['unpipelined'] else 'FAIL'))
  print('load average at the end: %s' % _Load())


if __name__ == '__main__':
  command_line.Run(main, 'benchmark_decode')
