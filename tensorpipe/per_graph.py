"""State kept per TensorFlow graph: the one way TensorPipe modules remember something about a graph.

A module that keeps state for each graph it builds in (a tf.Graph, or a function graph while a
function body is traced) declares one `PerGraph(name, make)`. `Of(graph)` is the graph's value,
made by `make()` on first use; `Peek(graph)` is the value, or None where nothing made it yet. The
values live in one attribute of the graph object itself (`ATTRIBUTE`: {name: value}), so they go
when the graph goes even where they refer to it, as tensors and ops do (a dictionary with weak graph
keys would keep such a graph alive through its own value).

Kept this way: randomness's hash constants and step keys, body_cache's shared tensors of a
function body, selective_recompute's replaced ops, partition_trace's layer of each op, and the
layer's traced partition functions.
"""

from typing import Any, Callable, Dict, Generic, Optional, Set, TypeVar

T = TypeVar('T')

# The attribute of a graph that holds its TensorPipe state: {PerGraph name: value}.
ATTRIBUTE = 'tensorpipe_state'
_NAMES: Set[str] = set()  # The names of the PerGraphs made so far: one kind of state per name.


class PerGraph(Generic[T]):
  """One kind of per-graph state: a value per graph, made by `make()` on first use."""

  def __init__(self, name: str, make: Callable[[], T]):
    if name in _NAMES:
      raise ValueError('PerGraph %r exists already; give each kind of per-graph state a name of '
                       'its own' % name)
    _NAMES.add(name)
    self.name = name
    self._make = make

  def Of(self, graph: Any) -> T:
    """`graph`'s value, made now if it has none."""
    states = _States(graph)
    if self.name not in states:
      states[self.name] = self._make()
    return states[self.name]

  def Peek(self, graph: Any) -> Optional[T]:
    """`graph`'s value, or None if it has none (nothing is made)."""
    return getattr(graph, ATTRIBUTE, {}).get(self.name)


def _States(graph: Any) -> Dict[str, Any]:
  states = getattr(graph, ATTRIBUTE, None)
  if states is None:
    states = {}
    setattr(graph, ATTRIBUTE, states)
  return states
