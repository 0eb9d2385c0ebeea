"""What the layers of a partition see while it is traced: one context object per thread.

A partition's layers are traced once into graph functions that run once per micro-batch and again
in the re-computation (see `partition_function`). While they are traced, what they compute depends
on more than their inputs:

  - the example offset: the index, in the whole mini-batch, of the micro-batch's first example,
    which keys dropout masks (see `randomness`); offsets of nested contexts add up (a pipeline
    inside a pipeline's partition);
  - the batch-norm collector that records the statistics of batch-norm updates (see `batch_norm`);
  - the routing state of the stateful entry points the partition's trace routes (see
    `stateful_ops`): the batch dimension and the example count, the layer being traced and its
    dropout uses so far, and what the trace noted (the non-padded positions behind each
    statistic, the layers whose dropout masks have no batch dimension);
  - the global step, whether Lingvo's CheckNumerics runs, and whether weight gradients of broadcast
    matmuls are 2-D (see `matmul_gradient`).

All of it is one `TraceContext`, the innermost of a per-thread stack (`Current()`): `Partition`
enters a partition's context, `LayerScope` scopes one of its layers, and `Offset` and `Collecting`
derive a context with another offset or collector. What Lingvo and TensorFlow keep themselves (the
cluster's parameters, the global step, the stateful entry points' module attributes, the gradient
override map) `Partition` enters beside it and restores on exit, even if the trace fails.
"""

import contextlib
import copy
import dataclasses
import threading
import zlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from lingvo import compat as tf
from lingvo.core import cluster_factory
from lingvo.core import py_utils

from tensorpipe import matmul_gradient
from tensorpipe import partition_spec

_STATE = threading.local()

# (module, attribute name, value): a module attribute to replace while a partition is traced.
Route = Tuple[Any, str, Any]


@dataclasses.dataclass
class Routing:
  """What the routed stateful entry points (see `stateful_ops`) need while one partition is traced.

  Contexts derived from the partition's (by `Offset` or `Collecting`) share this object, so what a
  layer's trace notes in any of them stays noted.
  """
  batch_dim: int  # The pipeline's batch dimension (where dropout looks for examples first).
  example_count: Optional[int]  # Examples per micro-batch, or None if unknown at graph building.
  layer: Optional[str] = None  # Key of the layer being traced (see `LayerScope`), or None.
  uses: int = 0  # Dropout uses so far in that layer.
  counts: Dict[int, Any] = dataclasses.field(default_factory=dict)  # id(statistic) -> positions.
  whole_micro_batch_masks: List[str] = dataclasses.field(default_factory=list)  # Layer keys.


@dataclasses.dataclass(frozen=True)
class TraceContext:
  """What the layers traced in this context see (the defaults: outside any partition)."""
  offset: Union[int, tf.Tensor] = 0  # Example offset, summed over nested contexts.
  collector: Any = None  # The batch_norm.StatsCollector that records batch-norm updates, or None.
  routing: Optional[Routing] = None  # The partition's routing state; None outside any partition.
  step: Optional[tf.Tensor] = None  # The partition's global step (None: none given).
  check_numerics: bool = True  # Whether Lingvo's CheckNumerics runs in the partition.
  two_d_weight_gradients: bool = False  # Whether broadcast matmuls get 2-D weight gradients.


def _Stack() -> List[TraceContext]:
  if not hasattr(_STATE, 'contexts'):
    _STATE.contexts = []
  return _STATE.contexts


def Current() -> Optional[TraceContext]:
  """The innermost context of this thread, or None outside any."""
  stack = _Stack()
  return stack[-1] if stack else None


@contextlib.contextmanager
def _Pushed(context: TraceContext) -> Iterator[TraceContext]:
  stack = _Stack()
  stack.append(context)
  try:
    yield context
  finally:
    stack.pop()


def _Outer() -> TraceContext:
  return Current() or TraceContext()


def _AddedOffset(outer: Union[int, tf.Tensor], offset: Union[int, tf.Tensor]
                 ) -> Union[int, tf.Tensor]:
  """`outer` + `offset`, after checking `offset` (a non-negative int or scalar integer tensor)."""
  if isinstance(offset, tf.Tensor):
    if not offset.dtype.is_integer or offset.shape.rank not in (None, 0):
      raise ValueError('example offset must be a scalar integer tensor, got %r' % (offset,))
  elif isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
    raise ValueError('example offset must be a non-negative integer, got %r' % (offset,))
  if isinstance(outer, tf.Tensor) or isinstance(offset, tf.Tensor):
    return tf.cast(outer, tf.int64) + tf.cast(offset, tf.int64)
  return outer + offset


