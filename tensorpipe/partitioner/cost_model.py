"""Cost model: what each layer of a pipeline costs, for the partitioner to balance.

Four sources (TensorPipeLayer's `partition_cost`):
- 'count': 1 per layer; needs no shapes.
- 'flops': each layer's FPropMeta estimate for the first layer's input shapes, chained through the
  layers (composite layers compose their children's estimates in their own FPropMeta).
- 'measured': seconds of each layer's forward and backward pass, run alone on the target device with
  the input shapes it gets in the pipeline (`measured_cost`, which uses this module's shapes).
- 'memory': bytes a layer adds to its device (parameters with their optimizer slots, and the
  activations its backward pass holds), plus, for the layer a partition starts at, its stashed
  input.

Shapes are those of the whole mini-batch; memory estimates divide by M where micro-batches matter.
"""

import concurrent.futures
import dataclasses
import importlib.metadata
import inspect
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import hyperparams
from lingvo.core import py_utils
from lingvo.core import tshape

from tensorpipe import disk_cache
from tensorpipe import selective_recompute
from tensorpipe.partitioner import balancing
from tensorpipe import progress as progress_lib

COST_SOURCES = ('count', 'flops', 'measured', 'memory')
# Bytes per trainable parameter: a float32 weight and two optimizer slots (e.g. Adam, RMSProp).
DEFAULT_BYTES_PER_PARAM = 12


@dataclasses.dataclass
class LayerProfile:
  """Static facts of one layer for the mini-batch input shapes.

  The element counts that scale with the batch are floats: planner.ScaledProfiles scales them to a
  share of the batch (e.g. a third of it per replica), which need not be a whole number.
  """
  name: str
  flops: float
  params: int  # Trainable parameters.
  state: int  # Other variables (e.g. batch-norm moving averages).
  in_elements: float  # Elements of the layer's inputs (the stash if a partition starts here).
  out_elements: float  # Elements of the layer's outputs.
  activation_elements: float = 0  # Elements of forward tensors its backward pass reads.
  forward_ops: int = 0  # Computing ops of its forward pass (each costs a launch, whatever size).
  backward_ops: int = 0  # Computing ops of its backward pass (tf.gradients).
  # Elements of the gradients its largest backward op reads and writes.
  gradient_elements: float = 0
  kept_elements: float = 0  # Elements of its matmul/conv outputs: what 'selective' keeps.
  kept_flops: float = 0  # FLOPs of those ops, which recompute='selective' does not re-compute.


def OutsideLayerStack(fn, *args):
  """Runs fn(*args) on a fresh thread: layers it builds are not taken for children of a layer
  being constructed on this one (Lingvo keeps its layer stack per thread)."""
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    return pool.submit(_InDefaultCluster, fn, *args).result()


def _InDefaultCluster(fn, *args):
  """fn(*args) inside the default cluster, which the fresh thread would use anyway: Lingvo makes a
  new one whenever a layer asks for the current cluster outside any (thousands of times for an
  AmoebaNet cell, 40% of its construction time)."""
  with cluster_factory.Current():
    return fn(*args)


def _IsShape(value):
  """A shape: a tshape.Shape, or a list or tuple of dimensions (not of shapes)."""
  return isinstance(value, tshape.Shape) or (
      isinstance(value, (list, tuple)) and
      not any(v is None or isinstance(v, (list, tuple, dict, tshape.Shape)) for v in value))


def MapShapes(fn: Callable[[tshape.Shape], Any], value: Any) -> Any:
  """`fn` of each shape in `value`, one FProp argument's shapes: a shape (see _IsShape), None (an
  absent input), or a dict (a NestedMap's fields: a NestedMap comes back), list or tuple of them
  (a tuple comes back)."""
  if value is None:
    return None
  if _IsShape(value):
    return fn(_ToShape(value))
  if isinstance(value, dict):
    return py_utils.NestedMap({k: MapShapes(fn, v) for k, v in value.items()})
  return tuple(MapShapes(fn, v) for v in value)


