"""pyproject.toml: its ranges admit the pinned stack, and its wheel works in a fresh venv.

The wheel test builds TensorPipe's wheel from a copy of the repository and installs it with
--no-deps into a new venv that sees the pinned stack through a .pth file naming this interpreter's
site-packages (no TensorFlow is installed again). Only path lines of that .pth count: .pth files of
the stack's site-packages are not run, so the stack's own editable TensorPipe (scripts/setup.sh)
cannot shadow the wheel, and the test checks that `tensorpipe` comes from the new venv.
"""

from importlib import metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import tomllib
import unittest
import zipfile

import pytest
from packaging import requirements
from packaging import utils as packaging_utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# {repository directory: the package the wheel installs it as}.
PACKAGES = {'tensorpipe': 'tensorpipe', 'params': 'tensorpipe/params'}
# Not copied into the build: environments, build output and caches.
_IGNORE = shutil.ignore_patterns('.git', '.venv', 'build', 'dist', '*.egg-info', '__pycache__',
                                 '.pytest_cache', 'logs')


def _Project():
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    return tomllib.load(f)['project']


def _Pins():
  """{normalized name: version} of requirements.txt and requirements-nodeps.txt."""
  pins = {}
  for name in ('requirements.txt', 'requirements-nodeps.txt'):
    with open(os.path.join(ROOT, name)) as f:
      for line in f:
        line = line.split('#')[0].strip()
        if line:
          req = requirements.Requirement(line)
          (spec,) = req.specifier
          assert spec.operator == '==', '%s: %s is not pinned with ==' % (name, line)
          pins[packaging_utils.canonicalize_name(req.name)] = spec.version
  return pins


def _Run(argv, timeout_s, **kwargs):
  """Runs argv in its own session; on timeout kills that session by its pid and fails."""
  proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True, **kwargs)
  try:
    out, _ = proc.communicate(timeout=timeout_s)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate()
    raise AssertionError('%s ran longer than %d s; output:\n%s' % (argv, timeout_s, out))
  return proc.returncode, out


def _TrackedFiles():
  """The repository's files as git tracks them (paths relative to ROOT)."""
  out = subprocess.run(['git', 'ls-files', '-z'], cwd=ROOT, capture_output=True, check=True,
                       timeout=60).stdout.decode('utf-8')
  return {path for path in out.split('\0') if path}


def _Site(path, levels=2):
  """The real path of `path` `levels` directories up (a package's site-packages from __file__)."""
  for _ in range(levels):
    path = os.path.dirname(path)
  return os.path.realpath(path)


class DependenciesTest(unittest.TestCase):

  def testStackSatisfiesEveryRange(self):
    """Every dependency and the stack's extra admit the pinned version and the one this venv has."""
    project = _Project()
    pins = _Pins()
    reqs = list(project['dependencies'])
    extras = project['optional-dependencies']
    # `trace` (viztracer, to view a trace offline) is outside the verified stack.
    self.assertEqual(sorted(extras), ['test', 'trace'])
    reqs += extras['test']
    self.assertGreater(len(reqs), 10)
    for line in reqs:
      req = requirements.Requirement(line)
      name = packaging_utils.canonicalize_name(req.name)
      versions = {'installed': metadata.version(name)}
      if name in pins:
        versions['pinned'] = pins[name]
      for kind, version in versions.items():
        self.assertTrue(req.specifier.contains(version, prereleases=True),
                        '%s %s==%s is outside pyproject.toml\'s %s' % (kind, name, version, line))

  def testLingvoIsInstalledWithoutItsMetadata(self):
    names = {packaging_utils.canonicalize_name(requirements.Requirement(r).name)
             for r in _Project()['dependencies']}
    self.assertNotIn('lingvo', names)
    with open(os.path.join(ROOT, 'requirements-nodeps.txt')) as f:
      self.assertIn('lingvo==', f.read())
    with open(os.path.join(ROOT, 'scripts', 'setup.sh')) as f:
      setup = f.read()
    self.assertIn('--no-deps -r requirements-nodeps.txt', setup)
    self.assertIn('pyproject.toml', setup)  # In the stamp: a changed pyproject installs again.


