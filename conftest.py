"""pytest setup: absl flags (used by tf.test, Lingvo's test_utils) count as parsed with defaults;
with `--dist loadscope` (scripts/test.sh), the classes named by pytest.ini's `first_scopes` are
handed out first."""
from absl import flags

flags.FLAGS.mark_as_parsed()


def pytest_addoption(parser):
  parser.addini('first_scopes', type='linelist', default=[],
                help='Test classes or modules (node ids) that pytest-xdist hands out before all '
                'others: the longest, so that the other processes run the rest beside them.')


def pytest_xdist_make_scheduler(config, log):
  """pytest-xdist's loadscope scheduling (a class's tests in one process), except that it hands
  out `first_scopes` first. loadscope orders classes by their number of tests, so a long class
  with few tests would otherwise start last and leave the other process idle at the end."""
  if config.getoption('dist') != 'loadscope' or not config.getini('first_scopes'):
    return None
  from xdist.scheduler import LoadScopeScheduling  # pylint: disable=g-import-not-at-top

  first = list(config.getini('first_scopes'))

  class FirstScopesFirst(LoadScopeScheduling):

    def _assign_work_unit(self, node):
      for scope in reversed(first):
        if scope in self.workqueue:
          self.workqueue.move_to_end(scope, last=False)
      super()._assign_work_unit(node)

  return FirstScopesFirst(config, log)