def _Leaves(value):
  """The shapes in one argument's shapes (see MapShapes), in a fixed order."""
  if value is None:
    return []
  if _IsShape(value):
    return [_ToShape(value)]
  if isinstance(value, dict):
    return [leaf for k in sorted(value) for leaf in _Leaves(value[k])]
  return [leaf for v in value for leaf in _Leaves(v)]


def WithBatch(input_shapes: Sequence[Any], batch_dim: int, batch: int) -> List[Any]:
  """The FProp arguments' shapes with dimension `batch_dim` of each shape set to `batch`, as lists
  of dimensions (see MapShapes)."""
  return [MapShapes(lambda s: [batch if i == batch_dim else d for i, d in enumerate(Dims(s))], a)
          for a in input_shapes]


def BatchOf(input_shapes: Sequence[Any], batch_dim: int) -> int:
  """The batch of the FProp arguments' shapes: dimension `batch_dim` of their first shape."""
  return int(Dims(_Leaves(list(input_shapes))[0])[batch_dim])


def _ToShape(shape):
  return shape if isinstance(shape, tshape.Shape) else tshape.Shape(list(shape))


def Dims(shape):
  """A shape's dimensions as a list (None where unknown)."""
  return _ToShape(shape).ToTensorShape().as_list()


def _Elements(shapes):
  total = 0
  for shape in _Leaves(list(shapes)):
    try:
      total += int(shape.num_elements())
    except TypeError as e:  # A symbolic dimension.
      raise ValueError('shape %s is not fully known; give concrete cost_input_shapes' %
                       shape) from e
  return total


def ChainMeta(layer_params: Sequence[Any], input_shapes: Sequence[Any],
              skips: Sequence[Tuple[int, int]] = ()
             ) -> Tuple[List[Tuple[float, Tuple[tshape.Shape, ...]]], Tuple[tshape.Shape, ...]]:
  """Runs FPropMeta through the layers in order.

  Args:
    layer_params: the L layer Params, in order.
    input_shapes: shapes (lists or tshape.Shape) of the first layer's FProp inputs.
    skips: (source, destination) layer indices of skip connections: the destination also gets the
      source's output, after its usual inputs (see TensorPipeLayer's skip_connections).

  Returns:
    (metas, out_shapes): per layer a (flops, input shapes) pair, and the last layer's output shapes.

  Raises:
    ValueError: when a layer does not implement FPropMeta, naming it.
  """
  with cluster_factory.Current():  # One default cluster, not one per Params() call.
    return _ChainMeta(layer_params, input_shapes, skips)


def _ChainMeta(layer_params, input_shapes, skips):
  shapes = tuple(MapShapes(lambda s: s, a) for a in input_shapes)
  metas: List[Tuple[float, Tuple[Any, ...]]] = []
  outs: List[Tuple[Any, ...]] = []
  for i, p in enumerate(layer_params):
    shapes += tuple(_SkipArgument(outs[src]) for src, dst in skips if dst == i)
    try:
      meta = p.cls.FPropMeta(p, *shapes)
    except NotImplementedError as e:
      raise ValueError('Layer %r (%s) has no FPropMeta, so its cost cannot be estimated; give '
                       'explicit `partitions`, or partition_cost=\'count\' or \'measured\'' %
                       (p.name, p.cls.__name__)) from e
    metas.append((float(meta.flops), shapes))
    shapes = tuple(meta.out_shapes)
    outs.append(shapes)
  return metas, shapes


def ChainFlops(layer_params: Sequence[Any], input_shapes: Sequence[Any]
              ) -> Tuple[float, Tuple[tshape.Shape, ...]]:
  """(total flops, output shapes) of layers run one after another, each on the previous outputs.

  For a composite layer's FPropMeta that runs a sequence of sub-layers (a stack of convolutions, a
  residual branch): it estimates them as `ChainMeta` does a pipeline's layers, so a composite layer
  and a pipeline of the same layers cost the same. Raises ValueError as ChainMeta does.
  """
  metas, out_shapes = ChainMeta(layer_params, input_shapes)
  return sum(flops for flops, _ in metas), out_shapes


def _SkipArgument(outputs):
  """What a skip connection passes: its source's output (one value, or the tuple of several)."""
  return outputs[0] if len(outputs) == 1 else outputs


