"""The installed commands: `tensorpipe-train` and `tensorpipe-launch`, each exactly its module run
with `python -m`.

A console script imports its entry point and calls it, so the module it names is not `__main__`.
absl's `--help` prints `__main__`'s docstring and the key flags of the module `sys.argv[0]` names:
called from a console script, the trainer's help would be one usage line. Each command here runs
its module as `python -m` does (`runpy`, with `sys.argv[0]` the module's file), so the help, the
flags and the exit status are the same whichever way it is started.
"""

import runpy


def _RunAsMain(module):
  # The module ends with sys.exit(status): SystemExit carries the status to the console script.
  runpy.run_module(module, run_name='__main__', alter_sys=True)


def Train():
  """tensorpipe-train: python -m tensorpipe.trainer.train."""
  _RunAsMain('tensorpipe.trainer.train')


def Launch():
  """tensorpipe-launch: python -m tensorpipe.trainer.launch."""
  _RunAsMain('tensorpipe.trainer.launch')
