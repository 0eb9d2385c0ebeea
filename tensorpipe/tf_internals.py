"""The one door to TensorFlow's private APIs: every use of one goes through a function here.

TensorPipe needs a few things TensorFlow 2.13's public API does not offer: a graph function called
from a TF1 graph without being inlined, specialised or shape-inferred again per call (see
`graph_function`: TensorFlow's private function attributes `_noinline` and `_nospecialize`); a
function graph's (FuncGraph's) captures, arguments and enclosing graphs (`partition_trace` finds a
layer's shortcuts with them); control inputs added to an op already built (`executor`, rule edges
into forward actions); an op's input rewired (`early_shapes`, `selective_recompute`); a graph's
function library and the op registry (`stateful_ops`); the module attributes TensorFlow's dropout
lives in (`stateful_ops` routes them); a scope that marks new ops for grappler to keep
(`accumulation`); the gradient registry (`matmul_gradient`, `selective_recompute`); and the
GetStatus request of TensorFlow's worker service, by which a server says which task it is
(`trainer.liveness`: TensorFlow's pip package ships no Python module for worker.proto). Two private
attributes of Lingvo's objects are read here too: a layer's own variable scope (`randomness`) and
the devices a cluster's session sees (`placement`). Keeping them here means a TensorFlow upgrade
that moves one breaks one module, and `Missing()` (run by the tests) names what moved and the
TensorFlow version.
"""

# This module is where TensorPipe reaches into TensorFlow's protected members, and only here.
# pylint: disable=protected-access

import functools
import types
from typing import Any, Callable, Dict, List, Sequence, Set, Tuple

import grpc
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory
import tensorflow as tf2
from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.framework import device_attributes_pb2
from tensorflow.python.eager.polymorphic_function import atomic_function
from tensorflow.python.framework import func_graph as func_graph_lib
from tensorflow.python.framework import op_def_registry
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import nn_ops as _nn_ops
from tensorflow.python.util import _pywrap_util_port

# The module whose `dropout` and `dropout_v2` code may call directly (stateful_ops replaces them).
nn_ops: types.ModuleType = _nn_ops

# (what, how to find it): every private name used here, for `Missing`.
_USED = (
    ('atomic_function.from_func_graph', lambda: atomic_function.from_func_graph),
    ('AtomicFunction.graph_call_attrs', lambda: atomic_function.AtomicFunction.graph_call_attrs),
    ('Graph._add_function_recursive', lambda: tf_ops.Graph._add_function_recursive),
    ('Graph._get_function', lambda: tf_ops.Graph._get_function),
    ('Graph._attr_scope', lambda: tf_ops.Graph._attr_scope),
    ('Operation._add_control_inputs', lambda: tf_ops.Operation._add_control_inputs),
    ('Operation._update_input', lambda: tf_ops.Operation._update_input),
    ('Operation._is_stateful', lambda: tf_ops.Operation._is_stateful),
    ('op_def_registry.get', lambda: op_def_registry.get),
    ('gradient_registry.lookup', lambda: tf_ops.gradient_registry.lookup),
    ('ops.get_gradient_function', lambda: tf_ops.get_gradient_function),
    ('nn_ops.dropout', lambda: _nn_ops.dropout),
    ('nn_ops.dropout_v2', lambda: _nn_ops.dropout_v2),
    ('DeviceAttributes.name', lambda: _Field(device_attributes_pb2.DeviceAttributes, 'name')),
    ('_pywrap_util_port.IsMklEnabled', lambda: _pywrap_util_port.IsMklEnabled),
    ('FuncGraph.outer_graph', lambda: func_graph_lib.FuncGraph.outer_graph),
    ('FuncGraph.external_captures', lambda: func_graph_lib.FuncGraph.external_captures),
    ('FuncGraph.internal_captures', lambda: func_graph_lib.FuncGraph.internal_captures),
)

# Attributes of a partition's graph functions: TensorFlow would otherwise inline each call into the
# session's graph, and grappler would make a specialised copy of the function for each call (each
# gets its own constant example offset): either way the graph TensorFlow optimises and runs would
# grow with M. Not inlining also keeps grappler from merging re-computed ops with the forward
# pass's, which would keep the forward activations alive.
_NOT_INLINED = {'_noinline': True}
_NOT_INLINED_NOR_SPECIALISED = {'_noinline': True, '_nospecialize': True}