def Flops(layer_params: Sequence[Any], input_shapes: Sequence[Any],
          skips: Sequence[Tuple[int, int]] = ()) -> List[float]:
  """Estimated flops of each layer for the given first-layer input shapes (see ChainMeta)."""
  return [flops for flops, _ in ChainMeta(layer_params, input_shapes, skips)[0]]


# A layer class may list, in SHAPE_NEUTRAL_PARAMS, its Params fields that change neither its
# variables nor any shape (a position in the network, a dropout rate): layers that differ only there
# are costed once.
SHAPE_NEUTRAL_PARAMS = 'SHAPE_NEUTRAL_PARAMS'
# Per process: (layer configuration, input shapes) -> (trainable, other, activation elements,
# forward ops, backward ops, gradient elements, kept elements, kept FLOPs); on disk in a cache given
# to Profiles.
_FACTS = {}
_FACTS_KIND = 'layer_facts'
_LINGVO_VERSION = importlib.metadata.version('lingvo')


def _ShapeKey(p):
  p = p.Copy()
  for field in ('name',) + tuple(getattr(p.cls, SHAPE_NEUTRAL_PARAMS, ())):
    if field in p:
      p.Set(**{field: None})
  return p.ToText()


def _CountVariables(layer):
  trainable = other = 0
  for var in layer.vars.Flatten():
    num = int(np.prod(var.shape.as_list()))
    if var.trainable:
      trainable += num
    else:
      other += num
  return trainable, other


# Ops whose outputs alias or describe other tensors rather than hold new activations.
_NOT_ACTIVATIONS = frozenset(['ReadVariableOp', 'Identity', 'IdentityN', 'Const', 'Placeholder',
                              'NoOp', 'Shape', 'Reshape', 'ExpandDims', 'Squeeze', 'StopGradient'])


def _Needed(graph, targets, first_op):
  """The ops created from `first_op` on that compute `targets`: what a step runs of them (the
  executor prunes the rest, e.g. the gradients of constants and masks that tf.gradients also
  builds)."""
  ops = graph.get_operations()
  since = {op.name for op in ops[first_op:]}
  needed, todo = set(), [t.op for t in targets]
  while todo:
    op = todo.pop()
    if op.name in needed or op.name not in since:
      continue
    needed.add(op.name)
    todo.extend(t.op for t in op.inputs)
    todo.extend(op.control_inputs)
  return [op for op in ops[first_op:] if op.name in needed]


def _KeptElements(graph, first_forward_op, first_backward_op, gradients):
  """Elements of the float tensors of the forward ops (created from `first_forward_op` on) that the
  backward ops computing `gradients` (created from `first_backward_op` on) read: what backprop
  keeps alive."""
  forward = graph.get_operations()[first_forward_op:first_backward_op]
  backward = _Needed(graph, gradients, first_backward_op)
  read = {t.name for op in backward for t in op.inputs}
  total = 0
  for op in forward:
    if op.type in _NOT_ACTIVATIONS:
      continue
    for out in op.outputs:
      if out.name in read and out.dtype.is_floating and out.shape.is_fully_defined():
        total += int(np.prod(out.shape.as_list()))
  return total


def _Elems(tensor):
  if not tensor.dtype.is_floating or not tensor.shape.is_fully_defined():
    return 0
  return int(np.prod(tensor.shape.as_list()))


# Element-wise ops: TensorFlow's kernels write their output into an input's buffer of the same
# shape when nothing else reads that input (e.g. a ReLU gradient into the incoming gradient).
_IN_PLACE = frozenset(['ReluGrad', 'Relu6Grad', 'EluGrad', 'SeluGrad', 'TanhGrad', 'SigmoidGrad',
                       'Mul', 'AddV2', 'Add', 'Sub', 'RealDiv', 'Neg', 'AddN', 'Square',
                       'Select', 'SelectV2'])


