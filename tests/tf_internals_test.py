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
# Private attributes of TensorFlow objects that tf_internals wraps; nothing else may touch them.
_PRIVATE_ATTRIBUTES = frozenset([
    '_add_function_recursive', '_get_function', '_attr_scope', '_add_control_inputs',
    '_update_input', '_is_stateful', 'gradient_registry'])


def _Offences(path):
  """(line, what) of each private TensorFlow import or attribute used in the file at `path`."""
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
      continue
    found.extend((node.lineno, name) for name in names
                 if name.startswith(('tensorflow.python', 'tensorflow.core')))
  return found


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
          offences.extend('%s:%d %s' % (os.path.relpath(path, ROOT), line, what)
                          for line, what in _Offences(path))
    self.assertEqual(offences, [], 'private TensorFlow APIs used outside tensorpipe/tf_internals.py')

  def testTheCheckSeesAnImportAndAnAttribute(self):
    with tempfile.TemporaryDirectory() as folder:  # Its own file, whoever else runs this test.
      path = os.path.join(folder, 'tf_internals_probe.py')
      with open(path, 'w') as f:
        f.write('from tensorflow.python.ops import nn_ops\nimport tensorflow.core\n'
                'def F(op, ops):\n  op._add_control_inputs(ops)\n')
      self.assertEqual(_Offences(path), [(1, 'tensorflow.python.ops'), (2, 'tensorflow.core'),
                                         (4, '_add_control_inputs')])


if __name__ == '__main__':
  unittest.main()
