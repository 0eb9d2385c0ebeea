"""The consistency check's cases: a Lingvo task (`TaskCase`, and `Check`, which compares it) or the
GPipe paper's own example (`PaperExample`) as a `consistency.Case`.

A task's case builds the task once as the unpipelined reference and once per (K, M) of a grid
(`WithPipelines` re-partitions every TensorPipeLayer nested in it), each fed the same batch of the
task's training input (`InputBatch`); where batch norm makes results depend on M
(`MicroBatchDependence`), its micro-batch reference runs the unpipelined layers on each micro-batch
of examples (`ExampleAxes`, `SplitExamples`). Why each comparison holds is in `consistency`, which
runs and compares any case.
"""

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import cluster_factory
from lingvo.core import hyperparams
from lingvo.core import layers as lingvo_layers
from lingvo.core import py_utils

from tensorpipe import layer as layer_lib
from tensorpipe import micro_batching
from tensorpipe import randomness
from tensorpipe.measure.consistency import Built, Case, Compare, ConsistencyReport
from tensorpipe.measure.consistency import DEFAULT_MICRO_BATCHES, DEFAULT_DEVICES
from tensorpipe.measure.consistency import DEFAULT_SEED, DEFAULT_TOLERANCE, MicroBatchReferenceName
from tensorpipe.measure.consistency import REFERENCE, Variant, VariantName


def _Layers(layer: base_layer.BaseLayer) -> Iterator[base_layer.BaseLayer]:
  """`layer` and every layer below it (each once, even when shared)."""
  seen, stack = set(), [layer]
  while stack:
    current = stack.pop()
    if id(current) in seen:
      continue
    seen.add(id(current))
    yield current
    stack.extend(reversed([c for c in current.children.Flatten()
                           if isinstance(c, base_layer.BaseLayer)]))


def MicroBatchDependence(layer: base_layer.BaseLayer) -> List[str]:
  """Why the results of `layer` (e.g. a task) depend on M, from every TensorPipeLayer below it.

  Call after its FProp has been built in the current graph: the reasons come from the partitions
  traced there.
  """
  reasons: List[str] = []
  for sub in _Layers(layer):
    if isinstance(sub, layer_lib.TensorPipeLayer):
      reasons.extend(r for r in sub.MicroBatchDependence() if r not in reasons)
  return reasons


def NumLayers(pipeline: hyperparams.Params) -> int:
  """The number of layers of a TensorPipeLayer's Params (the largest K it can be cut into)."""
  if pipeline.partitions is not None:
    return sum(len(partition) for partition in pipeline.partitions)
  return len(pipeline.layers or [])


def WithPipelines(params: hyperparams.Params, num_devices: int, num_micro_batches: int,
                  unpipelined: bool = False) -> hyperparams.Params:
  """A copy of `params` with every TensorPipeLayer's layers spread over `num_devices` devices
  (explicit `partitions` are flattened into `layers` and cut anew) and run with
  `num_micro_batches` micro-batches, or `unpipelined`. Memory budgets and explicit `devices`
  are dropped, since they were chosen for the model's own K; the schedule and everything else is
  kept."""
  params = params.Copy()
  for _, p in layer_lib.Pipelines(params):
    if p.partitions is not None:
      p.layers = [layer for partition in p.partitions for layer in partition]
      p.partitions = None
    p.num_devices, p.num_partitions = num_devices, None  # K; the Param's old name cleared.
    p.num_micro_batches = num_micro_batches
    p.micro_batch_size = None
    p.memory_budget = None
    p.devices = None
    p.unpipelined = unpipelined
  return params


def InputBatch(input_params: hyperparams.Params) -> py_utils.NestedMap:
  """One batch (numpy arrays) of the input generator `input_params`, built in its own graph."""
  with tf.Graph().as_default() as graph, cluster_factory.ForTestingWorker(cpus=1, split_size=1):
    generator = input_params.Instantiate()
    batch = generator.GetPreprocessedInputBatch()
    if isinstance(batch, list):
      batch = batch[0]  # One split per client here; take the first if the generator splits.
    batch = py_utils.NestedMap(batch)
    with tf.Session(graph=graph) as sess:
      sess.run([tf.global_variables_initializer(), tf.local_variables_initializer(),
                tf.tables_initializer()])
      generator.Initialize(sess)
      values = sess.run(batch.Flatten())
  return batch.Pack(values)


def _TaskPath(path: str) -> str:
  return 'task.' + path if path else 'task'


def _DescribeBatch(batch: py_utils.NestedMap) -> str:
  return ', '.join('%s %s %s' % (name, list(np.shape(value)), np.asarray(value).dtype.name)
                   for name, value in batch.FlattenItems())


