"""The GPipe paper's gradient-norm consistency test, for any model with TensorPipeLayers.

A pipeline must not change what a step computes: for every K (partitions) and M (micro-batches) the
gradients must equal those of the same layers run one after another, up to float rounding (the
sums over micro-batches add in another order). `Check` verifies this for a Lingvo task: it takes one
batch from the task's training input, builds the task once as the unpipelined reference
(`unpipelined=True`) and once per (K, M) of a grid, each in a fresh graph with the same graph seed
(Lingvo seeds initialisers from variable names and the graph seed, so every build starts from the
same weights), feeds the same batch, and compares the gradients of the task's loss with respect to
every trainable variable. `PaperExample` is the paper's own test (supplementary Figure 1).

Differences are divided by the largest gradient norm of what a variant is compared with, not by the
variable's own norm: a gradient that is zero by symmetry (e.g. Lingvo's attention key-projection
bias) carries float noise of ~1e-8, which is ~1 relative to its own norm but no sign of a bug.

Where results legitimately depend on M (`TensorPipeLayer.MicroBatchDependence`: batch norm's
micro-batch statistics, dropout masks without an example axis), a variant with M > 1 is compared
with the smallest K of the grid at the same M instead of the reference: results never depend on K.

The comparison core, `Compare`, runs any `Case`: variants whose `build` callable builds a model in
the current graph and returns its loss and variables, so the task path and the paper example share
it. Nothing here imports the trainer or the registered models; `tools/consistency.py` resolves a
model name and calls `Check`.
"""

import dataclasses
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import cluster_factory
from lingvo.core import hyperparams
from lingvo.core import layers as lingvo_layers
from lingvo.core import py_utils

from tensorpipe import layer as layer_lib
from tensorpipe import placement

# Relative to the largest gradient norm of what a variant is compared with. Float32 rounding of the
# re-ordered sums differs by at most 9e-7 on the registered tiny models (digits 1.9e-7, mt 7.6e-8,
# resnet 5.9e-7, amoebanet 8.9e-7, K in {1, 2, 4}, M in {1, 4}), so 1e-4 leaves a margin of ~100x;
# a real inconsistency (a layer that mixes examples across micro-batches, a wrong batch_dim) is
# 1e-2 or more.
DEFAULT_TOLERANCE = 1e-4
PAPER_TOLERANCE = 1e-6  # The paper's figure: global gradient norms equal to 1e-6.
DEFAULT_PARTITIONS = (1, 2, 4)
DEFAULT_MICRO_BATCHES = (1, 4)
DEFAULT_SEED = 1234
REFERENCE = 'unpipelined'
MAX_REASONS = 5  # Reasons listed per M; a model with many batch-norm layers has one per layer.


class Built(NamedTuple):
  """What a variant's build returns: its loss, the variables to differentiate, and why its results
  depend on M (from `MicroBatchDependence`; empty if they do not)."""
  loss: tf.Tensor
  variables: Sequence[tf.Variable]
  reasons: Sequence[str] = ()


BuildFn = Callable[[], Union[Built, Tuple[tf.Tensor, Sequence[tf.Variable]]]]


class Variant(NamedTuple):
  """One configuration to build: `build` is called in a fresh graph, inside a cluster of the
  case's logical CPU devices, and returns a `Built` (or a (loss, variables) pair).

  num_partitions and num_micro_batches are K and M, or None for the unpipelined reference.
  """
  name: str
  num_partitions: Optional[int]
  num_micro_batches: Optional[int]
  build: BuildFn


@dataclasses.dataclass
class Case:
  """A model to check: its reference, its pipelined variants, and notes for the report's header
  (what was built, what was skipped)."""
  title: str
  reference: Variant
  variants: List[Variant]
  notes: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class VariantResult:
  """One variant's run: its loss, {variable name: gradient}, M-dependence reasons, or the error
  that stopped it."""
  variant: Variant
  loss: Optional[float] = None
  grads: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # In creation order.
  reasons: List[str] = dataclasses.field(default_factory=list)
  error: Optional[str] = None

  @property
  def name(self) -> str:
    return self.variant.name

  @property
  def global_norm(self) -> float:
    """The paper's quantity: the gradient norm over all trainable variables."""
    return float(np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in self.grads.values())))

  @property
  def max_norm(self) -> float:
    """The largest gradient norm of any one variable: what differences are divided by."""
    return max((float(np.linalg.norm(g)) for g in self.grads.values()), default=0.0)


