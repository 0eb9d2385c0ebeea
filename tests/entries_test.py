"""A pipeline's entries: the state that flows between them, skip connections straight to their
destination, and the errors for bad names and connections."""

import dataclasses
from typing import Any

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe import entries
from tensorpipe import shared_layer
from tests import layer_helpers

# l0 -> l1 -> l2 -> l3 -> l4 -> l5, with l0's output also into l3, l2's into l3, l1's into l5.
_SKIPS = [('l0', 'l3'), ('l2', 'l3'), ('l1', 'l5')]
_PARTITIONS = [['l0', 'l1'], ['l2', 'l3'], ['l4', 'l5']]


@dataclasses.dataclass(frozen=True)
class _Call:
  """What a stand-in child returns: which child ran which method, with what."""
  child: str
  method: str
  theta: Any
  args: tuple


class _Recorder:
  """A stand-in child layer: each method returns the _Call it got."""

  def __init__(self, name):
    self.name = name

  def FProp(self, theta, *args):
    return _Call(self.name, 'FProp', theta, args)

  def Xent(self, theta, *args):
    return _Call(self.name, 'Xent', theta, args)


def _Entries(partitions=None, skips=None, loss_name=None, targets=None):
  partitions = partitions or _PARTITIONS
  names = [name for names in partitions for name in names]
  targets = targets or {name: (name, 'FProp') for name in names}
  return entries.Entries(partitions, targets, skips, loss_name, 'pipe')


def _Children(names):
  return {name: _Recorder(name) for name in names}


def _Run(functions, theta, state):
  for _, fn in functions:
    state = fn(theta, state)
  return state


class StateFlowTest(test_utils.TestCase):

  def testSkipsGoStraightToTheirDestination(self):
    routed = _Entries(skips=_SKIPS)
    self.assertEqual(routed.skips, {'skip000': ('l0', 'l3'), 'skip001': ('l2', 'l3'),
                                    'skip002': ('l1', 'l5')})
    children = _Children(['l%d' % i for i in range(6)])
    theta = {name: 'theta_' + name for name in children}
    outputs = []
    for k, names in enumerate(_PARTITIONS):
      state = routed.PartitionInputs(k, 'x', outputs)
      if k == 1:
        # Partition 1 (l2, l3) gets l1's output and l0's (a skip into l3).
        self.assertEqual(sorted(state[2]), ['skip000'])
      if k == 2:
        # Partition 2 (l4, l5) gets l3's output and l1's: l0's skip does not pass through it.
        self.assertEqual(sorted(state[2]), ['skip002'])
      outputs.append(_Run(routed.LayerFunctions(names, children), theta, state))
    l0 = _Call('l0', 'FProp', 'theta_l0', ('x',))
    l1 = _Call('l1', 'FProp', 'theta_l1', (l0,))
    l2 = _Call('l2', 'FProp', 'theta_l2', (l1,))
    l3 = _Call('l3', 'FProp', 'theta_l3', (l2, l0, l2))  # Its input, then its skips as declared.
    l4 = _Call('l4', 'FProp', 'theta_l4', (l3,))
    self.assertEqual(outputs[0], (l1, None, {'skip000': l0, 'skip002': l1}))
    self.assertEqual(outputs[1], (l3, None, {}))  # l1's skip went straight from partition 0.
    # The pipeline's last entry returns its output alone.
    self.assertEqual(outputs[2], _Call('l5', 'FProp', 'theta_l5', (l4, l1)))

  def testTheLossEntryGetsTheMainValueThenTheLossInputs(self):
    routed = _Entries([['a'], ['loss']], loss_name='loss',
                      targets={'a': ('a', 'FProp'), 'loss': ('tied', 'Xent')})
    children = _Children(['a', 'tied'])
    state = routed.PartitionInputs(0, ('x', ('labels', 'weights')), [])
    self.assertEqual(state, ('x', ('labels', 'weights'), {}))
    first = _Run(routed.LayerFunctions(['a'], children), {'a': 1}, state)
    self.assertEqual(first, (_Call('a', 'FProp', 1, ('x',)), ('labels', 'weights'), {}))
    last = _Run(routed.LayerFunctions(['loss'], children), {'tied': 2},
                routed.PartitionInputs(1, None, [first]))
    self.assertEqual(last, _Call('tied', 'Xent', 2, (first[0], 'labels', 'weights')))

  def testTupleInputsAreArguments(self):
    routed = _Entries([['a', 'b']])
    out = _Run(routed.LayerFunctions(['a', 'b'], _Children(['a', 'b'])), {'a': 0, 'b': 0},
               routed.PartitionInputs(0, ('x', 'y'), []))
    self.assertEqual(out, _Call('b', 'FProp', 0, (_Call('a', 'FProp', 0, ('x', 'y')),)))

  def testThetaNamesAndTargetsOfSharedEntries(self):
    tied = layer_helpers.Dense.Params().Set(name='tied')
    embed = shared_layer.SharedLayer.Params().Set(name='embed', layer=tied, method='FProp')
    self.assertEqual(entries.Target(embed), ('tied', 'FProp', tied))
    own = layer_helpers.Dense.Params().Set(name='own')
    self.assertEqual(entries.Target(own), ('own', 'FProp', own))
    routed = _Entries([['embed', 'own', 'xent']], targets={
        'embed': ('tied', 'Embed'), 'own': ('own', 'FProp'), 'xent': ('tied', 'Xent')})
    self.assertEqual(routed.ThetaNames(['embed', 'own', 'xent']), ['tied', 'own'])
    self.assertEqual(routed.Target('xent'), ('tied', 'Xent'))
    self.assertEqual(routed.PartitionOf('own'), 0)