def ExampleAxes(batch: py_utils.NestedMap, batch_size: Optional[int]) -> Dict[str, Optional[int]]:
  """{input name: the axis holding its examples, or None (the same for every example)}.

  Lingvo's input generators put the examples on axis 0 (Lingvo splits a batch along it for data
  parallelism), so axis 0 wins whenever its size is the input generator's `batch_size`; a tensor
  whose axis 0 has another size (e.g. a time-major [T, B, ...] input) gets its first axis of
  `batch_size`. Without a `batch_size` that any tensor has, every tensor of rank >= 1 uses axis 0.
  """
  shapes = {name: np.shape(value) for name, value in batch.FlattenItems()}
  if not isinstance(batch_size, int) or not any(batch_size in shape for shape in shapes.values()):
    return {name: 0 if shape else None for name, shape in shapes.items()}
  return {name: list(shape).index(batch_size) if batch_size in shape else None
          for name, shape in shapes.items()}


def SplitExamples(batch: py_utils.NestedMap, axes: Dict[str, Optional[int]],
                  num_micro_batches: int) -> List[Tuple[int, py_utils.NestedMap]]:
  """(example offset, micro-batch) of each of the M micro-batches of `batch`: each input split along
  its example axis in `axes` as the pipeline splits (the first N mod M get one example more)."""
  sizes = {np.shape(batch.GetItem(name))[axis] for name, axis in axes.items() if axis is not None}
  if len(sizes) != 1:
    raise ValueError('the inputs disagree on their number of examples: %s' % ', '.join(
        '%s %d' % (name, np.shape(batch.GetItem(name))[axis])
        for name, axis in axes.items() if axis is not None))
  count = sizes.pop()
  micro_sizes = micro_batching.Sizes(count, num_micro_batches)
  offsets = micro_batching.Offsets(micro_sizes)
  parts = []
  for offset, size in zip(offsets, micro_sizes):
    part = batch.DeepCopy()
    for name, axis in axes.items():
      if axis is not None:
        part.Set(name, np.take(batch.GetItem(name), range(offset, offset + size), axis=axis))
    parts.append((offset, part))
  return parts


def TaskCase(task_params: hyperparams.Params, devices: Sequence[int] = DEFAULT_DEVICES,
             micro_batches: Sequence[int] = DEFAULT_MICRO_BATCHES,
             input_params: Optional[hyperparams.Params] = None,
             title: Optional[str] = None) -> Case:
  """The Case of a Lingvo task: its unpipelined reference and one variant per (K, M).

  Args:
    task_params: the task's Params (e.g. a registered model's `cfg.task`), holding TensorPipeLayer
      Params anywhere inside.
    devices, micro_batches: the K (devices of each pipeline) and M of the grid. A K larger than
      some pipeline's number of layers is skipped with a note.
    input_params: the training input generator's Params; default `task_params.input`. One batch of
      it is taken and fed, as constants, to every variant.
    title: the report's first line.

  Raises:
    ValueError: (one line) if the task has no TensorPipeLayer, no input Params, or the grid is not
      positive integers.
  """
  devices, micro_batches = _Grid('devices', devices), _Grid('micro_batches', micro_batches)
  task_params = task_params.Copy()
  name = title or 'task %r' % task_params.name
  pipelines = layer_lib.Pipelines(task_params)
  if not pipelines:
    raise ValueError('%s has no TensorPipeLayer: there is nothing to compare; pipeline its layers '
                     'with tensorpipe.TensorPipeLayer first' % name)
  if input_params is None:
    input_params = task_params.Get('input') if 'input' in task_params else None
  if input_params is None:
    raise ValueError('%s has no input Params: pass input_params (e.g. a registered model\'s '
                     'cfg.input)' % name)
  if 'input' in task_params:
    task_params.input = None  # The batch is fed as constants: no generator in the variants' graphs.
  batch = InputBatch(input_params)
  notes = ['batch: %s (one batch of the training input, fed to every variant)' %
           _DescribeBatch(batch)]
  for path, p in pipelines:
    notes.append('TensorPipeLayer %s: %d layers, schedule %r, recompute %r' %
                 (_TaskPath(path), NumLayers(p), p.schedule, p.recompute))
  fewest = min(NumLayers(p) for _, p in pipelines)
  for k in devices:
    if k > fewest:
      path = [path for path, p in pipelines if NumLayers(p) == fewest][0]
      notes.append('K=%d skipped: TensorPipeLayer %s has only %d layers' %
                   (k, _TaskPath(path), fewest))
  devices = [k for k in devices if k <= fewest]

  axes = ExampleAxes(batch, input_params.Get('batch_size') if 'batch_size' in input_params
                     else None)
  notes.append('examples: %s (the axes a batch-norm model\'s micro-batch reference splits)' %
               ', '.join('%s axis %d' % (n, a) for n, a in axes.items() if a is not None))

  def Builder(params):

    def Build():
      task = params.Instantiate()
      feed = batch.Transform(tf.constant)
      metrics, _ = task.FPropDefaultTheta(feed)
      return Built(metrics['loss'][0], tf.trainable_variables(), MicroBatchDependence(task))

    return Build

  def MicroBatchReference(num_micro_batches):
    """The unpipelined task on each micro-batch of examples in turn, at its example offset (so
    dropout masks are those of the pipeline), the losses combined by their Lingvo weights."""
    params = WithPipelines(task_params, 1, 1, True)

    def Build():
      task = params.Instantiate()
      towers: List[Any] = []
      # The scopes of Lingvo's BaseTask.FProp, whose tower loop is what this does per micro-batch.
      with tf.name_scope('fprop'), tf.name_scope(task.params.name), py_utils.TaskCallScope(
          task), py_utils.GlobalStepContext(py_utils.GetGlobalStep()):
        py_utils.ResetStepSeed()
        for offset, part in SplitExamples(batch, axes, num_micro_batches):
          with randomness.ExampleOffset(offset), tf.name_scope('micro_batch_%d' % len(towers)):
            towers.append(task.FPropTower(task.theta, part.Transform(tf.constant))[0])
      metrics = py_utils.WeightedAvgOfMetrics(towers)
      return Built(metrics['loss'][0], tf.trainable_variables())

    return Variant(MicroBatchReferenceName(num_micro_batches), None, num_micro_batches, Build)

  hint = ('so the micro-batches likely split an axis other than the examples\': %s; batch_dim '
          'must name the axis of the pipeline\'s inputs that holds the examples (set batch_dim=1 '
          'for time-major inputs [T, B, ...])' % ', '.join(
              'TensorPipeLayer %s has batch_dim=%d' % (_TaskPath(path), p.batch_dim)
              for path, p in pipelines))
  reference = Variant(REFERENCE, None, None, Builder(WithPipelines(task_params, 1, 1, True)))
  variants = [Variant(VariantName(k, m), k, m, Builder(WithPipelines(task_params, k, m)))
              for m in micro_batches for k in devices]
  return Case(name, reference, variants, notes, MicroBatchReference, hint)


