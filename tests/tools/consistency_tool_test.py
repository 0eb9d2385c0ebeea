"""`python -m tools.consistency`, run as a user runs it: the paper's example and a registered model
pass with exit 0, a registered model whose results depend on M fails with exit 1, so does a
time-major batch-norm model with the wrong batch_dim (naming batch_dim), --list_models lists the
models of a user's module, and usage errors are one line with exit 2."""

import os
import re
import tempfile
import textwrap
import unittest
from unittest import mock

import pytest

from tests import helpers
from tests import task_helpers  # pylint: disable=unused-import
# WRONG_MODEL_MODULE imports it in the tool's process (declared here for the Bazel target's
# runfiles).

# A user's params module registering the time-major task of tests/task_helpers.py with
# the wrong batch_dim (0 instead of 1): its micro-batches cut the time axis that a layer mixes.
WRONG_MODEL_MODULE = '''
from lingvo import model_registry
from lingvo.core import base_model_params

from tests.task_helpers import ConstantInput, TimeMajorBatchNormTask, TimeMajorTask


@model_registry.RegisterSingleTaskModel
class TimeMajorWrongBatchDim(base_model_params.SingleTaskModelParams):
  """Time-major layers that mix time steps, split along T."""

  def Train(self):
    return ConstantInput.Params()

  def Task(self):
    return TimeMajorTask(batch_dim=0)


@model_registry.RegisterSingleTaskModel
class TimeMajorBatchNormWrongBatchDim(base_model_params.SingleTaskModelParams):
  """Time-major FC and batch norm, split along T (the batch_dim check off)."""

  def Train(self):
    return ConstantInput.Params()

  def Task(self):
    return TimeMajorBatchNormTask(batch_dim=0)
'''


def _UserModule():
  """The environment of a user whose module tp_consistency_models (WRONG_MODEL_MODULE) is on
  PYTHONPATH."""
  directory = tempfile.mkdtemp()
  with open(os.path.join(directory, 'tp_consistency_models.py'), 'w') as f:
    f.write(textwrap.dedent(WRONG_MODEL_MODULE))
  path = os.pathsep.join([directory, helpers.REPO, os.environ.get('PYTHONPATH', '')])
  return mock.patch.dict(os.environ, {'PYTHONPATH': path})


def _GlobalNorms(out):
  """The global gradient norms of the reference and each variant, from the report's table."""
  row = [l for l in out.splitlines() if l.startswith('global gradient norm (paper)')][0]
  return [float(v) for v in re.findall(r'\d\.\d+e[-+]\d\d', row)]


