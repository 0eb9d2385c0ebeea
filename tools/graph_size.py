#!/usr/bin/env python
r"""Graph size and build time: TensorPipe's training graph against M, and every registered model's.

Two reports, each configuration built in its own child process (fresh TensorFlow state; the child's
peak RSS is its own):

  stack   A stack of 16 stock Lingvo TransformerLayers (model dim 64, 4 heads, feed-forward 256;
          time-major [16, 64, 64] inputs, batch dimension 1), K = 4 equal cells: the plain model
          (SequentialLayer), TensorPipeLayer and Lingvo's GPipe (PipeliningLayer) side by side for
          M in {4, 16, 64}. Each row: seconds to build FProp + tf.gradients, the graph's ops, the
          nodes inside its function library, their total and the total over the plain model's.
          For the largest M also the first session.run of a training step (where TensorFlow
          optimises the graph) and the next one.
  models  For registered models (all of the repository's params/ by default), the training graph
          as Lingvo's trainer builds it first (`ConstructFPropBPropGraph`, variables never
          initialised; synthetic inputs where the input generator has them): seconds to
          instantiate and to build, ops, function-library nodes and the child's peak RSS.

  .venv/bin/python tools/graph_size.py stack                  # about 5 minutes on 2 cores
  .venv/bin/python tools/graph_size.py stack --quick          # smoke run (M in {2, 4}, 8 layers)
  .venv/bin/python tools/graph_size.py models --match 'AmoebaNetD18x256K8M32$|T64H16384A32$|TransformerL415Pipeline32$'
  .venv/bin/python tools/graph_size.py models                 # every registered model (hours)

Each report ends with PASS/FAIL lines for its targets, from ratios measured in the same run.
Results and commands: docs/benchmarks.md.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import argparse  # pylint: disable=g-import-not-at-top
import json
import re
import resource
import subprocess
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

_RESULT = 'GRAPH_SIZE_RESULT '
GIB = 2.0**30
KINDS = ('plain', 'tensorpipe', 'gpipe')


def _LibraryNodes(graph):
  """Nodes inside the graph's function library (the bodies of its graph functions)."""
  return sum(len(f.node_def) for f in graph.as_graph_def().library.function)


def _PeakRssBytes():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ----------------------------------------------------------------------------------------------------
# Children (run in their own process).


def StackChild(args):
  """Builds one stack configuration; prints its row as JSON."""
  from lingvo import compat as tf  # pylint: disable=g-import-not-at-top
  from lingvo.core import cluster_factory  # pylint: disable=g-import-not-at-top
  from lingvo.core import py_utils  # pylint: disable=g-import-not-at-top
  from tensorpipe import placement  # pylint: disable=g-import-not-at-top
  from tools import benchmark_pipeline as bench  # pylint: disable=g-import-not-at-top

  model = bench.ParseArgs(['--tr_layers=%d' % args.layers, '--tr_dim=64', '--tr_heads=4',
                           '--tr_hidden=256', '--tr_seq=16', '--tr_batch=64', '--devices=4'])
  config = bench.Config('transformer', args.kind, 4 if args.kind != 'plain' else 1, args.m)
  row = {'kind': args.kind, 'm': args.m}
  graph = tf.Graph()
  with graph.as_default(), cluster_factory.ForTestingWorker(cpus=4, split_size=4):
    py_utils.GetOrCreateGlobalStepVar()  # Lingvo's PipeliningLayer reads it.
    vecs = tf.random.normal([model.tr_seq, model.tr_batch, model.tr_dim])
    paddings = tf.zeros([model.tr_seq, model.tr_batch])
    net = bench._LayerParams(config, model).Instantiate()  # pylint: disable=protected-access
    start = time.perf_counter()
    out = net.FPropDefaultTheta(vecs, paddings)
    loss = tf.reduce_mean(tf.square(out[0]))
    grads = tf.gradients(loss, tf.trainable_variables(), colocate_gradients_with_ops=True)
    row['build_s'] = time.perf_counter() - start
    row['ops'] = len(graph.get_operations())
    row['function_nodes'] = _LibraryNodes(graph)
    step = tf.group(*grads)
    init = tf.global_variables_initializer()
  if args.first_run:
    with tf.Session(graph=graph, config=placement.SessionConfig(4, 1, 2)) as sess:
      sess.run(init)
      start = time.perf_counter()
      sess.run(step)
      row['first_run_s'] = time.perf_counter() - start
      start = time.perf_counter()
      sess.run(step)
      row['next_run_s'] = time.perf_counter() - start
  row['rss'] = _PeakRssBytes()
  print(_RESULT + json.dumps(row), flush=True)


