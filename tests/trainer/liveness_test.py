"""tensorpipe.trainer.liveness: a lost task is named once its timeout passed, and a task answering
at another task's address is named with the fix (fakes, and real TensorFlow servers); SIGTERM is
seen from a thread while the main thread is busy."""

import os
import signal
import subprocess
import sys
import time

import pytest
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import liveness
from tests import helpers
from tests import server_helpers

_SPEC = {'controller': ['10.0.0.2:7000'], 'trainer_client': ['10.0.0.2:7001'],
         'worker': ['10.0.0.3:7000', '10.0.0.4:7000']}


def _SpecTasks():
  """{address: (job, task)} of _SPEC: the task at each address, as the spec has it."""
  return {address: (job, i) for job, addresses in _SPEC.items()
          for i, address in enumerate(addresses)}


class _FakeNetwork:
  """Addresses that accept connections (`up`) on a clock that moves by `tick` per attempt; the task
  that answers at each address is `tasks[address]` (None: it gives no answer to GetStatus)."""

  def __init__(self, up, tick=1.0, tasks=None):
    self.up = set(up)
    self.now = 0.0
    self.tick = tick
    self.tasks = _SpecTasks() if tasks is None else tasks
    self.asked = []  # Addresses asked which task they are, in order.

  def Connect(self, address, unused_timeout_s):
    self.now += self.tick
    return (True, '') if address in self.up else (False, 'timed out')

  def Identify(self, address, unused_timeout_s):
    self.asked.append(address)
    task = self.tasks.get(address)
    return (task, '') if task else (None, 'no answer within 2 s')

  def Clock(self):
    return self.now


class _Stop:
  """A threading.Event stand-in that is set after `rounds` waits (and never sleeps)."""

  def __init__(self, rounds):
    self.rounds = rounds

  def wait(self, unused_seconds):
    self.rounds -= 1
    return self.rounds < 0


class PeerWatchTest(test_utils.TestCase):

  def _Watch(self, net, job='trainer_client', task=0):
    return liveness.PeerWatch(_SPEC, job, task, startup_timeout_s=100, lost_timeout_s=10,
                              connect=net.Connect, clock=net.Clock, identify=net.Identify)

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

  def testATaskAtAnotherTasksAddressIsNamedWithTheFix(self):
    # The two worker hosts were given each other's --task.
    net = _FakeNetwork(sum(_SPEC.values(), []),
                       tasks=dict(_SpecTasks(), **{'10.0.0.3:7000': ('worker', 1),
                                                   '10.0.0.4:7000': ('worker', 0)}))
    watch = self._Watch(net)
    self.assertIsNone(watch.Check())  # Every task answers: none is lost ...
    self.assertEqual(  # ... but the first address of the spec's order answered by another task:
        watch.WrongTask(),
        '--cluster_spec puts task worker:0 at 10.0.0.3:7000, but the task answering there is '
        'worker:1 (started with --job=worker --task=1); start on each host the task the spec puts '
        'at its address (each job\'s addresses in --cluster_spec are in task order): --job=worker '
        '--task=0 at 10.0.0.3:7000')

  def testATaskIsAskedWhoItIsUntilItSays(self):
    net = _FakeNetwork(sum(_SPEC.values(), []), tasks={})  # No task answers GetStatus yet.
    watch = self._Watch(net)
    self.assertIsNone(watch.Check())
    self.assertEqual(net.asked, ['10.0.0.2:7000', '10.0.0.3:7000', '10.0.0.4:7000'])
    net.tasks = _SpecTasks()
    for _ in range(3):
      self.assertIsNone(watch.Check())
    # Asked again at their next answer, then never again once known.
    self.assertEqual(net.asked, ['10.0.0.2:7000', '10.0.0.3:7000', '10.0.0.4:7000'] * 2)
    self.assertIsNone(watch.WrongTask())

  def testRunEndsAtAWrongTaskOrALostOne(self):
    net = _FakeNetwork(sum(_SPEC.values(), []),
                       tasks=dict(_SpecTasks(), **{'10.0.0.2:7000': ('worker', 0)}))
    found = []
    self._Watch(net).Run(lambda m: found.append(('lost', m)),
                         lambda m: found.append(('wrong', m)), _Stop(rounds=10))
    self.assertLen(found, 1)
    self.assertEqual(found[0][0], 'wrong')
    self.assertStartsWith(found[0][1], '--cluster_spec puts task controller:0 at 10.0.0.2:7000, '
                          'but the task answering there is worker:0')
    net = _FakeNetwork(['10.0.0.2:7000', '10.0.0.3:7000'])  # Worker 1 never answers.
    found = []
    self._Watch(net).Run(lambda m: found.append(('lost', m)),
                         lambda m: found.append(('wrong', m)), _Stop(rounds=1000))
    self.assertEqual(found, [('lost', "task worker:1 at 10.0.0.4:7000 never answered within 100 s "
                                      "of this task's start (timed out)")])

  def testSilentNamesTheTasksThatGiveNoStatusInTheSpecsOrder(self):
    peers = liveness.Peers(_SPEC, 'trainer_client', 0)
    self.assertEqual(peers, [('controller', 0, '10.0.0.2:7000'), ('worker', 0, '10.0.0.3:7000'),
                             ('worker', 1, '10.0.0.4:7000')])
    answers = {'10.0.0.2:7000': (['/job:controller/replica:0/task:0/device:CPU:0'], ''),
               '10.0.0.3:7000': (None, 'no answer within 5 s'),
               '10.0.0.4:7000': (None, 'UNAVAILABLE: Connection refused')}
    self.assertEqual(liveness.Silent(peers, 5, status=lambda a, unused_timeout: answers[a]),
                     ['worker:0 at 10.0.0.3:7000 (no answer within 5 s)',
                      'worker:1 at 10.0.0.4:7000 (UNAVAILABLE: Connection refused)'])
    self.assertEqual(liveness.Silent([], 5), [])

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
    self.assertEqual(liveness.DeviceNames(address, 1.0), (None, 'no answer within 1 s'))
    proc.send_signal(signal.SIGCONT)
    self.assertEqual(liveness.Answers(address, 30.0), (True, ''))
    # It answers, but not TensorFlow's worker service: it cannot say which task it is.
    self.assertEqual(liveness.TaskAt(address, 30.0), (None, 'it is no TensorFlow server'))

  def testARefusedConnectionSaysSoAtOnce(self):
    ok, why = liveness.Answers('127.0.0.1:1', 30.0)
    self.assertFalse(ok)
    self.assertIn('refused', why.lower())


