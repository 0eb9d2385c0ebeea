"""Registered models: TensorPipe's params package first, then wherever Lingvo looks.

TensorPipe's registered models are the repository's params/ directory: the package `params` in a
checkout, `tensorpipe.params` once installed (the wheel installs no generic top-level `params`).
Either way --model=digits.X names params/digits.py's X: Lingvo's registry keys a model by its module
path less "params.", which makes the installed one's key tensorpipe.digits.X, and the lookups here
translate. --model=my_lm.X imports a user's my_lm on PYTHONPATH, as Lingvo's trainer would.
`ModelRegistry` stands in for Lingvo's model_registry module in the trainer, and every lookup
failure is a `UsageError` with a one-line message: for an unknown model it lists the registered
ones, and a model module that exists but fails to import is named with its error (where Lingvo
would call the model unknown or print a traceback).
"""

import importlib
import importlib.util
import os
import pkgutil
import sys

from lingvo import model_registry
from lingvo.core import base_model_params

# The names TensorPipe's registered models import under: installed, in a checkout.
INSTALLED_PACKAGE = 'tensorpipe.params'
CHECKOUT_PACKAGE = 'params'
# Lingvo's registry proper; its module-level functions lack the lookups ModelRegistry adds.
_HELPER = model_registry._ModelRegistryHelper  # pylint: disable=protected-access
# Where Lingvo's model_imports.ImportParams looks for its built-in tasks' params.
_LINGVO_TASKS = 'lingvo.tasks'


class UsageError(Exception):
  """A problem with the command line or the model's configuration, reported in one line."""


def _Spec(name):
  """importlib's spec of module `name`, or None if it (or a parent package) does not exist."""
  try:
    return importlib.util.find_spec(name)
  except ModuleNotFoundError:
    return None


def ParamsPackage():
  """The package TensorPipe's registered models import from: 'tensorpipe.params' when installed,
  'params' in a checkout (also when the checkout is installed editable: both names are then the
  same files, and one name keeps one copy of each model), None if neither exists.

  A top-level `params` beside an installed TensorPipe is somebody else's package (a Lingvo
  project's params/, say) and is not taken for TensorPipe's.
  """
  installed, checkout = _Spec(INSTALLED_PACKAGE), _Spec(CHECKOUT_PACKAGE)
  if installed is None:
    return CHECKOUT_PACKAGE if checkout is not None else None
  if checkout is not None and checkout.submodule_search_locations is not None and (
      [os.path.realpath(p) for p in checkout.submodule_search_locations] ==
      [os.path.realpath(p) for p in installed.submodule_search_locations or ()]):
    return CHECKOUT_PACKAGE
  return INSTALLED_PACKAGE


def _KeyPrefix(package):
  """What Lingvo's registry puts before `module.Name` for a model of `package`: its path less
  "params" ('tensorpipe.' for tensorpipe.params, '' for params)."""
  return package[:-len('params')]


def _IsTensorPipes(cls, package):
  """Whether registered class `cls` comes from TensorPipe's params `package`."""
  return package is not None and ParamsClass(cls).__module__.startswith(package + '.')


def LingvoKey(model_name):
  """The key Lingvo's registry holds --model=`model_name` under, or None if it holds none: the name
  itself, or for an installed TensorPipe's model its name after 'tensorpipe.'."""
  known = _HELPER._MODEL_PARAMS  # pylint: disable=protected-access
  if model_name in known:
    return model_name
  package = ParamsPackage()
  key = _KeyPrefix(package or '') + model_name
  if package and key in known and _IsTensorPipes(known[key], package):
    return key
  return None


def _WithParams(module):
  """`module` with a `params` component inserted after each of its components in turn."""
  parts = module.split('.')
  return ['.'.join(parts[:i] + ['params'] + parts[i:]) for i in range(1, len(parts) + 1)]


def CandidateModules(model_name):
  """The modules that may register `model_name`, in the order ImportModel tries them.

  TensorPipe's `<ParamsPackage()>.<module>` first, then the paths of Lingvo's
  model_imports.ImportParams: the module itself (e.g. a user's module on PYTHONPATH), then with
  `params` inserted after each of its components, then both again under lingvo.tasks. Like Lingvo,
  nothing beyond TensorPipe's own module for `test.` models.
  """
  module = model_name.rpartition('.')[0]
  candidates = ['%s.%s' % (ParamsPackage() or CHECKOUT_PACKAGE, module)]
  if not model_name.startswith('test.'):
    for path in (module, '%s.%s' % (_LINGVO_TASKS, module)):
      candidates += [path] + _WithParams(path)
  return list(dict.fromkeys(candidates))


def _ErrorLine(e):
  """`Type: first line of the message` of exception `e`, for a one-line report."""
  lines = str(e).strip().splitlines()
  return '%s: %s' % (type(e).__name__, lines[0]) if lines else type(e).__name__


def _ImportIfExists(module_name, model_name, flag='--model'):
  """Imports `module_name`; False if it (or a parent package) does not exist, else True.

  Each package on the way is looked up (importlib.util.find_spec) before it runs, so a module that
  exists but raises while importing, even a ModuleNotFoundError for a package it needs, is told
  apart from one that is not there. Lingvo's model_imports only tells them apart by the name in a
  ModuleNotFoundError's message and lets every other error through as a traceback.

  Raises:
    UsageError: naming `flag`=`model_name`, the module that failed and its error, chained to the
      error.
  """
  parts = module_name.split('.')
  for i in range(1, len(parts) + 1):
    name = '.'.join(parts[:i])
    if sys.modules.get(name) is not None:
      continue
    try:
      # The parents are imported by now, so this only looks: it runs no module code.
      spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # The parent is a module, not a package.
      return False
    if spec is None:
      return False
    try:
      importlib.import_module(name)
    except Exception as e:  # pylint: disable=broad-except
      raise UsageError('%s=%s: module %s failed to import: %s' %
                       (flag, model_name, name, _ErrorLine(e))) from e
  return True


