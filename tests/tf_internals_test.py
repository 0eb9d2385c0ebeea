"""TensorFlow's private APIs: all behind tf_internals, and all still where this TensorFlow has them."""

import ast
import gc
import os
import tempfile
import unittest

from tensorflow.core.framework import device_attributes_pb2

from tensorpipe import tf_internals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DOOR = os.path.realpath(tf_internals.__file__)
# Private attributes of TensorFlow objects that tf_internals wraps, and the internals of a function
# graph (FuncGraph: its captures and enclosing graph); nothing else may touch them.
_PRIVATE_ATTRIBUTES = frozenset([
    '_add_function_recursive', '_get_function', '_attr_scope', '_add_control_inputs',
    '_update_input', '_is_stateful', 'gradient_registry',
    'outer_graph', 'captures', 'capture', 'external_captures', 'internal_captures',
    'deferred_external_captures', 'deferred_internal_captures', 'function_captures',
    'replace_capture', 'capture_call_time_value'])
# TensorFlow's private function and op attributes, which code names by string (a function's
# experimental_attributes, an op's attrs); flagged wherever such a string appears.
_PRIVATE_ATTRIBUTE_STRINGS = frozenset([
    '_noinline', '_nospecialize', '_disable_call_shape_inference', '_grappler_do_not_remove',
    '_XlaCompile', '_XlaScope', '_XlaMustCompile', '_class', '_read_only_resource_inputs'])
# Functions that take an attribute name by string: a private one ('_...') of anything but `self`
# (a mixin reads its runner's own members) is a private API reached around the door.
_BY_NAME = frozenset(['getattr', 'setattr', 'hasattr', 'delattr'])


def _PrivateString(node):
  """The private attribute name `node` gives by string, or None: a string of
  _PRIVATE_ATTRIBUTE_STRINGS, a private key of a dict literal or dict(...) keyword, or a private
  name, or a name of _PRIVATE_ATTRIBUTES, given to getattr and the like."""
  if isinstance(node, ast.Constant) and node.value in _PRIVATE_ATTRIBUTE_STRINGS:
    return node.value
  if isinstance(node, ast.Dict):
    for key in node.keys:
      if (isinstance(key, ast.Constant) and isinstance(key.value, str) and
          key.value.startswith('_') and not key.value.startswith('__')):
        return key.value
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
    if node.func.id == 'dict':
      for keyword in node.keywords:
        if keyword.arg and keyword.arg.startswith('_') and not keyword.arg.startswith('__'):
          return keyword.arg
    if (node.func.id in _BY_NAME and len(node.args) >= 2 and
        not (isinstance(node.args[0], ast.Name) and node.args[0].id == 'self') and
        isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) and
        ((node.args[1].value.startswith('_') and not node.args[1].value.startswith('__')) or
         node.args[1].value in _PRIVATE_ATTRIBUTES)):
      return node.args[1].value
  return None