def _Field(message_class: Any, name: str) -> Any:
  """The descriptor of field `name` of `message_class` (AttributeError if it has none)."""
  field = message_class.DESCRIPTOR.fields_by_name.get(name)
  if field is None:
    raise AttributeError('%s has no field %s' % (message_class.DESCRIPTOR.full_name, name))
  return field


def Missing() -> List[str]:
  """The private names this module uses that this TensorFlow does not have (empty if none)."""
  missing = []
  for name, find in _USED:
    try:
      find()
    except AttributeError:
      missing.append(name)
  return missing


def Version() -> str:
  """The TensorFlow version, for messages about moved private APIs."""
  return tf2.__version__


def OneDnnEnabled() -> bool:
  """Whether this process runs TensorFlow's oneDNN CPU kernels: TensorFlow's own answer, from the
  CPU's features (on by default where it has AVX-512 VNNI or BF16, AVX-VNNI or AMX) and
  TF_ENABLE_ONEDNN_OPTS."""
  return bool(_pywrap_util_port.IsMklEnabled())


def _Bool(value):
  return attr_value_pb2.AttrValue(b=value)


def TraceNotInlined(body: Callable[..., Any], input_signature: Sequence[Any]) -> Any:
  """The ConcreteFunction of `body` traced for `input_signature` (no autograph), whose calls
  TensorFlow does not inline (`_noinline`): tf.gradients differentiates them as calls."""
  return tf2.function(body, input_signature=input_signature, autograph=False,
                      experimental_attributes=_NOT_INLINED).get_concrete_function()


def FunctionFromGraph(name: str, func_graph: Any) -> Any:
  """An atomic function (what a call op calls) of a traced FuncGraph, never inlined nor specialised
  per call (`_noinline`, `_nospecialize`)."""
  return atomic_function.from_func_graph(
      name, func_graph, func_graph.inputs, func_graph.outputs,
      {key: _Bool(value) for key, value in _NOT_INLINED_NOR_SPECIALISED.items()})


def EnclosingGraphs(graph: tf2.Graph) -> List[tf2.Graph]:
  """`graph` and, for a function graph, the graphs it is built in, innermost first."""
  graphs = []
  while graph is not None:
    graphs.append(graph)
    graph = getattr(graph, 'outer_graph', None)  # A FuncGraph's; a tf.Graph has none.
  return graphs


def ExternalCaptures(func_graph: Any) -> List[tf2.Tensor]:
  """The outer-graph tensors a function graph captured so far, in capture order."""
  return list(func_graph.external_captures)


def CapturePairs(graph: Any) -> List[Tuple[tf2.Tensor, tf2.Tensor]]:
  """[(outer tensor, its placeholder inside)] of what a function graph captured; [] for a
  tf.Graph, which captures nothing."""
  return list(getattr(graph, 'captures', []))


def ArgumentOps(func_graph: Any) -> Set[tf2.Operation]:
  """The placeholders of a function graph's own arguments (its inputs other than captures)."""
  return {x.op for x in func_graph.inputs} - {x.op for x in func_graph.internal_captures}


def LayerVariableScope(layer: Any) -> Any:
  """The variable scope a Lingvo layer was built in (its private `_self_variable_scope`), or None
  for a layer that has none."""
  return getattr(layer, '_self_variable_scope', None)


def SessionDevices(cluster: Any) -> List[str]:
  """The devices a Lingvo cluster's session sees (its private `_session_devices`; [] unset)."""
  return list(getattr(cluster, '_session_devices', None) or [])


def AddFunctionCall(graph: tf2.Graph, function: Any, args: Sequence[tf2.Tensor],
                    name: str) -> tf2.Operation:
  """A call op of `function` (from FunctionFromGraph) on `args` in `graph`, without shape inference.

  The op is the one TensorFlow's own graph call makes, plus `_disable_call_shape_inference`: graph
  construction would otherwise run shape inference over the function's body for every call.
  """
  graph._add_function_recursive(function)
  call = function.graph_call_attrs
  list_value = attr_value_pb2.AttrValue.ListValue
  attrs = {
      'Tin': attr_value_pb2.AttrValue(list=list_value(
          type=[x.dtype.as_datatype_enum for x in args])),
      'Tout': attr_value_pb2.AttrValue(list=list_value(type=call['tout'])),
      'f': attr_value_pb2.AttrValue(func=attr_value_pb2.NameAttrList(name=function.name)),
      'config_proto': attr_value_pb2.AttrValue(s=call['config_proto']),
      'executor_type': attr_value_pb2.AttrValue(s=tf2.compat.as_bytes(call['executor_type'])),
      '_disable_call_shape_inference': _Bool(True),
  }
  return graph.create_op('StatefulPartitionedCall' if call['is_stateful'] else 'PartitionedCall',
                         list(args), call['tout'], name=name, attrs=attrs)


