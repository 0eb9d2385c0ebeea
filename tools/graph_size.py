r"""Graph size and build time: TensorPipe's training graph against M, and every registered model's.

Two reports. Every row is built in its own child process (this script with the hidden `--child`
flag): TensorFlow's caches and thread pools would otherwise carry over from one configuration to the
next and skew its times, and the child's peak RSS is then its own. Each row is printed as soon as
its child is done.

  stack   A stack of 16 stock Lingvo `layers_with_attention.TransformerLayer`s (model dim 64, 4
          heads, feed-forward 256; time-major [T=16, B=64, D=64] inputs with [T, B] paddings), cut
          into K = 4 equal partitions, built three ways side by side for M in {4, 16, 64}: the plain
          model (`builder_layers.SequentialLayer`), `TensorPipeLayer` (`partitions=` the 4
          partitions, batch_dim=1) and Lingvo's GPipe (`gpipe.PipeliningLayer` of
          `FeatureExtractionLayer` partitions, batch_dim=1). Each child builds, in a fresh tf.Graph
          inside `cluster_factory.ForTestingWorker(cpus=4, split_size=4)` (global step created
          first: Lingvo's GPipe reads it), the layer, its FProp and `tf.gradients(loss, trainable
          variables, colocate_gradients_with_ops=True)`. Row: seconds to instantiate the layer,
          seconds for FProp + gradients ("build s", what the targets compare), graph ops, nodes
          inside the graph's function library (partition bodies: TensorPipe's and Lingvo's GPipe
          keep partitions there), their total and that total over the plain model's at the same M.
          For one M (`--first_run_m`, default the largest) the child also opens a session with 4
          logical CPU devices (placement.SessionConfig(4, 1, 2)), initialises the variables and
          times the first session.run of the gradients (where grappler optimises the graph and
          functions are instantiated) and the second one.
  models  Registered models (every one of the repository's params/ package by default; `--match` to
          select), each built as Lingvo's trainer first builds it: model params with the Train()
          input (synthetic=True where the input Params has that field), instantiated and
          `ConstructFPropBPropGraph()` called inside `ForTestingWorker(cpus=K, split_size=K)`, K the
          largest TensorPipeLayer's number of partitions; variables are never initialised. Row: K,
          M, seconds to instantiate, seconds for FProp + BProp, their total, graph ops,
          function-library nodes, the child's peak RSS (getrusage ru_maxrss) and a status: ok,
          'needs data: ...' (the input's data directory or files are missing), 'timeout after N s'
          (the child is killed by pid) or 'error: ...'.

Commands:
  python -m tools.graph_size stack                 # about 3.5 minutes on 2 cores
  python -m tools.graph_size stack --quick         # smoke run: M in {2, 4}, 8 layers
  python -m tools.graph_size stack --first_run_m 0 # sizes and build times only
  python -m tools.graph_size models --match 'AmoebaNetD18x256K8M32$'   # about 75 s
  python -m tools.graph_size models \
      --match 'AmoebaNetD18x256K8M32$|T64H16384A32$|TransformerL415Pipeline32$'
  python -m tools.graph_size models                # every registered model (hours)

Each report ends with PASS/FAIL lines for its targets; every ratio in them comes from rows of the
same run. stack: TensorPipe's total nodes at the largest M <= 3x the plain model's; TensorPipe's
build time <= 1.5x Lingvo's GPipe's at every M. models (for those that were run):
AmoebaNetD18x256K8M32 builds in < 60 s with < 4 GiB peak RSS; mt.T64H16384A32 and
mt.TransformerL415Pipeline32 each in < 10 minutes. Results and commands: docs/benchmarks.md.
"""

import os

# Must be set before TensorFlow is imported (the children import it).
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import json  # pylint: disable=g-import-not-at-top
import re
import resource
import signal
import subprocess
import sys
import time
import traceback

from absl import flags  # pylint: disable=g-import-not-at-top

from tensorpipe.trainer import command_line  # pylint: disable=g-import-not-at-top

# The working directory of sub-runs: the repository root.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_RESULT = 'GRAPH_SIZE_RESULT '  # Prefix of the one line of JSON a child prints.
GIB = 2.0**30
KINDS = ('plain', 'tensorpipe', 'gpipe')
NUM_PARTITIONS = 4  # K of the stack report (and its logical CPU devices).
REPORTS = ('stack', 'models')
flags.DEFINE_bool('quick', False,
                  'stack: smoke run with M in {2, 4} and 8 layers (a minute or two).')
