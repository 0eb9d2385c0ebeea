"""SharedLayer: one layer, with one set of weights, run at several places of a pipeline.

Tied weights (a language model's input embedding and output softmax, say) are one layer used twice.
In a TensorPipeLayer's `layers` (or `partitions`, or as its `loss_layer`), a SharedLayer entry names
the place; its `layer` Params name the layer it runs. Every entry whose `layer` has the same name
runs the same layer object, whose variables are created once, on the device of the first partition
that uses it, and named `<pipeline>/<layer name>/...`. Each entry calls one method of it (`method`,
FProp by default), e.g. Lingvo's SharedSoftmaxLayer as `EmbLookup` first and as `FProp` last.

A partition that uses a shared layer reads its weights from the partition that owns them (they are
sent to its device), and the weights' gradient is the sum of every use's gradient, so training is
the same as with one layer object in an unpipelined model, for any K, M and schedule.
"""

from typing import Any

from lingvo.core import base_layer
from lingvo.core import py_utils


class SharedLayer(base_layer.BaseLayer):
  """A place in a pipeline where a shared layer runs (see the module docstring).

  Inside a TensorPipeLayer the entry itself is never built: the pipeline creates the shared layer
  once and runs its `method` in the entry's place. Built on its own (as the partitioner's cost
  estimates do), it is a layer with `layer` as its child that runs that method.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('layer', None,
             'Params of the layer this entry runs. Entries whose layer has the same name share one '
             'layer and its weights; give them equal Params.')
    p.Define('method', 'FProp',
             "The layer's method this entry calls, with (theta, *inputs), e.g. 'EmbLookup' of "
             'a SharedSoftmaxLayer.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    if p.layer is None or not p.layer.name:
      raise ValueError('SharedLayer %r: set `layer` to the Params of a named layer' % p.name)
    self.CreateChild(p.layer.name, p.layer)

  def FProp(self, theta, *args):
    name = self.params.layer.name
    return Run(self.children[name], self.params.method, theta[name], *args)

  @classmethod
  def FPropMeta(cls, p, *args):
    """The shared layer's FPropMeta, for the FProp method; other methods have no cost estimate."""
    if p.method != 'FProp':
      raise NotImplementedError(
          'SharedLayer %r calls %s.%s, which has no cost estimate; partition with '
          "partition_cost='count' or 'measured', or with explicit `partitions`" %
          (p.name, p.layer.cls.__name__, p.method))
    meta = p.layer.cls.FPropMeta(p.layer, *args)
    return py_utils.NestedMap(flops=meta.flops, out_shapes=meta.out_shapes)


def Run(layer: base_layer.BaseLayer, method: str, theta: py_utils.NestedMap, *args: Any) -> Any:
  """`layer`'s `method` on (theta, *args): what a SharedLayer entry does in its place."""
  fn = getattr(layer, method, None)
  if not callable(fn):
    raise AttributeError('%s %r has no method %r to run as a SharedLayer' %
                         (type(layer).__name__, layer.params.name, method))
  return fn(theta, *args)
