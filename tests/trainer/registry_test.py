"""The model registry: TensorPipe's params package first, and unknown models named in one line."""

from lingvo.core import test_utils

from tensorpipe.trainer import registry

MODEL = 'digits.TinyConvPipeline'


class RegistryTest(test_utils.TestCase):

  def testRegisteredModelsIncludeTheDigitsModel(self):
    self.assertIn(MODEL, registry.RegisteredModels())

  def testUnknownModel(self):
    with self.assertRaisesRegex(
        registry.UsageError, r'unknown --model=digits\.Nope; registered models:.*digits\.TinyConv'):
      registry.ImportModel('digits.Nope')

  def testModelParamsOfAMissingDatasetIsNamed(self):
    with self.assertRaisesRegex(registry.UsageError,
                                "model digits.TinyConvPipeline has no dataset 'Nope'"):
      registry.ModelParams(MODEL, 'Nope')


if __name__ == '__main__':
  test_utils.main()