class BadEntriesTest(test_utils.TestCase):

  def testBadSkipConnections(self):
    cases = [([('l0', 'nope')], "names 'nope', which is not a layer of the pipeline"),
             ([('l3', 'l1')], "goes from 'l3' to a layer that does not come after it"),
             ([('l0', 'l2'), ('l0', 'l2')], 'is declared twice'),
             (['l0'], r"skip_connections\[0\] is 'l0'; each skip connection is a pair")]
    for skips, message in cases:
      with self.assertRaisesRegex(ValueError, '^pipe: .*' + message):
        _Entries(skips=skips)

  def testLossLayerName(self):
    partitions = [layer_helpers.DenseLayers(1), layer_helpers.DenseLayers(2)[1:]]
    with self.assertRaisesRegex(ValueError, "^pipe: loss_layer name 'layer1' is also a layer name"):
      entries.WithLossLayer(partitions, layer_helpers.Dense.Params().Set(name='layer1'), 'pipe')
    with_loss, name = entries.WithLossLayer(partitions, layer_helpers.Dense.Params(), 'pipe')
    self.assertEqual(name, 'loss')
    self.assertEqual([[e.name for e in p] for p in with_loss], [['layer0'], ['layer1', 'loss']])
    self.assertEqual([[e.name for e in p] for p in partitions], [['layer0'], ['layer1']])
    self.assertEqual(entries.WithLossLayer(partitions, None, 'pipe'), (partitions, None))

  def testBadSharing(self):
    tied = layer_helpers.Dense.Params().Set(name='tied')

    def Shared(name, layer):
      return shared_layer.SharedLayer.Params().Set(name=name, layer=layer, method='FProp')

    with self.assertRaisesRegex(ValueError, "SharedLayer 'embed' runs a layer named 'tied', which "
                                'is also the name of a layer of the pipeline'):
      entries.CheckSharedNames([[Shared('embed', tied)], [tied.Copy()]], 'pipe')
    with self.assertRaisesRegex(ValueError, "SharedLayer entries 'embed' and 'xent' run layers "
                                "both named 'tied' but with different Params"):
      entries.CheckSharedNames(
          [[Shared('embed', tied)], [Shared('xent', tied.Copy().Set(dim=9))]], 'pipe')
    with self.assertRaisesRegex(ValueError, "^pipe: SharedLayer 'x' needs `layer`"):
      entries.CheckSharedNames([[shared_layer.SharedLayer.Params().Set(name='x')]], 'pipe')
    entries.CheckSharedNames([[Shared('embed', tied)], [Shared('xent', tied.Copy())]], 'pipe')


if __name__ == '__main__':
  tf.test.main()
