"""Progress lines of a long job that runs in phases (the planner's measurements and search).

A phase says what it does when it starts (with how many items and, if known, an estimate), then
at most one line every `interval` seconds while it runs (items done, seconds so far, about how many
are left), and one line when it ends: a few lines per phase, not one per item. Lines go to a
`write` function (a tool's stderr, the trainer's log); the clock can be replaced (tests use a
fake one).

  progress = Progress(lambda line: print(line, file=sys.stderr))
  with progress.Phase('measuring 16 layers', 16, estimate=12.0) as phase:
    for layer in layers:
      ...
      phase.Step()
"""

import time
from typing import Any, Callable, Optional


def Seconds(seconds: float) -> str:
  """'40 ms', '0.4 s', '12 s', '3 min 05 s': a duration for a progress line."""
  if seconds < 0.1:
    return '%.0f ms' % (seconds * 1e3)
  if seconds < 10:
    return '%.1f s' % seconds
  if seconds < 100:
    return '%.0f s' % seconds
  return '%d min %02d s' % divmod(int(round(seconds)), 60)


class Phase:
  """One phase of a Progress: counts items done and reports (see Progress.Phase)."""

  def __init__(self, progress: 'Progress', what: str, total: int,
               estimate: Optional[float] = None):
    self._progress = progress
    self.what = what
    self.total = total
    self.done = 0
    self.start = progress.clock()
    self._last = self.start
    self._ended = False
    line = '%s: %d to do' % (what, total) if total else what
    if estimate is not None:
      line += ', about %s' % Seconds(estimate)
    progress.write(line)

  def Elapsed(self) -> float:
    return self._progress.clock() - self.start

  def Step(self, count: int = 1) -> None:
    """`count` more items done; a line if `interval` seconds have passed since the last one."""
    self.done += count
    now = self._progress.clock()
    if now - self._last < self._progress.interval:
      return
    self._last = now
    elapsed = now - self.start
    if self.total:
      line = '%s: %d of %d done, %s' % (self.what, self.done, self.total, Seconds(elapsed))
    else:
      line = '%s: %d done, %s' % (self.what, self.done, Seconds(elapsed))
    if 0 < self.done < self.total:
      line += ', about %s left' % Seconds(elapsed / self.done * (self.total - self.done))
    self._progress.write(line)

  def End(self, note: str = '') -> None:
    """The phase's last line (once): its time, and `note` (what it found, what it skipped)."""
    if self._ended:
      return
    self._ended = True
    line = '%s: done in %s' % (self.what, Seconds(self.Elapsed()))
    self._progress.write(line + ('; ' + note if note else ''))

  def __enter__(self) -> 'Phase':
    return self

  def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
    if exc_type is None:
      self.End()


class Progress:
  """Writes the phases' lines with `write`; `interval`: seconds between a phase's periodic lines;
  `clock`: seconds (time.monotonic)."""

  def __init__(self, write: Callable[[str], None], interval: float = 10.0,
               clock: Callable[[], float] = time.monotonic):
    self.write = write
    self.interval = interval
    self.clock = clock

  def Phase(self, what: str, total: int = 0, estimate: Optional[float] = None) -> Phase:
    """Starts a phase of `total` items (0: not counted) taking about `estimate` seconds."""
    return Phase(self, what, total, estimate)

  def Say(self, line: str) -> None:
    """One line on its own (a decision, a skipped step)."""
    self.write(line)


QUIET = Progress(lambda line: None)  # No lines: the default of library functions.
