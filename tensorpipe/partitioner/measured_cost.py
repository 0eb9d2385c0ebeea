"""The 'measured' cost source: each layer's forward and backward pass timed in a TensorFlow session,
run alone on the target device with the inputs it gets in the pipeline (`MeasureSeconds`, for
TensorPipeLayer's partition_cost='measured'), or on random inputs of its shapes at several batch
sizes in one graph (`MeasureLayerSeconds`, for the planner's measured layer times).

The other sources (counts, flops, memory), and the layer facts they come from, are in `cost_model`.
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple

from lingvo import compat as tf

from tensorpipe.partitioner import cost_model


def _LocalDevice(device):
  """The device of this process with the same type as `device` (index 0)."""
  spec = tf.DeviceSpec.from_string(device or '/device:CPU:0')
  return '/device:%s:0' % (spec.device_type or 'CPU')


def MeasureSeconds(layer_params: Sequence[Any], input_shapes: Optional[Sequence[Any]],
                   device: Optional[str] = None, repeats: int = 5,
                   input_fn: Optional[Callable[[], Any]] = None,
                   timer: Optional[Callable[[Any, Any, int], float]] = None,
                   skips: Sequence[Tuple[int, int]] = (),
                   config: Optional[Any] = None) -> List[float]:
  """Median seconds of each layer's forward + backward pass, each layer run alone.

  Each layer's inputs are what the layers before it produce from random inputs, stored in variables
  so that a run times the layer only.

  Args:
    layer_params: the L layer Params.
    input_shapes: the first layer's input shapes (float32 uniform random inputs), unless input_fn.
    device: a device of the type to measure on (e.g. a partition's device); index 0 of that type is
      used.
    repeats: timed runs per layer (after one warm-up run).
    input_fn: optional callable returning the first layer's FProp args (e.g. integer ids).
    timer: `timer(session, step, repeats)` -> the cost of one layer's step; default
      cost_model.StepSeconds
      (wall clock). Tests inject a deterministic cost here.
    skips: (source, destination) layer indices of skip connections (see cost_model.ChainMeta).
    config: the session's ConfigProto (e.g. one thread, to time work rather than span); default:
      TensorFlow's thread pools, soft placement off.

  Returns:
    L floats (seconds, or the timer's unit).
  """
  return cost_model.OutsideLayerStack(_MeasureSeconds, layer_params, input_shapes, device, repeats,
                                      input_fn, timer or cost_model.StepSeconds, skips, config)


def _TimedStep(layer, args, name, view=lambda x: x, initial=False):
  """(step, stores, outputs) of `layer` run on `args` held in variables (named after `name`):
  running `stores` fills the variables (with `initial`, their initializers do: none to run);
  running `step` then runs its forward and backward pass on `view` of each variable's value."""
  leaves = tf.nest.flatten(args)
  held = [None if x is None else tf.Variable(x if initial else tf.zeros_like(x), trainable=False,
                                             name='%s_%d' % (name, j))
          for j, x in enumerate(leaves)]
  stores = [] if initial else [h.assign(x) for h, x in zip(held, leaves) if h is not None]
  inputs = tf.nest.pack_sequence_as(args, [None if h is None else view(h.read_value())
                                           for h in held])
  out = layer.FProp(layer.theta, *inputs)
  ys = [y for y in tf.nest.flatten(out) if y is not None and y.dtype.is_floating]
  sources = [x for x in tf.nest.flatten(inputs) if x is not None and x.dtype.is_floating]
  sources += layer.theta.Flatten()
  loss = tf.add_n([tf.reduce_sum(y) for y in ys]) if ys else None
  grads = [] if loss is None else [g for g in tf.gradients(loss, sources) if g is not None]
  # A scalar that needs every output and gradient: grappler drops unfetched pure ops, even
  # ones a fetched tf.group depends on.
  step = tf.add_n([tf.reduce_sum(t) for t in ys + grads]) if ys + grads else tf.no_op()
  return step, stores, out


def _MeasureSeconds(layer_params, input_shapes, device, repeats, input_fn, timer, skips, config):
  graph = tf.Graph()
  with graph.as_default(), tf.device(_LocalDevice(device)):
    if input_fn is not None:
      args = tuple(input_fn())
    else:
      args = tuple(RandomInputs(input_shapes, None, 0))
    layers = [p.Copy().Instantiate() for p in layer_params]
    steps: List[Any] = []
    stores: List[Any] = []
    outs: List[Any] = []
    for i, layer in enumerate(layers):
      args += tuple(outs[src] for src, dst in skips if dst == i)
      step, store, out = _TimedStep(layer, args, 'input%d' % i)
      steps.append(step)
      stores.extend(store)
      args = out if isinstance(out, tuple) else (out,)
      outs.append(out)
    init = tf.global_variables_initializer()
  return _RunSteps(graph, init, stores, steps, config, timer, repeats)


def _RunSteps(graph, init, stores, steps, config, timer, repeats):
  config = config or tf.compat.v1.ConfigProto(allow_soft_placement=False)
  seconds = []
  with tf.compat.v1.Session(graph=graph, config=config) as sess:
    sess.run(init)
    for store in stores:  # In order: a layer's inputs may come from the stored ones before it.
      sess.run(store)
    for step in steps:
      seconds.append(float(timer(sess, step, repeats)))
  return seconds


def MeasureLayerSeconds(layer_params: Sequence[Any], input_shapes: Sequence[Sequence[Any]],
                        examples: Sequence[int], batch_dim: int = 0,
                        device: Optional[str] = None, repeats: int = 5,
                        timer: Optional[Callable[[Any, Any, int], float]] = None,
                        config: Optional[Any] = None,
                        built: Callable[[], None] = lambda: None,
                        timed: Callable[[int, List[float]], None] = lambda i, seconds: None
                        ) -> List[List[float]]:
  """Per layer, the median seconds of its forward + backward pass, run alone, on each number of
  `examples` (the first the largest; `input_shapes[i]`, layer i's FProp input shapes, are for that
  many).

  What MeasureSeconds measures of a layer, without the layers before it: uniform random float
  inputs held in variables (an absent input stays None). Every layer is built once, in one graph
  and session, for every number of examples: on the first `examples` of its inputs along
  `batch_dim`, a size known when it runs. A layer that needs its batch size when its graph is built
  (its FProp raises TypeError or ValueError on that) gets a graph of its own, with a pass per
  number of examples. `built()` is called after each layer is built, `timed(i, seconds)` after
  layer i is timed. Other arguments as MeasureSeconds'.
  """
  if list(examples) != sorted(examples, reverse=True):
    raise ValueError('measured_cost: examples must be in decreasing order, got %r' % (examples,))
  return cost_model.OutsideLayerStack(_MeasureLayers, layer_params, input_shapes, examples,
                                      batch_dim, device, repeats, timer or cost_model.StepSeconds,
                                      config, built, timed)


def RandomInputs(input_shapes: Sequence[Any], examples: Optional[int] = None,
                 batch_dim: int = 0) -> Tuple[Any, ...]:
  """Uniform random floats of the FProp arguments' shapes (see cost_model.MapShapes), dimension
  `batch_dim` set to `examples` (unless None); each shape its own seed."""
  seeds = iter(range(1 << 30))
  return tuple(cost_model.MapShapes(
      lambda s: tf.random.uniform(
          [examples if i == batch_dim and examples is not None else d
           for i, d in enumerate(cost_model.Dims(s))], seed=next(seeds)), a) for a in input_shapes)


def _MeasureLayers(layer_params, input_shapes, examples, batch_dim, device, repeats, timer, config,
                   built, timed):
  graph = tf.Graph()
  steps, alone = {}, []
  with graph.as_default(), tf.device(_LocalDevice(device)):
    count = tf.Variable(examples[0], trainable=False, name='examples')
    counts = [count.assign(n) for n in examples]  # Made before the session: no graph extension.

    def FirstExamples(x):
      return x[(slice(None),) * batch_dim + (slice(0, count),)]

    for i, (p, shapes) in enumerate(zip(layer_params, input_shapes)):
      with tf.name_scope('layer%d' % i):
        layer = p.Copy().Instantiate()
        try:
          steps[i] = _TimedStep(layer, RandomInputs(shapes, examples[0], batch_dim),
                                'input%d' % i, FirstExamples, initial=True)[0]
        except (TypeError, ValueError):  # Its FProp needs the batch size: a graph of its own.
          alone.append(i)
      built()
    init = tf.global_variables_initializer()
  config = config or tf.compat.v1.ConfigProto(allow_soft_placement=False)
  out: List[Any] = [None] * len(layer_params)
  with tf.compat.v1.Session(graph=graph, config=config) as sess:
    sess.run(init)
    for i, step in steps.items():
      out[i] = []
      for set_count in counts:
        sess.run(set_count)
        out[i].append(float(timer(sess, step, repeats)))
      timed(i, out[i])
  for i in alone:
    out[i] = _MeasureAlone(layer_params[i], input_shapes[i], examples, batch_dim, device, repeats,
                           timer, config)
    timed(i, out[i])
  return out


def _MeasureAlone(p, input_shapes, examples, batch_dim, device, repeats, timer, config):
  """A layer's seconds on each number of examples, built once per number."""
  graph = tf.Graph()
  with graph.as_default(), tf.device(_LocalDevice(device)):
    layer = p.Copy().Instantiate()
    steps = [_TimedStep(layer, RandomInputs(input_shapes, n, batch_dim), 'input%d' % i,
                        initial=True)[0] for i, n in enumerate(examples)]
    init = tf.global_variables_initializer()
  return _RunSteps(graph, init, [], steps, config, timer, repeats)
