"""The GPipe paper's gradient-norm consistency test, for any model with TensorPipeLayers.

A pipeline must not change what a step computes: for every K (devices) and M (micro-batches) the
gradients must equal those of the same layers run one after another, up to float rounding (the
sums over micro-batches add in another order). `consistency_cases.Check` verifies this for a Lingvo
task: it takes one batch from the task's training input, builds the task once as the unpipelined
reference (`unpipelined=True`) and once per (K, M) of a grid, each in a fresh graph with the same
graph seed (Lingvo seeds initialisers from variable names and the graph seed, so every build starts
from the same weights), feeds the same batch, and compares the gradients of the task's loss with
respect to every trainable variable. `consistency_cases.PaperExample` is the paper's own test
(supplementary Figure 1).

Differences are divided by the largest gradient norm of what a variant is compared with, not by the
variable's own norm: a gradient that is zero by symmetry (e.g. Lingvo's attention key-projection
bias) carries float noise of ~1e-8, which is ~1 relative to its own norm but no sign of a bug.

Where results legitimately depend on M because of batch norm (each micro-batch is normalised with
its own statistics, `TensorPipeLayer.MicroBatchDependence`), the unpipelined reference cannot be
compared with M > 1. A variant with M > 1 is then compared with the micro-batch reference
(`Case.micro_batch_reference`): the same layers unpipelined, run on each of the M micro-batches of
examples one at a time (the input batch split along its example axis, which the input generator
knows, not along the pipeline's `batch_dim`), the losses combined by their Lingvo weights. That is
what GPipe's batch norm computes, so a right `batch_dim` agrees to rounding and a wrong one (time-
major [T, B, ...] inputs split along T) normalises other groups of values and differs. A model
without layers that mix time steps is symmetric in T and B apart from which axis holds the
examples, so only the input's example axis can tell a wrong `batch_dim` there; comparing across K
at fixed M cannot (a wrong split never depends on K). Where no micro-batch reference exists (the
paper example, dropout masks drawn per micro-batch), a variant with M > 1 is compared with the
smallest K of the grid at the same M instead: results never depend on K.

A variant that fails to run (e.g. a check inside the step) is reported with the first line of its
cause (`_Cause`), never as a difference.

This module is the comparison core: `Compare` runs any `Case`, variants whose `build` callable
builds a model in the current graph and returns its loss and variables, so the task path and the
paper example (`consistency_cases`) share it. Nothing here imports the trainer or the registered
models; `tools/consistency.py` resolves a model name and calls `consistency_cases.Check`.
"""

import dataclasses
import re
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils

from tensorpipe import check_failure
from tensorpipe import placement
from tensorpipe import progress as progress_lib

# Relative to the largest gradient norm of what a variant is compared with. Float32 rounding of the
# re-ordered sums differs by at most 1.1e-6 on the registered tiny models, K in {1, 2, 4}, M in
# {1, 4} (digits 1.9e-7, U-Net 1.4e-7, lm 2.1e-7, mt 7.6e-8 to 1.1e-7, resnet 5.9e-7, amoebanet
# 7.5e-7 to 1.1e-6; the batch-norm models at M = 4 against the micro-batch reference). 1e-5 leaves
# a margin of ~9x over the worst of them; a real inconsistency (a layer that mixes examples across
# micro-batches, a wrong batch_dim) is 1e-2 or more (0.59 for the time-major batch-norm stack of
# tests/helpers.py with batch_dim=0 at M = 4).
DEFAULT_TOLERANCE = 1e-5
TOLERANCE_REASON = ('float32 rounding of the re-ordered sums gives 8e-8 to 1.1e-6 on the '
                    'registered models; %.0e leaves a ~9x margin, while a wrong batch_dim or a '
                    'layer that mixes examples gives 1e-2 or more' % DEFAULT_TOLERANCE)
