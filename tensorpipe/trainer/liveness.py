"""Tasks of a multi-host job that notice a lost peer, and a preemption that keeps the current step.

A job started with --cluster_spec runs one process per task (controller, trainer client, workers),
usually on separate hosts. TensorFlow's distributed runtime does not bound a step that waits on a
task whose host is gone (a cut network leaves the step's RPC waiting for TCP, for many minutes), and
Lingvo's runners retry a failed step without end. `PeerWatch` gives each task a bound instead: it
asks every other task of the job for an answer every `poll_s` seconds (`Answers`: a TCP connection,
then gRPC's handshake, which only a running process completes: the kernel accepts connections for
a process that is stopped, swapping or hung as well), and reports a task that stopped answering for
`lost_timeout_s` seconds (or never did within `startup_timeout_s`). The trainer then ends the
process with one line naming the task and its address, so that after any fault every task of the
job ends by itself, and starting the same commands again resumes from the last checkpoint.

`Preemption` turns SIGTERM (what a scheduler sends before it takes a host away) into an event seen
by a thread of its own: Python runs signal handlers only in the main thread, which a worker spends
inside TensorFlow's server.join() and the trainer inside session calls. The trainer client then
saves a checkpoint of its current step before it ends (see tensorpipe.trainer.train).
"""

import signal
import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

import grpc

POLL_S = 1.0  # Seconds between two rounds of connection attempts.


def CanConnect(address: str, timeout_s: float) -> Tuple[bool, str]:
  """(True, '') if `address` (HOST:PORT) accepts a TCP connection within `timeout_s`, else (False,
  why)."""
  host, _, port = address.rpartition(':')
  try:
    with socket.create_connection((host, int(port)), timeout=timeout_s):
      return True, ''
  except (OSError, ValueError) as e:
    return False, str(e) or type(e).__name__


def Answers(address: str, timeout_s: float) -> Tuple[bool, str]:
  """(True, '') if the process at `address` (HOST:PORT) answers within `timeout_s`, else (False,
  why): first a TCP connection (a refusal or an unreachable host says so at once), then gRPC's
  HTTP/2 handshake, which the TensorFlow server's own threads must complete."""
  ok, why = CanConnect(address, timeout_s)
  if not ok:
    return ok, why
  # A channel of its own: gRPC shares connections between channels to an address by default, and
  # a connection made before the process stopped would answer for it.
  channel = grpc.insecure_channel(address, options=[('grpc.use_local_subchannel_pool', 1)])
  try:
    grpc.channel_ready_future(channel).result(timeout=timeout_s)
    return True, ''
  except grpc.FutureTimeoutError:
    return False, ('it accepts connections but gives no gRPC answer within %g s: the process is '
                   'stopped or hung' % timeout_s)
  finally:
    channel.close()


class PeerWatch:
  """Which other task of a job stopped answering; see the module docstring.

  Args:
    spec: {job: [HOST:PORT, ...]}, the parsed --cluster_spec.
    job, task: this process's task (not watched).
    startup_timeout_s: how long a task that never answered yet may take to start.
    lost_timeout_s: how long a task that answered before may stop answering.
    ignore: jobs not watched (e.g. those whose end is expected).
    connect: (address, timeout_s) -> (ok, why), default Answers; clock: seconds (fakes in tests).
  """

  def __init__(self, spec: Dict[str, List[str]], job: str, task: int, startup_timeout_s: float,
               lost_timeout_s: float,
               connect: Callable[[str, float], Tuple[bool, str]] = Answers,
               clock: Callable[[], float] = time.monotonic):
    self._peers = [(j, i, address) for j, addresses in sorted(spec.items())
                   for i, address in enumerate(addresses) if (j, i) != (job, task)]
    self._startup_timeout_s = startup_timeout_s
    self._lost_timeout_s = lost_timeout_s
    self._connect = connect
    self._clock = clock
    self._start = clock()
    self._last_answer = {}
    self.ignore = set()

  def Check(self) -> Optional[str]:
    """Tries every watched task once; returns why a task counts as lost, or None.

    Of several lost tasks it names the one silent longest: when a task ends because it lost
    another, the tasks that watch both still name the first.
    """
    lost = []
    for job, task, address in self._peers:
      if job in self.ignore:
        continue
      ok, why = self._connect(address, min(2.0, self._lost_timeout_s))
      now = self._clock()
      if ok:
        self._last_answer[(job, task)] = now
      elif (job, task) in self._last_answer:
        silence = now - self._last_answer[(job, task)]
        if silence > self._lost_timeout_s:
          lost.append((silence, 'task %s:%d at %s stopped answering: no answer for %d s (%s)' %
                       (job, task, address, self._lost_timeout_s, why)))
      elif now - self._start > self._startup_timeout_s:
        lost.append((now - self._start, 'task %s:%d at %s never answered within %d s of this '
                     'task\'s start (%s)' % (job, task, address, self._startup_timeout_s, why)))
    return max(lost)[1] if lost else None

  def Answered(self, job: str) -> bool:
    """Whether every task of `job` answered at least once."""
    tasks = [(j, i) for j, i, _ in self._peers if j == job]
    return all(t in self._last_answer for t in tasks)

  def Unreachable(self, job: str) -> Optional[str]:
    """'JOB:TASK at ADDRESS (why)' of the first task of `job` that does not answer now."""
    for j, task, address in self._peers:
      if j == job:
        ok, why = self._connect(address, min(2.0, self._lost_timeout_s))
        if not ok:
          return '%s:%d at %s (%s)' % (j, task, address, why)
    return None

  def Gone(self, job: str) -> bool:
    """Whether no task of `job` answers now."""
    return not any(self._connect(a, min(2.0, self._lost_timeout_s))[0]
                   for j, _, a in self._peers if j == job)

  def Run(self, on_lost: Callable[[str], None], stop: threading.Event, poll_s: float = POLL_S):
    """Calls Check every `poll_s` seconds until `stop` is set; calls `on_lost(message)` once."""
    while not stop.wait(poll_s):
      message = self.Check()
      if message:
        on_lost(message)
        return


class Preemption:
  """SIGTERM as an event, seen by a thread of its own (see the module docstring).

  Install() (from the main thread) gives SIGTERM a Python handler that does nothing, so the signal
  no longer ends the process, and makes Python's C-level handler, which runs in whichever thread
  the signal hits, write the signal's number to a socket; a daemon thread reads it, sets `received`
  and calls `on_sigterm`.
  """

  def __init__(self):
    self.received = threading.Event()
    self._sockets = None

  def Install(self, on_sigterm: Callable[[], None]):
    """From the main thread: from now on SIGTERM calls `on_sigterm` (once) in a thread."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    self._sockets = (reader, writer)  # Kept open for the life of the process.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)

    def Wait():
      while reader.recv(1) != bytes([signal.SIGTERM]):
        pass  # Another signal with a Python handler (e.g. SIGINT): not ours.
      self.received.set()
      on_sigterm()

    threading.Thread(target=Wait, name='tensorpipe-sigterm', daemon=True).start()
