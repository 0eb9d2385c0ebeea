"""A bound on how long the global step may stay put: a training step that hangs is named.

Every task of a job can answer the others (tensorpipe.trainer.liveness) while the trainer's step
waits without end: a deadlocked op, an input that never yields, a step waiting on a task that is
alive but never sends. TensorFlow bounds none of them and Lingvo's trainer waits forever.
`StepWatchdog` gives the trainer a bound: the trainer reports the global step before every step
(`Observe`, from Lingvo's `_ShouldStop`), and `Check` returns a `Stall` once the global step has
not moved for `timeout_s` seconds. Time spent saving or restoring a checkpoint does not count
(`NotCounting`, `Excluded`): a save of a large model to a slow file system is not a hung step. The
first step of a run also builds and starts the graph on every task (graph optimisation, function
instantiation), so it gets `FIRST_STEP_FACTOR` times the bound. `LoopWatch` runs the watchdog
beside a Lingvo training loop, and `StallLine` words the error the trainer ends the job with.

The clock is injected (`clock`), so tests decide every outcome with a fake one.
"""

import contextlib
import dataclasses
import functools
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence

FIRST_STEP_FACTOR = 3  # The first step of a run gets this many times the bound.
POLL_S = 1.0  # Seconds between two checks of the watching thread.


@dataclasses.dataclass(frozen=True)
class Stall:
  """A step that did not finish within its bound.

  Attributes:
    global_step: the global step that stayed put; the step waited on is global_step + 1.
    bound_s: the bound that passed (FIRST_STEP_FACTOR x timeout_s for the run's first step).
    timeout_s: the user's bound (--step_timeout_s).
    first: whether it is the first step of this run (no step finished since the watch began).
    restarts: how many times the trainer started the step again (after errors it retries).
  """
  global_step: int
  bound_s: float
  timeout_s: float
  first: bool
  restarts: int


