"""Traced steps for the TensorPipe tests: a step's executed ops (profiling.TracedRun), and
deterministic stand-ins for measured costs (the MatMul ops a step runs)."""

import collections

import numpy as np
from lingvo import compat as tf

from tensorpipe.measure import profiling
from tests import layer_helpers

MATMUL_TYPES = ('MatMul', '_MklMatMul', '_FusedMatMul', '_MklFusedMatMul', '_MklNativeFusedMatMul',
                '_MklNativeMatMul')


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
  with graph.as_default(), layer_helpers.Cluster(num_devices):
    net = params.Instantiate()
    loss = tf.reduce_mean(net.FPropDefaultTheta(tf.constant(x)))
    variables = tf.trainable_variables()
    grads = tf.gradients(loss, variables, colocate_gradients_with_ops=True)
    train_op = tf.group(*[v.assign_sub(0.1 * g) for v, g in zip(variables, grads)])
    with layer_helpers.Session(graph, num_devices) as sess:
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
  with tf.Graph().as_default() as graph, layer_helpers.Cluster(num_devices):
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
    with layer_helpers.Session(graph, num_devices, 1, 2) as sess:
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


def TraceRows(events):
  """{thread id: (device, row)} of a Chrome trace's events (chrome_trace.Events' 'traceEvents'):
  a thread named 'CPU:1 tasks: ops 2' is row 'tasks: ops 2' of device 'CPU:1'."""
  return {e['tid']: tuple(e['args']['name'].split(' ', 1)) for e in events
          if e['ph'] == 'M' and e['name'] == 'thread_name'}
