"""The tools' --out_dir: made (with its parents) and checked writable while the arguments are read.

A tool that runs for minutes must not fail on its output directory at the end, nor with a raw
traceback: `Writable` is an argparse `type`, so a bad path ends the tool at once with argparse's
one-line usage error naming the path and why.
"""

import argparse
import os
import tempfile


def Writable(path: str) -> str:
  """`path`, created if missing; argparse.ArgumentTypeError if it cannot be made or written."""
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError as e:
    raise argparse.ArgumentTypeError(
        '%r cannot hold the outputs (%s); give a directory you can write' %
        (path, e.strerror or e)) from e
  return path
