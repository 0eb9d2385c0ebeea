"""The suite's order across pytest-xdist's processes: the longest test classes first.

scripts/test.sh runs the suite in 2 processes with `--dist loadscope` (a class's tests in one
process). xdist hands out classes in the order of their number of tests, so a class of a few
minutes-long tests (the multi-host fault sequence, ~5 minutes) would start late and leave the other
process idle at the end. The classes in LONGEST (by their run time in CI's `--durations` list) are
handed out first instead, the rest as xdist orders them: the order changes how long the suite runs,
never what a test checks.
"""

from xdist.scheduler import LoadScopeScheduling

# Test classes (xdist's scopes: path::class) that run a minute or more, longest first.
LONGEST = (
    'tests/trainer/multihost_test.py::MultiHostTrainingTest',
    'tests/trainer/launch_test.py::LauncherTest',
    'tests/tasks/lm/decoder_lm_test.py::DecoderLmGradientsTest',
    'tests/trainer/train_test.py::TrainerSmokeTest',
    'tests/tasks/lm/decoder_lm_test.py::DecoderLmDecodingTest',
    'tests/selective_recompute_test.py::GradientsTest',
)


class LongestFirstScheduling(LoadScopeScheduling):
  """xdist's loadscope scheduling with the LONGEST classes at the front of its queue."""

  def _assign_work_unit(self, node):
    # The queue is complete at the first assignment (xdist's schedule() fills it, then assigns).
    if not getattr(self, '_longest_first', False):
      self._longest_first = True
      for scope in reversed([s for s in LONGEST if s in self.workqueue]):
        self.workqueue.move_to_end(scope, last=False)
    super()._assign_work_unit(node)


def pytest_xdist_make_scheduler(config, log):
  if config.getvalue('dist') == 'loadscope':
    return LongestFirstScheduling(config, log)
  return None