class StepWatchdog:
  """Whether the global step stays put longer than its bound; see the module docstring.

  Args:
    timeout_s: the bound, seconds (> 0).
    clock: seconds, monotonic (a fake one in tests).
  """

  def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic):
    if timeout_s <= 0:
      raise ValueError('timeout_s must be positive, got %r' % (timeout_s,))
    self._timeout_s = timeout_s
    self._clock = clock
    self._lock = threading.Lock()
    self._step: Optional[int] = None  # The last global step observed; None: not armed.
    self._since = 0.0  # When the global step last moved (or the watch began), pauses excluded.
    self._first = True
    self._restarts = 0
    self._paused = 0  # Depth of NotCounting blocks.
    self._pause_start = 0.0
    self._stopped = False

  def Observe(self, global_step: int) -> None:
    """The trainer is about to run the step after `global_step`. The first call arms the watch;
    a call with the same global step as the last one means the trainer started the step again
    (its loop restarted after an error)."""
    with self._lock:
      if self._step is None:
        self._step, self._since = global_step, self._clock()
      elif global_step != self._step:
        self._step, self._since = global_step, self._clock()
        self._first, self._restarts = False, 0
      else:
        self._restarts += 1

  def Stop(self) -> None:
    """Training ended: no more checks fire."""
    with self._lock:
      self._stopped = True

  @contextlib.contextmanager
  def NotCounting(self) -> Iterator[None]:
    """A block (a checkpoint save or restore) whose time does not count towards the bound."""
    with self._lock:
      if not self._paused:
        self._pause_start = self._clock()
      self._paused += 1
    try:
      yield
    finally:
      with self._lock:
        self._paused -= 1
        if not self._paused:
          self._since += self._clock() - self._pause_start

  def Excluded(self, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` (e.g. a checkpointer's Save), called with the same arguments and returning the
    same value, its time not counting towards the bound."""

    @functools.wraps(function)
    def Wrapped(*args, **kwargs):
      with self.NotCounting():
        return function(*args, **kwargs)

    return Wrapped

  def Check(self) -> Optional[Stall]:
    """The stall, if the global step has stayed put longer than its bound (outside saves and
    restores) since it last moved; else None (also before the first Observe and after Stop)."""
    with self._lock:
      if self._step is None or self._stopped or self._paused:
        return None
      bound = self._timeout_s * (FIRST_STEP_FACTOR if self._first else 1)
      if self._clock() - self._since <= bound:
        return None
      return Stall(global_step=self._step, bound_s=bound, timeout_s=self._timeout_s,
                   first=self._first, restarts=self._restarts)

  def Run(self, on_stall: Callable[[Stall], bool], stop: threading.Event,
          poll_s: float = POLL_S) -> None:
    """Calls Check every `poll_s` seconds until `stop` is set, and `on_stall(stall)` for a stall;
    returns once on_stall returns True (it ended the job)."""
    while not stop.wait(poll_s):
      stall = self.Check()
      if stall and on_stall(stall):
        return


class LoopWatch:
  """The watchdog of one training loop, as a Lingvo Trainer uses it (runners.WatchedSteps).

  Only the thread that runs the loop (`LoopStarts`) is observed: Lingvo's enqueue loops call the
  same `_ShouldStop` from threads of their own, with other steps. The first observed step starts
  the watching thread, which calls `on_stall` (see StepWatchdog.Run); `Stop` ends the watch when
  training ends. `ExcludeFrom` leaves a checkpointer's saves and restores out of the bound.

  Args:
    timeout_s: the bound (> 0); clock: as StepWatchdog's.
    on_stall: called with a Stall from the watching thread; returns True if it ended the job.
    spawn: runs its argument in a new daemon thread (tests pass one that does not).
  """

  def __init__(self, timeout_s: float, on_stall: Callable[[Stall], bool],
               clock: Callable[[], float] = time.monotonic,
               spawn: Optional[Callable[[Callable[[], None]], None]] = None):
    self.watchdog = StepWatchdog(timeout_s, clock)
    self._on_stall = on_stall
    self._spawn = spawn or _Spawn
    self._loop_thread: Optional[int] = None
    self._started = False
    self._stop = threading.Event()

  def ExcludeFrom(self, obj: Any, names: Sequence[str]) -> None:
    """Replaces the methods `names` of `obj` that it has (a checkpointer's Save, Restore, ...) with
    ones that run them unchanged, their time not counting (StepWatchdog.Excluded)."""
    for name in names:
      if hasattr(obj, name):
        setattr(obj, name, self.watchdog.Excluded(getattr(obj, name)))

  def LoopStarts(self) -> None:
    """Called by the training loop's thread as the loop (re)starts."""
    self._loop_thread = threading.get_ident()

  def Observe(self, global_step: int) -> bool:
    """From the training loop's thread: StepWatchdog.Observe, and the watching thread starts if it
    has not. Returns False (and does nothing) from any other thread."""
    if threading.get_ident() != self._loop_thread:
      return False
    self.watchdog.Observe(global_step)
    if not self._started and not self._stop.is_set():
      self._started = True
      self._spawn(lambda: self.watchdog.Run(self._on_stall, self._stop))
    return True

  def Stop(self) -> None:
    """Training ended: no stall is reported any more, and the watching thread ends."""
    self.watchdog.Stop()
    self._stop.set()


def _Spawn(target: Callable[[], None]) -> None:
  threading.Thread(target=target, daemon=True, name='tensorpipe-step-watchdog').start()


_RAISE = ('raise --step_timeout_s if steps of this model really take that long (0 turns the bound '
          'off)')
_RESTART = ('start every task of the job again with the same commands to resume from the last '
            'checkpoint')


def StallLine(stall: Stall, silent: Optional[Sequence[str]], probe_timeout_s: float) -> str:
  """The one line the trainer ends the job with for `stall`.

  Args:
    stall: what Check returned.
    silent: the other tasks of the job that gave no answer to a status request within
      `probe_timeout_s`, each as 'JOB:TASK at HOST:PORT (why)'; [] if every one answered; None
      for a job of one process.
    probe_timeout_s: the deadline of those requests.
  """
  step = stall.global_step + 1
  notes = []
  if stall.first:
    line = ('the first step of this run, step %d, did not finish within %d x --step_timeout_s=%g '
            '= %g s' % (step, FIRST_STEP_FACTOR, stall.timeout_s, stall.bound_s))
    notes.append('a run\'s first step also starts the graph')
  else:
    line = 'training step %d did not finish within --step_timeout_s=%g s' % (step, stall.timeout_s)
  notes.append('the global step stayed at %d, checkpoint saves and restores not counted' %
               stall.global_step)
  if stall.restarts:
    notes.append('the trainer started the step again %d time%s after errors: see this task\'s log'
                 % (stall.restarts, '' if stall.restarts == 1 else 's'))
  line += ' (%s): ' % '; '.join(notes)
  if silent is None:
    return line + ('the step is stuck inside TensorFlow in this process (e.g. a deadlocked op or '
                   'an input that never yields); look at the log for the cause, or %s' % _RAISE)
  if not silent:
    return line + ('every task of the job answers a status request within %g s, so the step '
                   'itself is stuck inside TensorFlow (e.g. a deadlocked op, an input that never '
                   'yields, or a task that waits for another); look at the tasks\' logs for the '
                   'cause, or %s' % (probe_timeout_s, _RAISE))
  if len(silent) == 1:
    return line + ('task %s does not answer a status request, and the step waits for it; look at '
                   'its log and its host, then %s' % (silent[0], _RESTART))
  return line + ('tasks %s do not answer a status request, and the step waits for them; look at '
                 'their logs and hosts, then %s' % (', '.join(silent), _RESTART))