def _GradientElements(backward):
  """The most elements of gradients one of the `backward` ops reads and writes at once: its float
  outputs and the inputs other backward ops made (e.g. a max-pool gradient writes a gradient of
  the pool's input, larger than the layer's input or output); an element-wise op's output that can
  take the buffer of a gradient it reads counts once."""
  made = {op.name for op in backward}
  most = 0
  for op in backward:
    read = [_Elems(t) for t in op.inputs if t.op.name in made]
    written = [_Elems(t) for t in op.outputs]
    total = sum(read) + sum(written)
    if op.type in _IN_PLACE:
      total -= max((n for n in written if n in read), default=0)
    most = max(most, total)
  return most


def _Facts(p, in_shapes):
  """(trainable, other, activation elements or None, forward ops, backward ops, gradient elements,
  kept elements, kept FLOPs) of one layer, from a graph never run."""
  with tf.Graph().as_default() as graph:
    layer = p.Copy().Instantiate()
    trainable, other = _CountVariables(layer)
    if in_shapes is None:
      return trainable, other, None, 0, 0, 0, 0, 0
    inputs = [MapShapes(lambda s: tf.zeros(Dims(s)), a) for a in in_shapes]
    first = len(graph.get_operations())
    try:
      out = layer.FProp(layer.theta, *inputs)
    except (TypeError, ValueError):  # E.g. integer ids: fall back to the outputs' size.
      return trainable, other, None, 0, 0, 0, 0, 0
    ys = [y for y in tf.nest.flatten(out) if y is not None and y.dtype.is_floating]
    first_backward = len(graph.get_operations())
    forward = graph.get_operations()[first:first_backward]
    forward_ops = len(_ComputeOps(forward))
    kept = [op for op in forward if selective_recompute.IsKept(op)]
    kept_elements = sum(_Elems(op.outputs[0]) for op in kept)
    kept_flops = sum(selective_recompute.OpFlops(op) for op in kept)
    if not ys:
      return trainable, other, None, forward_ops, 0, 0, kept_elements, kept_flops
    xs = [x for x in tf.nest.flatten(inputs) if x is not None] + layer.theta.Flatten()
    losses = [tf.reduce_sum(y) for y in ys]
    first_gradient = len(graph.get_operations())
    grads = [g for g in tf.gradients(losses, xs) if g is not None]
    backward = _ComputeOps(_Needed(graph, grads, first_gradient))
    return (trainable, other, _KeptElements(graph, first, first_backward, grads), forward_ops,
            len(backward), _GradientElements(backward), kept_elements, kept_flops)


def _ComputeOps(ops):
  """The ops of `ops` that compute (not reads, aliases or constants)."""
  return [op for op in ops if op.type not in _NOT_ACTIVATIONS]


def _ShapesKey(in_shapes):
  """The FProp arguments' shapes as text, each NestedMap's fields in sorted order."""
  def Text(value):
    if value is None or _IsShape(value):
      return repr(None if value is None else Dims(value))
    if isinstance(value, dict):
      return '{%s}' % ', '.join('%r: %s' % (k, Text(value[k])) for k in sorted(value))
    return '(%s)' % ', '.join(Text(v) for v in value)
  return None if in_shapes is None else '[%s]' % ', '.join(Text(a) for a in in_shapes)


def _Classes(value, out):
  """Adds to `out` every class that `value` (Params, or lists, tuples and dicts of them) names."""
  if isinstance(value, hyperparams.Params):
    for _, child in value.IterParams():
      _Classes(child, out)
  elif isinstance(value, (list, tuple)):
    for child in value:
      _Classes(child, out)
  elif isinstance(value, dict):
    for child in value.values():
      _Classes(child, out)
  elif isinstance(value, type):
    out.update(value.__mro__)


def _SourceFiles(p):
  classes: Set[type] = set()
  _Classes(p, classes)
  files = {__file__}
  for cls in classes:
    try:
      source = inspect.getsourcefile(cls)
    except TypeError:  # A built-in class.
      continue
    if source is not None:  # None: no source file on disk (e.g. only compiled code).
      files.add(source)
  return files


