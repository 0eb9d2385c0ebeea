"""Byte sizes: formatted for reports, parsed from flags, bad sizes named in the error."""

from lingvo.core import test_utils

from tensorpipe import units


class UnitsTest(test_utils.TestCase):

  def testFormat(self):
    self.assertEqual(units.FormatBytes(512), '512 B')
    self.assertEqual(units.FormatBytes(12 * 2**10), '12.00 KiB')
    self.assertEqual(units.FormatBytes(1.5 * 2**30), '1.50 GiB')

  def testParse(self):
    self.assertEqual(units.ParseBytes('1.5GiB'), 1.5 * 2**30)
    self.assertEqual(units.ParseBytes('500MB'), 500e6)
    self.assertEqual(units.ParseBytes(' 8 kib '), 8 * 2**10)
    self.assertEqual(units.ParseBytes('1e9'), 1e9)

  def testBadSizesAreNamed(self):
    for text in ('lots', '8 parsecs', '1.2.3GB', ''):
      with self.assertRaisesRegex(ValueError, 'memory budget %r is not a size' % text):
        units.ParseBytes(text)


if __name__ == '__main__':
  test_utils.main()
