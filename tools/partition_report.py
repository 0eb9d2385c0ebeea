"""Prints how a registered model's TensorPipeLayers are partitioned, and why.

For every TensorPipeLayer in the model's training params: per partition its layers, cost, share of
the total, parameters, estimated parameter and activation memory; then the imbalance (max/mean
partition cost), the bubble and the efficiency they predict for M micro-batches. Flags re-partition
the same layers to compare choices without editing the params.

  python -m tools.partition_report --model=digits.TinyConvPipeline
  python -m tools.partition_report --model=digits.TinyConvPipeline --num_devices=2 \\
      --cost=memory --algorithm=both --memory_budget=1MiB
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import flags  # pylint: disable=g-import-not-at-top

from tensorpipe import layer as layer_lib
from tensorpipe import placement
from tensorpipe.partitioner import balancing
from tensorpipe.partitioner import partition_report
from tensorpipe.partitioner import partitioning
from tensorpipe.trainer import command_line
from tensorpipe.trainer import registry
from tensorpipe import units  # pylint: disable=g-import-not-at-top

flags.DEFINE_string('model', None, 'Registered model, e.g. digits.TinyConvPipeline.',
                    required=True)
flags.DEFINE_string('dataset', 'Train', 'Which dataset params to read.')
flags.DEFINE_integer('num_devices', None, 'Re-split for K devices (K x virtual_stages '
                     'partitions).')
flags.DEFINE_integer('num_micro_batches', None, 'M for the prediction.')
flags.DEFINE_enum('cost', None, partitioning.COST_SOURCES,
                  'Cost source (default: the params\' partition_cost).')
flags.DEFINE_enum('algorithm', 'optimal', balancing.ALGORITHMS + ('both',),
                  'Balancing algorithm.')
flags.DEFINE_string('memory_budget', None, 'Bytes per device, e.g. 8GiB.')
FLAGS = flags.FLAGS


def Reports(model, dataset='Train', num_devices=None, num_micro_batches=None, cost=None,
            algorithms=('optimal',), memory_budget=None):
  """Reports for every TensorPipeLayer of `model` (the arguments override the params' values).

  The plan is the one the layer itself builds (partitioning.PipelinePlan: K x virtual_stages
  partitions, skip connections included); any override re-cuts explicit `partitions` from their
  layers.
  """
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()  # Lingvo's registry reads its override flags; keep the defaults.
  registry.ImportModel(model)
  cfg = registry.ModelParams(model, dataset)
  pipelines = layer_lib.Pipelines(cfg)
  if not pipelines:
    raise ValueError('model %s has no TensorPipeLayer' % model)
  reports = []
  for path, p in pipelines:
    where = '%s (%s)' % (model, path)
    p = p.Copy()
    k = num_devices or placement.NumDevices(p)
    if k is None and p.partitions is not None:
      k = len(p.partitions) // p.virtual_stages
    if num_devices or cost or memory_budget is not None or algorithms != ('optimal',):
      if p.partitions is not None:  # Re-partition the same layers.
        p.layers, p.partitions = [l for partition in p.partitions for l in partition], None
      p.partition_cost = cost or p.partition_cost
      if memory_budget is not None:
        p.memory_budget = memory_budget
    if 'num_partitions' in p:
      p.num_partitions = None  # K is in num_devices (placement.NumDevices read the old name).
    p.num_devices = k
    m = num_micro_batches or p.num_micro_batches
    for algorithm in algorithms:
      plan = partitioning.PipelinePlan(p.Copy().Set(partition_algorithm=algorithm), k, m, None,
                                       where)
      reports.append(partition_report.Build(plan, '%s %s' % (model, path)))
  return reports


def main(unused_argv):
  args = command_line.Args()
  algorithms = balancing.ALGORITHMS if args.algorithm == 'both' else (args.algorithm,)
  try:
    budget = None if args.memory_budget is None else units.ParseBytes(args.memory_budget)
    reports = Reports(args.model, args.dataset, args.num_devices, args.num_micro_batches,
                      args.cost, algorithms, budget)
  except (ValueError, registry.UsageError) as e:
    print('partition_report: error: %s' % e, file=sys.stderr)
    return 2
  print('\n\n'.join(str(r) for r in reports))
  return 0


if __name__ == '__main__':
  command_line.Run(main, 'partition_report')
