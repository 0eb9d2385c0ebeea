"""Benchmarks the partitioner: predicted imbalance of each algorithm, and the step time it buys.

Part 1, imbalance (max/mean estimated partition cost, by FPropMeta flops) of AmoebaNet-D (18, 256)
at 224x224 and of a Transformer-48 stack (token embedding, 48 Transformer layers with model
dimension 2048, feed-forward 8192, 32 heads, and a 32k-vocabulary softmax, as in the paper's Table
2) for K = 2, 4, 8, side by side: partitions of equal layer count, the paper's min-variance
heuristic, and the exact min-max split. The min-max split is the least imbalance of any contiguous
split of these
layers (tests/partition/balancing_test.py checks it against brute force): where it is above 1.05,
the layers are too coarse for any split to do better.

Part 2, step time: a training step (forward, backward, SGD update) of a TensorPipeLayer with K = 2
on 2 logical CPU devices (intra_op=1, inter_op=2), M = 4, for a dense stack with its work up front,
a small transformer stack whose softmax is expensive, and a small AmoebaNet-D; each model cut by
layer count, by flops and by measured layer time (all with the optimal algorithm). Configurations
are timed interleaved, in rounds, in one process (see benchmark_pipeline for why); ratios are of
median step times.

Usage:
  .venv/bin/python -m tools.benchmark_partitioning               # both parts (a few minutes)
  .venv/bin/python -m tools.benchmark_partitioning --skip_timing # part 1 only (seconds)

Results and the command that produced them: docs/benchmarks.md.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import argparse  # pylint: disable=g-import-not-at-top
import statistics
import time

import numpy as np  # pylint: disable=g-import-not-at-top
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import cluster_factory
from lingvo.core import py_utils

from tensorpipe.tasks.image import amoebanet
from tensorpipe.partition import balancing
from tensorpipe import layer as tensorpipe_layer
from tensorpipe.partition import partitioning
from tensorpipe import placement
from tensorpipe.measure import profiling
from tools import benchmark_pipeline


class TokenEmbedding(base_layer.BaseLayer):
  """ids [T, B] -> (vecs [T, B, D], paddings [T, B]): the first layer of a Transformer stack."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 32000, 'Vocabulary size.')
    p.Define('model_dim', 2048, 'Embedding width.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable('emb', py_utils.WeightParams(
        [p.vocab_size, p.model_dim], py_utils.WeightInit.Gaussian(p.model_dim**-0.5)))

  def FProp(self, theta, ids):
    with tf.name_scope(self.params.name):
      return tf.gather(theta.emb, ids), tf.zeros(tf.shape(ids), tf.float32)

  @classmethod
  def FPropMeta(cls, p, ids):
    t, b = ids[0], ids[1]
    vecs = ids.__class__([t, b, p.model_dim])
    return py_utils.NestedMap(flops=t * b * p.model_dim, out_shapes=(vecs, ids))


class SoftmaxLogits(base_layer.BaseLayer):
  """(vecs [T, B, D], paddings) -> log-probabilities [T, B, V]: the last layer of the stack."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('vocab_size', 32000, 'Vocabulary size.')
    p.Define('model_dim', 2048, 'Input width.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable('w', py_utils.WeightParams(
        [p.model_dim, p.vocab_size], py_utils.WeightInit.Gaussian(p.model_dim**-0.5)))

  def FProp(self, theta, vecs, paddings):
    with tf.name_scope(self.params.name):
      return tf.nn.log_softmax(tf.einsum('tbd,dv->tbv', vecs, theta.w))

  @classmethod
  def FPropMeta(cls, p, vecs, paddings):
    t, b = vecs[0], vecs[1]
    flops = 2 * t * b * p.model_dim * p.vocab_size + 3 * t * b * p.vocab_size
    return py_utils.NestedMap(flops=flops, out_shapes=(vecs.__class__([t, b, p.vocab_size]),))


class RepeatedDense(base_layer.BaseLayer):
  """x -> tanh(x w) applied `repeats` times with one weight: cost set by repeats, shape kept."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 512, 'Width.')
    p.Define('repeats', 1, 'How many times the weight is applied.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable('w', py_utils.WeightParams(
        [p.dim, p.dim], py_utils.WeightInit.Gaussian(p.dim**-0.5)))

  def FProp(self, theta, x):
    with tf.name_scope(self.params.name):
      for _ in range(self.params.repeats):
        x = tf.tanh(tf.matmul(x, theta.w))
      return x

  @classmethod
  def FPropMeta(cls, p, x):
    return py_utils.NestedMap(flops=2 * x[0] * p.dim * p.dim * p.repeats, out_shapes=(x,))


