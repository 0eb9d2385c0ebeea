"""A training step of one TensorPipeLayer configuration, to time and to trace.

Benchmarks compare configurations of one model (partition sizes, M, re-computation) by their step
times, and feed the simulator from traced steps. A `TrainingStep` is a forward pass, a backward pass
(`tf.gradients(..., colocate_gradients_with_ops=True)`) and a plain SGD update (`assign_sub`, no
optimizer slots) of the layers cut into the given partitions, built in its own tf.Graph inside
cluster_factory.ForTestingWorker(cpus=devices), so partition k runs on logical CPU device k, and run
in its own session. Warm-up, timing and tracing all run the same fetches: a new fetch set would make
TensorFlow build (and grappler optimise) another executor in the middle of the measurements.
"""

import statistics
import time
from typing import Callable, List, Optional, Sequence, Tuple

from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import cluster_factory
from lingvo.core import hyperparams

from tensorpipe import layer as tensorpipe_layer
from tensorpipe.measure import profiling
from tensorpipe import placement

PIPELINE_SCOPE = 'net'  # The TensorPipeLayer's name: its own ops are the trace's 'setup'.
PER_EXAMPLE_LOSS = 'per_example_loss'  # The name of the layer PerExampleSquare appends.


class PerExampleSquare(base_layer.BaseLayer):
  """Per-example losses: the mean square of each example's float outputs, summed over outputs.

  The step's loss (mean square of the outputs) computed per example inside the pipeline, so that
  the '1f1b' and 'zero_bubble' schedules can run a micro-batch's backward pass before later forward
  passes.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('batch_dim', 0, 'The outputs\' batch dimension.')
    return p

  def FProp(self, theta, *outputs):
    del theta
    losses = []
    for y in tf.nest.flatten(outputs):
      if y is None or not y.dtype.is_floating:
        continue
      axes = [a for a in range(y.shape.rank) if a != self.params.batch_dim]
      losses.append(tf.reduce_mean(tf.square(y), axis=axes))
    return tf.add_n(losses)


class TrainingStep:
  """One TensorPipeLayer configuration's training step, with its graph, session and timings.

  Args:
    name: a label for reports.
    layers: the layer Params, in order.
    sizes: the partitions' layer counts (summing to len(layers)).
    inputs_fn: returns the first layer's FProp inputs; called inside the step's graph, on device 0.
    num_micro_batches: M.
    batch_dim: the inputs' batch dimension.
    devices: logical CPU devices of the session (default: one per partition).
    recompute: the TensorPipeLayer's recompute mode.
    intra_op_threads, inter_op_threads: the session's thread pools.
    warmup: untimed steps run when the step is built.
    learning_rate: of the SGD update.
    schedule: the TensorPipeLayer's schedule; '1f1b' and 'zero_bubble' need per_example_loss.
    per_example_loss: True: the last partition ends with a PerExampleSquare layer and the loss is
      the mean of its per-example values; False: the loss is the mean square of the pipeline's
      outputs, computed after it.
  """

  def __init__(self, name: str, layers: Sequence[hyperparams.InstantiableParams],
               sizes: Sequence[int], inputs_fn: Callable[[], Tuple[tf.Tensor, ...]],
               num_micro_batches: int, batch_dim: int = 0, devices: Optional[int] = None,
               recompute: str = 'always', intra_op_threads: int = 1, inter_op_threads: int = 2,
               warmup: int = 3, learning_rate: float = 1e-4, schedule: str = 'gpipe',
               per_example_loss: bool = False):
    if sum(sizes) != len(layers):
      raise ValueError('TrainingStep %s: partition sizes %s do not add up to %d layers' %
                       (name, list(sizes), len(layers)))
    self.name, self.sizes = name, list(sizes)
    self.times: List[float] = []
    devices = devices or len(self.sizes)
    self.graph = tf.Graph()
    with self.graph.as_default(), cluster_factory.ForTestingWorker(
        cpus=devices, split_size=devices) as cluster:
      with tf.device(cluster.WorkerDeviceInModelSplit(0)):
        inputs = inputs_fn()
      partitions, start = [], 0
      for size in self.sizes:
        partitions.append([l.Copy() for l in layers[start:start + size]])
        start += size
      if per_example_loss:
        partitions[-1].append(PerExampleSquare.Params().Set(name=PER_EXAMPLE_LOSS,
                                                           batch_dim=batch_dim))
      net = tensorpipe_layer.TensorPipeLayer.Params().Set(
          name=PIPELINE_SCOPE, partitions=partitions, num_micro_batches=num_micro_batches,
          batch_dim=batch_dim, recompute=recompute, schedule=schedule).Instantiate()
      out = [y for y in tf.nest.flatten(net.FPropDefaultTheta(*inputs))
             if y is not None and y.dtype.is_floating]
      with tf.device(out[0].device):
        if per_example_loss:
          loss = tf.reduce_mean(out[0])
        else:
          loss = tf.add_n([tf.reduce_mean(tf.square(y)) for y in out])
      variables = tf.trainable_variables()
      grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
      updates = []
      for var, grad in zip(variables, grads):
        with tf.compat.v1.colocate_with(var):
          updates.append(var.assign_sub(learning_rate * tf.convert_to_tensor(grad)).op)
      self.fetches = [tf.group(*updates), loss]
      init = tf.global_variables_initializer()
    self.sess = tf.Session(graph=self.graph, config=placement.SessionConfig(
        devices, intra_op_threads, inter_op_threads))
    self.sess.run(init)
    for _ in range(warmup):
      self.Run()

  def Run(self) -> float:
    """Runs one step; returns its loss (before the update)."""
    return float(self.sess.run(self.fetches)[1])

  def Time(self, steps: int) -> None:
    """Runs `steps` steps, adding each one's wall seconds to `times`."""
    for _ in range(steps):
      start = time.perf_counter()
      self.sess.run(self.fetches)
      self.times.append(time.perf_counter() - start)

  def Median(self) -> float:
    """The median of the timed steps' seconds."""
    if not self.times:
      raise ValueError('TrainingStep %s: no timed steps; call Time() first' % self.name)
    return statistics.median(self.times)

  def Trace(self) -> profiling.Trace:
    """A profiling.Trace of one more step."""
    _, meta = profiling.TracedRun(self.sess, self.fetches)
    return profiling.Trace(meta, pipeline_scope=PIPELINE_SCOPE)

  def Close(self) -> None:
    self.sess.close()
