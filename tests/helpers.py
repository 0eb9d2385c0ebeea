"""Small layers and session helpers shared by the TensorPipe tests."""

import collections
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

import numpy as np
from absl import flags
from lingvo import compat as tf
from lingvo.core import base_input_generator
from lingvo.core import base_layer
from lingvo.core import base_model
from lingvo.core import bn_layers
from lingvo.core import builder_layers
from lingvo.core import cluster_factory
from lingvo.core import py_utils

from tensorpipe import layer as layer_lib
from tensorpipe.measure import profiling
from tensorpipe import placement
from tensorpipe.tasks.mt import num2words_corpus
from tensorpipe.trainer import registry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # The repository root.
MATMUL_TYPES = ('MatMul', '_MklMatMul', '_FusedMatMul', '_MklFusedMatMul', '_MklNativeFusedMatMul',
                '_MklNativeMatMul')
_NUM2WORDS_DIR = None  # Num2WordsCorpus's directory, once generated.


class Dense(base_layer.BaseLayer):
  """y = tanh(x w): cheap, with one MatMul per forward pass (easy to count in step stats)."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 8, 'Input and output width.')
    p.Define('seed', 0, 'Seed of the weight initialiser.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable('w', py_utils.WeightParams(
        [p.dim, p.dim], py_utils.WeightInit.Gaussian(1.0 / np.sqrt(p.dim), seed=p.seed)))

  def FProp(self, theta, x):
    with tf.name_scope(self.params.name):
      return tf.tanh(tf.matmul(x, theta.w))

  @classmethod
  def FPropMeta(cls, p, x):
    return py_utils.NestedMap(flops=2 * x.num_elements() * p.dim, out_shapes=(x,))


class MaskedDense(Dense):
  """Dense on NestedMap(vec, paddings, ids, extra=None): transforms vec, passes the rest through."""

  def FProp(self, theta, inputs):
    with tf.name_scope(self.params.name):
      vec = tf.tanh(tf.matmul(inputs.vec, theta.w)) * (1.0 - inputs.paddings)
      return py_utils.NestedMap(vec=vec, paddings=inputs.paddings, ids=inputs.ids, extra=None)


def DenseLayers(num_layers, dim=8, cls=Dense):
  return [cls.Params().Set(name='layer%d' % i, dim=dim, seed=100 + i) for i in range(num_layers)]


def Pipeline(layers, num_devices, num_micro_batches, recompute='always', name='pipe', **kwargs):
  return layer_lib.TensorPipeLayer.Params().Set(
      name=name, layers=layers, num_devices=num_devices,
      num_micro_batches=num_micro_batches, recompute=recompute, **kwargs)


def Plain(layers, name='pipe'):
  """The same layers, unpipelined (variables named like TensorPipeLayer's: pipe/<layer>/...)."""
  return builder_layers.SequentialLayer.Params().Set(name=name, sub=layers)


def Cluster(num_devices):
  return cluster_factory.ForTestingWorker(cpus=num_devices, split_size=num_devices)


def StepPeakBytes(run):
  """Peak CPU allocator bytes of `run()` above what was allocated before it (earlier tests in the
  process may hold memory), and what `run()` returned. All logical CPU devices share the allocator.

  Needs an allocator that keeps statistics: the root conftest.py sets TF_CPU_ALLOCATOR_USE_BFC=true
  before TensorFlow is imported (TensorFlow 2.13 keeps none without oneDNN)."""
  try:
    tf.config.experimental.reset_memory_stats('CPU:0')
  except ValueError as e:
    raise AssertionError(
        'the CPU allocator keeps no statistics (%s): TF_CPU_ALLOCATOR_USE_BFC=%r; set '
        'TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow is imported (the root conftest.py does)'
        % (e, os.environ.get('TF_CPU_ALLOCATOR_USE_BFC'))) from e
  before = tf.config.experimental.get_memory_info('CPU:0')['current']
  value = run()
  return tf.config.experimental.get_memory_info('CPU:0')['peak'] - before, value


def Session(graph, num_devices, intra_op_threads=None, inter_op_threads=None):
  return tf.Session(graph=graph, config=placement.SessionConfig(
      num_devices, intra_op_threads, inter_op_threads))


def Gradients(params, inputs_fn, num_devices=4, loss_fn=None, seed=None):
  """Builds `params`, runs one forward/backward pass; returns {var name: gradient} and outputs.
  `seed`: the graph's random seed, if set."""
  graph = tf.Graph()
  with graph.as_default(), Cluster(num_devices):
    if seed is not None:
      tf.random.set_seed(seed)
    net = params.Instantiate()
    inputs = inputs_fn()
    out = net.FPropDefaultTheta(*inputs)
    loss = loss_fn(out) if loss_fn else tf.reduce_mean(out)
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    with Session(graph, num_devices) as sess:
      sess.run(tf.global_variables_initializer())
      values, loss_value = sess.run([grads, loss])
  return {v.op.name: g for v, g in zip(variables, values)}, loss_value


def ValuesOnlyConfig(num_devices):
  """A session config for `num_devices` devices without grappler's rewrites.

  For tests that compare values only: optimising a many-variant graph before its single run would
  take most of the test's time. Tests of what training runs (placement, memory, schedules) keep the
  default config.
  """
  config = placement.SessionConfig(num_devices)
  config.graph_options.rewrite_options.disable_meta_optimizer = True
  return config


def GradientsOfVariants(variants, inputs_fn, loss_fn=None, num_devices=4, grappler=False):
  """As Gradients for each (name, params) of `variants`, all in one graph and one run.

  Building and running the variants together saves a session (and its graph optimisation) per
  variant, which is most of the time of a small model's check. Each params must be named `name`, so
  its variables are distinct from the others'; they are still initialised identically, since every
  layer here seeds its initialiser explicitly. Each variant gets its own inputs (so gradient
  construction never walks another variant's ops). `grappler`: run with TensorFlow's graph
  optimiser, as training does (slower to start; the paper's test keeps it on).

  Returns:
    {name: ({variable name below name/: gradient}, loss)}.
  """
  graph = tf.Graph()
  fetches = {}
  with graph.as_default(), Cluster(num_devices):
    for name, params in variants:
      assert params.name == name, (params.name, name)
      out = params.Instantiate().FPropDefaultTheta(*inputs_fn())
      loss = loss_fn(out) if loss_fn else tf.reduce_mean(out)
      variables = [v for v in tf.trainable_variables() if v.op.name.startswith(name + '/')]
      grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
      fetches[name] = ({v.op.name[len(name) + 1:]: g for v, g in zip(variables, grads)}, loss)
    config = (placement.SessionConfig(num_devices) if grappler else
              ValuesOnlyConfig(num_devices))
    with tf.Session(graph=graph, config=config) as sess:
      sess.run(tf.global_variables_initializer())
      return sess.run(fetches)


def MaxRelativeError(grads, reference):
  """max over variables of |g - g_ref| / |g_ref| (Frobenius norms)."""
  assert sorted(grads) == sorted(reference), (sorted(grads), sorted(reference))
  return max(np.linalg.norm(grads[k] - reference[k]) / np.linalg.norm(reference[k]) for k in grads)


def TracedStep(sess, fetches):
  """Runs `fetches` fully traced; returns (values, [(device, node name, op type, start, end)])."""
  values, meta = profiling.TracedRun(sess, fetches)
  nodes = []
  for dev in meta.step_stats.dev_stats:
    for n in dev.node_stats:
      op_type = n.timeline_label.split('(')[0].split('=')[-1].strip() if n.timeline_label else ''
      nodes.append((dev.device, n.node_name, op_type, n.all_start_micros,
                    n.all_start_micros + n.all_end_rel_micros))
  return values, nodes


def TracedPipelineStep(params, x, num_devices=2):
  """profiling.Trace of one traced SGD step (after an untraced one) of the TensorPipeLayer
  `params` on the input array `x`; the loss is the outputs' mean and is fetched with the update, as
  a trainer fetches it."""
  graph = tf.Graph()
  with graph.as_default(), Cluster(num_devices):
    net = params.Instantiate()
    loss = tf.reduce_mean(net.FPropDefaultTheta(tf.constant(x)))
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    train_op = tf.group(*[v.assign_sub(0.1 * g) for v, g in zip(variables, grads)])
    with Session(graph, num_devices) as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(train_op)
      _, meta = profiling.TracedRun(sess, [train_op, loss])
  return profiling.Trace(meta, pipeline_scope=params.name)


def OpsMetadata(ops):
  """A RunMetadata with the given ops: [(name, op type, start micros, end micros)] on CPU:0."""
  meta = tf.compat.v1.RunMetadata()
  dev = meta.step_stats.dev_stats.add(device='/job:localhost/replica:0/task:0/device:CPU:0')
  for name, op_type, start, end in ops:
    dev.node_stats.add(node_name=name, all_start_micros=start, all_end_rel_micros=end - start,
                       timeline_label='%s = %s(x)' % (name, op_type))
  return meta


def TracedSgdSteps(params, batch, num_devices, steps=3):
  """Builds `params` with a plain SGD update (assign_sub per variable) on a [batch, dim] input.

  Runs a warm-up step, then `steps` traced ones; returns their RunMetadata step stats.
  """
  with tf.Graph().as_default() as graph, Cluster(num_devices):
    net = params.Instantiate()
    dim = params.layers[0].dim
    loss = tf.reduce_sum(tf.square(net.FPropDefaultTheta(tf.random.uniform([batch, dim]))))
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    updates = []
    for var, grad in zip(variables, grads):
      with tf.compat.v1.colocate_with(var):
        updates.append(var.assign_sub(1e-3 * grad).op)
    train = tf.group(*updates)
    stats = []
    with Session(graph, num_devices, 1, 2) as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(train)
      for _ in range(steps):
        stats.append(profiling.TracedRun(sess, train)[1].step_stats)
  return stats


def MatMulsRun(sess, step, repeats=1):
  """A deterministic stand-in for cost_model.StepSeconds: the MatMul ops one traced run of `step`
  executes (`repeats` is accepted and ignored). Costs from it follow the work, never the load."""
  del repeats
  _, nodes = TracedStep(sess, step)
  return CountByType(nodes, MATMUL_TYPES)


def MatMulElementsRun(sess, step, repeats=1):
  """A deterministic stand-in for cost_model.StepSeconds that follows the batch: the elements
  the MatMul ops of one traced run of `step` write (`repeats` is accepted and ignored). A Dense
  layer of width D on B examples: B x D forward, B x D and D x D backward."""
  del repeats
  _, meta = profiling.TracedRun(sess, step)
  total = 0
  for dev in meta.step_stats.dev_stats:
    for n in dev.node_stats:
      op_type = n.timeline_label.split('(')[0].split('=')[-1].strip() if n.timeline_label else ''
      if op_type in MATMUL_TYPES:
        total += sum(int(np.prod([d.size for d in o.tensor_description.shape.dim]))
                     for o in n.output)
  return total


def CountByType(nodes, types, predicate=lambda name: True):
  counts = collections.Counter()
  for _, name, op_type, _, _ in nodes:
    if op_type in types and predicate(name):
      counts[op_type] += 1
  return sum(counts.values())


def StepWithBatchNormUpdates(params, inputs_fn, num_devices=4, loss_fn=None):
  """One forward/backward pass that also runs the registered batch-norm updates.

  Returns ({trainable var name: gradient}, {moving-average var name: value after the step}, the
  number of registered batch-norm updates, the number of those Lingvo finds relevant to the loss).
  """
  graph = tf.Graph()
  with graph.as_default(), Cluster(num_devices):
    tf.random.set_seed(1234)  # Lingvo then seeds unseeded variables from their names.
    net = params.Instantiate()
    out = net.FPropDefaultTheta(*inputs_fn())
    loss = loss_fn(out) if loss_fn else tf.reduce_mean(tf.square(out - 0.5))
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    updates = tf.get_collection(py_utils.BATCH_NORM_UPDATES)
    relevant, _ = py_utils.FindRelevantBatchNormUpdates(loss, updates)
    moving = [v for v in tf.global_variables() if 'moving_' in v.op.name]
    # Values only: grappler's rewrites would take most of the time on these 10k-op graphs.
    with tf.Session(graph=graph, config=ValuesOnlyConfig(num_devices)) as sess:
      sess.run(tf.global_variables_initializer())
      grad_values, _ = sess.run([grads, updates])
      moving_values = sess.run(moving)
  return ({v.op.name: g for v, g in zip(variables, grad_values)},
          {v.op.name: m for v, m in zip(moving, moving_values)}, len(updates), len(relevant))


def TransformerParameterCount(num_layers,
                              model_dim,
                              ffn_dim,
                              num_heads,
                              vocab,
                              head_dim=64,
                              lm=False):
  """Parameters of PipelinedTransformer (or, lm=True, PipelinedTransformerLm) from its shapes."""
  d, att = model_dim, num_heads * head_dim
  ffn = 2 * d * ffn_dim + ffn_dim + d
  enc_layer = 4 * d * att + ffn + 2 * 2 * d
  dec_layer = 8 * d * att + ffn + 3 * 2 * d
  emb_softmax = vocab * d + d * vocab + vocab
  if lm:
    return num_layers * enc_layer + 2 * d + emb_softmax
  return num_layers * (enc_layer + dec_layer) + 2 * 2 * d + emb_softmax


def TrainerGraph(cfg, num_devices, train=True):
  """Registered model params `cfg` built as Lingvo's trainer client builds them (the training graph,
  or with train=False the evaluation graph), in a new graph on `num_devices` logical CPU devices.

  Returns (graph, task); build what else the test needs under `graph.as_default()`.
  """
  graph = tf.Graph()
  with graph.as_default(), cluster_factory.ForTestingWorker(
      mode='sync', job='trainer_client', cpus=num_devices, split_size=num_devices,
      do_eval=not train):
    tf.random.set_seed(1)  # Lingvo then seeds unseeded variables from their names.
    model = cfg.Instantiate()
    if train:
      model.ConstructFPropBPropGraph()
    else:
      model.ConstructFPropGraph()
  return graph, model.GetTask()


def ModelParams(name, dataset='Train'):
  """registry.ModelParams of a registered model (`name` as in --model), flags parsed if need be."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(['test'])
  registry.ImportModel(name)
  return registry.ModelParams(name, dataset)


def WriteStepCheckpoint(train_dir, step):
  """Writes a checkpoint train_dir/ckpt-<step> holding just global_step = `step`, as Lingvo names
  its checkpoints, makes it the latest and returns its path."""
  with tf.Graph().as_default():
    global_step = tf.train.get_or_create_global_step()
    with tf.Session() as sess:
      sess.run(global_step.assign(step))
      return tf.train.Saver().save(sess, os.path.join(train_dir, 'ckpt-%08d' % step))


def Num2WordsCorpus():
  """The directory of a small num2words corpus, generated once per process.

  Imbalanced: 200 .. 10 train examples per language, and 10 test examples each.
  """
  global _NUM2WORDS_DIR
  if _NUM2WORDS_DIR is None:
    _NUM2WORDS_DIR = os.path.join(tempfile.mkdtemp(), 'corpus')
    num2words_corpus.EnsureCorpus(_NUM2WORDS_DIR, max_number=299, num_test=10, max_train=200,
                                  min_train=10, vocab_size=400)
  return _NUM2WORDS_DIR


@contextlib.contextmanager
def HeldPorts(count, listen=(), reuse=()):
  """Yields `count` loopback ports, each bound by a socket held for the whole block: no other
  process can take one meanwhile. Ports with an index in `listen` accept connections (as a running
  task's server does); those in `reuse` are bound with SO_REUSEADDR and not listening, so a
  TensorFlow server (and preflight.CheckPortFree, which binds as it does) could still bind them,
  while connections to them are refused."""
  with contextlib.ExitStack() as stack:
    ports = []
    for i in range(count):
      s = stack.enter_context(socket.socket())
      if i in reuse:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      s.bind(('127.0.0.1', 0))
      if i in listen:
        s.listen()
      ports.append(s.getsockname()[1])
    yield ports


def InPrivateNetwork(argv):
  """`argv` run in a network namespace of its own with only loopback up, or None where this user
  may not create one (not root, or no `unshare`/`ip`).

  Ports a job picks there cannot be taken by any process outside it, so multi-process tests that
  start servers on picked ports do not race with the rest of the machine.
  """
  if os.geteuid() != 0 or not (shutil.which('unshare') and shutil.which('ip')):
    return None
  return ['unshare', '--net', '--', 'sh', '-c', 'ip link set lo up && exec "$@"', 'sh'] + list(argv)


# A TensorFlow server, task TASK of job JOB of the cluster CLUSTER (JSON), as Lingvo's trainer
# starts one for --job=JOB --task=TASK: it binds the port of its own address on every interface.
# It ends by itself if the test process dies without stopping it (e.g. a crash in C++).
_TF_SERVER = """
import json, os, sys, threading, time
import tensorflow as tf
cluster, job, task = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
parent = os.getppid()
def EndWithParent():
  while os.getppid() == parent:
    time.sleep(1)
  os._exit(0)
threading.Thread(target=EndWithParent, daemon=True).start()
server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=task,
                              config=tf.compat.v1.ConfigProto(device_count={'CPU': 2}))
print('ready', flush=True)
server.join()
"""
TF_SERVER_START_S = 60  # Bound on a server's start (importing TensorFlow on a loaded machine).


def StartTfServer(test, cluster, job, task):
  """Starts a TensorFlow server with 2 CPU devices, task `task` of `job` of `cluster` ({job:
  [HOST:PORT, ...]}), in a process of its own, which `test` (a TestCase) kills by pid when it
  ends; returns once the server serves (at most TF_SERVER_START_S, else the test fails)."""
  proc = subprocess.Popen([sys.executable, '-c', _TF_SERVER, json.dumps(cluster), job, str(task)],
                          stdout=subprocess.PIPE, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))

  def Stop():
    if proc.poll() is None:
      os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

  test.addCleanup(proc.stdout.close)
  test.addCleanup(Stop)
  timer = threading.Timer(TF_SERVER_START_S, Stop)  # Hang guard: readline returns at the kill.
  timer.start()
  test.addCleanup(timer.cancel)
  test.assertEqual(proc.stdout.readline(), 'ready\n', 'no TensorFlow server within %d s' %
                   TF_SERVER_START_S)
  timer.cancel()


SCALE_OUT_DIM = 8  # Width of the dense layers of the scale-out gradient checks.


def ScaleOutInput():
  """The [16, SCALE_OUT_DIM] input of the scale-out gradient checks."""
  return np.random.RandomState(5).normal(size=[16, SCALE_OUT_DIM]).astype(np.float32)


def ScaleOutPipeline(num_devices):
  """4 dense layers in a TensorPipeLayer on `num_devices` devices, M = 4."""
  return Pipeline(DenseLayers(4, dim=SCALE_OUT_DIM), num_devices, 4)


def RemoteSessionConfig(addresses, timeout_s=60, **kwargs):
  """A session config naming the TF servers at `addresses` tasks 0.. of job 'worker'."""
  cluster = tf.train.ClusterSpec({'worker': addresses})
  return tf.compat.v1.ConfigProto(cluster_def=cluster.as_cluster_def(),
                                  operation_timeout_in_ms=timeout_s * 1000, **kwargs)


def RemotePipelineGradients(addresses):
  """Gradients ({var: value}) of mean(square(out)) of ScaleOutPipeline on ScaleOutInput, partition
  k on worker task k of the TF servers at `addresses` (one replica spanning them, a device each,
  as Lingvo's trainer client sees it), and the step's RunMetadata."""
  p = cluster_factory.Current().params.Copy()
  p.mode, p.job = 'sync', 'trainer_client'
  p.worker.name = '/job:worker'
  p.worker.replicas = 1
  p.worker.cpus_per_replica = len(addresses)
  p.worker.devices_per_split = len(addresses)
  cluster = p.Instantiate()
  with tf.Session('grpc://' + addresses[0], config=RemoteSessionConfig(addresses)) as sess:
    cluster.InitDevices(sess)
  graph = tf.Graph()
  with graph.as_default(), cluster:
    devices = [cluster.WorkerDeviceInModelSplit(k) for k in range(len(addresses))]
    assert devices == ['/job:worker/replica:0/task:%d/device:CPU:0' % k
                       for k in range(len(addresses))], devices
    tf.random.set_seed(1234)
    net = ScaleOutPipeline(len(addresses)).Instantiate()
    loss = tf.reduce_mean(tf.square(net.FPropDefaultTheta(tf.constant(ScaleOutInput()))))
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    config = RemoteSessionConfig(addresses, allow_soft_placement=False)
    with tf.Session('grpc://' + addresses[0], graph=graph, config=config) as sess:
      sess.run(tf.global_variables_initializer())
      values, meta = profiling.TracedRun(sess, grads)
  return {v.op.name: g for v, g in zip(variables, values)}, meta


def StepLosses(log):
  """{step: [loss, ...]} from Lingvo's trainer lines 'step: N, steps/sec: ... loss:X ...' of `log`,
  in the order logged (a step trained again after a restore appears once per time)."""
  out = {}
  for m in re.finditer(r'\] step:\s*(\d+), steps/sec:.* loss:([0-9.eE+-]+)', log):
    out.setdefault(int(m.group(1)), []).append(float(m.group(2)))
  return out


def RunTool(name, *args, timeout=300):
  """Runs `python -m tools.<name> <args>` from the repository root, as a user would.

  Returns (exit code, stdout, stderr); a run longer than `timeout` seconds fails the test.
  """
  proc = subprocess.run([sys.executable, '-m', 'tools.' + name] + list(args), capture_output=True,
                        text=True, timeout=timeout, check=False, cwd=REPO)
  return proc.returncode, proc.stdout, proc.stderr


def OwnLines(err):
  """A tool's stderr lines less TensorFlow's own import-time warnings ('WARNING:tensorflow:...',
  e.g. Lingvo's 'Please fix your imports'), which no flag of the tool changes."""
  return [line for line in err.splitlines() if not line.startswith('WARNING:tensorflow:')]


# Tiny tasks for the consistency check: its library test and its tool test (which registers them).

TIME_MAJOR_SHAPE = (4, 8, 4)  # T, B, D of ConstantInput's default x.
_TIME, _BATCH, _DIM = TIME_MAJOR_SHAPE


class ConstantInput(base_input_generator.BaseInputGenerator):
  """Every batch is the same: x uniform in [-1, 1] of `shape`, from a fixed numpy seed."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.name = 'constant_input'
    p.batch_size = _BATCH
    p.Define('shape', [_TIME, _BATCH, _DIM], 'Shape of x, e.g. time-major [T, B, D].')
    p.Define('seed', 0, 'Numpy seed of x.')
    return p

  def _InputBatch(self):
    p = self.params
    x = np.random.RandomState(p.seed).uniform(-1, 1, size=p.shape).astype(np.float32)
    return py_utils.NestedMap(x=tf.constant(x))


class PipelineTask(base_model.BaseTask):
  """loss = mean((pipeline(x) - 0.5)^2) over every output element."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.name = 'tiny'
    p.Define('pipeline', None, 'The TensorPipeLayer Params run on input_batch.x.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateChild('pipeline', self.params.pipeline)

  def ComputePredictions(self, theta, input_batch):
    return self.pipeline.FProp(theta.pipeline, input_batch.x)

  def ComputeLoss(self, theta, predictions, input_batch):
    loss = tf.reduce_mean(tf.square(predictions - 0.5))
    return {'loss': (loss, tf.constant(1.0))}, {}


class TimeMix(base_layer.BaseLayer):
  """y = x + mean of x over axis 0: mixes the time steps of time-major [T, B, D] inputs."""

  def FProp(self, theta, x):
    with tf.name_scope(self.params.name):
      return x + tf.reduce_mean(x, axis=0, keepdims=True)


def TimeMajorTask(batch_dim):
  """A task on time-major x [T, B, D] whose layers mix along T. batch_dim=1 is right; with
  batch_dim=0 the micro-batches cut the time axis, so results depend on M (the batch_dim check is
  off, as it would otherwise stop the first step)."""
  layers = DenseLayers(2, _DIM)
  layers.insert(1, TimeMix.Params().Set(name='mix'))
  return PipelineTask.Params().Set(pipeline=layer_lib.TensorPipeLayer.Params().Set(
      name='pipe', layers=layers, num_devices=2, num_micro_batches=2, batch_dim=batch_dim,
      check_batch_dim=False))


def TimeMajorBatchNormTask(batch_dim):
  """A time-major task on x [T, B, D]: FC, Lingvo BatchNormLayer, FC, BatchNormLayer, FC. Nothing
  but batch norm mixes positions, and it reduces over T and B alike, so only the input's example
  axis tells batch_dim=0 (micro-batches of time steps) from the right batch_dim=1. The batch_dim
  check is off: what is tested is the comparison, not the check inside the step."""
  dense = DenseLayers(3, _DIM)

  def Norm(name):
    return bn_layers.BatchNormLayer.Params().Set(name=name, dim=_DIM,
                                                 add_stats_to_moving_average_variables=True)

  layers = [dense[0], Norm('bn0'), dense[1], Norm('bn1'), dense[2]]
  return PipelineTask.Params().Set(pipeline=layer_lib.TensorPipeLayer.Params().Set(
      name='pipe', layers=layers, num_devices=2, num_micro_batches=2, batch_dim=batch_dim,
      check_batch_dim=False))
