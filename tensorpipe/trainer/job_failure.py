"""The line a job ended with, recorded in its --logdir so that every task of the job ends with it.

A job of several processes (a --cluster_spec job: controller, trainer client, workers) must end as a
whole, and every task with the line that says what went wrong: a TensorPipe check that failed
inside a step, a step that did not finish within --step_timeout_s, a task at another task's
address. Without it the other tasks would end later with a line that misleads ("task
trainer_client:0 stopped answering"), or not at all. The task that ends the job writes its line to
LOGDIR/tensorpipe_job_failure.txt (`Record`), a directory every task of the job shares; the others
read it every second (`Records.Line`) and end with it (tensorpipe.trainer.cluster_task).

The same commands started again must not end at once with the line of the run they follow, even
when a scheduler starts them within a second of that run's end. A task tells its run's record from
an earlier one's in two ways (`Records`):
  1. The record as the task first finds it (its file's identity: every Record writes a new file)
     is an earlier run's if it was written before the process started (`ProcessStart`, to the
     kernel's clock tick). A record of a failure that happened while the task was still starting
     counts: the task compares with its start, not with the time it got round to looking.
  2. Any record written after that first look counts, whatever the clocks of the hosts that share
     the logdir say.
"""

import os
import socket
import time
from typing import Optional, Tuple

FILE = 'tensorpipe_job_failure.txt'


def ProcessStart() -> float:
  """When this process started, in seconds since the epoch (time.time()'s clock), to the clock
  tick (it may read up to 1/SC_CLK_TCK s early): from Linux's /proc; elsewhere, now."""
  try:
    with open('/proc/self/stat', encoding='ascii') as f:
      # Field 22, after the command name in parentheses (which may hold spaces): clock ticks
      # between the boot and the start of this process, on CLOCK_BOOTTIME.
      ticks = int(f.read().rsplit(')', 1)[1].split()[19])
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot + ticks / os.sysconf('SC_CLK_TCK')
  except (OSError, ValueError, IndexError, AttributeError):
    return time.time()


def Record(logdir: str, line: str) -> None:
  """Writes `line`, the line the job ends with, to `logdir` (raises OSError if it cannot): as a new
  file that replaces the old one whole, so a reader finds the old record or the new, never part of
  one."""
  path = os.path.join(logdir, FILE)
  # Tasks on several hosts may record at once, with the same pid (e.g. each in a container).
  partial = '%s.%s.%d.partial' % (path, socket.gethostname(), os.getpid())
  try:
    with open(partial, 'w', encoding='utf-8') as f:
      f.write(line + '\n')
    os.replace(partial, path)
  except BaseException:
    if os.path.exists(partial):
      os.unlink(partial)
    raise


_Identity = Tuple[int, int, int, int]  # (device, inode, mtime in ns, size) of the record's file.


def _FileIdentity(path: str) -> Optional[_Identity]:
  try:
    st = os.stat(path)
  except OSError:
    return None
  return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


class Records:
  """The records of `logdir` as one task of a job reads them: the line its own run's tasks record,
  and not an earlier run's (see the module docstring). Constructing it is the first look.

  Args:
    logdir: the job's --logdir.
    since: when this process started (ProcessStart).
  """

  def __init__(self, logdir: str, since: float):
    self.logdir = logdir
    self._path = os.path.join(logdir, FILE)
    self._since = since
    self._first = _FileIdentity(self._path)

  def Line(self) -> Optional[str]:
    """The line recorded by a task of this run, or None: no record, an earlier run's (rule 1 of
    the module docstring), an empty one, or one that cannot be read."""
    identity = _FileIdentity(self._path)
    if identity is None:
      return None
    if identity == self._first and identity[2] / 1e9 < self._since:
      return None  # There at the first look, and written before this process started.
    try:
      with open(self._path, encoding='utf-8') as f:
        return f.read().strip() or None
    except OSError:
      return None