class TaskAtTest(test_utils.TestCase):
  """Real TensorFlow servers on 127.0.0.1 say which task they are; PeerWatch names one that is not
  the task the spec puts at its address."""

  @pytest.mark.slow  # Two TensorFlow processes.
  def testAServerStartedAsAnotherTaskIsNamed(self):
    # Ports held (with SO_REUSEADDR, not listening) for the whole test: the servers bind them, no
    # other process can. The spec of the job: worker 0 at A, worker 1 at B.
    with helpers.HeldPorts(2, reuse=(0, 1)) as ports:
      a, b = ['127.0.0.1:%d' % port for port in ports]
      server_helpers.StartTfServer(self, {'worker': [a, b]}, 'worker', 0)  # Worker 0, right.
      # The host of worker 1 was started with --task=0. TensorFlow binds the port of its task's
      # address on every interface, so on its own host it listens at B while it is task 0; on
      # this one host, a spec that puts task 0 at B's port does the same.
      server_helpers.StartTfServer(self, {'worker': [b, a]}, 'worker', 0)
      self.assertEqual(liveness.TaskAt(a, 30.0), (('worker', 0), ''))
      self.assertEqual(liveness.TaskAt(b, 30.0), (('worker', 0), ''))
      names, why = liveness.DeviceNames(a, 30.0)
      self.assertEqual((names, why), (['/job:worker/replica:0/task:0/device:CPU:0',
                                       '/job:worker/replica:0/task:0/device:CPU:1'], ''))
      watch = liveness.PeerWatch({'worker': [a, b]}, 'controller', 0, startup_timeout_s=60,
                                 lost_timeout_s=60)
      self.assertIsNone(watch.Check())
      self.assertEqual(
          watch.WrongTask(),
          '--cluster_spec puts task worker:1 at %s, but the task answering there is worker:0 '
          '(started with --job=worker --task=0); start on each host the task the spec puts at its '
          'address (each job\'s addresses in --cluster_spec are in task order): --job=worker '
          '--task=1 at %s' % (b, b))
      self.assertEqual(liveness.Silent(liveness.Peers({'worker': [a, b]}, 'controller', 0), 30.0),
                       [])


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
