"""Parameter counts of registered models from the built model (variables declared, never allocated).

`CountParameters(task_params)` instantiates the task in a throwaway graph under a cluster with as
many devices as its largest TensorPipeLayer needs and sums the sizes of the trainable variables it
creates. In graph mode creating a variable only adds ops to the graph; nothing is initialised, so
even the 6B and 84B models are counted on a laptop.
"""

import numpy as np
from lingvo import compat as tf
from lingvo.core import cluster_factory

from tensorpipe import progress as progress_lib
from tensorpipe.trainer import preflight


def MaxDevices(params):
  """The largest K (num_devices) of any TensorPipeLayer inside `params`."""
  return max([1] + [k for _, _, k in preflight.PipelineDevices(params)])


def BuildTask(task_params, progress=progress_lib.QUIET):
  """(graph, task): the task instantiated in a new graph on a cluster with enough devices;
  `progress` gets a phase that counts the variables as they are declared (the deepest models
  declare tens of thousands, for minutes)."""
  k = MaxDevices(task_params)
  graph = tf.Graph()
  with progress.Phase('building %s, counting its variables' % task_params.name) as phase:

    def Counted(next_creator, **kwargs):
      phase.Step()
      return next_creator(**kwargs)

    with graph.as_default(), cluster_factory.ForTestingWorker(cpus=k, split_size=k):
      with tf.variable_creator_scope(Counted):
        p = task_params.Copy()
        p.input = None
        task = p.Instantiate()
    phase.End('%d variables' % phase.done)
  return graph, task


def CountParameters(task_params, progress=progress_lib.QUIET):
  """Number of trainable parameters of the task `task_params` describes (`progress`: see
  BuildTask)."""
  graph, _ = BuildTask(task_params, progress)
  with graph.as_default():
    return int(sum(np.prod(v.shape.as_list()) for v in tf.trainable_variables()))