class SetupScriptTest(unittest.TestCase):
  """scripts/setup.sh with a stand-in pip: what it says, what it installs, and that it is quiet
  and installs nothing once the stack is in place."""

  def _Copy(self):
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root)
    os.makedirs(os.path.join(root, 'scripts'))
    for name in ('requirements.txt', 'requirements-nodeps.txt', 'pyproject.toml',
                 'scripts/setup.sh'):
      shutil.copy(os.path.join(ROOT, name), os.path.join(root, name))
    # A .venv whose pip records its arguments instead of installing.
    os.makedirs(os.path.join(root, '.venv', 'bin'))
    for name, body in (('python', 'exit 0'),
                       ('pip', 'echo "$*" >> "$(dirname "$0")/../pip-calls"')):
      path = os.path.join(root, '.venv', 'bin', name)
      with open(path, 'w') as f:
        f.write('#!/bin/sh\n%s\n' % body)
      os.chmod(path, 0o755)
    return root

  def _Setup(self, root):
    run = subprocess.run(['bash', os.path.join(root, 'scripts', 'setup.sh')], cwd='/',
                         capture_output=True, text=True, timeout=60, check=False)
    self.assertEqual(run.returncode, 0, run.stderr)
    self.assertEqual(run.stdout, '')
    return run.stderr

  def testSaysWhatItInstallsStepByStepThenNothing(self):
    root = self._Copy()
    said = self._Setup(root)
    lines = said.splitlines()
    self.assertTrue(lines[0].startswith('setup: installing the verified stack into .venv: '),
                    said)
    self.assertIn('about 6 minutes', said)
    steps = [line for line in lines if line.startswith('setup: step ')]
    self.assertEqual([s.split(':')[1] for s in steps],
                     [' step %d of 4' % i for i in range(1, 5)], said)
    self.assertRegex(lines[-1], r'^setup: done in \d+ s$')
    with open(os.path.join(root, '.venv', 'pip-calls')) as f:
      calls = f.read().splitlines()
    self.assertEqual([c for c in calls if '-r ' in c or ' -e ' in c],
                     ['install --quiet -r requirements.txt',
                      'install --quiet --no-deps -r requirements-nodeps.txt',
                      'install --quiet --no-deps --no-build-isolation -e .'])
    # Installed: a second run says nothing and calls no pip.
    self.assertEqual(self._Setup(root), '')
    with open(os.path.join(root, '.venv', 'pip-calls')) as f:
      self.assertEqual(f.read().splitlines(), calls)


