"""tensorpipe.trainer.liveness: a lost task is named once its timeout passed; SIGTERM is seen from a
thread while the main thread is busy."""

import os
import signal
import subprocess
import sys
import time

from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import liveness
from tests import helpers

_SPEC = {'controller': ['10.0.0.2:7000'], 'trainer_client': ['10.0.0.2:7001'],
         'worker': ['10.0.0.3:7000', '10.0.0.4:7000']}


class _FakeNetwork:
  """Addresses that accept connections (`up`) on a clock that moves by `tick` per attempt."""

  def __init__(self, up, tick=1.0):
    self.up = set(up)
    self.now = 0.0
    self.tick = tick

  def Connect(self, address, unused_timeout_s):
    self.now += self.tick
    return (True, '') if address in self.up else (False, 'timed out')

  def Clock(self):
    return self.now


class PeerWatchTest(test_utils.TestCase):

  def _Watch(self, net, job='trainer_client', task=0):
    return liveness.PeerWatch(_SPEC, job, task, startup_timeout_s=100, lost_timeout_s=10,
                              connect=net.Connect, clock=net.Clock)

  @staticmethod
  def _CheckUntilLost(watch, rounds=1000):
    for _ in range(rounds):
      message = watch.Check()
      if message:
        return message
    raise AssertionError('no task lost after %d rounds' % rounds)

  def testATaskThatStopsAnsweringIsNamedAfterTheLostTimeout(self):
    net = _FakeNetwork(sum(_SPEC.values(), []))
    watch = self._Watch(net)
    self.assertIsNone(watch.Check())
    self.assertTrue(watch.Answered('worker'))
    net.up.discard('10.0.0.4:7000')
    message = self._CheckUntilLost(watch)
    # Its last answer came at 3 s; rounds of 3 attempts (1 s each) see it missing at 6, 9, 12 and
    # 15 s: the first round after 10 s without an answer names it.
    self.assertEqual(net.now, 15)
    self.assertEqual(message, 'task worker:1 at 10.0.0.4:7000 stopped answering: no '
                     'answer for 10 s (timed out)')
    self.assertFalse(watch.Gone('worker'))  # worker:0 still answers.
    self.assertEqual(watch.Unreachable('worker'), 'worker:1 at 10.0.0.4:7000 (timed out)')
    self.assertIsNone(watch.Unreachable('controller'))

  def testATaskThatNeverAnsweredIsNamedAfterTheStartupTimeout(self):
    net = _FakeNetwork(['10.0.0.2:7001', '10.0.0.3:7000', '10.0.0.4:7000'])
    watch = self._Watch(net, job='worker', task=0)  # Watches controller, trainer client, worker 1.
    message = self._CheckUntilLost(watch)
    self.assertGreater(net.now, 100)
    self.assertEqual(message, "task controller:0 at 10.0.0.2:7000 never answered within "
                     "100 s of this task's start (timed out)")
    self.assertFalse(watch.Answered('controller'))
    self.assertTrue(watch.Gone('controller'))

  def testOfSeveralLostTasksTheOneSilentLongestIsNamed(self):
    net = _FakeNetwork(sum(_SPEC.values(), []))
    watch = self._Watch(net, job='worker', task=0)  # Controller, trainer client, worker 1.
    self.assertIsNone(watch.Check())
    net.up.discard('10.0.0.4:7000')  # Worker 1 goes first ...
    self.assertIsNone(watch.Check())
    self.assertIsNone(watch.Check())
    net.up.discard('10.0.0.2:7001')  # ... then the trainer client, which watched it.
    messages = [watch.Check() for _ in range(5)]
    self.assertTrue(all(m is None or m.startswith('task worker:1 at') for m in messages),
                    messages)
    self.assertTrue(messages[-1], messages)

  def testIgnoredJobsAreNotWatched(self):
    net = _FakeNetwork(['10.0.0.3:7000', '10.0.0.4:7000'])
    watch = self._Watch(net)
    watch.ignore.add('controller')
    for _ in range(100):
      self.assertIsNone(watch.Check())

  def testAnUnreachableAddressIsNotConnectable(self):
    # Nothing listens on port 1 of loopback.
    ok, why = liveness.CanConnect('127.0.0.1:1', 1.0)
    self.assertFalse(ok)
    self.assertIn('refused', why.lower())


# A gRPC server on a port of its own choosing (it holds it), as a TensorFlow server's threads answer.
_GRPC_SERVER = """
import time
from concurrent import futures
import grpc
server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
port = server.add_insecure_port('127.0.0.1:0')
server.start()
print(port, flush=True)
time.sleep(300)
"""


def _State(pid):
  """The state letter of process `pid` ('T': stopped)."""
  with open('/proc/%d/stat' % pid) as f:
    return f.read().rsplit(')', 1)[1].split()[0]


class AnswersTest(test_utils.TestCase):
  """A process that is stopped (SIGSTOP: a deadlock, a swap storm look the same) still gets its
  TCP connections accepted by the kernel, but gives no gRPC answer."""

  def testAStoppedProcessDoesNotAnswerARunningOneDoes(self):
    proc = subprocess.Popen([sys.executable, '-c', _GRPC_SERVER], stdout=subprocess.PIPE,
                            text=True)
    self.addCleanup(lambda: (proc.kill(), proc.wait(), proc.stdout.close()))
    address = '127.0.0.1:%d' % int(proc.stdout.readline())
    self.assertEqual(liveness.Answers(address, 30.0), (True, ''))
    proc.send_signal(signal.SIGSTOP)
    while _State(proc.pid) != 'T':  # The signal is delivered asynchronously.
      time.sleep(0.01)
    self.assertTrue(liveness.CanConnect(address, 30.0)[0])  # What a TCP check alone would see.
    self.assertEqual(liveness.Answers(address, 1.0),
                     (False, 'it accepts connections but gives no gRPC answer within 1 s: the '
                      'process is stopped or hung'))
    proc.send_signal(signal.SIGCONT)
    self.assertEqual(liveness.Answers(address, 30.0), (True, ''))

  def testARefusedConnectionSaysSoAtOnce(self):
    ok, why = liveness.Answers('127.0.0.1:1', 30.0)
    self.assertFalse(ok)
    self.assertIn('refused', why.lower())


_SIGTERM_CHILD = """
import time
from tensorpipe.trainer import liveness
import os
preemption = liveness.Preemption()
preemption.Install(lambda: (print('SIGTERM seen', flush=True), os._exit(0)))
print('ready', flush=True)
time.sleep(120)
raise SystemExit(1)
"""


class PreemptionTest(test_utils.TestCase):

  def testSigtermReachesTheCallbackAndDoesNotEndTheProcess(self):
    proc = subprocess.Popen([sys.executable, '-c', _SIGTERM_CHILD], cwd=helpers.REPO,
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=helpers.REPO))
    self.addCleanup(lambda: proc.poll() is None and proc.kill())
    self.assertEqual(proc.stdout.readline(), 'ready\n')
    proc.send_signal(signal.SIGTERM)
    self.assertEqual(proc.wait(timeout=60), 0)  # Ended by the callback, not by the signal.
    self.assertEqual(proc.stdout.read(), 'SIGTERM seen\n')
    proc.stdout.close()


if __name__ == '__main__':
  tf.test.main()
