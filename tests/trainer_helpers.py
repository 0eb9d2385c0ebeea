"""Registered models for the TensorPipe tests: their params and their graphs as Lingvo's trainer
client builds them."""

from absl import flags
from lingvo import compat as tf
from lingvo.core import cluster_factory

from tensorpipe.trainer import registry

def TrainerGraph(cfg, num_devices, train=True):
  """Registered model params `cfg` built as Lingvo's trainer client builds them (the training graph,
  or with train=False the evaluation graph), in a new graph on `num_devices` logical CPU devices.

  Returns (graph, task); build what else the test needs under `graph.as_default()`.
  """
  graph = tf.Graph()
  with graph.as_default(), cluster_factory.ForTestingWorker(
      mode='sync', job='trainer_client', cpus=num_devices, split_size=num_devices,
      do_eval=not train):
    tf.random.set_seed(1)  # Lingvo then seeds unseeded variables from their names.
    model = cfg.Instantiate()
    if train:
      model.ConstructFPropBPropGraph()
    else:
      model.ConstructFPropGraph()
  return graph, model.GetTask()


def ModelParams(name, dataset='Train'):
  """registry.ModelParams of a registered model (`name` as in --model), flags parsed if need be."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(['test'])
  registry.ImportModel(name)
  return registry.ModelParams(name, dataset)