def LayerKey(p: Any) -> str:
  """What a layer's facts and times depend on, besides its input shapes and the machine: its
  Params but for the fields that change no shape or variable (see SHAPE_NEUTRAL_PARAMS), the
  versions of TensorFlow and Lingvo, and a digest of the source files of every class its Params
  name (and of this module): a key of a disk_cache entry. Layers of equal keys cost the same."""
  return 'tensorflow %s; lingvo %s; code %s; layer %s' % (
      tf.version.VERSION, _LINGVO_VERSION, disk_cache.FilesDigest(_SourceFiles(p)), _ShapeKey(p))


def _FactsFromCache(value):
  """Facts read from a disk_cache entry, or None if they are not facts (see _Facts)."""
  def Count(v):
    return isinstance(v, int) and not isinstance(v, bool)
  if isinstance(value, list) and len(value) == 8 and all(
      Count(v) or (i == 2 and v is None) for i, v in enumerate(value)):
    return tuple(value)
  return None


def DistinctKey(p: Any, in_shapes: Sequence[Any]) -> str:
  """LayerKey with the layer's FProp input shapes: layers of one key cost the same."""
  return '%s; inputs %s' % (LayerKey(p), _ShapesKey(in_shapes))


def _CachedFacts(p, in_shapes=None, cache=None):
  key = (_ShapeKey(p), _ShapesKey(in_shapes))
  if key not in _FACTS:
    disk_key = DistinctKey(p, in_shapes)
    facts = None if cache is None else _FactsFromCache(cache.Get(_FACTS_KIND, disk_key))
    if facts is None:
      facts = OutsideLayerStack(_Facts, p, in_shapes)
      if cache is not None:
        cache.Put(_FACTS_KIND, disk_key, list(facts))
    _FACTS[key] = facts
  return _FACTS[key]


def ParamCounts(layer_params: Sequence[Any]) -> List[Tuple[int, int]]:
  """(trainable, other) variable elements of each layer, from graphs that are built but never run.

  Variables are created as graph ops only, so even billion-parameter layers cost no memory here.
  Layers whose Params differ only in name, position or regularisation (e.g. the partitions of one
  stack) are built once per process.
  """
  return [_CachedFacts(p)[:2] for p in layer_params]


def ParamCount(layer_params: Sequence[Any]) -> int:
  """Total trainable parameters of a sequence of layer Params (see ParamCounts)."""
  return sum(trainable for trainable, _ in ParamCounts(layer_params))


def Profiles(layer_params: Sequence[Any], input_shapes: Sequence[Any],
             skips: Sequence[Tuple[int, int]] = (), cache: Optional[Any] = None,
             progress: progress_lib.Progress = progress_lib.QUIET) -> List[LayerProfile]:
  """A LayerProfile per layer: FPropMeta flops and shapes, variable counts, activation sizes.

  Activation sizes come from building each layer's forward and backward pass on inputs of its
  shapes in a graph that never runs, and adding up the forward tensors read by the backward ops
  that compute the input and weight gradients (what backprop keeps alive; tf.gradients also builds
  gradients of constants and masks, which a step never runs), so the insides of composite layers
  count, not only their outputs. Gradient sizes: the most one backward op reads and writes.

  Each distinct layer (equal LayerKey and input shapes) is built once per process, and with a
  `cache` (a disk_cache.DiskCache) once per machine: later runs read its facts from the cache.
  `progress` hears of the layers built.
  """
  metas, out_shapes = ChainMeta(layer_params, input_shapes, skips)
  in_shapes = [shapes for _, shapes in metas]
  out_elements = [_Elements(s) for s in in_shapes[1:]] + [_Elements(out_shapes)]
  distinct: Dict[Tuple[str, Optional[str]], Tuple[hyperparams.Params, Tuple[Any, ...]]] = {}
  for p, shapes in zip(layer_params, in_shapes):
    distinct.setdefault((_ShapeKey(p), _ShapesKey(shapes)), (p, shapes))
  todo = [v for k, v in distinct.items() if k not in _FACTS]
  hits = 0 if cache is None else cache.hits
  with progress.Phase('cost model: building the distinct layers of %d' % len(layer_params),
                      len(todo)) as phase:
    for p, shapes in todo:
      _CachedFacts(p, shapes, cache)
      phase.Step()
    if cache is not None:
      phase.End('%d read from the cache' % (cache.hits - hits))
  profiles = []
  for p, (flops, shapes), out in zip(layer_params, metas, out_elements):
    (params, state, activations, forward_ops, backward_ops, gradients, kept_elements,
     kept_flops) = _CachedFacts(p, shapes)
    profiles.append(LayerProfile(p.name, flops, params, state, _Elements(shapes), out,
                                 out if activations is None else activations, forward_ops,
                                 backward_ops, gradients, kept_elements, kept_flops))
  return profiles


