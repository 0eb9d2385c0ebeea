"""Model capacity: the largest model whose fullest device fits a memory budget, by the estimate.

The GPipe paper's Table 1 asks how large a model each configuration (K partitions, M micro-batches,
re-computation or not) can train within a per-device memory budget. Here a model family is a
function from a size (filters, layers, ...) to the models' `cost_model.LayerProfile`s; a size fits
when the split that minimises the fullest device's estimated memory (`cost_model.MemoryCost`,
`balancing.OptimalSplit`) keeps it within the budget, and `LargestModel` finds the largest size
that fits by bisection, which assumes that every smaller size fits too.
"""

from typing import Callable, List, Optional, Sequence, Tuple

from tensorpipe.partitioner import balancing
from tensorpipe.partitioner import cost_model


def PeakOfBestSplit(profiles: Sequence[cost_model.LayerProfile], num_partitions: int,
                    num_micro_batches: int, recompute: str,
                    bytes_per_param: float = cost_model.DEFAULT_BYTES_PER_PARAM
                    ) -> Tuple[float, List[int]]:
  """(estimated bytes of the fullest device, partition sizes) for the split that minimises it."""
  mem = cost_model.MemoryCost(profiles, num_micro_batches, recompute, bytes_per_param)
  sizes = balancing.OptimalSplit(mem, num_partitions)
  return max(mem.Partitions(sizes)), sizes


def Fits(profiles: Sequence[cost_model.LayerProfile], num_partitions: int, num_micro_batches: int,
         recompute: str, budget: float,
         bytes_per_param: float = cost_model.DEFAULT_BYTES_PER_PARAM) -> bool:
  """Whether the best split's fullest device is within `budget` bytes.

  A model with fewer layers than partitions counts as fitting: it cannot fill the devices, and the
  bisection of `LargestModel` needs every size below a fitting one to fit.
  """
  if len(profiles) < num_partitions:
    return True
  peak, _ = PeakOfBestSplit(profiles, num_partitions, num_micro_batches, recompute,
                            bytes_per_param)
  return peak <= budget


def LargestFitting(fits: Callable[[int], bool], lo: int, hi: int) -> Optional[int]:
  """The largest integer n in [lo, hi] with fits(n), by bisection (fits holds up to some n).

  None if not fits(lo).
  """
  if lo > hi:
    raise ValueError('LargestFitting: empty range [%r, %r]' % (lo, hi))
  if not fits(lo):
    return None
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if fits(mid):
      lo = mid
    else:
      hi = mid - 1
  return lo


def LargestModel(profiles_fn: Callable[[int], Sequence[cost_model.LayerProfile]],
                 num_partitions: int, num_micro_batches: int, recompute: str, budget: float,
                 lo: int, hi: int, step: int = 1,
                 bytes_per_param: float = cost_model.DEFAULT_BYTES_PER_PARAM) -> Optional[int]:
  """The largest size, a multiple of `step` in [lo, hi], whose model fits `budget`; or None.

  Args:
    profiles_fn: size -> the model's LayerProfiles (called once per size tried; cache it if it
      builds graphs).
    num_partitions, num_micro_batches, recompute: the pipeline configuration (see cost_model).
    budget: bytes per device.
    lo, hi: the sizes to search.
    step: sizes tried are multiples of it.
    bytes_per_param: bytes per trainable parameter with its optimizer slots.
  """
  if step < 1 or lo < step or hi < lo:
    raise ValueError('LargestModel: need 1 <= step <= lo <= hi, got step=%r, lo=%r, hi=%r' %
                     (step, lo, hi))

  def SizeFits(i):
    return Fits(profiles_fn(i * step), num_partitions, num_micro_batches, recompute, budget,
                bytes_per_param)

  largest = LargestFitting(SizeFits, lo // step, hi // step)
  return None if largest is None else largest * step
