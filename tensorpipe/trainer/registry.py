"""Registered models: TensorPipe's top-level `params` package first, then wherever Lingvo looks.

--model=digits.X imports params.digits; --model=my_lm.X imports a user's my_lm on PYTHONPATH, as
Lingvo's trainer would. `ModelRegistry` stands in for Lingvo's model_registry module in the trainer,
and every lookup failure is a `UsageError` with a one-line message: for an unknown model it lists
the registered ones, and a model module that exists but fails to import is named with its error
(where Lingvo would call the model unknown or print a traceback).
"""

import importlib
import importlib.util
import pkgutil
import sys

from lingvo import model_registry
from lingvo.core import base_model_params

PARAMS_PACKAGE = 'params'
# Lingvo's registry proper; its module-level functions lack the lookups ModelRegistry adds.
_HELPER = model_registry._ModelRegistryHelper  # pylint: disable=protected-access
# Where Lingvo's model_imports.ImportParams looks for its built-in tasks' params.
_LINGVO_TASKS = 'lingvo.tasks'


class UsageError(Exception):
  """A problem with the command line or the model's configuration, reported in one line."""


def _WithParams(module):
  """`module` with a `params` component inserted after each of its components in turn."""
  parts = module.split('.')
  return ['.'.join(parts[:i] + ['params'] + parts[i:]) for i in range(1, len(parts) + 1)]


def CandidateModules(model_name):
  """The modules that may register `model_name`, in the order ImportModel tries them.

  TensorPipe's `params.<module>` first, then the paths of Lingvo's model_imports.ImportParams: the
  module itself (e.g. a user's module on PYTHONPATH), then with `params` inserted after each of its
  components, then both again under lingvo.tasks. Like Lingvo, nothing beyond TensorPipe's own
  module for `test.` models.
  """
  module = model_name.rpartition('.')[0]
  candidates = ['%s.%s' % (PARAMS_PACKAGE, module)]
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
  """Imports every module of the `params` package (registering its models)."""
  try:
    package = importlib.import_module(PARAMS_PACKAGE)
  except ModuleNotFoundError:
    return
  for info in pkgutil.walk_packages(package.__path__, PARAMS_PACKAGE + '.'):
    importlib.import_module(info.name)


def RegisteredModels():
  """{key: params class} of every registered model, after importing the `params` package."""
  ImportAllParams()
  return dict(_HELPER.GetAllRegisteredClasses())


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
  """{key: params class} of the models that TensorPipe's `params` package registers."""
  return {key: cls for key, cls in RegisteredModels().items()
          if ParamsClass(cls).__module__.startswith(PARAMS_PACKAGE + '.')}


def ImportModel(model_name):
  """Imports the modules that may register `model_name` (see CandidateModules) until one does.

  Raises:
    UsageError: if a candidate module exists but fails to import, or no registered model has that
      name; the latter lists the registered models and the candidates that imported without it.
  """
  if not model_name or '.' not in model_name:
    raise UsageError('--model=%r is not a registered model name such as digits.TinyConvPipeline '
                     '(see --list_models)' % (model_name or ''))
  known = _HELPER._MODEL_PARAMS  # pylint: disable=protected-access
  imported = []
  for module in CandidateModules(model_name):
    if model_name in known:
      return
    if _ImportIfExists(module, model_name):
      imported.append(module)
  if model_name not in known:
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
    return _HELPER.GetClass(class_key)

  @staticmethod
  def GetParams(class_key, dataset_name):
    ImportModel(class_key)
    return _HELPER.GetParams(class_key, dataset_name)

  @staticmethod
  def GetProgramSchedule(class_key):
    ImportModel(class_key)
    return _HELPER.GetProgramSchedule(class_key)



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
