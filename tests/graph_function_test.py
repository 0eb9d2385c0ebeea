"""Graph functions: signatures as named groups; traced once, called many times, never re-traced."""

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe import graph_function

SHAPE = [2, 3]
_SPEC = tf.TensorSpec(SHAPE, tf.float32)


def _Signature():
  """x: one tensor; w: a tensor and an absent argument; empty: no arguments."""
  return graph_function.Signature.Of([('x', [_SPEC]), ('w', [_SPEC, None]), ('empty', [])])


class SignatureTest(test_utils.TestCase):

  def testFlattenThenUnflattenGivesTheGroupsBack(self):
    sig = _Signature()
    x, w = object(), object()
    flat = sig.Flatten({'x': [x], 'w': [w, None], 'empty': []}, 'here')
    self.assertLen(flat, 2)
    self.assertIs(flat[0], x)
    self.assertIs(flat[1], w)
    groups = sig.Unflatten(flat)
    self.assertEqual(list(groups), ['x', 'w', 'empty'])  # In the signature's order.
    self.assertIs(groups['x'][0], x)
    self.assertIs(groups['w'][0], w)
    self.assertIsNone(groups['w'][1])
    self.assertEqual(groups['empty'], [])
    self.assertEqual(sig.specs, [_SPEC, _SPEC])  # The present arguments only.

  def testOfValuesHasNoneAtAbsentArguments(self):
    with tf.Graph().as_default():
      a, b = tf.zeros([4], tf.int32), tf.ones(SHAPE)
      sig = graph_function.Signature.OfValues({'b': [b, None], 'a': [a]})
    self.assertEqual(sig.groups, (('b', (_SPEC, None)), ('a', (tf.TensorSpec([4], tf.int32),))))
    self.assertEqual(sig.specs, [_SPEC, tf.TensorSpec([4], tf.int32)])
    self.assertEqual(sig, graph_function.Signature.Of([('b', [_SPEC, None]),
                                                       ('a', [tf.TensorSpec([4], tf.int32)])]))

  def testFlattenRefusesADifferentPresenceNamingTheGroup(self):
    sig = _Signature()
    with self.assertRaisesRegex(AssertionError, r"here: group 'w' has tensors at \[True, True\], "
                                r'the function at \[True, False\]'):
      sig.Flatten({'x': [1], 'w': [2, 3], 'empty': []}, 'here')
    with self.assertRaisesRegex(AssertionError, r"there: group 'x' has tensors at \[False\]"):
      sig.Flatten({'x': [None], 'w': [2, None], 'empty': []}, 'there')

  def testFlattenRefusesAMissingOrExtraGroupNamingIt(self):
    sig = _Signature()
    with self.assertRaisesRegex(AssertionError, r"here: got groups \['empty', 'x'\] for .*'w'"):
      sig.Flatten({'x': [1], 'empty': []}, 'here')
    with self.assertRaisesRegex(AssertionError, r"here: got groups \['empty', 'extra', 'w', 'x'\]"):
      sig.Flatten({'x': [1], 'w': [2, None], 'empty': [], 'extra': [3]}, 'here')


def _LibraryNames(graph):
  return [f.signature.name for f in graph.as_graph_def().library.function]


class GraphFunctionTest(test_utils.TestCase):

  def _Trace(self, scale):
    """y = x * w * scale (`scale` captured from the outer graph), and an absent output."""

    def Body(groups):
      x, = groups['x']
      w, absent = groups['w']
      assert absent is None, absent
      return {'y': [x * w * scale, None]}, ('facts', x.shape.as_list())

    return graph_function.GraphFunction.Trace('mul', Body, _Signature(), '/device:CPU:0')

  def testTracedOnceCalledTwice(self):
    graph = tf.Graph()
    with graph.as_default():
      scale = tf.placeholder(tf.float32, [])  # Captured: read at each call, not at the trace.
      x = tf.placeholder(tf.float32, [None, 3])
      fn = self._Trace(scale)
      self.assertEqual(fn.facts, ('facts', SHAPE))
      self.assertEqual(fn.outputs, graph_function.Signature.Of([('y', [_SPEC, None])]))
      self.assertLen(fn.captured_inputs, 1)
      self.assertIs(fn.captured_inputs[0], scale)
      before = _LibraryNames(graph)
      w = tf.fill(SHAPE, 2.0)
      out1, op1 = fn.Call({'x': [tf.ensure_shape(x, SHAPE)], 'w': [w, None], 'empty': []}, 'c1')
      out2, op2 = fn.Call({'x': [w], 'w': [w, None], 'empty': []}, 'c2')
      added = [name for name in _LibraryNames(graph) if name not in before]
      self.assertLen(added, 1)  # One function for both calls.
      self.assertEqual({op1.get_attr('f').name, op2.get_attr('f').name}, set(added))
      definition, = [f for f in graph.as_graph_def().library.function
                     if f.signature.name == added[0]]
      self.assertTrue(definition.attr['_noinline'].b)
      self.assertTrue(definition.attr['_nospecialize'].b)
      for op, out in ((op1, out1), (op2, out2)):
        self.assertTrue(op.get_attr('_disable_call_shape_inference'))
        self.assertEqual(list(out), ['y'])
        self.assertLen(out['y'], 2)
        self.assertIs(out['y'][0], op.outputs[0])
        self.assertIsNone(out['y'][1])
        self.assertLen(op.outputs, 1)
        self.assertEqual(out['y'][0].shape.as_list(), SHAPE)  # From the trace.
        self.assertIs(op.inputs[len(op.inputs) - 1], scale)  # Captures after the arguments.
      with self.session(graph=graph) as sess:
        y1, y2 = sess.run([out1['y'][0], out2['y'][0]], {x: [[1, 2, 3], [4, 5, 6]], scale: 3.0})
    self.assertAllEqual(y1, [[6, 12, 18], [24, 30, 36]])
    self.assertAllEqual(y2, [[12] * 3] * 2)

  def testCallRefusesArgumentsNotMatchingTheSignature(self):
    with tf.Graph().as_default():
      fn = self._Trace(tf.constant(1.0))
      w = tf.ones(SHAPE)
      with self.assertRaisesRegex(AssertionError, "call1: group 'w' has tensors at"):
        fn.Call({'x': [w], 'w': [w, w], 'empty': []}, 'call1')

  def testCallDifferentiableGivesTheAnalyticGradient(self):
    graph = tf.Graph()
    with graph.as_default():
      fn = self._Trace(tf.constant(3.0))
      x = tf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
      w = tf.constant([[0.5, -1.0, 2.0], [1.0, 0.0, -3.0]])
      out, op = fn.CallDifferentiable({'x': [x], 'w': [w, None], 'empty': []}, 'diff')
      self.assertIsNone(out['y'][1])
      self.assertIs(out['y'][0].op, op)
      dy = tf.constant([[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0]])
      dx, dw = tf.gradients(out['y'][0], [x, w], grad_ys=dy)
      with self.session(graph=graph) as sess:
        y, dx, dw, x, w, dy = sess.run([out['y'][0], dx, dw, x, w, dy])
    self.assertAllClose(y, x * w * 3.0)
    self.assertAllClose(dx, dy * w * 3.0)  # d(x w s)/dx = w s
    self.assertAllClose(dw, dy * x * 3.0)


if __name__ == '__main__':
  tf.test.main()
