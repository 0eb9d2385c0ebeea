"""The model registry: TensorPipe's params package first, a user's own params modules on sys.path,
unknown models named in one line, and a model module that fails to import named with its error."""

import importlib
import os
import sys
import textwrap
from unittest import mock

from lingvo import model_imports
from lingvo.core import test_utils

from tensorpipe.trainer import registry

MODEL = 'digits.TinyConvPipeline'

# A user's params module: a registered subclass of a TensorPipe model. Its file name must not end
# in test.py, or Lingvo would register it as test.<class>.
USER_MODULE = '''
from lingvo import model_registry

from params import digits


@model_registry.RegisterSingleTaskModel
class UserDigits(digits.TinyConvPipeline):
  """The digits model, registered from a module outside the params package."""
'''


class RegistryTest(test_utils.TestCase):

  def _WriteModules(self, **sources):
    """Writes modules {name: source} into a new directory on sys.path for the rest of the test.

    The modules, the directory and the models they register are gone again after the test, so
    names do not leak into other tests; each test uses module names of its own.
    """
    directory = self.create_tempdir().full_path
    for name, source in sources.items():
      with open(os.path.join(directory, name + '.py'), 'w') as f:
        f.write(textwrap.dedent(source))
      self.addCleanup(sys.modules.pop, name, None)
    sys.path.insert(0, directory)
    self.addCleanup(sys.path_importer_cache.pop, directory, None)
    self.addCleanup(sys.path.remove, directory)
    # The import system caches directory listings; a fresh look does not depend on mtimes.
    importlib.invalidate_caches()

  def _Unregister(self, model_name):
    """Drops `model_name` from Lingvo's registry after the test (Lingvo has no call for it)."""
    registered = registry._HELPER._MODEL_PARAMS  # pylint: disable=protected-access
    self.addCleanup(registered.pop, model_name, None)

  def testRegisteredModelsIncludeTheDigitsModel(self):
    self.assertIn(MODEL, registry.RegisteredModels())

  def testCandidateModulesAreTensorPipesThenThoseLingvoTries(self):
    tried = []

    def _Missing(name):
      tried.append(name)
      raise ModuleNotFoundError("No module named '%s'" % name, name=name)

    with mock.patch.object(importlib, 'import_module', side_effect=_Missing):
      model_imports.ImportParams('a.b.C', require_success=False)
    self.assertEqual(['params.a.b'] + tried, registry.CandidateModules('a.b.C'))
    self.assertEqual(['params.my_lm', 'my_lm', 'my_lm.params', 'lingvo.tasks.my_lm',
                      'lingvo.params.tasks.my_lm', 'lingvo.tasks.params.my_lm',
                      'lingvo.tasks.my_lm.params'], registry.CandidateModules('my_lm.TinyLm'))

  def testUserModuleOnSysPathRegistersAndResolves(self):
    model = 'tp_user_models.UserDigits'
    self._WriteModules(tp_user_models=USER_MODULE)
    self._Unregister(model)
    registry.ImportModel(model)
    self.assertEqual('tp_user_models',
                     registry.ParamsClass(registry.RegisteredModels()[model]).__module__)
    cfg = registry.ModelParams(model, 'Train')
    self.assertStartsWith(cfg.model, model + '@')  # Lingvo's source info of the registered class.
    self.assertEqual('train', cfg.input.split)

  def testUserModuleWithoutTheClassNamesTheModule(self):
    self._WriteModules(tp_user_models_no_class=USER_MODULE)
    self._Unregister('tp_user_models_no_class.UserDigits')
    with self.assertRaisesRegex(
        registry.UsageError,
        r'^unknown --model=tp_user_models_no_class\.Nope; registered models: .*digits\.TinyConv'
        r'.*; module tp_user_models_no_class imports fine but does not register it$'):
      registry.ImportModel('tp_user_models_no_class.Nope')

  def testUserModuleNeedingAMissingPackageNamesTheModuleAndTheError(self):
    self._WriteModules(tp_user_needs_pkg='import tp_registry_no_such_package\n')
    with self.assertRaisesRegex(
        registry.UsageError,
        r"^--model=tp_user_needs_pkg\.TinyLm: module tp_user_needs_pkg failed to import: "
        r"ModuleNotFoundError: No module named 'tp_registry_no_such_package'$") as raised:
      registry.ImportModel('tp_user_needs_pkg.TinyLm')
    self.assertIsInstance(raised.exception.__cause__, ModuleNotFoundError)

  def testUserModuleWithASyntaxErrorNamesTheModuleAndTheError(self):
    self._WriteModules(tp_user_syntax='def Broken(:\n  pass\n')
    with self.assertRaisesRegex(
        registry.UsageError,
        r'^--model=tp_user_syntax\.TinyLm: module tp_user_syntax failed to import: '
        r'SyntaxError: .*\(tp_user_syntax\.py, line 1\)$') as raised:
      registry.ModelParams('tp_user_syntax.TinyLm', 'Train')
    self.assertIsInstance(raised.exception.__cause__, SyntaxError)

  def testUnknownModel(self):
    with self.assertRaisesRegex(
        registry.UsageError, r'unknown --model=digits\.Nope; registered models:.*digits\.TinyConv'
        r'.*; module params\.digits imports fine but does not register it$'):
      registry.ImportModel('digits.Nope')

  def testUnknownModuleListsTheRegisteredModels(self):
    with self.assertRaisesRegex(
        registry.UsageError,
        r'^unknown --model=tp_no_such_module\.Model; registered models: [^;]*digits\.TinyConv'
        r'[^;]*$'):
      registry.ImportModel('tp_no_such_module.Model')

  def testTinyModelsAreMarkedAndTheRestArePaperScale(self):
    tiny = sorted(name for name, cls in registry.TensorPipeModels().items()
                  if registry.IsTiny(cls))
    self.assertEqual(tiny, [
        'amoebanet.TinyAmoebaNetB', 'amoebanet.TinyAmoebaNetD', 'amoebanet.TinyTransferAmoebaNetB',
        'digits.TinyConvPipeline', 'digits.TinyUNetPipeline', 'lm.TinyTiedLm',
        'mt.Num2WordsDeepT', 'mt.Num2WordsTinyT', 'mt.Num2WordsWideT', 'resnet.TinyResNet'])

  def testDescriptionsAreWholeSentences(self):
    for name, cls in registry.TensorPipeModels().items():
      description = registry.Description(cls)
      self.assertRegex(description, r'^[A-Z0-9].*\.$', name)
      self.assertNotIn('\n', description, name)
    # A first paragraph over two docstring lines is printed whole.
    self.assertEqual(
        registry.Description(registry.RegisteredModels()['amoebanet.TinyTransferAmoebaNetB']),
        'Fine-tunes a TinyAmoebaNetB checkpoint (set CHECKPOINT) with a fresh softmax: SGD with '
        'momentum, as the paper\'s transfer runs (the digits stand in for the target data set).')

  def testModelParamsOfAMissingDatasetIsNamed(self):
    with self.assertRaisesRegex(registry.UsageError,
                                "model digits.TinyConvPipeline has no dataset 'Nope'"):
      registry.ModelParams(MODEL, 'Nope')


if __name__ == '__main__':
  test_utils.main()
