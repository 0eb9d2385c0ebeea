"""absl flags for TensorPipe's commands (tensorpipe-launch and the tools under tools/), parsed so
that a bad command line ends the command with one line.

Each command defines its flags at module level with absl.flags and runs `Run(main, prog)`, i.e.
absl.app.run with `FlagsParser` as its flags_parser: `--help` prints the module's docstring and its
own flags, `--helpfull` every flag (absl's too, and Lingvo's where the command imports Lingvo),
both with exit status 0 (absl's own is 1: help asked for is no error; see `ParseArgv`), and an
unknown flag, a bad value or a missing required flag prints

  PROG: error: flag --NAME=VALUE: WHAT (see --helpfull)

on stderr and exits with status 2, as argparse did for these commands (absl's own parser prints
two lines and exits with 1); so does a wrong number of positional arguments. Logging stays at
WARNING unless --v (--verbosity) is given.

A flag that names an output directory registers `WritableDir` as its validator, so a bad path ends
the command at once with that line, not after minutes of work or in a raw traceback.
"""

import os
import sys
import tempfile
import types

from absl import app
from absl import flags

ERROR_EXIT_CODE = 2


def Fail(prog, message):
  """Ends the command with the line `PROG: error: MESSAGE` and exit status 2."""
  sys.stderr.write('%s: error: %s\n' % (prog, message))
  sys.stderr.flush()
  sys.exit(ERROR_EXIT_CODE)


def FirstLine(error):
  """The first line of an exception's text (absl's flag errors may add hints below it)."""
  lines = str(error).strip().splitlines()
  return lines[0] if lines else type(error).__name__


def Args():
  """The parsed flags' values as a namespace of their own (args.NAME), which a command may fill in
  further (e.g. a default that depends on another flag) without changing FLAGS."""
  return types.SimpleNamespace(**flags.FLAGS.flag_values_dict())


def PositiveInts(values):
  """Validator of a DEFINE_list flag whose items are integers >= 1 (e.g. --devices=1,2,4)."""
  try:
    return all(int(v) >= 1 for v in values)
  except ValueError:
    return False


def WritableDir(path):
  """Validator of a directory flag: True once `path` exists (made with its parents if missing) and
  a file can be made in it, and for None (not given); raises flags.ValidationError naming the path
  and why otherwise."""
  if path is None:
    return True
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError as e:
    raise flags.ValidationError(
        '%r cannot hold the outputs (%s); give a directory you can write' %
        (path, e.strerror or e)) from e
  return True


def ParseArgv(argv, known_only=False):
  """flags.FLAGS(argv): the arguments no flag took, program name first.

  absl's help flags (--help, --helpshort, --helpfull, --helpxml) print and then exit with status
  1; here they exit with 0, so that `COMMAND --help && ...` works. Nothing else in parsing exits
  (a bad flag raises flags.Error).
  """
  try:
    return flags.FLAGS(list(argv), known_only=known_only)
  except SystemExit as e:
    if e.code == 1:
      sys.exit(0)
    raise


def FlagsParser(prog, args=(), known_only=False):
  """A flags_parser for absl.app.run: parses absl's FLAGS from argv (program name first).

  Returns [program name] + the positional arguments, which main(argv) receives. `args`: the usage
  names of the positional arguments the command takes (e.g. ('stack|models',)); a command line with
  another number of them ends the command. With `known_only`, flags no module defines are returned
  among the positional arguments instead of ending the command (the launcher passes them on), and
  their number is not checked.
  """

  def Parse(argv):
    try:
      rest = ParseArgv(argv, known_only)
    except flags.Error as e:
      Fail(prog, '%s (see --helpfull)' % FirstLine(e))
    if not flags.FLAGS['verbosity'].present:
      # Logging stays at WARNING, as before absl parsed the flags (app.run would lower it to INFO
      # and Lingvo's INFO lines would bury the command's own output); --v=0 shows them.
      flags.FLAGS.verbosity = -1
    if not known_only and len(rest) - 1 != len(args):
      given = ' '.join(rest[1:]) or 'none'
      if args:
        Fail(prog, 'takes %d positional argument%s, %s (got: %s); see --help' %
             (len(args), '' if len(args) == 1 else 's', ' '.join(args), given))
      Fail(prog, 'takes no positional arguments (got: %s); flags are spelled --name=value' % given)
    return rest

  return Parse


def Run(main, prog, args=(), known_only=False, argv=None):
  """absl.app.run(main) with FlagsParser(prog, args, known_only); exits with main's status."""
  app.run(main, argv=argv, flags_parser=FlagsParser(prog, args, known_only))
