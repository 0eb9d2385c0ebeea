"""Per-graph state: made once per graph on first use, apart between graphs, gone with its graph."""

import gc
import unittest
import weakref

from lingvo import compat as tf

from tensorpipe import per_graph

_MADE = []


def _Make():
  """A value that refers to its graph (a tensor of it), as TensorPipe's per-graph values do."""
  _MADE.append(1)
  return {'constant': tf.constant(1.0)}


_STATE = per_graph.PerGraph('per_graph_test', _Make)


class PerGraphTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    del _MADE[:]

  def testMadeOncePerGraphOnFirstUse(self):
    a, b = tf.Graph(), tf.Graph()
    self.assertIsNone(_STATE.Peek(a))
    with a.as_default():
      first = _STATE.Of(a)
      self.assertIs(_STATE.Of(a), first)
    self.assertIs(_STATE.Peek(a), first)
    self.assertIs(first['constant'].graph, a)
    self.assertIsNone(_STATE.Peek(b))
    with b.as_default():
      self.assertIsNot(_STATE.Of(b), first)
    self.assertEqual(len(_MADE), 2)

  def testGoesWithItsGraph(self):
    graph = tf.Graph()
    with graph.as_default():
      _STATE.Of(graph)
    gone = weakref.ref(graph)
    del graph
    gc.collect()
    self.assertIsNone(gone())

  def testRefusesASecondStateOfOneName(self):
    with self.assertRaisesRegex(ValueError, "PerGraph 'per_graph_test' exists already"):
      per_graph.PerGraph('per_graph_test', dict)


if __name__ == '__main__':
  unittest.main()
