"""Graph functions with declared signatures: traced once, called many times, never re-specialised.

A `Signature` names a function's tensors in groups (e.g. offset, step, theta, x, dy, sums); each
group is a list of specs with None where an argument is absent (a weight without a gradient, an
output leaf that got none). The body of a traced function receives its inputs as such groups and
returns its outputs as groups, and each call passes and receives the same groups, so no caller
slices or packs flat argument lists by hand. What a trace finds out about itself beyond its tensors
(an output structure, which weights got gradients) is returned by the body as `facts`, kept with
the function.

`GraphFunction.Trace` traces a body once on a device. `Call` adds one call op of it, never inlined
nor specialised per call and without per-call shape inference (see `tf_internals.FunctionFromGraph`
and `tf_internals.AddFunctionCall`), so the graph TensorFlow optimises and runs does not grow with
the number of calls.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from lingvo import compat as tf
from lingvo.core import py_utils

from tensorpipe import tf_internals

# A group of tensors: one per argument, None where absent.
Group = List[Optional[tf.Tensor]]
Groups = Dict[str, Group]


def Spec(t: tf.Tensor) -> tf.TensorSpec:
  return tf.TensorSpec(t.shape, t.dtype)


@dataclasses.dataclass(frozen=True)
class Signature:
  """A function's tensors as named groups, in order; a None spec is an absent argument."""
  groups: Tuple[Tuple[str, Tuple[Optional[tf.TensorSpec], ...]], ...]

  @classmethod
  def Of(cls, groups: Sequence[Tuple[str, Sequence[Optional[tf.TensorSpec]]]]) -> 'Signature':
    return cls(tuple((name, tuple(specs)) for name, specs in groups))

  @classmethod
  def OfValues(cls, values: Groups) -> 'Signature':
    """The signature of `values` (name -> tensors or None), in their order."""
    return cls.Of([(name, [None if t is None else Spec(t) for t in group])
                   for name, group in values.items()])

  @property
  def specs(self) -> List[tf.TensorSpec]:
    """The present arguments' specs, in order: what the traced function takes."""
    return [s for _, specs in self.groups for s in specs if s is not None]

  def Flatten(self, values: Mapping[str, Sequence[Optional[Any]]], where: str) -> List[Any]:
    """The present tensors of `values` in order; each group must match its specs' presence."""
    if set(values) != {name for name, _ in self.groups}:
      raise AssertionError('%s: got groups %s for %s' % (where, sorted(values), self.groups))
    flat: List[Any] = []
    for name, specs in self.groups:
      group = list(values[name])
      present = [x is not None for x in group]
      if present != [s is not None for s in specs]:
        raise AssertionError('%s: group %r has tensors at %s, the function at %s' %
                             (where, name, present, [s is not None for s in specs]))
      flat.extend(x for x in group if x is not None)
    return flat

  def Unflatten(self, flat: Sequence[Any]) -> Groups:
    """`flat` (the present tensors, in order) as groups, None at absent arguments."""
    it = iter(flat)
    return {name: [None if s is None else next(it) for s in specs] for name, specs in self.groups}


@dataclasses.dataclass(frozen=True)
class GraphFunction:
  """A body traced once as a graph function on a device.

  As Lingvo's py_utils.Function does, the body gets a fresh step seed and no summaries collection
  of the outer graph. `concrete` is TensorFlow's ConcreteFunction of the trace, whose own calls
  tf.gradients can differentiate; `atomic` is what `Call` calls: the same trace, never inlined nor
  specialised per call (tf_internals.FunctionFromGraph).
  """
  concrete: Any
  atomic: Any
  inputs: Signature
  outputs: Signature
  facts: Any  # What the body returned about its trace besides its outputs.

  @classmethod
  def Trace(cls, name: str, body: Callable[[Groups], Tuple[Groups, Any]], inputs: Signature,
            device: str) -> 'GraphFunction':
    """`body` traced on `device` for `inputs`: body(input groups) -> (output groups, facts).

    The trace is made in the outermost graph (`tf.init_scope`) even while a loop body is being
    built, so what it captures are that graph's tensors, and any loop body of it may call it.
    """
    with tf.init_scope():
      return cls._Trace(name, body, inputs, device)

  @classmethod
  def _Trace(cls, name, body, inputs, device):
    result = {}

    def Body(*args):
      py_utils.ResetStepSeed()
      tf.get_default_graph().clear_collection(tf.GraphKeys.SUMMARIES)
      with tf.device(device):
        outputs, result['facts'] = body(inputs.Unflatten(args))
      result['outputs'] = Signature.OfValues(outputs)
      return result['outputs'].Flatten(outputs, name)

    Body.__name__ = name
    concrete = tf_internals.TraceNotInlined(Body, inputs.specs)
    atomic = tf_internals.FunctionFromGraph(concrete.name.decode() + '_call', concrete.graph)
    return cls(concrete, atomic, inputs, result['outputs'], result['facts'])

  @property
  def captured_inputs(self) -> List[tf.Tensor]:
    """The outer-graph tensors the body captured; every call passes them after the arguments."""
    return self.concrete.captured_inputs

  def Call(self, inputs: Mapping[str, Sequence[Optional[Any]]], name: str
           ) -> Tuple[Groups, tf.Operation]:
    """One call op on `inputs` (groups as the signature's); returns (output groups, the op).

    The output shapes are taken from the trace: graph construction runs no shape inference over
    the body for each call (which would make building the graph grow with M).
    """
    args = [tf.convert_to_tensor(x) for x in
            self.inputs.Flatten(inputs, name) + list(self.captured_inputs)]
    op = tf_internals.AddFunctionCall(tf.get_default_graph(), self.atomic, args, name)
    for out, spec in zip(op.outputs, self.outputs.specs):
      out.set_shape(spec.shape)
    return self.outputs.Unflatten(op.outputs), op

  def CallDifferentiable(self, inputs: Mapping[str, Sequence[Optional[Any]]], name: str
                         ) -> Tuple[Groups, tf.Operation]:
    """As `Call`, with TensorFlow's own call op (named by TensorFlow; `name` only names the call
    in messages), which tf.gradients differentiates: TensorFlow then rewrites the call to also
    output the activations its gradient needs."""
    outputs = self.concrete(*self.inputs.Flatten(inputs, name))
    return self.outputs.Unflatten(outputs), outputs[0].op