flags.DEFINE_string('ms', '4,16,64', 'stack: comma-separated list of M.')
flags.DEFINE_string('kinds', ','.join(KINDS),
                    'stack: comma-separated kinds to build, of %s (the GPipe build-time targets '
                    'need gpipe).' % ', '.join(KINDS))
flags.DEFINE_integer('layers', None,
                     'stack: number of TransformerLayers, a multiple of 4 (default 16; 8 with '
                     '--quick).')
flags.DEFINE_integer('model_dim', 64, 'stack: model dimension D.')
flags.DEFINE_integer('num_heads', 4, 'stack: attention heads.')
flags.DEFINE_integer('hidden_dim', 256, 'stack: feed-forward dimension.')
flags.DEFINE_integer('seq_len', 16, 'stack: sequence length T.')
flags.DEFINE_integer('batch', 64, 'stack: batch size B (sequences).')
flags.DEFINE_integer('first_run_m', None,
                     'stack: the M whose rows also time the first and second session.run '
                     '(default: the largest M; 0: none).')
flags.DEFINE_string('match', '', 'models: regular expression the registered model key must match.')
flags.DEFINE_integer('timeout', 900, 'Seconds a child process may take before it is killed.')
# Used by the parent to start a child.
flags.DEFINE_bool('child', False,
                  'Internal: build one row of the report in this process (the tool starts one '
                  'child per row).')
flags.DEFINE_enum('kind', None, KINDS, 'Internal: the kind of a stack --child.')
flags.DEFINE_integer('m', None, 'Internal: the M of a stack --child.')
flags.DEFINE_string('model', None, 'Internal: the registered model of a models --child.')
flags.DEFINE_bool('first_run', False, 'Internal: a stack --child also times its first runs.')

# Models with a target: (maximum total build seconds, maximum peak RSS bytes or None).
MODEL_TARGETS = {
    'amoebanet.AmoebaNetD18x256K8M32': (60.0, 4 * GIB),
    'mt.T64H16384A32': (600.0, None),
    'mt.TransformerL415Pipeline32': (600.0, None),
}


def _LibraryNodes(graph):
  """Nodes inside the graph's function library (the bodies of its graph functions)."""
  return sum(len(f.node_def) for f in graph.as_graph_def().library.function)


