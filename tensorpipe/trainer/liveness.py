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

A TensorFlow server binds its port on every interface, so a process started with another task's
--job/--task (two hosts' flags swapped) listens at the address the spec gives the right task and
answers like it, while every step fails on devices that task does not have. So the first time a
task answers, `PeerWatch` also asks it which task it is (`TaskAt`: the GetStatus request of
TensorFlow's worker service, whose device names carry /job:J/replica:0/task:N) and reports one
that is not the task --cluster_spec puts at that address. The same request, a real one the
server's threads must serve, tells the trainer's step watchdog which tasks still answer
(`Silent`).

`Preemption` turns SIGTERM (what a scheduler sends before it takes a host away) into an event seen
by a thread of its own: Python runs signal handlers only in the main thread, which a worker spends
inside TensorFlow's server.join() and the trainer inside session calls. The trainer client then
saves a checkpoint of its current step before it ends (see tensorpipe.trainer.runners).
"""

from concurrent import futures
import re
import signal
import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import grpc

from tensorpipe import tf_internals

POLL_S = 1.0  # Seconds between two rounds of connection attempts.
STATUS_TIMEOUT_S = 5.0  # How long the step watchdog waits for each task's answer to GetStatus.

Task = Tuple[str, int]  # (job, task index)
_DEVICE_TASK = re.compile(r'^/job:([^/]+)/replica:\d+/task:(\d+)/')


def _Channel(address: str) -> grpc.Channel:
  """A channel of its own to `address`: gRPC shares connections between channels to an address by
  default, and a connection made before the process stopped would answer for it."""
  return grpc.insecure_channel(address, options=[('grpc.use_local_subchannel_pool', 1)])


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
  channel = _Channel(address)
  try:
    grpc.channel_ready_future(channel).result(timeout=timeout_s)
    return True, ''
  except grpc.FutureTimeoutError:
    return False, ('it accepts connections but gives no gRPC answer within %g s: the process is '
                   'stopped or hung' % timeout_s)
  finally:
    channel.close()


def DeviceNames(address: str, timeout_s: float) -> Tuple[Optional[List[str]], str]:
  """(the device names the TensorFlow server at `address` reports, '') if it answers TensorFlow's
  GetStatus request within `timeout_s`, else (None, why)."""
  channel = _Channel(address)
  try:
    return tf_internals.WorkerDeviceNames(channel, timeout_s), ''
  except grpc.RpcError as e:
    code = e.code()  # pylint: disable=no-member  # A failed call's error is a grpc.Call too.
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
      return None, 'no answer within %g s' % timeout_s
    if code == grpc.StatusCode.UNIMPLEMENTED:
      return None, 'it is no TensorFlow server'
    return None, '%s: %s' % (code.name, e.details())  # pylint: disable=no-member
  finally:
    channel.close()


def TaskAt(address: str, timeout_s: float) -> Tuple[Optional[Task], str]:
  """((job, task), '') of the TensorFlow server at `address`, from the names of its devices, else
  (None, why) if it gives no answer within `timeout_s` or names no task."""
  names, why = DeviceNames(address, timeout_s)
  if names is None:
    return None, why
  for name in names:
    m = _DEVICE_TASK.match(name)
    if m:
      return (m.group(1), int(m.group(2))), ''
  return None, 'its devices name no task: %s' % (', '.join(names) or 'none')


def Peers(spec: Dict[str, List[str]], job: str, task: int) -> List[Tuple[str, int, str]]:
  """(job, task, address) of every task of `spec` ({job: [HOST:PORT, ...]}, the parsed
  --cluster_spec) but task `task` of `job`, in job order, then task order."""
  return [(j, i, address) for j, addresses in sorted(spec.items())
          for i, address in enumerate(addresses) if (j, i) != (job, task)]


def Silent(peers: Sequence[Tuple[str, int, str]], timeout_s: float,
           status: Callable[[str, float], Tuple[Optional[List[str]], str]] = DeviceNames
           ) -> List[str]:
  """'JOB:TASK at HOST:PORT (why)' of each of `peers` ((job, task, address), e.g. from Peers) that
  gives no answer to `status` (default: TensorFlow's GetStatus) within `timeout_s`, in the order
  of `peers`; all are asked at once."""
  if not peers:
    return []
  with futures.ThreadPoolExecutor(max_workers=len(peers)) as pool:
    answers = list(pool.map(lambda peer: status(peer[2], timeout_s), peers))
  return ['%s:%d at %s (%s)' % (job, task, address, why)
          for (job, task, address), (names, why) in zip(peers, answers) if names is None]


class PeerWatch:
  """Which other task of a job stopped answering, or is not the task the spec puts at its address;
  see the module docstring.

  Args:
    spec: {job: [HOST:PORT, ...]}, the parsed --cluster_spec.
    job, task: this process's task (not watched).
    startup_timeout_s: how long a task that never answered yet may take to start.
    lost_timeout_s: how long a task that answered before may stop answering.
    ignore: jobs not watched (e.g. those whose end is expected).
    connect: (address, timeout_s) -> (ok, why), default Answers; identify: (address, timeout_s)
      -> ((job, task) or None, why), default TaskAt; clock: seconds (fakes in tests).
  """

  def __init__(self, spec: Dict[str, List[str]], job: str, task: int, startup_timeout_s: float,
               lost_timeout_s: float,
               connect: Callable[[str, float], Tuple[bool, str]] = Answers,
               clock: Callable[[], float] = time.monotonic,
               identify: Callable[[str, float], Tuple[Optional[Task], str]] = TaskAt):
    self._peers = Peers(spec, job, task)
    self._startup_timeout_s = startup_timeout_s
    self._lost_timeout_s = lost_timeout_s
    self._connect = connect
    self._identify = identify
    self._clock = clock
    self._start = clock()
    self._last_answer: Dict[Task, float] = {}
    self._identified: Dict[Task, Task] = {}  # Watched task: the task that answered at its address.
    self.ignore: Set[str] = set()

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
        if (job, task) not in self._identified:
          found, _ = self._identify(address, min(2.0, self._lost_timeout_s))
          if found is not None:  # Else it is asked again at its next answer.
            self._identified[(job, task)] = found
      elif (job, task) in self._last_answer:
        silence = now - self._last_answer[(job, task)]
        if silence > self._lost_timeout_s:
          lost.append((silence, 'task %s:%d at %s stopped answering: no answer for %d s (%s)' %
                       (job, task, address, self._lost_timeout_s, why)))
      elif now - self._start > self._startup_timeout_s:
        lost.append((now - self._start, 'task %s:%d at %s never answered within %d s of this '
                     'task\'s start (%s)' % (job, task, address, self._startup_timeout_s, why)))
    return max(lost)[1] if lost else None

  def WrongTask(self) -> Optional[str]:
    """Why the first watched address answered by another task than the one --cluster_spec puts
    there (in the order of the spec) is wrong, with the fix; None if every task that answered so
    far is the right one."""
    for job, task, address in self._peers:
      found = self._identified.get((job, task))
      if found is not None and found != (job, task):
        return ('--cluster_spec puts task %s:%d at %s, but the task answering there is %s:%d '
                '(started with --job=%s --task=%d); start on each host the task the spec puts at '
                'its address (each job\'s addresses in --cluster_spec are in task order): '
                '--job=%s --task=%d at %s' % (job, task, address, found[0], found[1], found[0],
                                              found[1], job, task, address))
    return None

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

  def Run(self, on_lost: Callable[[str], None], on_wrong_task: Callable[[str], None],
          stop: threading.Event, poll_s: float = POLL_S) -> None:
    """Calls Check every `poll_s` seconds until `stop` is set; calls `on_wrong_task(message)` (see
    WrongTask) or `on_lost(message)` once."""
    while not stop.wait(poll_s):
      message = self.Check()
      wrong = self.WrongTask()
      if wrong:
        on_wrong_task(wrong)
        return
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

  def Install(self, on_sigterm: Callable[[], None]) -> None:
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
