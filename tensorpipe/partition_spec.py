"""PartitionSpec: what one partition's trace needs to know besides its layers, in one frozen value.

TensorPipeLayer builds one per partition (see `TensorPipeLayer._Specs`) and gives it to the
partition's functions (`partition_function.PartitionFunctions`), their bodies
(`partition_trace.PartitionBody`), the context its layers are traced in (`trace_context.Partition`)
and its batch_dim check (`batch_dim_check.Check`), which all read the same values from it. Being
frozen and hashable, it also keys the layer's cache of traced partition functions.
"""

import dataclasses
from typing import Optional


def Where(pipeline: str) -> str:
  """How messages name the TensorPipeLayer named `pipeline`: "TensorPipeLayer 'pipe'"."""
  return 'TensorPipeLayer %r' % pipeline


@dataclasses.dataclass(frozen=True)
class PartitionSpec:
  """One partition of one pipeline, as its traces see it.

  The pipeline is named by `pipeline` (its Params' name) in messages and function names, and by
  `scope` in dropout sites and step seeds. They differ on purpose: `scope` is the pipeline's
  variable scope, which includes the names of the layers it is nested in (e.g. 'model/dec/pipe'),
  so two pipelines of one name in one model still draw different dropout masks; messages name the
  pipeline as its user named it.
  """
  pipeline: str = 'pipe'  # The pipeline's name (its Params' `name`).
  index: int = 0  # k: the partition's place in the pipeline, 0 to K x virtual_stages - 1.
  device: str = ''  # The device its functions are placed on ('' for the current one).
  scope: str = ''  # Names the pipeline in dropout sites and step seeds (the same whatever K is).
  batch_dim: int = 0  # The batch dimension of the partition's inputs.
  example_count: Optional[int] = None  # Examples per micro-batch; None: unknown at graph building.
  two_d_weight_gradients: bool = True  # Trace under matmul_gradient.Scope().
  recomputes: bool = True  # Whether backward passes re-compute the partition.
  # Selective re-computation: the forward function keeps the outputs of its ops of these types, the
  # backward function re-computes only the others (see `selective_recompute`). None: not selective.
  kept_op_types: Optional[frozenset] = None
  decoding: bool = False  # A decode step's partition (see TensorPipeLayer.ExtendStep).

  @property
  def where(self) -> str:
    """Names the pipeline in error messages."""
    return Where(self.pipeline)

  @property
  def function_name(self) -> str:
    """The prefix of the partition's graph function names, e.g. 'pipe_partition1'."""
    return '%s_partition%d%s' % (self.pipeline, self.index, '_step' if self.decoding else '')
