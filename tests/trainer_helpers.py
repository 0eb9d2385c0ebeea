"""Registered models for the TensorPipe tests: their params and their graphs as Lingvo's trainer
client builds them."""

import os

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


def WriteStepCheckpoint(train_dir, step):
  """Writes a checkpoint train_dir/ckpt-<step> holding just global_step = `step`, as Lingvo names
  its checkpoints, makes it the latest and returns its path."""
  with tf.Graph().as_default():
    global_step = tf.train.get_or_create_global_step()
    with tf.Session() as sess:
      sess.run(global_step.assign(step))
      return tf.train.Saver().save(sess, os.path.join(train_dir, 'ckpt-%08d' % step))