def VariantName(num_partitions: int, num_micro_batches: int) -> str:
  return 'K=%d M=%d' % (num_partitions, num_micro_batches)


def _VariableName(variable: tf.Variable) -> str:
  name = variable.op.name
  return name[:-len('/var')] if name.endswith('/var') else name


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
  reasons = []
  for sub in _Layers(layer):
    if isinstance(sub, layer_lib.TensorPipeLayer):
      reasons.extend(r for r in sub.MicroBatchDependence() if r not in reasons)
  return reasons


def NumLayers(pipeline: hyperparams.Params) -> int:
  """The number of layers of a TensorPipeLayer's Params (the largest K it can be cut into)."""
  if pipeline.partitions is not None:
    return sum(len(partition) for partition in pipeline.partitions)
  return len(pipeline.layers or [])


def WithPipelines(params: hyperparams.Params, num_partitions: int, num_micro_batches: int,
                  unpipelined: bool = False) -> hyperparams.Params:
  """A copy of `params` with every TensorPipeLayer cut into `num_partitions` partitions of its
  layers (explicit `partitions` are flattened into `layers`) and run with `num_micro_batches`
  micro-batches, or `unpipelined`. Memory budgets and explicit `devices` are dropped, since they
  were chosen for the model's own K; the schedule and everything else is kept."""
  params = params.Copy()
  for _, p in layer_lib.Pipelines(params):
    if p.partitions is not None:
      p.layers = [layer for partition in p.partitions for layer in partition]
      p.partitions = None
    p.num_partitions = num_partitions
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


def TaskCase(task_params: hyperparams.Params, partitions: Sequence[int] = DEFAULT_PARTITIONS,
             micro_batches: Sequence[int] = DEFAULT_MICRO_BATCHES,
             input_params: Optional[hyperparams.Params] = None,
             title: Optional[str] = None) -> Case:
  """The Case of a Lingvo task: its unpipelined reference and one variant per (K, M).

  Args:
    task_params: the task's Params (e.g. a registered model's `cfg.task`), holding TensorPipeLayer
      Params anywhere inside.
    partitions, micro_batches: the K and M of the grid. A K larger than some pipeline's number of
      layers is skipped with a note.
    input_params: the training input generator's Params; default `task_params.input`. One batch of
      it is taken and fed, as constants, to every variant.
    title: the report's first line.

  Raises:
    ValueError: (one line) if the task has no TensorPipeLayer, no input Params, or the grid is not
      positive integers.
  """
  partitions, micro_batches = _Grid('partitions', partitions), _Grid('micro_batches', micro_batches)
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
  for k in partitions:
    if k > fewest:
      path = [path for path, p in pipelines if NumLayers(p) == fewest][0]
      notes.append('K=%d skipped: TensorPipeLayer %s has only %d layers' %
                   (k, _TaskPath(path), fewest))
  partitions = [k for k in partitions if k <= fewest]

  def Builder(params):

    def Build():
      task = params.Instantiate()
      feed = batch.Transform(tf.constant)
      metrics, _ = task.FPropDefaultTheta(feed)
      return Built(metrics['loss'][0], tf.trainable_variables(), MicroBatchDependence(task))

    return Build

  reference = Variant(REFERENCE, None, None, Builder(WithPipelines(task_params, 1, 1, True)))
  variants = [Variant(VariantName(k, m), k, m, Builder(WithPipelines(task_params, k, m)))
              for m in micro_batches for k in partitions]
  return Case(name, reference, variants, notes)


