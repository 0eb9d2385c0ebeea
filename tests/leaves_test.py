"""leaves: structures with None leaves to flat tensor lists and back."""

from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import leaves


class LeavesTest(test_utils.TestCase):

  def testRoundTrip(self):
    a, b, c = tf.constant(1.0), tf.constant(2.0), tf.constant(3.0)
    structure = (a, None, py_utils.NestedMap(x=b, y=None, z=(c,)))
    present = leaves.Present(structure)
    self.assertEqual(present, [a, b, c])
    d, e, f = tf.constant(4.0), tf.constant(5.0), tf.constant(6.0)
    filled = leaves.Fill(structure, [d, e, f])
    self.assertIs(filled[0], d)
    self.assertIsNone(filled[1])
    self.assertIs(filled[2].x, e)
    self.assertIsNone(filled[2].y)
    self.assertIs(filled[2].z[0], f)
    self.assertEqual(leaves.Fill(structure, [d, e, f], flat=True), [d, None, e, None, f])

  def testSpread(self):
    self.assertEqual(leaves.Spread(['a', 'b'], [False, True, True]), [None, 'a', 'b'])
    self.assertEqual(leaves.Present([None, 'a', None]), ['a'])

  def testCountMismatchIsNamed(self):
    with self.assertRaisesRegex(ValueError, 'Spread: 1 values for a mask with 2 places'):
      leaves.Spread(['a'], [True, False, True])
    with self.assertRaisesRegex(ValueError, 'Spread: 3 values for a mask with 2 places'):
      leaves.Fill((1, None, 2), [1, 2, 3])


if __name__ == '__main__':
  test_utils.main()
