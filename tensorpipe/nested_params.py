"""Every Params nested in a Lingvo Params, with its path (e.g. 'task.encoder.layers[2]').

Model params hold layer Params inside Params, lists, tuples and dicts; the trainer's checks, the
tools and the consistency check look through all of them for TensorPipeLayers (see
`layer.Pipelines`) and input generators.
"""

from typing import Any, Iterator, Tuple

from lingvo.core import hyperparams


def Walk(params: hyperparams.Params, path: str = '') -> Iterator[Tuple[str, hyperparams.Params]]:
  """Yields (path, Params) for `params` and every Params nested in it (also inside lists, tuples
  and dicts), parents before children."""
  yield path, params
  for name, value in params.IterParams():
    yield from _WalkValue(value, '%s.%s' % (path, name) if path else name)


def _WalkValue(value: Any, path: str) -> Iterator[Tuple[str, hyperparams.Params]]:
  if isinstance(value, hyperparams.Params):
    yield from Walk(value, path)
  elif isinstance(value, (list, tuple)):
    for i, v in enumerate(value):
      yield from _WalkValue(v, '%s[%d]' % (path, i))
  elif isinstance(value, dict):
    for k, v in value.items():
      yield from _WalkValue(v, '%s[%r]' % (path, k))