def ModelChild(args):
  """Builds one registered model's training graph; prints its row as JSON."""
  from lingvo import compat as tf  # pylint: disable=g-import-not-at-top
  from lingvo.core import cluster_factory  # pylint: disable=g-import-not-at-top
  from tensorpipe import param_count  # pylint: disable=g-import-not-at-top
  from tensorpipe import train  # pylint: disable=g-import-not-at-top

  cfg = train.RegisteredModels()[args.model]()
  model_params = cfg.Model()
  inputs = cfg.Train()
  if 'synthetic' in inputs:
    inputs.synthetic = True
  model_params.input = inputs
  pipelines = train.Pipelines(model_params)
  k = param_count.MaxPartitions(model_params)
  row = {'model': args.model, 'k': k,
         'm': max([p.num_micro_batches for _, p in pipelines] or [1])}
  graph = tf.Graph()
  with graph.as_default(), cluster_factory.ForTestingWorker(cpus=k, split_size=k):
    start = time.perf_counter()
    model = model_params.Instantiate()
    row['instantiate_s'] = time.perf_counter() - start
    start = time.perf_counter()
    model.ConstructFPropBPropGraph()
    row['fprop_bprop_s'] = time.perf_counter() - start
  row['ops'] = len(graph.get_operations())
  row['function_nodes'] = _LibraryNodes(graph)
  row['rss'] = _PeakRssBytes()
  print(_RESULT + json.dumps(row), flush=True)


# ----------------------------------------------------------------------------------------------------
# Parent.


def _RunChild(flags, timeout):
  """(row dict or None, status): runs this tool as a child; kills it by pid after `timeout` s."""
  cmd = [sys.executable, os.path.abspath(__file__)] + flags
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.communicate()
    return None, 'timeout after %d s' % timeout
  lines = [l for l in out.splitlines() if l.startswith(_RESULT)]
  if proc.returncode or not lines:
    errors = [l for l in err.splitlines() if re.search(r'Error|error:', l)]
    return None, 'error (rc %d): %s' % (proc.returncode, errors[-1] if errors else err[-300:])
  return json.loads(lines[-1][len(_RESULT):]), 'ok'


def _Verdict(ok):
  return 'PASS' if ok else 'FAIL'


def Stack(args):
  ms = [2, 4] if args.quick else [int(m) for m in args.ms.split(',')]
  layers = 8 if args.quick else args.layers
  first_run_m = max(ms) if args.first_run_m is None else args.first_run_m
  print('Stack of %d stock Lingvo TransformerLayers (d 64, 4 heads, ffn 256), K = 4; FProp + '
        'tf.gradients, one process per row' % layers)
  print('%-11s %3s %8s %8s %10s %8s %9s %10s %10s %9s' % (
      'kind', 'M', 'build s', 'ops', 'fn nodes', 'total', 'vs plain', 'first run', 'next run',
      'RSS GiB'))
  rows = {}
  for m in ms:
    for kind in KINDS:
      flags = ['--child', 'stack', '--kind', kind, '--m', str(m), '--layers', str(layers)]
      if m == first_run_m:
        flags.append('--first_run')
      row, status = _RunChild(flags, args.timeout)
      if row is None:
        print('%-11s %3d %s' % (kind, m, status), flush=True)
        continue
      rows[(kind, m)] = row
      total = row['ops'] + row['function_nodes']
      plain = rows.get(('plain', m))
      ratio = total / float(plain['ops'] + plain['function_nodes']) if plain else float('nan')
      runs = ('%10.1f %10.3f' % (row['first_run_s'], row['next_run_s'])
              if 'first_run_s' in row else '%10s %10s' % ('-', '-'))
      print('%-11s %3d %8.1f %8d %10d %8d %8.2fx %s %9.2f' % (
          kind, m, row['build_s'], row['ops'], row['function_nodes'], total, ratio, runs,
          row['rss'] / GIB), flush=True)
  print()
  top = max(ms)
  tp, plain = rows.get(('tensorpipe', top)), rows.get(('plain', top))
  if tp and plain:
    ratio = (tp['ops'] + tp['function_nodes']) / float(plain['ops'] + plain['function_nodes'])
    print('%-64s %7.2fx  %s' % ('TensorPipe graph (ops + function nodes) at M=%d <= 3x plain' % top,
                                ratio, _Verdict(ratio <= 3.0)))
  for m in ms:
    tp, gpipe = rows.get(('tensorpipe', m)), rows.get(('gpipe', m))
    if tp and gpipe:
      ratio = tp['build_s'] / gpipe['build_s']
      print('%-64s %7.2fx  %s' % ("TensorPipe build time <= 1.5x Lingvo's GPipe's, M=%d" % m, ratio,
                                  _Verdict(ratio <= 1.5)))


