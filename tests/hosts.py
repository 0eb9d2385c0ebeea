"""Test hosts on one machine: Linux network namespaces with addresses of their own.

`Hosts(['h0', 'w0', 'w1'])` creates one network namespace per host plus a 'switch' namespace
holding a bridge; each host has an interface eth0 with its own address (10.77.0.2, 10.77.0.3, ...)
on a veth pair whose other end is a port of the bridge. Hosts reach each other by address, as
separate machines on one network segment do, and nothing else: the root namespace (the machine's
own network) is never changed, so the tests cannot disturb it, and two test processes' hosts
(namespace names carry the test process's pid) never see each other even though they use the same
addresses. Inside a host's namespace no other process binds ports, so fixed ports are safe (no
picked-free-then-taken race).

`Run(host, argv, log)` runs a command inside a host (`ip netns exec`), `Cut(host)` takes its link
down (its network drops; its processes keep running), `Restore(host)` brings it back. `Close()`
stops every process started here, by pid (SIGTERM, then SIGKILL), then kills anything else still
inside the namespaces (by pid, from `ip netns pids`) and deletes them by name. It runs on every
exit path (use as a context manager or register it as a cleanup).

Needs root and iproute2 (`ip netns`); `Available()` says whether this machine permits it. A test
helper, not part of the installed package: used by tests/trainer/multihost_test.py and
tools.scale_out (a job's per-host commands across hosts; a testonly Bazel target for that reason).
"""

import os
import signal
import subprocess
import time

SUBNET = '10.77.0.'  # Host i gets SUBNET + str(i + 2); .1 is unused.
_IP_TIMEOUT_S = 30  # Bound on every `ip` command.


def _Ip(*args, check=True):
  return subprocess.run(('ip',) + args, capture_output=True, text=True, timeout=_IP_TIMEOUT_S,
                        check=check)


def Available():
  """(True, '') where network namespaces can be created here, else (False, the reason)."""
  if os.geteuid() != 0:
    return False, 'network namespaces need root (ip netns add); running as uid %d' % os.geteuid()
  name = 'tpprobe%d' % os.getpid()
  try:
    probe = _Ip('netns', 'add', name, check=False)
  except (OSError, subprocess.TimeoutExpired) as e:
    return False, 'ip netns is not usable here: %s' % e
  if probe.returncode:
    return False, 'ip netns add is not permitted here: %s' % probe.stderr.strip()
  _Ip('netns', 'del', name, check=False)
  return True, ''


class Hosts:
  """Network namespaces as hosts on one bridge; see the module docstring."""

  def __init__(self, names):
    self._tag = 'tp%d' % os.getpid()
    self.names = list(names)
    self._switch = '%s-switch' % self._tag
    self._procs = []
    self._created = []
    try:
      self._Create()
    except BaseException:
      self.Close()
      raise

  def Namespace(self, host):
    return '%s-%s' % (self._tag, host)

  def Address(self, host):
    return SUBNET + str(self.names.index(host) + 2)

  def _Create(self):
    for ns in [self._switch] + [self.Namespace(h) for h in self.names]:
      _Ip('netns', 'del', ns, check=False)  # Left over by a killed run of a process with our pid.
      _Ip('netns', 'add', ns)
      self._created.append(ns)
      _Ip('-n', ns, 'link', 'set', 'lo', 'up')
    _Ip('-n', self._switch, 'link', 'add', 'br0', 'type', 'bridge')
    _Ip('-n', self._switch, 'link', 'set', 'br0', 'up')
    for i, host in enumerate(self.names):
      port = 'p%d' % i
      _Ip('-n', self._switch, 'link', 'add', port, 'type', 'veth', 'peer', 'name', 'eth0', 'netns',
          self.Namespace(host))
      _Ip('-n', self._switch, 'link', 'set', port, 'master', 'br0', 'up')
      _Ip('-n', self.Namespace(host), 'addr', 'add', self.Address(host) + '/24', 'dev', 'eth0')
      _Ip('-n', self.Namespace(host), 'link', 'set', 'eth0', 'up')

  def Run(self, host, argv, log_path, env=None):
    """Starts `argv` inside `host`, output appended to `log_path`; returns its Popen."""
    with open(log_path, 'ab') as log:
      # Stopped by Stop or Close, by pid.
      proc = subprocess.Popen(  # pylint: disable=consider-using-with
          ['ip', 'netns', 'exec', self.Namespace(host)] + list(argv), stdout=log,
          stderr=subprocess.STDOUT, env=env, start_new_session=True)
    self._procs.append(proc)
    return proc

  def Cut(self, host):
    """Takes `host`'s link down: nothing reaches it any more, its processes keep running."""
    _Ip('-n', self.Namespace(host), 'link', 'set', 'eth0', 'down')

  def Restore(self, host):
    _Ip('-n', self.Namespace(host), 'link', 'set', 'eth0', 'up')

  @staticmethod
  def Stop(proc, sig=signal.SIGTERM, grace_s=20.0):
    """Sends `sig` to `proc` (by pid) if it runs, SIGKILL after `grace_s`; returns its status."""
    if proc.poll() is None:
      proc.send_signal(sig)
      try:
        proc.wait(timeout=grace_s)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=_IP_TIMEOUT_S)
    return proc.returncode

  def Close(self):
    """Stops every process started here, then anything left in the namespaces; deletes them."""
    for proc in self._procs:
      if proc.poll() is None:
        proc.kill()
    for proc in self._procs:
      try:
        proc.wait(timeout=_IP_TIMEOUT_S)
      except subprocess.TimeoutExpired:
        pass
    for ns in self._created:
      pids = _Ip('netns', 'pids', ns, check=False).stdout.split()
      for pid in pids:
        try:
          os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
          pass
    deadline = time.monotonic() + _IP_TIMEOUT_S
    for ns in reversed(self._created):
      while _Ip('netns', 'del', ns, check=False).returncode and time.monotonic() < deadline:
        time.sleep(0.2)
    self._created = []

  def __enter__(self):
    return self

  def __exit__(self, *unused_exc):
    self.Close()