def _Offences(path):
  """(line, what) of each private TensorFlow import, attribute or attribute string (see
  `_PrivateString`) used in the file at `path`."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom):
      names = [node.module or '']
    elif isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.Attribute) and node.attr in _PRIVATE_ATTRIBUTES:
      found.append((node.lineno, node.attr))
      continue
    else:
      string = _PrivateString(node)
      if string is not None:
        found.append((node.lineno, repr(string)))
      continue
    found.extend((node.lineno, name) for name in names
                 if name.startswith(('tensorflow.python', 'tensorflow.core')))
  return sorted(set(found))  # A dict key of _PRIVATE_ATTRIBUTE_STRINGS is found twice.


class _FakeChannel:
  """A gRPC channel whose unary calls all answer `response` (serialised)."""

  def __init__(self, response):
    self.response = response
    self.calls = []

  # grpc.Channel's name.
  def unary_unary(self, method, request_serializer, response_deserializer):  # pylint: disable=C0103

    def Call(request, timeout):
      self.calls.append((method, request_serializer(request), timeout))
      return response_deserializer(self.response)

    return Call


class TfInternalsTest(unittest.TestCase):

  def testEveryPrivateApiIsWhereThisTensorFlowHasIt(self):
    missing = tf_internals.Missing()
    self.assertEqual(
        missing, [], 'TensorFlow %s moved private APIs TensorPipe uses: %s; adapt '
        'tensorpipe/tf_internals.py to this version' % (tf_internals.Version(), missing))

  def testWorkerDeviceNamesReadsTensorFlowsGetStatusResponse(self):
    # What a TensorFlow server sends: worker.proto's GetStatusResponse, its devices as field 1.
    devices = [device_attributes_pb2.DeviceAttributes(
        name='/job:worker/replica:0/task:1/device:CPU:%d' % i, device_type='CPU',
        memory_limit=1 << 28, incarnation=7 + i) for i in range(2)]
    response = b''.join(b'\x0a' + bytes([d.ByteSize()]) + d.SerializeToString() for d in devices)
    channel = _FakeChannel(response)
    for _ in range(2):  # A second call after a garbage collection reads the same.
      gc.collect()
      self.assertEqual(tf_internals.WorkerDeviceNames(channel, 5.0),
                       ['/job:worker/replica:0/task:1/device:CPU:0',
                        '/job:worker/replica:0/task:1/device:CPU:1'])
    self.assertEqual(channel.calls, [('/tensorflow.WorkerService/GetStatus', b'', 5.0)] * 2)

  def testNoModuleOutsideTheDoorUsesThem(self):
    offences = []
    for top in ('tensorpipe', 'tools', 'params'):
      for folder, _, names in os.walk(os.path.join(ROOT, top)):
        for name in sorted(names):
          path = os.path.join(folder, name)
          if not name.endswith('.py') or os.path.realpath(path) == _DOOR:
            continue
          relative = os.path.relpath(path, ROOT)
          offences.extend('%s:%d %s' % (relative, line, what) for line, what in _Offences(path))
    self.assertEqual(offences, [], 'private TensorFlow APIs used outside tensorpipe/tf_internals.py')

  def testTheCheckSeesAnImportAndAnAttribute(self):
    with tempfile.TemporaryDirectory() as folder:  # Its own file, whoever else runs this test.
      path = os.path.join(folder, 'tf_internals_probe.py')
      with open(path, 'w') as f:
        f.write('from tensorflow.python.ops import nn_ops\nimport tensorflow.core\n'
                'def F(op, ops):\n  op._add_control_inputs(ops)\n')
      self.assertEqual(_Offences(path), [(1, 'tensorflow.python.ops'), (2, 'tensorflow.core'),
                                         (4, '_add_control_inputs')])

  def testTheCheckSeesAttributeStringsAndFunctionGraphInternals(self):
    with tempfile.TemporaryDirectory() as folder:
      path = os.path.join(folder, 'tf_internals_probe.py')
      with open(path, 'w') as f:
        f.write('def F(tf, g, layer, attrs):\n'
                '  tf.function(g, experimental_attributes={\'_noinline\': True})\n'
                '  attrs[\'_nospecialize\'] = True\n'
                '  x = dict(_XlaCompile=True)\n'
                '  s = getattr(layer, \'_private_scope\', None)\n'
                '  o = g.outer_graph\n'
                '  c = g.internal_captures\n'
                '  k = getattr(self, \'_runner_member\', None)\n'
                '  d = {\'__name__\': 1, \'public\': 2}\n'
                '  t = dict(__module__=__name__)\n'
                '  p = getattr(g, \'captures\', [])\n'
                '  n = getattr(g, \'name\', None)\n')
      self.assertEqual(_Offences(path),
                       [(2, "'_noinline'"), (3, "'_nospecialize'"),
                        (4, "'_XlaCompile'"), (5, "'_private_scope'"), (6, 'outer_graph'),
                        (7, 'internal_captures'), (11, "'captures'")])


if __name__ == '__main__':
  unittest.main()