def TransformerStack(num_layers, model_dim, hidden_dim, num_heads, vocab_size):
  return ([TokenEmbedding.Params().Set(name='embedding', vocab_size=vocab_size,
                                       model_dim=model_dim)] +
          [benchmark_pipeline.TransformerBlock.Params().Set(
              name='block%d' % i, model_dim=model_dim, num_heads=num_heads, hidden_dim=hidden_dim)
           for i in range(num_layers)] +
          [SoftmaxLogits.Params().Set(name='softmax', vocab_size=vocab_size, model_dim=model_dim)])


def ImbalanceModels():
  """(name, layer Params, first-layer input shapes) of the models of part 1."""
  return [
      ('AmoebaNet-D (18, 256), 224x224', amoebanet.AmoebaNetLayers('D', 18, 256, image_size=224),
       [[128, 224, 224, 3]]),
      ('Transformer-48 (2048, 8192, 32 heads, 32k vocab)', TransformerStack(48, 2048, 8192, 32, 32000),
       [[1024, 32]]),
  ]


def ImbalanceTable(models, ks=(2, 4, 8)):
  """Rows of (model, K, layers, count, min_variance, optimal) imbalances."""
  rows = []
  for name, layers, shapes in models:
    flops = partitioning.MakePlan(layers, 1, shapes).cost
    for k in ks:
      by_count = partitioning.MakePlan(layers, k, None)
      row = [name, k, len(layers), balancing.Imbalance(flops.Partitions(by_count.sizes))]
      for algorithm in balancing.ALGORITHMS:
        row.append(partitioning.MakePlan(layers, k, shapes, algorithm=algorithm).Imbalance())
      rows.append(tuple(row))
  return rows


def PrintImbalance(rows):
  print('Part 1: imbalance, max/mean estimated partition cost (FPropMeta flops); 1.000 is perfect')
  print('%-50s %2s %6s  %7s  %12s  %7s' % ('model', 'K', 'layers', 'count', 'min_variance',
                                          'optimal'))
  for name, k, num_layers, count, variance, optimal in rows:
    print('%-50s %2d %6d  %7.3f  %12.3f  %7.3f' % (name, k, num_layers, count, variance, optimal))


# ----------------------------------------------------------------------------------------------------
# Part 2: step time.


class Step:
  """A training step (forward, backward, SGD update) of one TensorPipeLayer configuration.

  Built in its own graph and session inside cluster_factory.ForTestingWorker(cpus=devices), so
  partition k runs on logical CPU device k; `sizes` gives the partitions' layer counts.
  """

  def __init__(self, name, layers, sizes, inputs_fn, num_micro_batches, batch_dim=0, devices=None,
               recompute='always', intra_op_threads=1, inter_op_threads=2, warmup=3):
    self.name, self.sizes, self.times = name, list(sizes), []
    devices = devices or len(sizes)
    self.graph = tf.Graph()
    with self.graph.as_default(), cluster_factory.ForTestingWorker(
        cpus=devices, split_size=devices) as cluster:
      with tf.device(cluster.WorkerDeviceInModelSplit(0)):
        inputs = inputs_fn()
      partitions, start = [], 0
      for size in sizes:
        partitions.append([l.Copy() for l in layers[start:start + size]])
        start += size
      net = tensorpipe_layer.TensorPipeLayer.Params().Set(
          name='net', partitions=partitions, num_micro_batches=num_micro_batches, batch_dim=batch_dim,
          recompute=recompute).Instantiate()
      out = [y for y in tf.nest.flatten(net.FPropDefaultTheta(*inputs))
             if y is not None and y.dtype.is_floating]
      with tf.device(out[0].device):
        loss = tf.add_n([tf.reduce_mean(tf.square(y)) for y in out])
      variables = tf.trainable_variables()
      grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
      updates = []
      for var, grad in zip(variables, grads):
        with tf.compat.v1.colocate_with(var):
          updates.append(var.assign_sub(1e-4 * tf.convert_to_tensor(grad)).op)
      self.fetches = [tf.group(*updates), loss]
      init = tf.global_variables_initializer()
    self.sess = tf.Session(graph=self.graph, config=placement.SessionConfig(
        devices, intra_op_threads, inter_op_threads))
    self.sess.run(init)
    for _ in range(warmup):
      self.sess.run(self.fetches)

  def Time(self, steps):
    for _ in range(steps):
      start = time.perf_counter()
      self.sess.run(self.fetches)
      self.times.append(time.perf_counter() - start)

  def Median(self):
    return statistics.median(self.times)

  def Trace(self):
    """A profiling.Trace of one more step."""
    _, meta = profiling.TracedRun(self.sess, self.fetches)
    return profiling.Trace(meta, pipeline_scope='net')

  def Close(self):
    self.sess.close()