def PaperExample(devices: Sequence[int] = (1, 2, 4),
                 micro_batches: Sequence[int] = (8,)) -> Case:
  """The GPipe paper's consistency test (supplementary Figure 1) as a Case.

  16 convolutions (Lingvo's Conv2DLayerNoPadding, 3x3 filters with one input and one output
  channel, stride 1, Gaussian initialisers seeded per layer) on a uniform random [16, 8, 8, 1]
  input (fixed numpy seed); the loss is the mean of the outputs. The paper runs K = 1, 2, 4 with 8
  micro-batches and finds the same gradient norm.
  """
  devices, micro_batches = _Grid('devices', devices), _Grid('micro_batches', micro_batches)
  notes = ['16 Conv2DLayerNoPadding layers, filter (3, 3, 1, 1), stride 1; input uniform '
           '[16, 8, 8, 1]; loss = mean of the outputs']
  for k in devices:
    if k > 16:
      notes.append('K=%d skipped: the example has only 16 layers' % k)
  devices = [k for k in devices if k <= 16]
  x = np.random.RandomState(12345).uniform(size=[16, 8, 8, 1]).astype(np.float32)

  def Builder(num_devices, num_micro_batches, unpipelined=False):

    def Build():
      layers = [lingvo_layers.Conv2DLayerNoPadding.Params().Set(
          name='conv%d' % i, filter_shape=(3, 3, 1, 1), filter_stride=(1, 1),
          params_init=py_utils.WeightInit.Gaussian(0.5, seed=i)) for i in range(16)]
      net = layer_lib.TensorPipeLayer.Params().Set(
          name='pipe', layers=layers, num_devices=num_devices,
          num_micro_batches=num_micro_batches, unpipelined=unpipelined).Instantiate()
      loss = tf.reduce_mean(net.FPropDefaultTheta(tf.constant(x)))
      return Built(loss, tf.trainable_variables(), MicroBatchDependence(net))

    return Build

  reference = Variant(REFERENCE, None, None, Builder(1, 1, unpipelined=True))
  variants = [Variant(VariantName(k, m), k, m, Builder(k, m))
              for m in micro_batches for k in devices]
  return Case('the GPipe paper\'s consistency test (supplementary Figure 1)', reference, variants,
              notes)


def _Grid(name: str, values: Sequence[int]) -> List[int]:
  """`values` without repeats, checked to be positive integers."""
  values = list(values)
  if not values or any(not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1
                       for v in values):
    raise ValueError('%s must be a non-empty list of positive integers, got %r' % (name, values))
  return list(dict.fromkeys(int(v) for v in values))


def Check(task_params: hyperparams.Params, devices: Sequence[int] = DEFAULT_DEVICES,
          micro_batches: Sequence[int] = DEFAULT_MICRO_BATCHES,
          tolerance: float = DEFAULT_TOLERANCE, input_params: Optional[hyperparams.Params] = None,
          title: Optional[str] = None, seed: int = DEFAULT_SEED) -> ConsistencyReport:
  """The consistency check of a task (see the module docstring and `TaskCase`): a
  ConsistencyReport whose `Format()` is the text and `ok` the verdict."""
  return Compare(TaskCase(task_params, devices, micro_batches, input_params, title), tolerance,
                 seed)