def _PeakRssBytes():
  """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _Emit(row):
  print(_RESULT + json.dumps(row), flush=True)


def _OneLine(error):
  """An exception as one short line: its type and the first line of its message."""
  message = str(error).strip().splitlines()
  return '%s: %s' % (type(error).__name__, message[0][:300] if message else '')


# --------------------------------------------------------------------------------------------------
# The stack report's model.


def _StackParams(kind, num_layers, m, model_dim, num_heads, hidden_dim):
  """Params of the stack as `kind` ('plain', 'tensorpipe' or 'gpipe') in NUM_PARTITIONS partitions.

  The blocks are workloads.TransformerBlock: a stock Lingvo TransformerLayer on time-major vecs and
  paddings. TensorFlow is imported here, not at the top, so that the parent process never imports
  it.
  """
  from lingvo.core import builder_layers  # pylint: disable=g-import-not-at-top
  from lingvo.core import gpipe  # pylint: disable=g-import-not-at-top
  from tensorpipe import layer as tensorpipe_layer  # pylint: disable=g-import-not-at-top
  from tensorpipe.measure import workloads  # pylint: disable=g-import-not-at-top

  if num_layers % NUM_PARTITIONS:
    raise ValueError('%d layers cannot be cut into %d equal partitions' %
                     (num_layers, NUM_PARTITIONS))
  blocks = [
      workloads.TransformerBlock.Params().Set(name='block%d' % i, model_dim=model_dim,
                                              num_heads=num_heads, hidden_dim=hidden_dim)
      for i in range(num_layers)
  ]
  size = num_layers // NUM_PARTITIONS
  partitions = [blocks[k * size:(k + 1) * size] for k in range(NUM_PARTITIONS)]
  if kind == 'plain':
    return builder_layers.SequentialLayer.Params().Set(name='net', sub=blocks)
  if kind == 'tensorpipe':
    return tensorpipe_layer.TensorPipeLayer.Params().Set(
        name='net', partitions=partitions, num_micro_batches=m, batch_dim=1)
  if kind == 'gpipe':
    return gpipe.PipeliningLayer.Params().Set(
        name='net', num_micro_batches=m, batch_dim=1, cell_tpl=[
            gpipe.FeatureExtractionLayer.Params().Set(name='partition%d' % k, sub=partition)
            for k, partition in enumerate(partitions)
        ])
  raise ValueError('unknown kind %r' % kind)


# --------------------------------------------------------------------------------------------------
# Children (each runs in its own process and prints one result line).


def StackChild(args):
  """Builds one configuration of the stack report (see the module docstring); prints its row."""
  from lingvo import compat as tf  # pylint: disable=g-import-not-at-top
  from lingvo.core import cluster_factory  # pylint: disable=g-import-not-at-top
  from lingvo.core import py_utils  # pylint: disable=g-import-not-at-top
  from tensorpipe import placement  # pylint: disable=g-import-not-at-top

  row = {'kind': args.kind, 'm': args.m}
  graph = tf.Graph()
  with graph.as_default(), cluster_factory.ForTestingWorker(
      cpus=NUM_PARTITIONS, split_size=NUM_PARTITIONS) as cluster:
    py_utils.GetOrCreateGlobalStepVar()  # Lingvo's PipeliningLayer reads the global step.
    with tf.device(cluster.WorkerDeviceInModelSplit(0)):
      vecs = tf.random.normal([args.seq_len, args.batch, args.model_dim], seed=1)
      paddings = tf.zeros([args.seq_len, args.batch])
    params = _StackParams(args.kind, args.layers, args.m, args.model_dim, args.num_heads,
                          args.hidden_dim)
    start = time.perf_counter()
    net = params.Instantiate()
    row['instantiate_s'] = time.perf_counter() - start
    start = time.perf_counter()
    out = net.FPropDefaultTheta(vecs, paddings)[0]
    with tf.device(out.device):
      loss = tf.reduce_mean(tf.square(out))
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    row['build_s'] = time.perf_counter() - start
    missing = [v.name for v, g in zip(variables, grads) if g is None]
    if missing:
      raise ValueError('no gradient for %d variables, e.g. %s' % (len(missing), missing[0]))
    row['ops'] = len(graph.get_operations())
    row['function_nodes'] = _LibraryNodes(graph)
    step = tf.group(*grads)
    init = tf.global_variables_initializer()
  if args.first_run:
    with tf.Session(graph=graph, config=placement.SessionConfig(NUM_PARTITIONS, 1, 2)) as sess:
      sess.run(init)
      start = time.perf_counter()
      sess.run(step)
      row['first_run_s'] = time.perf_counter() - start
      start = time.perf_counter()
      sess.run(step)
      row['next_run_s'] = time.perf_counter() - start
  row['rss'] = _PeakRssBytes()
  _Emit(row)


def _NeedsData(error):
  """Whether a build failure means the model's input data is missing (not a bug in the model)."""
  from lingvo import compat as tf  # pylint: disable=g-import-not-at-top
  if isinstance(error, (OSError, tf.errors.NotFoundError)):
    return True
  return bool(re.search(r'data_dir|does not exist|no such file|could not find data|DatasetNotFound',
                        '%s %s' % (type(error).__name__, error), re.IGNORECASE))


def _MicroBatches(pipelines):
  """M of the model: the largest num_micro_batches of its TensorPipeLayers ('b/N' for
  micro_batch_size=N, where M depends on the batch)."""
  ms = [p.num_micro_batches for _, p in pipelines if p.micro_batch_size is None]
  sizes = ['b/%d' % p.micro_batch_size for _, p in pipelines if p.micro_batch_size is not None]
  if sizes and not ms:
    return sizes[0]
  return max(ms or [1])


def ModelChild(args):
  """Builds one registered model's training graph as Lingvo's trainer does; prints its row."""
  from lingvo import compat as tf  # pylint: disable=g-import-not-at-top
  from lingvo.core import cluster_factory  # pylint: disable=g-import-not-at-top
  from tensorpipe.trainer import param_count  # pylint: disable=g-import-not-at-top
  from tensorpipe import layer as layer_lib  # pylint: disable=g-import-not-at-top
  from tensorpipe.trainer import registry  # pylint: disable=g-import-not-at-top

  row = {'model': args.model}
  graph = tf.Graph()
  phase = 'params'
  try:
    cfg = registry.RegisteredModels()[args.model]()
    model_params = cfg.Model()
    inputs = cfg.Train()
    if 'synthetic' in inputs:
      inputs.synthetic = True
    model_params.input = inputs
    row['k'] = param_count.MaxDevices(model_params)
    row['m'] = _MicroBatches(layer_lib.Pipelines(model_params))
    # No preflight.CheckDataDirs here: the launcher's pre-check insists on input.data_dir even with
    # synthetic=True. Missing data shows up as the input generator's error when it is instantiated.
    with graph.as_default(), cluster_factory.ForTestingWorker(cpus=row['k'], split_size=row['k']):
      phase = 'instantiate'
      start = time.perf_counter()
      model = model_params.Instantiate()
      row['instantiate_s'] = time.perf_counter() - start
      phase = 'FProp+BProp'
      start = time.perf_counter()
      model.ConstructFPropBPropGraph()
      row['fprop_bprop_s'] = time.perf_counter() - start
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()  # To the child's stderr; the parent shows the one-line status.
    if _NeedsData(e):
      row['status'] = 'needs data: %s' % _OneLine(e)
    else:
      row['status'] = 'error in %s: %s' % (phase, _OneLine(e))
    row['rss'] = _PeakRssBytes()
    _Emit(row)
    return
  row['ops'] = len(graph.get_operations())
  row['function_nodes'] = _LibraryNodes(graph)
  row['rss'] = _PeakRssBytes()
  row['status'] = 'ok'
  _Emit(row)