class ConsistencyToolTest(unittest.TestCase):

  @pytest.mark.slow
  def testPaperExamplePasses(self):
    code, out, err = helpers.RunTool('consistency', '--example=paper')
    self.assertEqual(code, 0, err)
    self.assertIn("the GPipe paper's consistency test", out)
    self.assertIn('K=1 M=8', out)
    self.assertIn('K=4 M=8', out)
    norms = _GlobalNorms(out)
    self.assertEqual(len(norms), 4)  # The reference, then K = 1, 2, 4.
    for norm in norms[1:]:
      self.assertLess(abs(norm - norms[0]) / norms[0], 1e-6, norms)
    self.assertRegex(out.splitlines()[-1], r'^PASS: 3 variant\(s\) agree .* within 1\.0e-06')

  @pytest.mark.slow
  def testRegisteredDigitsModelPasses(self):
    code, out, err = helpers.RunTool('consistency', '--model=digits.TinyConvPipeline',
                                     '--devices=1,2', '--micro_batches=1,2')
    self.assertEqual(code, 0, err)
    self.assertIn('consistency check: digits.TinyConvPipeline', out)
    self.assertIn('batch: image [64, 8, 8, 1] float32', out)
    self.assertIn('digits/pipeline/conv1/w', out)
    self.assertNotIn('results depend on M', out)  # No batch norm or dropout in this model.
    self.assertEqual(len(_GlobalNorms(out)), 5)
    self.assertRegex(out.splitlines()[-1], r'^PASS: 4 variant\(s\) agree .* within 1\.0e-05')
    self.assertIn('tolerance 1.0e-05: float32 rounding of the re-ordered sums gives', out)
    # Progress on stderr: a line when each run starts, one with its time when it ends.
    own = helpers.OwnLines(err)
    self.assertIn('consistency: run 1 of 5, unpipelined', own)
    self.assertIn('consistency: run 5 of 5, K=2 M=2', own)
    ends = [l for l in own if re.match(r'consistency: run \d of 5, .*: done in ', l)]
    self.assertEqual(len(ends), 5, err)

  @pytest.mark.slow
  def testModelWhoseResultsDependOnMFailsWithExitCode1(self):
    with _UserModule():
      code, out, err = helpers.RunTool(
          'consistency', '--model=tp_consistency_models.TimeMajorWrongBatchDim',
          '--devices=1,2', '--micro_batches=1,2')
    self.assertEqual(code, 1, out + err)
    self.assertRegex(out.splitlines()[-1], r'^FAIL: 2 of 4 variant\(s\) \(K=1 M=2, K=2 M=2\) '
                     r'differ by more than 1\.0e-05; largest: ')
    self.assertIn(' !', out)  # The differing cells are marked.

  @pytest.mark.slow
  def testBatchNormModelWithTheWrongBatchDimFailsNamingBatchDim(self):
    with _UserModule():
      code, out, err = helpers.RunTool(
          'consistency', '--model=tp_consistency_models.TimeMajorBatchNormWrongBatchDim',
          '--devices=2', '--micro_batches=2')
    self.assertEqual(code, 1, out + err)
    self.assertIn('compared with unpipelined M=2: the same layers unpipelined, run on each of the '
                  '2 micro-batches of examples in turn', out)
    self.assertIn('consistency: extra run, unpipelined M=2 (the micro-batch reference)',
                  helpers.OwnLines(err))
    self.assertRegex(out.splitlines()[-1], r'^FAIL: 1 of 1 variant\(s\) \(K=2 M=2\) differ by '
                     r'more than 1\.0e-05; .*TensorPipeLayer task.pipeline has batch_dim=0; .*set '
                     r'batch_dim=1 for time-major inputs \[T, B, \.\.\.\]')

  @pytest.mark.slow  # Two runs of the tool, each importing TensorFlow and Lingvo.
  def testListModelsListsTheModelsOfAUsersModule(self):
    with _UserModule():
      for flag in ('--params_module=tp_consistency_models',
                   '--model=tp_consistency_models.TimeMajorWrongBatchDim'):
        code, out, err = helpers.RunTool('consistency', '--list_models', flag)
        self.assertEqual(code, 0, err)
        self.assertIn('tp_consistency_models.TimeMajorBatchNormWrongBatchDim  [paper-scale]  '
                      'Time-major FC and batch norm, split along T', out)
        self.assertIn('digits.TinyConvPipeline  [tiny]  ', out)  # TensorPipe's own, as before.

  @pytest.mark.slow  # Two runs of the tool, each importing TensorFlow and Lingvo.
  def testUsageErrorsAreOneLine(self):
    code, _, err = helpers.RunTool('consistency', '--model=digits.TinyConvPipeline',
                                   '--devices=1,two')
    self.assertEqual(code, 2, err)
    self.assertEqual(err.strip().splitlines()[-1],
                     'consistency: error: --devices=1,two is not a comma-separated list of '
                     'positive integers; write e.g. --devices=1,2,4')
    self.assertEqual(len([l for l in err.splitlines() if 'consistency' in l]), 1, err)
    code, _, err = helpers.RunTool('consistency', '--model=digits.NoSuchModel')
    self.assertEqual(code, 2, err)
    self.assertIn('consistency: error: unknown --model=digits.NoSuchModel; registered models:', err)
    code, _, err = helpers.RunTool('consistency', '--list_models', '--params_module=no_such_mod')
    self.assertEqual(code, 2, err)
    self.assertRegex(err.strip().splitlines()[-1], r'^consistency: error: --params_module='
                     r'no_such_mod: no module no_such_mod on PYTHONPATH; ')


if __name__ == '__main__':
  unittest.main()
