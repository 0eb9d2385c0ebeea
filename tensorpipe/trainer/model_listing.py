"""--list_models: the registered models, each marked tiny or paper-scale, with its K."""

import sys

import lingvo.compat as tf

from tensorpipe.trainer import flags as trainer_flags
from tensorpipe.trainer import preflight
from tensorpipe.trainer import registry

FLAGS = trainer_flags.FLAGS

LIST_LEGEND = (
    'tiny: trains on 2 CPU cores in minutes (run times and expected results: docs/guide.md, '
    '"Registered models"); paper-scale: the paper\'s configuration, for accelerators (on CPU it '
    'builds, but does not train in reasonable time or memory). K: partitions of each '
    'TensorPipeLayer, the devices of one model split (on CPU, --cpu_devices=K).')


def ModelLine(name, cls):
  """One --list_models line: `name  [tiny|paper-scale, K=..]  description` (K from its params)."""
  partitions = preflight.PipelineDevices(registry.ModelParams(name, 'Train'))
  if len(partitions) == 1:
    k = 'K=%d' % partitions[0][2]
  elif partitions:
    k = 'K=' + ', '.join('%d (%s)' % (k, layer) for _, layer, k in partitions)
  else:
    k = 'no TensorPipeLayer'
  scale = 'tiny' if registry.IsTiny(cls) else 'paper-scale'
  return '%s  [%s, %s]  %s' % (name, scale, k, registry.Description(cls))


def ListModels(out=None):
  """Prints the legend and one ModelLine per registered model, as each is ready: TensorPipe's own
  and those of the user's module named by --model or --params_module (imported first, so that a
  model `--model=` trains is listed too).

  Raises:
    registry.UsageError: if that module does not exist or fails to import.
  """
  registry.ImportUserModules(FLAGS.model, FLAGS.params_module)
  out = out or sys.stdout
  verbosity = tf.logging.get_verbosity()
  tf.logging.set_verbosity(tf.logging.WARNING)  # Not Lingvo's per-model 'No dataset ...' lines.
  try:
    out.write(LIST_LEGEND + '\n')
    for name, cls in sorted(registry.RegisteredModels().items()):
      out.write(ModelLine(name, cls) + '\n')
      out.flush()
  finally:
    tf.logging.set_verbosity(verbosity)
