"""FLOPs of a training step, for model and hardware FLOPs utilisation.

A step's FLOP rate says how much of a machine it uses only beside what the machine can do: the
benchmarks divide it by the rate this machine reaches on large float32 matmuls in the same run
(`MatmulFlops` per matmul). Two counts of a step's FLOPs, both from the forward FLOPs of its layers
for the mini-batch (e.g. `cost_model.ChainFlops` of the layers' FPropMeta):

- model FLOPs = 3 x forward FLOPs: the forward pass once and the backward pass, which for
  matmul-dominated layers costs twice its forward pass (x @ w forward; dy @ w^T and x^T @ dy
  backward). They are the same for every implementation of the model, so model FLOPs utilisation
  compares implementations by the work the model needs. The first layer's input gradient is
  counted although a step whose inputs need no gradient may skip it.
- hardware FLOPs = (3 + r) x forward FLOPs, r the forward passes run again (`RecomputedForwards`):
  a re-computing backward pass (GPipe's re-computation) re-runs its micro-batch's forward pass once.
  A split backward pass's weight-gradient task re-creates only the ops that read weights and
  differentiates them (see layer_gradients), so it adds nothing; a layer it re-runs instead (its
  weights go through control flow or a function call) is not counted. They say how busy the
  arithmetic units were, needed work or not.

Micro-batching changes neither count: the FLOPs of a layer's matmuls are linear in its batch.
"""

from typing import Sequence

from tensorpipe import schedule as schedule_lib

# Forward passes' worth of FLOPs in a forward and backward pass of matmul-dominated layers.
MODEL_FORWARDS = 3


def MatmulFlops(rows: int, inner: int, columns: int) -> float:
  """2 x rows x inner x columns: the multiply-adds of a [rows, inner] @ [inner, columns] matmul,
  two FLOPs each."""
  for name, value in (('rows', rows), ('inner', inner), ('columns', columns)):
    if value < 1:
      raise ValueError('MatmulFlops: %s must be >= 1, got %r' % (name, value))
  return 2.0 * rows * inner * columns


def ModelFlops(forward_flops: float) -> float:
  """The model FLOPs of a training step: 3 x the forward FLOPs of the mini-batch."""
  return MODEL_FORWARDS * forward_flops


def RecomputedForwards(schedule: schedule_lib.Schedule, micro_batch_sizes: Sequence[int],
                       selective_share: float = 1.0) -> float:
  """Forward passes of the whole mini-batch that a step run by `schedule` runs again.

  Each micro-batch whose backward passes re-compute their partitions (`Schedule.Recomputes`) adds
  its share of the mini-batch once: 0 for recompute='never', 1 for 'always' (GPipe, zero-bubble, and
  Lingvo's PipeliningLayer, whose backward pass re-runs each cell); for 'selective', the share of
  the forward FLOPs it re-runs, `selective_share` (those outside matmuls and convolutions).

  Args:
    schedule: the step's schedule (its recompute mode and whether it splits backward passes).
    micro_batch_sizes: examples in each of its M micro-batches (micro_batching.Sizes).
    selective_share: with recompute='selective', the share of a forward pass's FLOPs it re-runs
      (e.g. from cost_model.SelectiveShare of the layers' profiles, weighted by their FLOPs).

  Raises:
    ValueError: if there is not one size per micro-batch, or the sizes add up to no example.
  """
  if len(micro_batch_sizes) != schedule.num_micro_batches or sum(micro_batch_sizes) < 1:
    raise ValueError('RecomputedForwards: %s needs %d micro-batch sizes adding up to >= 1, got %r'
                     % (schedule.name, schedule.num_micro_batches, list(micro_batch_sizes)))
  recomputed = sum(size for t, size in enumerate(micro_batch_sizes) if schedule.Recomputes(t))
  share = selective_share if schedule.recompute == 'selective' else 1.0
  return share * recomputed / float(sum(micro_batch_sizes))


def HardwareFlops(forward_flops: float, recomputed_forwards: float) -> float:
  """The hardware FLOPs of a training step: (3 + recomputed_forwards) x the forward FLOPs."""
  return (MODEL_FORWARDS + recomputed_forwards) * forward_flops
