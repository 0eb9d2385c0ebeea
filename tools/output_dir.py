"""The tools' --out_dir: made (with its parents) and checked writable while the flags are parsed.

A tool that runs for minutes must not fail on its output directory at the end, nor with a raw
traceback. A tool defines --out_dir with absl and registers `Writable` as its validator:

  flags.DEFINE_string('out_dir', None, 'Folder for ..., created if missing.')
  flags.register_validator('out_dir', output_dir.Writable)

so a bad path ends the tool at once with the one-line flag error of
tensorpipe.trainer.command_line, naming the path, why it cannot hold the outputs and what to give.
"""

import os
import tempfile

from absl import flags


def Writable(path):
  """True once `path` exists (created if missing) and a file can be made in it; also for None (no
  --out_dir given). Raises flags.ValidationError naming the path and why otherwise."""
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