# --------------------------------------------------------------------------------------------------
# Parent.


def _RunChild(flags, timeout):
  """(row dict or None, status) of this script run as a child with `flags`.

  The child is killed (SIGKILL, by its pid) when it takes longer than `timeout` seconds.
  """
  cmd = [sys.executable, '-m', 'tools.graph_size'] + flags
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=_REPO)
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    return None, 'timeout after %d s' % timeout
  lines = [l for l in out.splitlines() if l.startswith(_RESULT)]
  if lines:
    row = json.loads(lines[-1][len(_RESULT):])
    return row, row.get('status', 'ok')
  errors = [l for l in err.splitlines() if re.search(r'Error\b|Error:|error:', l)]
  return None, 'error (exit %d): %s' % (proc.returncode,
                                        errors[-1].strip() if errors else err[-300:].strip())


def _Verdict(ok):
  return 'PASS' if ok else 'FAIL'


def _Total(row):
  return row['ops'] + row['function_nodes']


def Stack(args):
  """The stack report: one child per (M, kind), then the targets."""
  ms = [2, 4] if args.quick else [int(m) for m in args.ms.split(',')]
  layers = args.layers or (8 if args.quick else 16)
  unknown = set(args.kinds.split(',')) - set(KINDS)
  if unknown or 'plain' not in args.kinds.split(','):
    raise SystemExit('graph_size: --kinds=%s must name kinds of %s, plain among them (the ratios '
                     'are against it)' % (args.kinds, ', '.join(KINDS)))
  if layers % NUM_PARTITIONS:
    raise SystemExit('graph_size: --layers=%d cannot be cut into %d equal partitions' %
                     (layers, NUM_PARTITIONS))
  first_run_m = max(ms) if args.first_run_m is None else args.first_run_m
  first_run = '; first session.run timed at M=%d' % first_run_m if first_run_m in ms else ''
  print('Stack of %d stock Lingvo TransformerLayers (d %d, %d heads, ffn %d; [T=%d, B=%d, D] '
        'inputs, batch_dim 1), K = %d equal partitions; FProp + tf.gradients in a fresh process '
        'per row%s' % (layers, args.model_dim, args.num_heads, args.hidden_dim, args.seq_len,
                       args.batch, NUM_PARTITIONS, first_run), flush=True)
  print('%-11s %3s %7s %8s %8s %9s %8s %9s %10s %9s %8s' % (
      'kind', 'M', 'inst s', 'build s', 'ops', 'fn nodes', 'total', 'vs plain', 'first run',
      'next run', 'RSS GiB'), flush=True)
  rows = {}
  start = time.perf_counter()
  kinds = [kind for kind in KINDS if kind in args.kinds.split(',')]
  for m in ms:
    for kind in kinds:
      flags = ['stack', '--child', '--kind', kind, '--m', str(m), '--layers', str(layers)]
      flags += ['--%s=%s' % (name, getattr(args, name)) for name in
                ('model_dim', 'num_heads', 'hidden_dim', 'seq_len', 'batch')]
      if m == first_run_m:
        flags.append('--first_run')
      row, status = _RunChild(flags, args.timeout)
      if row is None:
        print('%-11s %3d %s' % (kind, m, status), flush=True)
        continue
      rows[(kind, m)] = row
      plain = rows.get(('plain', m))
      ratio = '%8.2fx' % (_Total(row) / float(_Total(plain))) if plain else '%9s' % '-'
      runs = ('%9.2f %10.3f' % (row['first_run_s'], row['next_run_s'])
              if 'first_run_s' in row else '%9s %10s' % ('-', '-'))
      print('%-11s %3d %7.1f %8.1f %8d %9d %8d %s %s %8.2f' % (
          kind, m, row['instantiate_s'], row['build_s'], row['ops'], row['function_nodes'],
          _Total(row), ratio, runs, row['rss'] / GIB), flush=True)
  print('(%.0f s)' % (time.perf_counter() - start))
  print()
  if args.quick:
    print('--quick: a smoke run; the verdicts below are not the targets\' measurement.')
  top = max(ms)
  tp, plain = rows.get(('tensorpipe', top)), rows.get(('plain', top))
  label = 'TensorPipe total nodes (ops + fn nodes) at M=%d <= 3x plain' % top
  if tp and plain:
    ratio = _Total(tp) / float(_Total(plain))
    print('%-66s %7.2fx  %s' % (label, ratio, _Verdict(ratio <= 3.0)))
  else:
    print('%-66s %8s  FAIL (missing rows)' % (label, '-'))
  for m in ms if 'gpipe' in kinds else []:
    tp, gpipe = rows.get(('tensorpipe', m)), rows.get(('gpipe', m))
    label = "TensorPipe build s <= 1.5x Lingvo's GPipe's, M=%d" % m
    if tp and gpipe:
      ratio = tp['build_s'] / gpipe['build_s']
      print('%-66s %7.2fx  %s' % (label, ratio, _Verdict(ratio <= 1.5)))
    else:
      print('%-66s %8s  FAIL (missing rows)' % (label, '-'))