@pytest.mark.slow
class WheelTest(unittest.TestCase):
  """`pip install` of the wheel into a venv with the pinned stack: imports and console scripts."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(prefix='tensorpipe-wheel-')
    try:
      cls._Install()
    except BaseException:
      shutil.rmtree(cls.tmp, ignore_errors=True)
      raise

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  @classmethod
  def _Install(cls):
    src = os.path.join(cls.tmp, 'src')
    shutil.copytree(ROOT, src, ignore=_IGNORE)  # Builds write build/ and *.egg-info into it.
    dist = os.path.join(cls.tmp, 'dist')
    pip = [sys.executable, '-m', 'pip', '--disable-pip-version-check']
    code, out = _Run(pip + ['wheel', '--no-index', '--no-deps', '--no-build-isolation', '-w', dist,
                            src], 300, cwd=cls.tmp)
    assert code == 0, out
    (wheel,) = os.listdir(dist)
    cls.wheel = os.path.join(dist, wheel)
    cls.venv = os.path.join(cls.tmp, 'venv')
    code, out = _Run([sys.executable, '-m', 'venv', '--without-pip', cls.venv], 120)
    assert code == 0, out
    cls.python = os.path.join(cls.venv, 'bin', 'python')
    code, out = _Run([cls.python, '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
                     60)
    assert code == 0, out
    cls.site = out.strip()
    stack = dict.fromkeys([sysconfig.get_path('purelib'), sysconfig.get_path('platlib')])
    with open(os.path.join(cls.site, 'tensorpipe_stack.pth'), 'w') as f:
      f.write(''.join(p + '\n' for p in stack))
    code, out = _Run(pip + ['--python', cls.python, 'install', '--no-index', '--no-deps',
                            cls.wheel], 300, cwd=cls.tmp)
    assert code == 0, out
    # Nothing of the repository's: no PYTHONPATH, and the current directory is the temporary one.
    cls.env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    cls.env['TF_CPP_MIN_LOG_LEVEL'] = '2'

  def _RunInVenv(self, argv, timeout_s):
    return _Run(argv, timeout_s, cwd=self.tmp, env=self.env)

  def testWheelHoldsEveryModule(self):
    want = set()
    for directory, package in PACKAGES.items():
      top = os.path.join(ROOT, directory)
      for folder, subfolders, names in os.walk(top):
        subfolders[:] = [d for d in subfolders if d != '__pycache__']
        want.update(package + '/' + os.path.relpath(os.path.join(folder, n), top).replace(
            os.sep, '/') for n in names if n.endswith('.py'))
    with zipfile.ZipFile(self.wheel) as z:
      names = z.namelist()
      have = {n for n in names if n.endswith('.py')}
      (top_level,) = [n for n in names if n.endswith('.dist-info/top_level.txt')]
      self.assertEqual(z.read(top_level).decode().split(), ['tensorpipe'])
    self.assertEqual(have, want)
    # No generic top-level package: the registered models are tensorpipe.params.
    self.assertEqual({n.split('/')[0] for n in have}, {'tensorpipe'})

  def testWheelCarriesTheLicence(self):
    with zipfile.ZipFile(self.wheel) as z:
      names = z.namelist()
      (meta,) = [n for n in names if n.endswith('.dist-info/METADATA')]
      text = z.read(meta).decode('utf-8')
      (licence,) = [n for n in names if re.search(r'\.dist-info/(licenses/)?LICENSE$', n)]
      with open(os.path.join(ROOT, 'LICENSE'), 'rb') as f:
        self.assertEqual(z.read(licence), f.read())
    self.assertIn('Name: tensorpipe-lingvo', text)
    self.assertIn('License: Apache-2.0', text)
    self.assertIn('Classifier: License :: OSI Approved :: Apache Software License', text)
    self.assertIn('Author: The TensorPipe Authors', text)

  def testSdistIsTheSourceTree(self):
    # Every file of the repository (what git tracks), so the README's links and both of its
    # commands (scripts/run_demo.sh, scripts/test.sh: the tests, tools, Bazel files) work from the
    # unpacked sdist; and nothing built or cached.
    src = os.path.join(self.tmp, 'src')
    out_dir = os.path.join(self.tmp, 'sdist')
    code, out = _Run([sys.executable, '-c', 'import sys; from setuptools import build_meta; '
                      'print(build_meta.build_sdist(sys.argv[1]))', out_dir], 300, cwd=src)
    self.assertEqual(code, 0, out)
    (name,) = os.listdir(out_dir)
    with tarfile.open(os.path.join(out_dir, name)) as tar:
      have = {n.split('/', 1)[1] for n in tar.getnames() if '/' in n and tar.getmember(n).isfile()}
    with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
      links = {m.group(1).split('#')[0] for m in re.finditer(r'\]\(([^)#:]+[^)]*)\)', f.read())
               if '://' not in m.group(1)}
    links.discard('')
    self.assertTrue({'docs/guide.md', 'docs/benchmarks.md', 'LICENSE'} <= links, sorted(links))
    want = _TrackedFiles() | links
    self.assertEqual(sorted(want - have), [])
    self.assertEqual([n for n in have if '__pycache__' in n or n.endswith('.pyc')], [])

  def testImportsComeFromTheVenv(self):
    code, out = self._RunInVenv([
        self.python, '-c', 'import tensorpipe, tensorpipe.params, tensorpipe.schedule, lingvo; '
        'print(tensorpipe.__file__); print(tensorpipe.params.__file__); print(lingvo.__file__)'],
        120)
    self.assertEqual(code, 0, out)
    tensorpipe_dir, params_dir, lingvo_dir = [_Site(f) for f in out.split()]
    self.assertEqual(tensorpipe_dir, _Site(self.site, 0))
    self.assertEqual(params_dir, os.path.join(_Site(self.site, 0), 'tensorpipe'))
    self.assertIn(lingvo_dir, [_Site(sysconfig.get_path(p), 0) for p in ('purelib', 'platlib')])
    code, out = self._RunInVenv([self.python, '-c', 'import params'], 120)
    self.assertNotEqual(code, 0, out)
    self.assertIn("No module named 'params'", out)

  def testModelNamesAreTheCheckoutsBesideAnotherParamsPackage(self):
    # A Lingvo project's own top-level `params` (here in the current directory, which python -m
    # puts first on sys.path) is not taken for TensorPipe's; --model=digits.X still resolves.
    project = os.path.join(self.tmp, 'project')
    os.makedirs(os.path.join(project, 'params'), exist_ok=True)
    for name in ('__init__.py', 'digits.py'):
      with open(os.path.join(project, 'params', name), 'w') as f:
        f.write('raise ImportError("not TensorPipe\'s params")\n')
    code, out = _Run([self.python, '-c', 'from absl import flags; flags.FLAGS(["x"]); '
                      'from tensorpipe.trainer import registry; '
                      'print(registry.ParamsPackage()); '
                      'print(registry.ModelParams("digits.TinyConvPipeline", "Train").cls)'], 300,
                     cwd=project, env=self.env)
    self.assertEqual(code, 0, out)
    self.assertIn('tensorpipe.params\n', out)
    self.assertIn('SingleTaskModel', out)

  def testTrainListsEveryParamsModule(self):
    code, out = self._RunInVenv([os.path.join(self.venv, 'bin', 'tensorpipe-train'),
                                 '--list_models'], 300)
    self.assertEqual(code, 0, out)
    # One line per model: 'module.Name  [tiny|paper-scale, K=...]  description'.
    modules = {m.group(1) for m in re.finditer(r'^(\w+)\.\w+  \[', out, re.M)}
    want = {n[:-3] for n in os.listdir(os.path.join(ROOT, 'params'))
            if n.endswith('.py') and n != '__init__.py'}
    self.assertEqual(modules, want, out)
    self.assertIn('digits.TinyConvPipeline  [tiny, K=4]  ', out)

  def _Help(self, command, module):
    """(the console script's --help, python -m module's --help), each with its exit status."""
    script = self._RunInVenv([os.path.join(self.venv, 'bin', command), '--help'], 120)
    as_module = self._RunInVenv([self.python, '-m', module, '--help'], 120)
    return script, as_module

  def testTrainHelpIsTheModulesHelp(self):
    script, as_module = self._Help('tensorpipe-train', 'tensorpipe.trainer.train')
    self.assertEqual(script, as_module)
    code, out = script
    self.assertEqual(code, 0, out)
    for flag in ('--model', '--logdir', '--cpu_devices', '--tensorpipe_plan', '--step_timeout_s'):
      self.assertRegex(out, r'\n  %s: ' % flag)
    self.assertIn('`tensorpipe-train FLAGS` is the same command', out)
    # It speaks of the installed commands, not of a checkout's interpreter or tools.
    self.assertNotIn('python -m tools.', out)
    self.assertNotIn('.venv/bin/python', out)

  def testTrainHelpfullListsLingvosFlagsToo(self):
    script = self._RunInVenv([os.path.join(self.venv, 'bin', 'tensorpipe-train'), '--helpfull'],
                             120)
    self.assertEqual(script, self._RunInVenv([self.python, '-m', 'tensorpipe.trainer.train',
                                              '--helpfull'], 120))
    code, out = script
    self.assertEqual(code, 0, out)
    for flag in ('model', 'cpu_devices', 'run_locally', 'worker_split_size', 'helpfull',
                 'logtostderr'):
      self.assertRegex(out, r'\n  (-\S,)?--(\[no\])?%s: ' % flag)

  def testLaunchHelpIsTheModulesHelp(self):
    script, as_module = self._Help('tensorpipe-launch', 'tensorpipe.trainer.launch')
    self.assertEqual(script, as_module)
    code, out = script
    self.assertEqual(code, 0, out)
    for flag in ('--model', '--logdir', '--worker_tasks', '--tasks_per_replica', '--cpu_devices'):
      self.assertRegex(out, r'\n  %s: ' % flag)
    self.assertIn('`tensorpipe-launch FLAGS` is the same command', out)


if __name__ == '__main__':
  unittest.main()