# Models with a target: (build seconds, peak RSS bytes or None).
MODEL_TARGETS = {
    'amoebanet.AmoebaNetD18x256K8M32': (60.0, 4 * GIB),
    'mt.T64H16384A32': (600.0, None),
    'mt.TransformerL415Pipeline32': (600.0, None),
}


def Models(args):
  from tensorpipe import train  # pylint: disable=g-import-not-at-top
  from tools import param_counts  # pylint: disable=g-import-not-at-top
  models = train.RegisteredModels()
  names = sorted(k for k, cls in models.items()
                 if param_counts.IsOurs(cls) and re.search(args.match, k))
  if not names:
    raise SystemExit('graph_size: no registered model matches %r' % args.match)
  print('Training graphs as Lingvo\'s trainer builds them (ConstructFPropBPropGraph), one process '
        'per model')
  print('%-40s %3s %3s %8s %8s %8s %8s %9s %8s  %s' % (
      'model', 'K', 'M', 'inst. s', 'build s', 'total s', 'ops', 'fn nodes', 'RSS GiB', 'status'))
  verdicts = []
  for name in names:
    row, status = _RunChild(['--child', 'models', '--model', name], args.timeout)
    if row is None:
      print('%-40s %s' % (name, status), flush=True)
      if name in MODEL_TARGETS:
        verdicts.append((name, None, None))
      continue
    total = row['instantiate_s'] + row['fprop_bprop_s']
    print('%-40s %3d %3d %8.1f %8.1f %8.1f %8d %9d %8.2f  %s' % (
        name, row['k'], row['m'], row['instantiate_s'], row['fprop_bprop_s'], total, row['ops'],
        row['function_nodes'], row['rss'] / GIB, status), flush=True)
    if name in MODEL_TARGETS:
      verdicts.append((name, total, row['rss']))
  if verdicts:
    print()
  for name, seconds, rss in verdicts:
    limit_s, limit_rss = MODEL_TARGETS[name]
    goal = '%s builds in < %.0f s%s' % (name, limit_s, ' and < %.0f GiB peak RSS' % (
        limit_rss / GIB) if limit_rss else '')
    if seconds is None:
      print('%-80s FAIL (did not build)' % goal)
      continue
    ok = seconds < limit_s and (limit_rss is None or rss < limit_rss)
    print('%-80s %.0f s, %.2f GiB  %s' % (goal, seconds, rss / GIB, _Verdict(ok)))


def ParseArgs(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('report', choices=['stack', 'models'], help='Which report to print.')
  parser.add_argument('--quick', action='store_true',
                      help='stack: smoke run with M in {2, 4} and 8 layers.')
  parser.add_argument('--ms', default='4,16,64', help='stack: comma list of M.')
  parser.add_argument('--layers', type=int, default=16, help='stack: number of TransformerLayers.')
  parser.add_argument('--first_run_m', type=int, default=None,
                      help='stack: the M whose rows also time the first session.run (default: the '
                      'largest).')
  parser.add_argument('--match', default='',
                      help='models: regular expression the registered model key must match.')
  parser.add_argument('--timeout', type=int, default=900,
                      help='Seconds a child may take before it is killed.')
  parser.add_argument('--child', default=None, help=argparse.SUPPRESS)
  parser.add_argument('--kind', default=None, help=argparse.SUPPRESS)
  parser.add_argument('--m', type=int, default=None, help=argparse.SUPPRESS)
  parser.add_argument('--model', default=None, help=argparse.SUPPRESS)
  parser.add_argument('--first_run', action='store_true', help=argparse.SUPPRESS)
  if argv is None:
    argv = sys.argv[1:]
  if '--child' in argv:
    argv = ['stack'] + argv  # A child gets the report from --child.
  return parser.parse_args(argv)


def main(argv=None):
  args = ParseArgs(argv)
  if args.child == 'stack':
    StackChild(args)
  elif args.child == 'models':
    ModelChild(args)
  elif args.report == 'stack':
    Stack(args)
  else:
    Models(args)
  return 0


if __name__ == '__main__':
  sys.exit(main())