def _TimingModels(args):
  """(name, layers, input_fn, first-layer shapes, batch_dim) of the models of part 2."""
  t, b = 32, 16
  rng = np.random.RandomState(0)

  def Ids():
    return (tf.constant(rng.randint(0, 8000, size=[t, b]).astype(np.int32)),)

  def Images():
    return (tf.constant(rng.uniform(size=[32, 32, 32, 3]).astype(np.float32)),)

  def Vectors():
    return (tf.constant(rng.uniform(size=[256, 512]).astype(np.float32)),)

  front_heavy = [RepeatedDense.Params().Set(name='dense%d' % i, repeats=r)
                 for i, r in enumerate([6, 6, 6, 1, 1, 1, 1, 1])]
  transformer = TransformerStack(6, 128, 512, 4, 8000)
  amoeba = amoebanet.AmoebaNetLayers('D', 6, 16, num_classes=10, image_size=32, stem_stride=1,
                                     num_stem_cells=0, stem_filters=16)
  return [('dense, 3 heavy layers then 5 light (512 wide)', front_heavy, Vectors, [[256, 512]], 0),
          ('transformer (6 blocks, dim 128, 8k-vocab softmax)', transformer, Ids, [[t, b]], 1),
          ('AmoebaNet-D (6, 16), 32x32 inputs', amoeba, Images, [[32, 32, 32, 3]], 0)]


def TimeSplits(args):
  """Per model: step time of the count, flops and measured splits (interleaved rounds)."""
  results = []
  for name, layers, inputs_fn, shapes, batch_dim in _TimingModels(args):
    plans = [
        partitioning.MakePlan(layers, args.k, None, cost='count'),
        partitioning.MakePlan(layers, args.k, shapes, cost='flops'),
        partitioning.MakePlan(layers, args.k, shapes, cost='measured', device='/device:CPU:0',
                              input_fn=inputs_fn),
    ]
    seconds = plans[-1].cost
    steps = []
    for plan in plans:
      if any(s.sizes == plan.sizes for s in steps):
        print('  %s: the %s split %s is the same as an earlier one' %
              (name, plan.cost_source, plan.sizes))
        continue
      steps.append(Step('%s split %s' % (plan.cost_source, plan.sizes), layers, plan.sizes,
                        inputs_fn, args.micro_batches, batch_dim, args.devices,
                        intra_op_threads=args.intra_op_threads,
                        inter_op_threads=args.inter_op_threads, warmup=args.warmup))
    for r in range(args.rounds):
      for s in steps[r % len(steps):] + steps[:r % len(steps)]:
        s.Time(args.steps_per_round)
    base = steps[0].Median()
    for s in steps:
      results.append((name, s.name, balancing.Imbalance(seconds.Partitions(s.sizes)), s.Median(),
                      base / s.Median()))
      s.Close()
  return results


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--skip_timing', action='store_true', help='Only part 1.')
  parser.add_argument('--k', type=int, default=2, help='Partitions (= logical CPU devices) in part 2.')
  parser.add_argument('--micro_batches', type=int, default=4, help='M in part 2.')
  parser.add_argument('--rounds', type=int, default=12, help='Interleaved timing rounds.')
  parser.add_argument('--steps_per_round', type=int, default=5, help='Timed steps per round.')
  parser.add_argument('--warmup', type=int, default=3, help='Untimed steps first.')
  parser.add_argument('--intra_op_threads', type=int, default=1)
  parser.add_argument('--inter_op_threads', type=int, default=2)
  args = parser.parse_args(argv)
  args.devices = args.k
  start = time.time()
  PrintImbalance(ImbalanceTable(ImbalanceModels()))
  if not args.skip_timing:
    print('\nPart 2: step time, K=%d, M=%d on %d logical CPU devices; imbalance by measured layer '
          'time; speed-up over the count split' % (args.k, args.micro_batches, args.devices))
    for model, name, imbalance, median, speedup in TimeSplits(args):
      print('%-50s %-28s imbalance %.3f  step %.1f ms  speed-up %.2fx' %
            (model, name, imbalance, 1e3 * median, speedup))
  print('\n(%.0f s)' % (time.time() - start))


if __name__ == '__main__':
  main()