def ImportAllParams():
  """Imports every module of TensorPipe's params package (registering its models)."""
  name = ParamsPackage()
  if name is None:
    return
  package = importlib.import_module(name)
  for info in pkgutil.walk_packages(package.__path__, name + '.'):
    importlib.import_module(info.name)


def RegisteredModels():
  """{--model name: params class} of every registered model, after importing TensorPipe's params
  package; TensorPipe's own are named as in a checkout (digits.X, not tensorpipe.digits.X)."""
  ImportAllParams()
  package = ParamsPackage()
  prefix = _KeyPrefix(package or '')
  models = {}
  for key, cls in _HELPER.GetAllRegisteredClasses().items():
    if prefix and key.startswith(prefix) and _IsTensorPipes(cls, package):
      key = key[len(prefix):]
    models[key] = cls
  return models


def ParamsClass(cls):
  """The params class a model was declared as (Lingvo's registry may wrap it in a namesake)."""
  return cls.__bases__[0] if cls.__name__ == cls.__bases__[0].__name__ else cls


def IsTiny(cls):
  """Whether a registered model is CPU-sized: its params class sets TINY = True (it trains on 2 CPU
  cores in minutes); the others are the paper's configurations, sized for accelerators."""
  return bool(getattr(ParamsClass(cls), 'TINY', False))


def Description(cls):
  """The first paragraph of a registered model's docstring, on one line (whole sentences)."""
  doc = (ParamsClass(cls).__doc__ or '').strip()
  return ' '.join(doc.split('\n\n')[0].split())


def TensorPipeModels():
  """{--model name: params class} of the models that TensorPipe's params package registers."""
  package = ParamsPackage()
  return {name: cls for name, cls in RegisteredModels().items() if _IsTensorPipes(cls, package)}


def ImportModel(model_name):
  """Imports the modules that may register `model_name` (see CandidateModules) until one does.

  Raises:
    UsageError: if a candidate module exists but fails to import, or no registered model has that
      name; the latter lists the registered models and the candidates that imported without it.
  """
  if not model_name or '.' not in model_name:
    raise UsageError('--model=%r is not a registered model name such as digits.TinyConvPipeline '
                     '(see --list_models)' % (model_name or ''))
  imported = []
  for module in CandidateModules(model_name):
    if LingvoKey(model_name):
      return
    if _ImportIfExists(module, model_name):
      imported.append(module)
  if not LingvoKey(model_name):
    names = sorted(RegisteredModels())
    message = 'unknown --model=%s; registered models: %s' % (
        model_name, ', '.join(names) if names else '(none)')
    if len(imported) == 1:
      message += '; module %s imports fine but does not register it' % imported[0]
    elif imported:
      message += '; modules %s import fine but do not register it' % ', '.join(imported)
    raise UsageError(message)


def ImportUserModules(model_name=None, params_module=None):
  """Imports a user's modules so that the models they register are listed (--list_models) beside
  TensorPipe's own: `params_module` (a module on PYTHONPATH, e.g. mymodels) and the module that
  registers `model_name` (see ImportModel). Either may be None.

  Raises:
    UsageError: (one line) if `params_module` does not exist or fails to import, or as ImportModel.
  """
  if params_module:
    if not _ImportIfExists(params_module, params_module, flag='--params_module'):
      raise UsageError('--params_module=%s: no module %s on PYTHONPATH; give a module that '
                       'registers models, e.g. --params_module=mymodels for mymodels.py in a '
                       'directory on PYTHONPATH' % (params_module, params_module))
  if model_name:
    ImportModel(model_name)


class ModelRegistry:
  """Stands in for the `lingvo.model_registry` module in RunnerManager (see ImportModel)."""

  @staticmethod
  def GetAllRegisteredClasses():
    return RegisteredModels()

  @staticmethod
  def GetClass(class_key):
    ImportModel(class_key)
    return _HELPER.GetClass(LingvoKey(class_key))

  @staticmethod
  def GetParams(class_key, dataset_name):
    ImportModel(class_key)
    return _HELPER.GetParams(LingvoKey(class_key), dataset_name)

  @staticmethod
  def GetProgramSchedule(class_key):
    ImportModel(class_key)
    return _HELPER.GetProgramSchedule(LingvoKey(class_key))


def ModelParams(model_name, dataset):
  """The registered model's params for `dataset`; UsageError with a one-line message if it fails."""
  try:
    return ModelRegistry.GetParams(model_name, dataset)
  except base_model_params.DatasetError:
    try:
      return ModelRegistry.GetParams(model_name, dataset.title())
    except base_model_params.DatasetError as e:
      raise UsageError('model %s has no dataset %r: %s' % (model_name, dataset, e)) from e
  except (AttributeError, ValueError, TypeError) as e:
    # E.g. a --model_params_override naming a param that does not exist.
    raise UsageError('cannot configure model %s for dataset %s: %s' %
                     (model_name, dataset, str(e).strip().splitlines()[0] if str(e) else
                      type(e).__name__)) from e
