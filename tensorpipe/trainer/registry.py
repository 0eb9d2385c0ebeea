"""Registered models: TensorPipe's top-level `params` package first, then wherever Lingvo looks.

--model=digits.X imports params.digits. `ModelRegistry` stands in for Lingvo's model_registry module
in the trainer, and every lookup failure is a `UsageError` with a one-line message that names the
model and lists the registered ones.
"""

import importlib
import pkgutil

from lingvo import model_imports
from lingvo import model_registry
from lingvo.core import base_model_params

PARAMS_PACKAGE = 'params'
# Lingvo's registry proper; its module-level functions lack the lookups ModelRegistry adds.
_HELPER = model_registry._ModelRegistryHelper  # pylint: disable=protected-access


class UsageError(Exception):
  """A problem with the command line or the model's configuration, reported in one line."""


def _ImportIfPresent(module_name):
  """Imports `module_name`; False if it (or a parent package) does not exist, else True."""
  try:
    importlib.import_module(module_name)
    return True
  except ModuleNotFoundError as e:
    if e.name and module_name.startswith(e.name):
      return False
    raise


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


def TensorPipeModels():
  """{key: params class} of the models that TensorPipe's `params` package registers."""
  return {key: cls for key, cls in RegisteredModels().items()
          if ParamsClass(cls).__module__.startswith(PARAMS_PACKAGE + '.')}


def ImportModel(model_name):
  """Imports the module that registers `model_name` (`params.<module>` first, then Lingvo's paths).

  Raises:
    UsageError: if no registered model has that name.
  """
  if not model_name or '.' not in model_name:
    raise UsageError('--model=%r is not a registered model name such as digits.TinyConvPipeline '
                     '(see --list_models)' % (model_name or ''))
  known = _HELPER._MODEL_PARAMS  # pylint: disable=protected-access
  if model_name not in known:
    module = model_name.rpartition('.')[0]
    _ImportIfPresent('%s.%s' % (PARAMS_PACKAGE, module))
  if model_name not in known:
    try:
      model_imports.ImportParams(model_name, require_success=False)
    except ModuleNotFoundError:
      pass
  if model_name not in known:
    names = sorted(RegisteredModels())
    raise UsageError('unknown --model=%s; registered models: %s' %
                     (model_name, ', '.join(names) if names else '(none)'))


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
