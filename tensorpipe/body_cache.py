"""Small tensors made once per traced function body and shared by every op there that needs them.

Building a graph costs about the same per op whatever the op computes, and a partition's function
bodies need the same small tensors over and over: a reshape's shape, the per-example terms of every
dropout mask of one shape. Inside a function body, whose ops all run on the partition's device, each
is made once and shared: the same values from fewer ops. Outside function bodies (a graph whose ops
may sit on several devices) every caller makes its own, as without this module.
"""

from typing import Any, Callable, Dict, Hashable

from lingvo import compat as tf

from tensorpipe import per_graph

# Per function graph: {key: tensors}.
_SHARED: per_graph.PerGraph[Dict[Hashable, Any]] = per_graph.PerGraph('body_cache', dict)


def Shared(key: Hashable, build: Callable[[], Any]) -> Any:
  """build()'s tensors (or ops), made once per function body for `key`, shared by every caller.

  They are made outside any control context, so no caller's control dependencies reach the others;
  so build() may use only tensors that every caller can use (constants, function arguments).
  Outside a function body, build() itself.
  """
  graph = tf.get_default_graph()
  if not graph.building_function:
    return build()
  cache = _SHARED.Of(graph)
  if key not in cache:
    with tf.control_dependencies(None):
      cache[key] = build()
  return cache[key]


def Constant(value: Any, dtype: tf.DType) -> tf.Tensor:
  """tf.constant(value, dtype) of an integer or a flat list of integers, shared as `Shared` is."""
  key = tuple(value) if isinstance(value, (list, tuple)) else value
  return Shared(('constant', key, dtype), lambda: tf.constant(value, dtype))