def Models(args):
  """The models report: one child per registered model, then the targets of those that ran."""
  from tensorpipe.trainer import registry  # pylint: disable=g-import-not-at-top
  names = sorted(k for k in registry.TensorPipeModels() if re.search(args.match, k))
  if not names:
    raise SystemExit('graph_size: no registered model matches %r' % args.match)
  print("Training graphs as Lingvo's trainer builds them (ConstructFPropBPropGraph, synthetic "
        'inputs where supported, variables not initialised), a fresh process per model, timeout '
        '%d s' % args.timeout, flush=True)
  print('%-40s %3s %4s %7s %9s %8s %8s %9s %8s  %s' % (
      'model', 'K', 'M', 'inst s', 'fp+bp s', 'total s', 'ops', 'fn nodes', 'RSS GiB', 'status'),
        flush=True)
  results = {}
  for name in names:
    row, status = _RunChild(['models', '--child', '--model', name], args.timeout)
    results[name] = (row, status)
    if row is None or status != 'ok':
      k = m = '-'
      if row is not None:
        k, m = row.get('k', '-'), row.get('m', '-')
      print('%-40s %3s %4s %7s %9s %8s %8s %9s %8s  %s' % (name, k, m, '-', '-', '-', '-', '-', '-',
                                                         status), flush=True)
      continue
    row['total_s'] = row['instantiate_s'] + row['fprop_bprop_s']
    print('%-40s %3d %4s %7.1f %9.1f %8.1f %8d %9d %8.2f  %s' % (
        name, row['k'], row['m'], row['instantiate_s'], row['fprop_bprop_s'], row['total_s'],
        row['ops'], row['function_nodes'], row['rss'] / GIB, status), flush=True)
  ran = [name for name in MODEL_TARGETS if name in results]
  if ran:
    print()
  for name in ran:
    limit_s, limit_rss = MODEL_TARGETS[name]
    goal = '%s builds in < %.0f s%s' % (name, limit_s, ' and < %.0f GiB peak RSS' % (
        limit_rss / GIB) if limit_rss else '')
    row, status = results[name]
    if row is None or status != 'ok':
      print('%-78s FAIL (%s)' % (goal, status))
      continue
    ok = row['total_s'] < limit_s and (limit_rss is None or row['rss'] < limit_rss)
    print('%-78s %.1f s, %.2f GiB  %s' % (goal, row['total_s'], row['rss'] / GIB, _Verdict(ok)))




def main(argv):
  report = argv[1]
  if report not in REPORTS:
    command_line.Fail('graph_size', 'unknown report %r: give stack or models, e.g. python -m '
                      'tools.graph_size stack' % report)
  args = command_line.Args()
  if args.child:
    if report == 'stack':
      StackChild(args)
    else:
      ModelChild(args)
  else:
    # The parent stays free of TensorFlow until here (its children build the graphs).
    from tensorpipe.measure import machine  # pylint: disable=g-import-not-at-top
    print(machine.Line(), flush=True)
    if report == 'stack':
      Stack(args)
    else:
      Models(args)
  return 0


if __name__ == '__main__':
  command_line.Run(main, 'graph_size', args=('stack|models',))