def AddControlInputs(op: tf2.Operation, control_ops: Sequence[tf2.Operation]) -> None:
  """Makes `op`, already built, run after `control_ops`."""
  op._add_control_inputs(control_ops)


def UpdateInput(op: tf2.Operation, index: int, tensor: tf2.Tensor) -> None:
  """Rewires input `index` of `op`, already built, to `tensor`."""
  op._update_input(index, tensor)


def AttributesButColocation(op: tf2.Operation) -> Dict[str, Any]:
  """`op`'s attributes (name -> AttrValue) but its colocation, TensorFlow's private `_class`
  attribute, which names ops of the graph `op` was made in."""
  return {k: v for k, v in op.node_def.attr.items() if k != '_class'}


def IsStateful(op: tf2.Operation) -> bool:
  """Whether TensorFlow treats `op` as stateful (never folded, pruned or merged)."""
  return op._is_stateful


def GraphFunctionDefinition(graph: tf2.Graph, name: str) -> Any:
  """The FunctionDef of function `name` in `graph`'s library, or None."""
  function = graph._get_function(name)
  return getattr(function, 'definition', None) if function is not None else None


def OpDef(op_type: str) -> Any:
  """The registered OpDef of `op_type`, or None."""
  return op_def_registry.get(op_type)


def KeptByGrappler(graph: tf2.Graph) -> Any:
  """A scope in which new ops of `graph` carry the attribute that stops grappler removing them."""
  return graph._attr_scope({'_grappler_do_not_remove': _Bool(True)})


def RegisteredGradient(op_type: str) -> Any:
  """The gradient function TensorFlow registered for `op_type`."""
  return tf_ops.gradient_registry.lookup(op_type)


def GradientFunction(op: tf2.Operation) -> Any:
  """The gradient function tf.gradients would use for `op` (its gradient override included)."""
  return tf_ops.get_gradient_function(op)


# TensorFlow's worker service (tensorflow/core/protobuf/worker_service.proto), which every server
# of a cluster (tf.distribute.Server) serves on its gRPC port. Its GetStatus request is empty and
# its response is `GetStatusResponse { repeated DeviceAttributes device_attributes = 1; }`
# (worker.proto), the devices of the server, each named /job:J/replica:R/task:T/device:D.
_GET_STATUS_METHOD = '/tensorflow.WorkerService/GetStatus'


@functools.cache
def _GetStatusResponseClass() -> Any:
  """worker.proto's GetStatusResponse, built on TensorFlow's DeviceAttributes on first use.

  Its file, tensorpipe/worker_status.proto (package tensorpipe), goes to protobuf's default pool,
  where TensorFlow's protos are: reading a nested message of a class from a pool of its own
  crashes protobuf 4.23's upb backend (a segmentation fault, once the garbage collector ran).
  """
  # protobuf's descriptor_pb2 defines its classes at run time, where pylint does not see them.
  file_proto = descriptor_pb2.FileDescriptorProto  # pylint: disable=no-member
  field_proto = descriptor_pb2.FieldDescriptorProto  # pylint: disable=no-member
  proto = file_proto(name='tensorpipe/worker_status.proto', package='tensorpipe', syntax='proto3',
                     dependency=[device_attributes_pb2.DESCRIPTOR.name])
  message = proto.message_type.add(name='GetStatusResponse')
  message.field.add(name='device_attributes', number=1, label=field_proto.LABEL_REPEATED,
                    type=field_proto.TYPE_MESSAGE, type_name='.tensorflow.DeviceAttributes')
  pool = descriptor_pool.Default()
  pool.AddSerializedFile(proto.SerializeToString())
  return message_factory.GetMessageClass(
      pool.FindMessageTypeByName('tensorpipe.GetStatusResponse'))


def WorkerDeviceNames(channel: grpc.Channel, timeout_s: float) -> List[str]:
  """The names of the devices of the TensorFlow server at the other end of `channel`, from its
  worker service's GetStatus; raises grpc.RpcError if it gives no answer within `timeout_s`."""
  get_status = channel.unary_unary(_GET_STATUS_METHOD, request_serializer=lambda request: request,
                                   response_deserializer=_GetStatusResponseClass().FromString)
  response = get_status(b'', timeout=timeout_s)  # An empty GetStatusRequest.
  return [device.name for device in response.device_attributes]
