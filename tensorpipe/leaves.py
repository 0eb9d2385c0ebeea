"""Structures as the flat tensor lists that graph functions and gradients pass, and back.

A partition's inputs, outputs and gradients are nested structures (tensors, tuples, NestedMaps)
whose leaves may be None; a graph function or a custom gradient takes and returns flat lists of
tensors. `Present` drops the None leaves, `Fill` puts tensors back into a template's non-None
leaves, and `Spread` does the same for a flat list described by a mask.
"""

from typing import Any, List, Optional, Sequence

from lingvo import compat as tf


def Present(values: Any) -> List[Any]:
  """The non-None leaves of `values` (a structure or a flat list), in order."""
  return [x for x in tf.nest.flatten(values) if x is not None]


def Spread(values: Sequence[Any], mask: Sequence[bool]) -> List[Optional[Any]]:
  """`values` (one per True in `mask`), in order, at the True positions of `mask`; None elsewhere.

  Raises:
    ValueError: if `values` does not have one value per True in `mask`.
  """
  values = list(values)
  if len(values) != sum(bool(has) for has in mask):
    raise ValueError('Spread: %d values for a mask with %d places' %
                     (len(values), sum(bool(has) for has in mask)))
  it = iter(values)
  return [next(it) if has else None for has in mask]


def Fill(template: Any, values: Sequence[Any], flat: bool = False) -> Any:
  """`template` with its non-None leaves replaced, in order, by `values`.

  Returns the structure of `template`, or with `flat`, its flattened leaves.
  """
  leaves = Spread(values, [x is not None for x in tf.nest.flatten(template)])
  return leaves if flat else tf.nest.pack_sequence_as(template, leaves)
