"""Removes what killed checkpoint saves leave in a train directory, never a committed checkpoint.

A save of Lingvo's checkpointer (its own saver, or tf.train.Saver with sharded=True) writes each
task's shard to `ckpt-N_temp/part-*`, merges the shards into `ckpt-N.index` and `ckpt-N.data-*`
(removing `ckpt-N_temp/`), writes `ckpt-N.meta`, and only then commits the checkpoint by naming it
in the `checkpoint` state file. A task killed in between (a preemption, a lost host) leaves
`ckpt-N_temp/` or the files of an uncommitted `ckpt-N` behind for good: nothing restores, evaluates
or garbage-collects them (Lingvo collects only the checkpoints the state file names), and on a
shared file system they pile up with every fault.

`RemoveStale` removes them when the job that saves starts, before it restores: every
`ckpt-N_temp/` directory, and the checkpoint files (`.index`, `.data-*`, `.meta`) of each prefix
`ckpt-N` that the state file does not name and whose step is above that of the newest checkpoint
it names. It never removes the files of a prefix the state file names, nor those of an older
unnamed one (a copy kept on purpose, or one left to the user). Without a readable state file
nothing tells a committed checkpoint from a killed save's, so then only `_temp` directories go.
Only the job that saves calls it (tensorpipe.trainer.train: the trainer client in sync mode, see
CheckpointsBetweenSteps; else the controller): another task could remove the files of a save still
in progress.
"""

import os
import re

import lingvo.compat as tf

_TEMP_DIR = re.compile(r'^ckpt-\d+_temp$')
_CHECKPOINT_FILE = re.compile(r'^(ckpt-(\d+))\.(?:index|meta|data-\d+-of-\d+)$')
_PREFIX = re.compile(r'^ckpt-(\d+)$')


def Committed(train_dir):
  """The checkpoint prefixes (basenames, e.g. 'ckpt-00000180') the state file of `train_dir`
  names, or None without a readable state file."""
  try:
    state = tf.train.get_checkpoint_state(train_dir)  # None if missing or unreadable.
  except ValueError:  # A state file naming no latest checkpoint.
    return None
  if state is None:
    return None
  paths = list(state.all_model_checkpoint_paths) + [state.model_checkpoint_path]
  return {os.path.basename(p) for p in paths if p}


def StaleEntries(train_dir):
  """The names in `train_dir` that RemoveStale removes (see the module docstring), sorted."""
  if not tf.io.gfile.isdir(train_dir):
    return []
  committed = Committed(train_dir)
  steps = [int(m.group(1)) for m in map(_PREFIX.match, committed or ()) if m]
  newest = max(steps) if steps else None
  stale = []
  for name in tf.io.gfile.listdir(train_dir):
    name = name.rstrip('/')  # gfile lists directories with a trailing '/' on some file systems.
    if _TEMP_DIR.match(name):
      if tf.io.gfile.isdir(os.path.join(train_dir, name)):
        stale.append(name)
      continue
    m = _CHECKPOINT_FILE.match(name)
    if (m and newest is not None and m.group(1) not in committed and
        int(m.group(2)) > newest):
      stale.append(name)
  return sorted(stale)


def RemoveStale(train_dir):
  """Removes the `_temp` directories and uncommitted checkpoint files of killed saves from
  `train_dir` and logs one line naming them; returns their names (see the module docstring)."""
  stale = StaleEntries(train_dir)
  for name in stale:
    path = os.path.join(train_dir, name)
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)
    else:
      tf.io.gfile.remove(path)
  if stale:
    latest = tf.train.latest_checkpoint(train_dir)
    tf.logging.info(
        'TensorPipe: removed what killed checkpoint saves left in %s: %s (the committed '
        'checkpoints stay; the latest is %s)', train_dir,
        ', '.join(n + '/' if _TEMP_DIR.match(n) else n for n in stale),
        os.path.basename(latest) if latest else 'none')
  return stale