PAPER_TOLERANCE = 1e-6  # The paper's figure: global gradient norms equal to 1e-6.
DEFAULT_DEVICES = (1, 2, 4)
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

  num_devices and num_micro_batches are K (the devices of each pipeline) and M, or None for the
  unpipelined reference.
  """
  name: str
  num_devices: Optional[int]
  num_micro_batches: Optional[int]
  build: BuildFn


@dataclasses.dataclass
class Case:
  """A model to check: its reference, its pipelined variants, and notes for the report's header
  (what was built, what was skipped).

  micro_batch_reference: M -> the Variant that computes what M micro-batches must give where batch
    norm makes results depend on M (see the module docstring), or None if the case has none.
  batch_dim_hint: the likely cause and fix printed when only variants with M > 1 differ (e.g. the
    pipelines' batch_dim), or None.
  """
  title: str
  reference: Variant
  variants: List[Variant]
  notes: List[str] = dataclasses.field(default_factory=list)
  micro_batch_reference: Optional[Callable[[int], Variant]] = None
  batch_dim_hint: Optional[str] = None


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


def VariantName(num_devices: int, num_micro_batches: int) -> str:
  return 'K=%d M=%d' % (num_devices, num_micro_batches)


def MicroBatchReferenceName(num_micro_batches: int) -> str:
  return 'unpipelined M=%d' % num_micro_batches


_BATCH_NORM_REASON = 'batch norm '  # How MicroBatchDependence's batch-norm reasons begin.


def _Cause(error: BaseException) -> str:
  """The first meaningful line of why a variant failed to run (all of it in this one function).

  For a TensorPipe check that failed inside the step, its one line (check_failure.OneLine); for
  another failed `tf.debugging.Assert`, the assertion's message alone; for another error `Type:
  message`. TensorFlow's "Graph execution error:" header,
  its "Detected at node ... defined at" traceback (up to the "Node:" line that ends it), "root
  error(s) found" and "[[{{node ...}}]]" lines are skipped: the user reads the cause first, not on
  line 4 or 48.
  """
  # TensorFlow's lines around the cause, and the values an Assert prints after its message, each
  # in brackets (numbers, booleans, nested arrays, '...').
  not_a_cause = re.compile(r'^(Graph execution error:$|\[\[|Node:|Detected at node|File "|\d+ '
                           r'root error\(s\) found|\d+ successful operations)')
  assert_data = re.compile(r'^(\s*\[[-+0-9.eE\s\[\]naifTrueFls.]*\])*\s*$')
  line = check_failure.OneLine(error)
  if line:
    return line
  text = (error.message if isinstance(error, tf.errors.OpError) else str(error)) or ''
  lines = [line.strip() for line in text.splitlines()]
  kept, in_traceback = [], False
  for line in lines:
    if line.startswith('Detected at node'):
      in_traceback = True
    elif in_traceback:
      in_traceback = not line.startswith('Node:')
    else:
      kept.append(line)
  if in_traceback:  # No line ended the traceback: keep everything rather than lose the cause.
    kept = lines
  for line in kept:
    line = re.sub(r'^\(\d+\) [A-Z_]+: ', '', line)  # '(0) INVALID_ARGUMENT: ' of grouped errors.
    if not line or not_a_cause.match(line):
      continue
    if not line.startswith('assertion failed: ['):
      return '%s: %s' % (type(error).__name__, line)
    # `assertion failed: [message] [value] ...`: the message ends at the first '] [' followed by
    # printed values only (the message may itself hold brackets).
    message = line[len('assertion failed: ['):]
    end = message.find('] [')
    while end >= 0 and not assert_data.match(message[end + 1:]):
      end = message.find('] [', end + 1)
    if end >= 0:
      return message[:end]
    return message[:-1] if message.endswith(']') else message
  return type(error).__name__


def _VariableName(variable: tf.Variable) -> str:
  name = variable.op.name
  return name[:-len('/var')] if name.endswith('/var') else name


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
        result.error = _Cause(e)
  return result


def Compare(case: Case, tolerance: float = DEFAULT_TOLERANCE, seed: int = DEFAULT_SEED,
            progress: progress_lib.Progress = progress_lib.QUIET) -> 'ConsistencyReport':
  """Runs every variant of `case` and compares its gradients with what it must equal.

  A variant is compared with the unpipelined reference, except that a variant with M > 1 whose
  results depend on M (its reasons, or another variant's at the same M) is compared with the
  case's micro-batch reference at that M where only batch norm makes them depend on M and the
  case has one, else with the variant of the smallest K at that M. Every build runs on max K
  logical CPU devices. `progress` hears of each run (a build and one step): 'run I of N, NAME'
  for the reference and the variants, 'extra run, NAME (the micro-batch reference)' for the rest.
  """
  if not tolerance > 0:
    raise ValueError('tolerance must be positive, got %r' % (tolerance,))
  num_devices = max([v.num_devices or 1 for v in case.variants] + [1])
  total = 1 + len(case.variants)

  def Run(variant, what, why=''):
    with progress.Phase('consistency: %s, %s%s' % (what, variant.name, why)):
      return _Run(variant, num_devices, seed)

  reference = Run(case.reference, 'run 1 of %d' % total)
  if reference.error:
    raise ValueError('%s: the unpipelined reference failed to run: %s' % (case.title,
                                                                          reference.error))
  results = [Run(v, 'run %d of %d' % (i + 2, total)) for i, v in enumerate(case.variants)]
  micro_references = {}  # M -> the VariantResult of the case's micro-batch reference at M.
  if case.micro_batch_reference is not None:
    for m, reasons in _DependentMs(results).items():
      if all(r.startswith(_BATCH_NORM_REASON) for r in reasons):
        micro = micro_references[m] = Run(case.micro_batch_reference(m), 'extra run',
                                           ' (the micro-batch reference)')
        if micro.error:
          raise ValueError('%s: the micro-batch reference %s (the unpipelined layers on each '
                           'micro-batch of examples) failed to run: %s' % (case.title, micro.name,
                                                                          micro.error))
  for result in results + list(micro_references.values()):
    if result.error is None and sorted(result.grads) != sorted(reference.grads):
      raise ValueError('%s: %s has variables %s but the reference has %s; every variant must '
                       'create the same variables' % (case.title, result.name,
                                                      sorted(result.grads),
                                                      sorted(reference.grads)))
  return ConsistencyReport(case, tolerance, reference, results, micro_references)


def _DependentMs(results: Sequence[VariantResult]) -> Dict[int, List[str]]:
  """{M > 1: why results at M depend on M} from the variants' reasons."""
  dependent: Dict[int, List[str]] = {}
  for result in results:
    m = result.variant.num_micro_batches
    if m is not None and m > 1 and result.reasons:
      reasons = dependent.setdefault(m, [])
      reasons.extend(r for r in result.reasons if r not in reasons)
  return dependent


def _LossText(result: VariantResult) -> str:
  """The variant's loss for the report's table, or '-' if it failed to run."""
  if result.error:
    return '-'
  assert result.loss is not None, 'a variant that ran without error has a loss (see _Run)'
  return '%.6g' % result.loss


class ConsistencyReport:
  """The outcome of a consistency check: per variable and variant, the difference of gradients,
  divided by the largest gradient norm of what the variant is compared with, and the global
  gradient norms. `ok` is False if any difference exceeds the tolerance or a variant failed."""

  def __init__(self, case: Case, tolerance: float, reference: VariantResult,
               results: List[VariantResult],
               micro_references: Optional[Dict[int, VariantResult]] = None):
    self.case, self.tolerance, self.reference, self.results = case, tolerance, reference, results
    self.micro_references = dict(micro_references or {})  # M -> micro-batch reference's result.
    self.fixed_m = _DependentMs(results)  # M -> reasons its results depend on M (only M > 1).
    # M -> what variants at M are compared with, if anything ran.
    self.fixed_m_bases: Dict[int, VariantResult] = {}
    for m in self.fixed_m:
      at_m = [r for r in results if r.variant.num_micro_batches == m and r.error is None]
      if m in self.micro_references:
        self.fixed_m_bases[m] = self.micro_references[m]
      elif at_m:
        self.fixed_m_bases[m] = min(at_m, key=lambda r: r.variant.num_devices or 1)
    self.baselines: Dict[str, VariantResult] = {}  # Variant name -> what it is compared with.
    for result in results:
      micro = result.variant.num_micro_batches
      base = (self.fixed_m_bases.get(micro) if micro is not None and micro in self.fixed_m else
              reference)
      if base is not None:
        self.baselines[result.name] = base
    # Variant name -> {variable: difference / largest baseline norm}.
    self.differences: Dict[str, Dict[str, float]] = {}
    # Variant name -> relative difference of the global norm.
    self.norm_differences: Dict[str, float] = {}
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
    # (variant name, what, value) above the tolerance; value None: the variant failed to run.
    self.mismatches: List[Tuple[str, str, Optional[float]]] = []
    for result in results:
      if result.error:
        self.mismatches.append((result.name, 'failed to run: %s' % result.error, None))
        continue
      for name, value in sorted(self.differences.get(result.name, {}).items()):
        if not value <= tolerance:  # NaN counts as a mismatch.
          self.mismatches.append((result.name, name, value))
      norm_difference = self.norm_differences.get(result.name)
      if norm_difference is not None and not norm_difference <= tolerance:
        self.mismatches.append((result.name, 'global gradient norm', norm_difference))

  @property
  def ok(self) -> bool:
    return not self.mismatches

  def LargestDifference(self) -> Tuple[float, Optional[str], Optional[str]]:
    """(difference, variant, variable) of the largest per-variable difference."""
    best: Tuple[float, Optional[str], Optional[str]] = (0.0, None, None)
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
                 '%d logical CPU devices' %
                 max([r.variant.num_devices or 1 for r in self.results] + [1]))
    lines.append('  tolerance %.1e%s' % (self.tolerance, ': ' + TOLERANCE_REASON
                                          if self.tolerance == DEFAULT_TOLERANCE else ''))
    lines.append('')
    for m, reasons in sorted(self.fixed_m.items()):
      base = self.fixed_m_bases.get(m)
      if m in self.micro_references:
        micro = self.micro_references[m]  # Also fixed_m_bases[m].
        lines.append('M=%d: results depend on M, so each K at M=%d is compared with %s: the same '
                     'layers unpipelined, run on each of the %d micro-batches of examples in turn '
                     '(the input split along its examples\' axis, not along batch_dim), losses '
                     'combined by their weights; global gradient norm %.7e. A batch_dim that '
                     'splits another axis normalises other values and differs. Why:' %
                     (m, m, micro.name, m, micro.global_norm))
      else:
        lines.append('M=%d: results depend on M, so each K at M=%d is compared with %s (across K '
                     'at fixed M), not with the unpipelined reference; results never depend on '
                     'K, so a wrong batch_dim is not detected at M=%d. Why:' %
                     (m, m, base.name if base else 'nothing (no variant at M=%d ran)' % m, m))
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
    col = max([len(c) for c in columns] + [len(self._Base(r)) for r in self.results] +
              [len('1.2345678e+00')]) + 2

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
    out.append(Row('loss', _LossText(self.reference), [_LossText(r) for r in self.results]))
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

  def Failed(self) -> List[VariantResult]:
    """The variants that failed to run (not compared: they are never said to differ)."""
    return [r for r in self.results if r.error]

  def Differing(self) -> List[str]:
    """The names of the variants that ran and differ by more than the tolerance."""
    return sorted({variant for variant, _, value in self.mismatches if value is not None})

  def _Verdict(self) -> str:
    compared = len(self.differences)
    if self.ok:
      value, variant, name = self.LargestDifference()
      where = ' (%s, %s)' % (variant, name) if variant else ''
      return ('PASS: %d variant(s) agree with what they are compared with within %.1e; largest '
              'difference %.1e%s' % (compared, self.tolerance, value, where))
    parts = []
    failed, differing = self.Failed(), self.Differing()
    if failed:
      parts.append('%d of %d variant(s) failed to run (%s); first cause: %s' % (
          len(failed), len(self.results), ', '.join(r.name for r in failed), failed[0].error))
    if differing:
      measured = [(variant, what, value) for variant, what, value in self.mismatches
                  if value is not None]
      variant, what, value = max(measured, key=lambda m: m[2])
      parts.append('%d of %d variant(s) (%s) differ by more than %.1e; largest: %s, %s differs '
                   'by %.1e' % (len(differing), len(self.results), ', '.join(differing),
                                self.tolerance, variant, what, value))
      m_of = {r.name: r.variant.num_micro_batches or 1 for r in self.results}
      if self.case.batch_dim_hint and all(m_of[name] > 1 for name in differing):
        parts.append('only M > 1 differs, ' + self.case.batch_dim_hint)
    return 'FAIL: ' + '; '.join(parts)