@contextlib.contextmanager
def Offset(offset: Union[int, tf.Tensor]) -> Iterator[TraceContext]:
  """Within it, the context is the current one with an example offset `offset` more.

  Args:
    offset: a non-negative Python int or a scalar integer tensor.
  """
  outer = _Outer()
  with _Pushed(dataclasses.replace(outer, offset=_AddedOffset(outer.offset, offset))) as context:
    yield context


@contextlib.contextmanager
def Collecting(collector: Any) -> Iterator[TraceContext]:
  """Within it, the context is the current one with batch-norm updates recorded into `collector`."""
  with _Pushed(dataclasses.replace(_Outer(), collector=collector)) as context:
    yield context


def _Cluster(check_numerics: bool) -> Any:
  """The current cluster as partitions run in it: no Lingvo runtime asserts or summaries, and no
  CheckNumerics unless `check_numerics` (a re-computation repeats values already checked).

  An Assert op would make the partition's function stateful, and TensorFlow instantiates a stateful
  function once per call op, so the time to start the first step and every step's overhead would
  grow with M. Lingvo's asserts check shapes the traced function already fixes. Summaries made
  in a function body never reach the session's summary writer (and some read variables, which makes
  the function stateful too).
  """
  cluster = copy.deepcopy(cluster_factory.Current())
  cluster.params.enable_asserts = False
  cluster.params.add_summary = False
  if not check_numerics:
    cluster.params.enable_check_numerics = False
  return cluster


@contextlib.contextmanager
def _Replaced(routes: Sequence[Route]) -> Iterator[None]:
  """Sets each (module, name, value); restores the old values on exit."""
  saved = [(module, name, getattr(module, name)) for module, name, _ in routes]
  try:
    for module, name, value in routes:
      setattr(module, name, value)
    yield
  finally:
    for module, name, value in reversed(saved):
      setattr(module, name, value)


@contextlib.contextmanager
def Partition(spec: partition_spec.PartitionSpec, step: Optional[tf.Tensor],
              offset: Union[int, tf.Tensor], collector: Any, check_numerics: bool = True,
              routes: Optional[Callable[[], Sequence[Route]]] = None) -> Iterator[TraceContext]:
  """The context a partition's layers are traced in; everything it sets is restored on exit.

  Args:
    spec: the partition: its batch_dim, example_count and two_d_weight_gradients (trace under
      matmul_gradient.Scope(): 2-D weight gradients of broadcast matmuls) count here.
    step: the global step the layers see (py_utils.GetGlobalStep()), or None.
    offset: the example offset of the micro-batch (added to the current context's).
    collector: the batch_norm.StatsCollector that records the partition's batch-norm updates.
    check_numerics: whether Lingvo's CheckNumerics runs (not in a re-computation).
    routes: returns the module attributes to replace while the partition is traced (see
      stateful_ops.Routes). Called only for the outermost partition: a partition traced inside
      another one finds them in place.

  Yields:
    The partition's context; its `routing` holds what the trace noted.
  """
  outer = _Outer()
  context = TraceContext(offset=_AddedOffset(outer.offset, offset), collector=collector,
                         routing=Routing(spec.batch_dim, spec.example_count), step=step,
                         check_numerics=check_numerics,
                         two_d_weight_gradients=spec.two_d_weight_gradients)
  with contextlib.ExitStack() as entered:
    entered.enter_context(_Cluster(check_numerics))
    entered.enter_context(py_utils.GlobalStepContext(step))
    entered.enter_context(_Pushed(context))
    if routes is not None and outer.routing is None:
      entered.enter_context(_Replaced(routes()))
    if spec.two_d_weight_gradients:
      entered.enter_context(matmul_gradient.Scope())
    yield context


@contextlib.contextmanager
def LayerScope(key: str) -> Iterator[None]:
  """Within `Partition`: the trace of the top-level layer `key` (a string, the same for any K).

  Routed dropout names its sites after `key` and the order of its uses in the layer, and Lingvo's
  step seed restarts from a value derived from `key`, so stateless ops seeded by
  py_utils.GenerateStepSeedPair draw the same numbers in the forward pass, in the re-computation
  and whatever partition the layer lands in.
  """
  context = Current()
  if context is None or context.routing is None:
    raise AssertionError('layer %r traced outside any partition context' % (key,))
  routing = context.routing
  routing.layer, routing.uses = key, 0
  py_utils.ResetStepSeed(zlib.crc32(('%s|step seed' % key).encode('utf-8')) & 0x7FFFFFFF)
  try:
    yield
  finally:
    routing.layer = None
