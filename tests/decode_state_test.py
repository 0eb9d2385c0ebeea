"""Decoding states: which entries keep state, their batch axes, and reordering by rows."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import decode_state


class _Stateless(base_layer.BaseLayer):

  def FProp(self, theta, x):
    return x


class _Extends(_Stateless):
  """Time-major states [T, B, N] and a step counter without a batch axis."""

  def InitStates(self, theta, batch_size, max_length, context=None):
    states = py_utils.NestedMap(key=tf.zeros([max_length, batch_size, 3]), steps=tf.zeros([2]))
    if context is not None:
      states.memory = context * 2.0
    return states

  def ExtendStep(self, theta, x, states, t):
    return x, states


class _InitOnly(_Stateless):

  def InitStates(self, theta, batch_size, max_length):
    return py_utils.NestedMap()


class _Wraps(_Stateless):

  def __init__(self, params):
    super().__init__(params)
    self.CreateChildren('inner', [_Stateless.Params(), _Extends.Params()])


class DecodeStateTest(test_utils.TestCase):

  def testWhichEntriesDecodeAndWhichAreRefused(self):
    with tf.Graph().as_default():
      stateless = _Stateless.Params().Set(name='plain').Instantiate()
      extends = _Extends.Params().Set(name='ext').Instantiate()
      init_only = _InitOnly.Params().Set(name='half').Instantiate()
      wraps = _Wraps.Params().Set(name='wrap').Instantiate()
    self.assertTrue(decode_state.Decodes(extends, 'FProp'))
    self.assertFalse(decode_state.Decodes(extends, 'Other'))  # A SharedLayer's other method.
    self.assertFalse(decode_state.Decodes(stateless, 'FProp'))
    for layer in (stateless, extends):
      decode_state.Check(layer, 'FProp', 'e', 0, 'pipe')
    decode_state.Check(wraps, 'Other', 'e', 0, 'pipe')
    with self.assertRaisesRegex(ValueError, r"pipe: layer 'e' \(a _InitOnly, in partition 2\) has "
                                r"InitStates but no ExtendStep, so a decode step cannot run it"):
      decode_state.Check(init_only, 'FProp', 'e', 2, 'pipe')
    with self.assertRaisesRegex(ValueError, r"layer 'w' \(a _Wraps, in partition 1\) keeps state "
                                r"between positions \(its sublayer 'w/inner\[1\]', a _Extends, has "
                                r"InitStates\) but has no ExtendStep.*Give _Wraps both InitStates"):
      decode_state.Check(wraps, 'FProp', 'w', 1, 'pipe')

  def testBatchAxesAddNoOp(self):
    with tf.Graph().as_default() as g:
      layer = _Extends.Params().Set(name='ext').Instantiate()
      context = tf.zeros([4, 7])
      init = lambda size, piece: layer.InitStates(layer.theta, size, 9, piece)
      before = len(g.get_operations())
      axes = decode_state.BatchAxes(init, context, 0, 'ext')
      self.assertLen(g.get_operations(), before)
      self.assertEqual(decode_state.Bytes(init(4, context)), 4 * (9 * 4 * 3 + 2 + 4 * 7))
      merged = lambda size, piece: py_utils.NestedMap(x=tf.zeros([2 * size, 3]))
      with self.assertRaisesRegex(ValueError, r'ext: a decoding state of shape \[6, 3\] for 3 '
                                  r'examples has no axis of its own for the examples'):
        decode_state.BatchAxes(merged, None, 0, 'ext')
    self.assertEqual(axes, py_utils.NestedMap(key=1, steps=None, memory=0))

  def testReorderGathersRowsAcrossMicroBatches(self):
    rng = np.random.RandomState(0)
    whole = rng.normal(size=[6, 5, 2]).astype(np.float32)  # Batch axis 1.
    sizes = [2, 2, 1]
    rows = np.array([4, 4, 0, 1, 3], np.int32)
    with tf.Graph().as_default(), self.session() as sess:
      pieces = np.split(whole, np.cumsum(sizes)[:-1], axis=1)
      states = [{'e': py_utils.NestedMap(key=tf.constant(p), steps=tf.constant([1.0, 2.0]))}
                for p in pieces]
      axes = {'e': py_utils.NestedMap(key=1, steps=None)}
      out = sess.run(decode_state.Reorder(states, axes, tf.constant(rows), sizes))
      alone = sess.run(decode_state.Reorder(states[:1], axes, tf.constant([1, 1]), [2]))
    self.assertAllEqual(np.concatenate([o['e'].key for o in out], axis=1), whole[:, rows])
    for o in out:
      self.assertAllEqual(o['e'].steps, [1.0, 2.0])
    self.assertAllEqual(alone[0]['e'].key, whole[:, [1, 1]])


if __name__ == '__main__':
  test_utils.main()
