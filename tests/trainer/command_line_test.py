"""tensorpipe.trainer.command_line: a command's flags and positional arguments, parsed by absl with
one-line errors (exit status 2), help with status 0."""

import os
import re
import subprocess
import sys

from absl import flags
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import command_line
from tests import helpers

# A command as the tools are written: a flag, one positional argument, main printing both.
_COMMAND = r'''
"""Prints its report and --rows."""
import sys
from absl import flags
from absl import logging
from tensorpipe.trainer import command_line
flags.DEFINE_integer('rows', 20, 'Table rows.', lower_bound=0)
def main(argv):
  print(argv[1:], flags.FLAGS.rows)
  logging.info('an info line')
  logging.warning('a warning line')
  return 0
command_line.Run(main, 'demo', args=('stack|models',), known_only=sys.argv.pop(1) == 'known')
'''


def _Run(mode, *args):
  """(exit status, stdout, stderr less logged lines) of _COMMAND with `args`; `mode`: 'known'
  parses known_only."""
  code, out, err = _RunLogged(mode, *args)
  return code, out, ''.join(line for line in err.splitlines(True)
                            if not line.rstrip().endswith(('an info line', 'a warning line')))


def _RunLogged(mode, *args):
  """(exit status, stdout, stderr) of _COMMAND with `args`."""
  proc = subprocess.run([sys.executable, '-c', _COMMAND, mode] + list(args), capture_output=True,
                        text=True, timeout=120, check=False, cwd=helpers.REPO,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
  return proc.returncode, proc.stdout, proc.stderr


class CommandLineTest(test_utils.TestCase):

  def testFlagsAndPositionalArgumentsReachMain(self):
    self.assertEqual(_Run('all', 'stack', '--rows', '3'), (0, "['stack'] 3\n", ''))
    self.assertEqual(_Run('all', '--rows=0', 'models'), (0, "['models'] 0\n", ''))

  def testLoggingStaysAtWarningUnlessVerbositySaysOtherwise(self):
    code, _, err = _RunLogged('all', 'stack')
    self.assertEqual(code, 0, err)
    self.assertIn('a warning line', err)
    self.assertNotIn('an info line', err)
    code, _, err = _RunLogged('all', 'stack', '--v=0')
    self.assertEqual(code, 0, err)
    self.assertIn('an info line', err)

  def testABadCommandLineIsOneLineWithStatus2(self):
    for args, line in [
        (['stack', '--rows=-1'], 'flag --rows=-1: -1 is not a non-negative integer (see --helpfull)'),
        (['stack', '--rows=many'],
         "flag --rows=many: invalid literal for int() with base 10: 'many' (see --helpfull)"),
        (['stack', '--colums=2'], "Unknown command line flag 'colums' (see --helpfull)"),
        ([], 'takes 1 positional argument, stack|models (got: none); see --help'),
        (['stack', 'models'],
         'takes 1 positional argument, stack|models (got: stack models); see --help')]:
      self.assertEqual(_Run('all', *args), (2, '', 'demo: error: %s\n' % line))

  def testHelpPrintsTheFlagsAndExitsWith0(self):
    for mode in ('all', 'known'):
      for flag in ('--help', '--helpshort', '--helpfull'):
        code, out, err = _Run(mode, flag)
        self.assertEqual((code, err), (0, ''), (mode, flag))
        self.assertTrue(out.startswith('Prints its report and --rows.'), out)
        self.assertRegex(out, r'\n  --rows: Table rows.')

  def testPositiveIntsAcceptsCommaSeparatedIntegersOfAtLeast1(self):
    self.assertTrue(command_line.PositiveInts(['1', '2', '16']))
    self.assertTrue(command_line.PositiveInts([]))
    for values in (['0'], ['1', 'two'], ['-4'], ['1.5']):
      self.assertFalse(command_line.PositiveInts(values), values)

  def testWritableDirMakesTheDirectoryOrNamesWhyNot(self):
    made = os.path.join(self.create_tempdir().full_path, 'a', 'b')
    self.assertTrue(command_line.WritableDir(made))
    self.assertTrue(os.path.isdir(made))
    self.assertTrue(command_line.WritableDir(None))  # Not given.
    blocker = os.path.join(made, 'file')
    open(blocker, 'w').close()
    with self.assertRaisesRegex(flags.ValidationError,
                                r"^'%s' cannot hold the outputs \(Not a directory\); give a "
                                r'directory you can write$' % re.escape(blocker + '/x')):
      command_line.WritableDir(blocker + '/x')

  def testKnownOnlyReturnsUnknownFlagsToMain(self):
    self.assertEqual(_Run('known', '--colums=2', '--rows=4', 'x', 'y'),
                     (0, "['--colums=2', 'x', 'y'] 4\n", ''))
    code, _, err = _Run('known', '--rows=x')
    self.assertEqual(code, 2)
    self.assertRegex(err, r'\Ademo: error: flag --rows=x: invalid literal .*\n\Z')


if __name__ == '__main__':
  tf.test.main()