def PaperExample(partitions: Sequence[int] = (1, 2, 4),
                 micro_batches: Sequence[int] = (8,)) -> Case:
  """The GPipe paper's consistency test (supplementary Figure 1) as a Case.

  16 convolutions (Lingvo's Conv2DLayerNoPadding, 3x3 filters with one input and one output
  channel, stride 1, Gaussian initialisers seeded per layer) on a uniform random [16, 8, 8, 1]
  input (fixed numpy seed); the loss is the mean of the outputs. The paper runs K = 1, 2, 4 with 8
  micro-batches and finds the same gradient norm.
  """
  partitions, micro_batches = _Grid('partitions', partitions), _Grid('micro_batches', micro_batches)
  notes = ['16 Conv2DLayerNoPadding layers, filter (3, 3, 1, 1), stride 1; input uniform '
           '[16, 8, 8, 1]; loss = mean of the outputs']
  for k in partitions:
    if k > 16:
      notes.append('K=%d skipped: the example has only 16 layers' % k)
  partitions = [k for k in partitions if k <= 16]
  x = np.random.RandomState(12345).uniform(size=[16, 8, 8, 1]).astype(np.float32)

  def Builder(num_partitions, num_micro_batches, unpipelined=False):

    def Build():
      layers = [lingvo_layers.Conv2DLayerNoPadding.Params().Set(
          name='conv%d' % i, filter_shape=(3, 3, 1, 1), filter_stride=(1, 1),
          params_init=py_utils.WeightInit.Gaussian(0.5, seed=i)) for i in range(16)]
      net = layer_lib.TensorPipeLayer.Params().Set(
          name='pipe', layers=layers, num_partitions=num_partitions,
          num_micro_batches=num_micro_batches, unpipelined=unpipelined).Instantiate()
      loss = tf.reduce_mean(net.FPropDefaultTheta(tf.constant(x)))
      return Built(loss, tf.trainable_variables(), MicroBatchDependence(net))

    return Build

  reference = Variant(REFERENCE, None, None, Builder(1, 1, unpipelined=True))
  variants = [Variant(VariantName(k, m), k, m, Builder(k, m))
              for m in micro_batches for k in partitions]
  return Case('the GPipe paper\'s consistency test (supplementary Figure 1)', reference, variants,
              notes)


def _Grid(name: str, values: Sequence[int]) -> List[int]:
  """`values` without repeats, checked to be positive integers."""
  values = list(values)
  if not values or any(not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1
                       for v in values):
    raise ValueError('%s must be a non-empty list of positive integers, got %r' % (name, values))
  return list(dict.fromkeys(int(v) for v in values))


def _Run(variant: Variant, num_devices: int, seed: int) -> VariantResult:
  """Builds `variant` in a fresh graph on `num_devices` logical CPU devices and runs its loss and
  gradients once."""
  graph = tf.Graph()
  with graph.as_default(), cluster_factory.ForTestingWorker(cpus=num_devices,
                                                           split_size=num_devices):
    tf.random.set_seed(seed)  # With the same names, every build gets the same initial weights.
    py_utils.GetOrCreateGlobalStepVar()  # Dropout masks hash the global step.
    built = variant.build()
    if not isinstance(built, Built):
      built = Built(*built)
    variables = list(built.variables)
    grads = tf.gradients(built.loss, variables, colocate_gradients_with_ops=True)
    fetches = {}
    for variable, grad in zip(variables, grads):
      if grad is None:  # Not on the loss's path: its gradient is zero.
        grad = tf.zeros_like(variable)
      fetches[_VariableName(variable)] = tf.convert_to_tensor(grad)  # IndexedSlices to dense.
    init = [tf.global_variables_initializer(), tf.local_variables_initializer(),
            tf.tables_initializer()]
    result = VariantResult(variant, reasons=list(built.reasons))
    with tf.Session(graph=graph, config=placement.SessionConfig(num_devices)) as sess:
      sess.run(init)
      try:
        loss, values = sess.run((built.loss, list(fetches.values())))
        result.loss, result.grads = float(loss), dict(zip(fetches, values))
      except tf.errors.OpError as e:
        lines = (e.message or type(e).__name__).strip().splitlines()
        result.error = '%s: %s' % (type(e).__name__, lines[0] if lines else '')
  return result


