"""The line a job ended with, recorded in its --logdir so that every task of the job ends with it.

A job of several processes (a --cluster_spec job: controller, trainer client, workers) must end as a
whole, and every task with the line that says what went wrong: a TensorPipe check that failed
inside a step, a step that did not finish within --step_timeout_s, a task at another task's
address. Without it the other tasks would end later with a line that misleads ("task
trainer_client:0 stopped answering"), or not at all. The task that ends the job writes its line to
LOGDIR/tensorpipe_job_failure.txt (`Record`), a directory every task of the job shares; the others
read it every second (`Recorded`) and end with it (tensorpipe.trainer.cluster_task). A record
written before the reading process started is an earlier run's and counts for nothing: the reader
passes its own start (`ProcessStart`), not the time it got round to reading, since a task that
starts slowly may find the record of a failure that happened while it was still starting.
"""

import os
import time
from typing import Optional

FILE = 'tensorpipe_job_failure.txt'
# A record up to this much older than the reader's start still counts (clocks of hosts sharing
# the logdir may differ a little); ProcessStart itself reads up to a second early.
_MARGIN_S = 1.0


def ProcessStart() -> float:
  """When this process started, in seconds since the epoch (time.time()'s clock): from Linux's
  /proc; elsewhere, now."""
  try:
    with open('/proc/self/stat', encoding='ascii') as f:
      # Field 22, after the command name in parentheses (which may hold spaces): clock ticks
      # between the boot and the start of this process.
      ticks = int(f.read().rsplit(')', 1)[1].split()[19])
    with open('/proc/stat', encoding='ascii') as f:
      boot = next(int(line.split()[1]) for line in f if line.startswith('btime '))
    return boot + ticks / os.sysconf('SC_CLK_TCK')
  except (OSError, ValueError, IndexError, StopIteration):
    return time.time()


def Record(logdir: str, line: str) -> None:
  """Writes `line`, the line the job ends with, to `logdir` (raises OSError if it cannot)."""
  with open(os.path.join(logdir, FILE), 'w', encoding='utf-8') as f:
    f.write(line + '\n')


def Recorded(logdir: str, since: float) -> Optional[str]:
  """The line recorded in `logdir` by a task that ended the job at or after `since` (the reader's
  ProcessStart), or None: no record, an earlier run's, or one that cannot be read."""
  path = os.path.join(logdir, FILE)
  try:
    if os.path.getmtime(path) < since - _MARGIN_S:
      return None  # An earlier run's.
    with open(path, encoding='utf-8') as f:
      return f.read().strip() or None
  except OSError:
    return None
