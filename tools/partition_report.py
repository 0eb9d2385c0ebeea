"""Prints how a registered model's TensorPipeLayers are partitioned, and why.

For every TensorPipeLayer in the model's training params: per partition its layers, cost, share of
the total, parameters, estimated parameter and activation memory; then the imbalance (max/mean
partition cost), the bubble and the efficiency they predict for M micro-batches. Flags re-partition
the same layers to compare choices without editing the params.

  python -m tools.partition_report --model=digits.TinyConvPipeline
  python -m tools.partition_report --model=digits.TinyConvPipeline --num_partitions=2 \\
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
flags.DEFINE_integer('num_partitions', None, 'Re-split into K partitions.')
flags.DEFINE_integer('num_micro_batches', None, 'M for the prediction.')
flags.DEFINE_enum('cost', None, partitioning.COST_SOURCES,
                  'Cost source (default: the params\' partition_cost).')
flags.DEFINE_enum('algorithm', 'optimal', balancing.ALGORITHMS + ('both',),
                  'Balancing algorithm.')
flags.DEFINE_string('memory_budget', None, 'Bytes per device, e.g. 8GiB.')
FLAGS = flags.FLAGS


def Reports(model, dataset='Train', num_partitions=None, num_micro_batches=None, cost=None,
            algorithms=('optimal',), memory_budget=None):
  """Reports for every TensorPipeLayer of `model` (flags override the params' values)."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()  # Lingvo's registry reads its override flags; keep the defaults.
  registry.ImportModel(model)
  cfg = registry.ModelParams(model, dataset)
  pipelines = layer_lib.Pipelines(cfg)
  if not pipelines:
    raise ValueError('model %s has no TensorPipeLayer' % model)
  reports = []
  for path, p in pipelines:
    if p.layers is not None:
      layers, sizes = list(p.layers), None
    else:
      layers = [l for partition in p.partitions for l in partition]
      sizes = [len(partition) for partition in p.partitions]
    k = num_partitions or placement.NumDevices(p) or len(sizes)
    if num_partitions or cost or memory_budget is not None or algorithms != ('optimal',):
      sizes = None  # Re-partition.
    m = num_micro_batches or p.num_micro_batches
    for algorithm in algorithms:
      plan = partitioning.MakePlan(
          layers, k, p.cost_input_shapes, cost or p.partition_cost, algorithm,
          memory_budget if memory_budget is not None else p.memory_budget, m, p.recompute,
          p.bytes_per_param, None, sizes, where='%s (%s)' % (model, path))
      reports.append(partition_report.Build(plan, '%s %s' % (model, path)))
  return reports


def main(unused_argv):
  args = command_line.Args()
  algorithms = balancing.ALGORITHMS if args.algorithm == 'both' else (args.algorithm,)
  try:
    budget = None if args.memory_budget is None else units.ParseBytes(args.memory_budget)
    reports = Reports(args.model, args.dataset, args.num_partitions, args.num_micro_batches,
                      args.cost, algorithms, budget)
  except (ValueError, registry.UsageError) as e:
    print('partition_report: error: %s' % e, file=sys.stderr)
    return 2
  print('\n\n'.join(str(r) for r in reports))
  return 0


if __name__ == '__main__':
  command_line.Run(main, 'partition_report')
