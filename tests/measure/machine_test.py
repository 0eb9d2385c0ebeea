"""machine: the line every benchmark prints, from TensorFlow's own answer about its CPU kernels."""

import os
import subprocess
import sys

from lingvo.core import test_utils

from tensorpipe.measure import machine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _LineIn(onednn_opts):
  """machine.Line() of a new process with TF_ENABLE_ONEDNN_OPTS set to `onednn_opts`."""
  env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn_opts, TF_CPP_MIN_LOG_LEVEL='3')
  out = subprocess.run(
      [sys.executable, '-c', 'from tensorpipe.measure import machine; print(machine.Line())'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True)
  return out.stdout.strip().splitlines()[-1]


class MachineTest(test_utils.TestCase):

  def testTheLineSaysWhichKernelsAndWhy(self):
    m = machine.Machine(cpu='AMD EPYC 9B14', cores=2, avx512=True, onednn=True,
                        onednn_opts='unset', tensorflow='2.13.1')
    self.assertEqual(machine.Line(m), 'machine: CPU AMD EPYC 9B14, 2 cores, AVX-512; TensorFlow '
                     '2.13.1 with its oneDNN kernels (TF_ENABLE_ONEDNN_OPTS unset: the default '
                     'on this CPU)')
    m = machine.Machine(cpu='Intel Xeon', cores=1, avx512=False, onednn=False,
                        onednn_opts='0', tensorflow='2.13.1')
    self.assertEqual(machine.Line(m), 'machine: CPU Intel Xeon, 1 core, no AVX-512; TensorFlow '
                     '2.13.1 with its Eigen kernels (oneDNN off) (TF_ENABLE_ONEDNN_OPTS=0)')
    self.assertNotEqual(machine.Key(m), machine.Key(machine.Machine(
        cpu='Intel Xeon', cores=1, avx512=False, onednn=True, onednn_opts='1',
        tensorflow='2.13.1')))

  def testTensorFlowsAnswerFollowsTheEnvironment(self):
    # Whatever this CPU has: 0 turns oneDNN off and 1 on.
    self.assertIn('with its Eigen kernels (oneDNN off) (TF_ENABLE_ONEDNN_OPTS=0)', _LineIn('0'))
    self.assertIn('with its oneDNN kernels (TF_ENABLE_ONEDNN_OPTS=1)', _LineIn('1'))

  def testThisMachine(self):
    m = machine.This()
    self.assertGreaterEqual(m.cores, 1)
    self.assertNotEmpty(m.cpu)
    self.assertEqual(m.onednn_opts, os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset'))


if __name__ == '__main__':
  test_utils.main()