def Compare(case: Case, tolerance: float = DEFAULT_TOLERANCE,
            seed: int = DEFAULT_SEED) -> 'ConsistencyReport':
  """Runs every variant of `case` and compares its gradients with what it must equal.

  A variant is compared with the unpipelined reference, except that a variant with M > 1 whose
  results depend on M (its reasons, or another variant's at the same M) is compared with the
  variant of the smallest K at that M. Every build runs on max K logical CPU devices.
  """
  if not tolerance > 0:
    raise ValueError('tolerance must be positive, got %r' % (tolerance,))
  num_devices = max([v.num_partitions or 1 for v in case.variants] + [1])
  reference = _Run(case.reference, num_devices, seed)
  if reference.error:
    raise ValueError('%s: the unpipelined reference failed to run: %s' % (case.title,
                                                                          reference.error))
  results = [_Run(v, num_devices, seed) for v in case.variants]
  for result in results:
    if result.error is None and sorted(result.grads) != sorted(reference.grads):
      raise ValueError('%s: %s has variables %s but the reference has %s; every variant must '
                       'create the same variables' % (case.title, result.name,
                                                      sorted(result.grads),
                                                      sorted(reference.grads)))
  return ConsistencyReport(case, tolerance, reference, results)


class ConsistencyReport:
  """The outcome of a consistency check: per variable and variant, the difference of gradients,
  divided by the largest gradient norm of what the variant is compared with, and the global
  gradient norms. `ok` is False if any difference exceeds the tolerance or a variant failed."""

  def __init__(self, case: Case, tolerance: float, reference: VariantResult,
               results: List[VariantResult]):
    self.case, self.tolerance, self.reference, self.results = case, tolerance, reference, results
    self.fixed_m = {}  # M -> reasons its results depend on M (only M > 1).
    for result in results:
      m = result.variant.num_micro_batches
      if (m or 1) > 1 and result.reasons:
        reasons = self.fixed_m.setdefault(m, [])
        reasons.extend(r for r in result.reasons if r not in reasons)
    self.fixed_m_bases = {}  # M -> the VariantResult of the smallest K at M that ran, if any.
    for m in self.fixed_m:
      at_m = [r for r in results if r.variant.num_micro_batches == m and r.error is None]
      if at_m:
        self.fixed_m_bases[m] = min(at_m, key=lambda r: r.variant.num_partitions)
    self.baselines = {}  # Variant name -> the VariantResult it is compared with.
    for result in results:
      m = result.variant.num_micro_batches
      base = self.fixed_m_bases.get(m) if m in self.fixed_m else reference
      if base is not None:
        self.baselines[result.name] = base
    self.differences = {}  # Variant name -> {variable: difference / largest baseline norm}.
    self.norm_differences = {}  # Variant name -> relative difference of the global norm.
    for result in results:
      base = self.baselines.get(result.name)
      if result.error or base is None or base is result:
        continue
      scale = base.max_norm or 1.0
      self.differences[result.name] = {
          name: float(np.linalg.norm(result.grads[name] - base.grads[name])) / scale
          for name in base.grads}
      self.norm_differences[result.name] = (abs(result.global_norm - base.global_norm) /
                                            (base.global_norm or 1.0))
    self.mismatches = []  # (variant name, what, value) above the tolerance.
    for result in results:
      if result.error:
        self.mismatches.append((result.name, 'failed to run: %s' % result.error, None))
        continue
      for name, value in sorted(self.differences.get(result.name, {}).items()):
        if not value <= tolerance:  # NaN counts as a mismatch.
          self.mismatches.append((result.name, name, value))
      value = self.norm_differences.get(result.name)
      if value is not None and not value <= tolerance:
        self.mismatches.append((result.name, 'global gradient norm', value))

  @property
  def ok(self) -> bool:
    return not self.mismatches

  def LargestDifference(self) -> Tuple[float, Optional[str], Optional[str]]:
    """(difference, variant, variable) of the largest per-variable difference."""
    best = (0.0, None, None)
    for variant, values in self.differences.items():
      for name, value in values.items():
        if value > best[0] or np.isnan(value):
          best = (value, variant, name)
    return best

  def Format(self) -> str:
    """The report as text: header, table, M-dependence notes, and a last line PASS or FAIL."""
    lines = ['consistency check: %s' % self.case.title]
    lines += ['  ' + note for note in self.case.notes]
    lines.append('  reference: the same layers unpipelined (unpipelined=True), one after another; '
                 '%d logical CPU devices; tolerance %.1e' %
                 (max([r.variant.num_partitions for r in self.results] + [1]), self.tolerance))
    lines.append('')
    for m, reasons in sorted(self.fixed_m.items()):
      base = self.fixed_m_bases.get(m)
      lines.append('M=%d: results depend on M, so each K at M=%d is compared with %s (across K at '
                   'fixed M), not with the unpipelined reference; results never depend on K. '
                   'Why:' % (m, m, base.name if base else 'nothing (no variant at M=%d ran)' % m))
      lines += ['  - ' + r for r in reasons[:MAX_REASONS]]
      if len(reasons) > MAX_REASONS:
        lines.append('  - ... and %d more' % (len(reasons) - MAX_REASONS))
      lines.append('')
    lines.append('Per variable: |reference gradient|, then per variant |g - g_base| / largest '
                 '|g_base| (g_base: the gradient it is compared with).')
    lines.append(self._Table())
    lines.append('')
    for result in self.results:
      if result.error:
        lines.append('%s failed to run: %s' % (result.name, result.error))
    lines.append(self._Verdict())
    return '\n'.join(lines)

  def _Table(self) -> str:
    names = list(self.reference.grads)
    width = max([len(n) for n in names] + [len('global gradient norm (paper)')]) + 2
    columns = [r.name for r in self.results]
    col = max([len(c) for c in columns] + [len('1.2345678e+00')]) + 2

    def Row(label, first, cells):
      return ('%-*s%*s' % (width, label, 14, first) + ''.join('%*s' % (col, c) for c in cells))

    out = [Row('variable', '|g_ref|', columns)]
    for name in names:
      cells = []
      for result in self.results:
        value = self.differences.get(result.name, {}).get(name)
        cells.append(self._Cell(result, value))
      out.append(Row(name, '%.4e' % np.linalg.norm(self.reference.grads[name]), cells))
    out.append(Row('global gradient norm (paper)', '%.7e' % self.reference.global_norm,
                   ['-' if r.error else '%.7e' % r.global_norm for r in self.results]))
    out.append(Row('  relative difference', '',
                   [self._Cell(r, self.norm_differences.get(r.name)) for r in self.results]))
    out.append(Row('loss', '%.6g' % self.reference.loss,
                   ['-' if r.error else '%.6g' % r.loss for r in self.results]))
    out.append(Row('compared with', '', [self._Base(r) for r in self.results]))
    return '\n'.join(out)

  def _Base(self, result: VariantResult) -> str:
    base = self.baselines.get(result.name)
    if base is None:
      return 'nothing'
    return 'itself' if base is result else base.name

  def _Cell(self, result: VariantResult, value: Optional[float]) -> str:
    if result.error:
      return 'failed'
    if value is None:
      return 'base' if self.baselines.get(result.name) is result else '-'
    return '%.1e%s' % (value, '' if value <= self.tolerance else ' !')

  def _Verdict(self) -> str:
    compared = len(self.differences)
    if self.ok:
      value, variant, name = self.LargestDifference()
      where = ' (%s, %s)' % (variant, name) if variant else ''
      return ('PASS: %d variant(s) agree with what they are compared with within %.1e; largest '
              'difference %.1e%s' % (compared, self.tolerance, value, where))
    failed = sorted({variant for variant, _, _ in self.mismatches})
    variant, what, value = max(self.mismatches, key=lambda m: -1.0 if m[2] is None else m[2])
    if value is None:
      why = '%s %s' % (variant, what)
    else:
      why = 'largest: %s, %s differs by %.1e' % (variant, what, value)
    return ('FAIL: %d of %d variant(s) (%s) differ by more than %.1e; %s' %
            (len(failed), len(self.results), ', '.join(failed), self.tolerance, why))


def Check(task_params: hyperparams.Params, partitions: Sequence[int] = DEFAULT_PARTITIONS,
          micro_batches: Sequence[int] = DEFAULT_MICRO_BATCHES,
          tolerance: float = DEFAULT_TOLERANCE, input_params: Optional[hyperparams.Params] = None,
          title: Optional[str] = None, seed: int = DEFAULT_SEED) -> ConsistencyReport:
  """The consistency check of a task (see the module docstring and `TaskCase`): a
  ConsistencyReport whose `Format()` is the text and `ok` the verdict."""
  return Compare(TaskCase(task_params, partitions, micro_batches, input_params, title), tolerance,
                 seed)