def SelectiveShare(profile: LayerProfile) -> float:
  """The share of a layer's forward time a selective re-computation takes (recompute='selective'
  re-runs all but its matmuls and convolutions): its FLOPs outside those ops over its forward FLOPs
  (1 where its FLOPs are unknown)."""
  if profile.flops <= 0:
    return 1.0
  return min(1.0, max(0.0, 1.0 - profile.kept_flops / profile.flops))


def MemoryCost(profiles: Sequence[LayerProfile], num_micro_batches: int, recompute: str = 'always',
               bytes_per_param: float = DEFAULT_BYTES_PER_PARAM,
               bytes_per_activation: float = 4, stashed: Optional[float] = None,
               waiting: float = 0.0, running: Optional[float] = None) -> balancing.LayerCosts:
  """Per-layer device bytes as balancing.LayerCosts, whose Of(i, j) is a partition's (an estimate
  for budgets and balance).

  Per layer: parameters x bytes_per_param (weights and optimizer slots), other variables, and the
  activations its backward pass holds (the forward tensors it reads, see Profiles): with
  re-computation those of the micro-batches a partition runs at once (two at most: two forward
  passes with forward_overlap; one more kept with 'except_last'), without it those of every
  micro-batch waiting for its backward pass; with 'selective', also the outputs of its matmuls and
  convolutions (kept_elements) of every micro-batch waiting for its backward pass; for a layer with
  weights, its input and output gradient for each micro-batch waiting for a weight-gradient task.
  At a partition's first layer: the inputs of the micro-batches waiting for their backward pass,
  stashed until then.

  Args:
    profiles: the layers' LayerProfiles for the whole mini-batch.
    num_micro_batches: M.
    recompute: the TensorPipeLayer's recompute mode.
    bytes_per_param: bytes per trainable parameter with its optimizer slots.
    bytes_per_activation: bytes per activation element (4 for float32).
    stashed: micro-batches waiting for their backward pass on the device at once: M (the default)
      for fill-drain, which runs every forward pass first; fewer for 1F1B (see
      `schedule.Schedule.InFlight`).
    waiting: micro-batches waiting for a later weight-gradient task (zero-bubble): for each layer
      with weights, about its input and its output gradient are kept until then (what the
      weight gradients of the ops that read its weights need; see layer_gradients.Keep).
    running: with re-computation, micro-batches whose activations are held at once (default
      min(2, M): two forward passes with forward_overlap). A forward pass frees each activation
      once the next layer has read it, and a device runs one backward pass at a time, so 1 is
      closer where the whole partition's activations matter (the planner's estimate).
  """
  m = num_micro_batches
  stashed = m if stashed is None else min(stashed, m)
  if recompute == 'never':
    held = stashed / m
  else:
    at_once = min(2, m) if running is None else min(running, m)
    held = at_once / m + (1.0 / m if recompute == 'except_last' and m > 1 else 0.0)
  kept = waiting / m
  selective = stashed / m if recompute == 'selective' else 0.0
  per_layer = [
      p.params * bytes_per_param +
      (p.state + held * max(p.activation_elements, p.out_elements) + selective * p.kept_elements +
       (kept * (p.in_elements + p.out_elements) if p.params else 0.0)) * bytes_per_activation
      for p in profiles
  ]
  at_start = [p.in_elements * bytes_per_activation * stashed / m for p in profiles]
  return balancing.LayerCosts(per_layer, at_start, what='memory')


def StepSeconds(sess: Any, step: Any, repeats: int = 5) -> float:
  """Median wall-clock seconds of `repeats` runs of `step` in `sess`, after one warm-up run."""
  sess.run(step)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    sess.run(step)
    times.append(time.perf_counter() - start)
  return float(np.median(times))
