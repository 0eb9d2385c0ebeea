"""nested_params.Walk: every Params nested in a Params, with its path."""

from lingvo.core import hyperparams
from lingvo.core import test_utils

from tensorpipe import nested_params


class WalkTest(test_utils.TestCase):

  def testFindsParamsInsideParamsListsTuplesAndDicts(self):
    leaf = lambda: hyperparams.Params()
    outer = hyperparams.Params()
    outer.Define('a', leaf(), '')
    outer.Define('layers', [leaf(), 3, (leaf(),)], '')
    outer.Define('by_name', {'x': leaf()}, '')
    outer.Define('number', 1, '')
    outer.a.Define('inner', leaf(), '')
    paths = [path for path, _ in nested_params.Walk(outer, 'model')]
    self.assertEqual(paths, ['model', 'model.a', 'model.a.inner', 'model.layers[0]',
                             'model.layers[2][0]', "model.by_name['x']"])
    self.assertIs(dict(nested_params.Walk(outer))['a.inner'], outer.a.inner)


if __name__ == '__main__':
  test_utils.main()
