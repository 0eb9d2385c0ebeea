r"""The planner's answers to the GPipe paper's Table 1 and Table 2, beside the paper's figures.

Table 1 (largest model per accelerator count): for each configuration the largest model for which
the planner finds a configuration that fits the device memory, with the paper's K, M and
re-computation: AmoebaNet-D (L, D) on TPUv2 cores (8 GiB; 224x224, batch 128, M = 16, 12 bytes per
parameter; the paper's L per column, the filters D searched in steps of 32), Transformer-L (model
2048, feed-forward 8192, 32 heads, 32k vocabulary, sequence 1024, batch 32, M = 32, 8 bytes per
parameter) on TPUv3 cores (16 GiB). Naive-1 is K = 1, M = 1 without re-computation.

Table 2 (throughput normalised to K = 2, M = 1): the planner's predicted step times for
AmoebaNet-D (18, 256) (224x224, batch 128) and Transformer-48 (Transformer-L's layers) on TPUv3
cores, and AmoebaNet-D (18, 128) and Transformer-24 on P100 GPUs at M = 32, normalised to K = 2.
Predictions come from flops, the profile's peak x efficiency and its per-op and per-call costs
(no measurement: these devices are not here).

  python -m tools.plan_paper            # about 5 minutes (AmoebaNet profiles at 224x224)
  python -m tools.plan_paper --tables=2

Run time on a 2-core CPU: both tables 280 s (docs/benchmarks.md, commit 83ec2be). Each row of the
tables is printed, flushed, as it is found.

Results: docs/benchmarks.md.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import dataclasses
import functools
import time

from absl import flags  # pylint: disable=g-import-not-at-top

from tensorpipe.measure import machine  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import workloads  # pylint: disable=g-import-not-at-top
from tensorpipe.partitioner import capacity  # pylint: disable=g-import-not-at-top
from tensorpipe.partitioner import cost_model  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import device_profiles  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import planner  # pylint: disable=g-import-not-at-top
from tensorpipe.tasks.image import amoebanet  # pylint: disable=g-import-not-at-top
from tensorpipe import units  # pylint: disable=g-import-not-at-top
from tensorpipe.trainer import command_line  # pylint: disable=g-import-not-at-top

flags.DEFINE_list('tables', ['1', '2'], 'Which tables: 1, 2 or 1,2.')
flags.register_validator('tables', lambda tables: set(tables) <= {'1', '2'},
                         message='give 1, 2 or 1,2')
FLAGS = flags.FLAGS

AMOEBA_BATCH, AMOEBA_M = 128, 16
TRANSFORMER_BATCH, TRANSFORMER_M = 32, 32


@functools.lru_cache(maxsize=None)
def AmoebaProfiles(num_cells, filters, batch=AMOEBA_BATCH):
  layers = amoebanet.AmoebaNetLayers('D', num_cells, filters, image_size=224)
  return tuple(cost_model.Profiles(layers, [[batch, 224, 224, 3]]))


@functools.lru_cache(maxsize=None)
def _TransformerParts():
  return cost_model.Profiles(workloads.TransformerStack(1, 2048, 8192, 32, 32000),
                             [[1024, TRANSFORMER_BATCH]])


def TransformerProfiles(num_layers):
  """Transformer-L's profiles: its one block profiled once, repeated."""
  embedding, block, softmax = _TransformerParts()
  return [embedding] + [block] * num_layers + [softmax]


def _Fits(profiles, batch, k, m, recompute, device, bytes_per_param):
  """Whether the planner finds a configuration of exactly K devices (S = 1) that fits."""
  if len(profiles) < k:
    return True  # Too few layers to fill K devices: smaller models count as fitting.
  try:
    planner.PlanPipeline(profiles, batch, k, device, schedules=('gpipe',), recomputes=(recompute,),
                         micro_batches=(m,), bytes_per_param=bytes_per_param, pipeline_devices=(k,),
                         replicas=(1,))
  except ValueError:
    return False
  return True


def _Best(profiles, batch, k, m, recompute, device, bytes_per_param):
  return planner.PlanPipeline(profiles, batch, k, device, schedules=('gpipe',),
                              recomputes=(recompute,), micro_batches=(m,),
                              bytes_per_param=bytes_per_param, pipeline_devices=(k,), replicas=(1,)).best


def _Configs(ks, m):
  """Naive-1 (no micro-batches, no re-computation), then Pipeline-K for each K."""
  return [('Naive-1', 1, 1, 'never')] + [('Pipeline-%d' % k, k, m, 'always') for k in ks]


def Table1():
  tpu2, tpu3 = device_profiles.PROFILES['TPUv2-core'], device_profiles.PROFILES['TPUv3-core']
  print('Table 1, AmoebaNet-D on %s (%s per device), 224x224, batch %d, M = %d, 12 bytes per '
        'parameter' % (tpu2.name, units.FormatBytes(tpu2.memory), AMOEBA_BATCH, AMOEBA_M))
  paper = {'Naive-1': ((18, 208), '82M'), 'Pipeline-1': ((18, 416), '318M'),
           'Pipeline-2': ((18, 544), '542M'), 'Pipeline-4': ((36, 544), '1.05B'),
           'Pipeline-8': ((72, 512), '1.8B')}
  configs = _Configs((1, 2, 4, 8), AMOEBA_M)
  print('| config | the planner: (L, D) | parameters | peak per device | the paper |')
  print('|---|---|---:|---:|---|')
  for label, k, m, recompute in configs:
    num_cells = paper[label][0][0]

    def Fits(d, num_cells=num_cells, k=k, m=m, recompute=recompute):
      return _Fits(AmoebaProfiles(num_cells, d), AMOEBA_BATCH, k, m, recompute, tpu2, 12)

    d = capacity.LargestFitting(lambda i, f=Fits: f(32 * i), 1, 40)
    if d is None:
      print('| %s | none with L = %d | | | (%d, %d), %s |' % ((label, num_cells) + paper[label][0] +
                                                              (paper[label][1],)))
      continue
    profiles = AmoebaProfiles(num_cells, 32 * d)
    best = _Best(profiles, AMOEBA_BATCH, k, m, recompute, tpu2, 12)
    print('| %s | (%d, %d) | %.0fM | %s | (%d, %d), %s |' % (
        label, num_cells, 32 * d, sum(p.params for p in profiles) / 1e6,
        units.FormatBytes(best.peak_memory), paper[label][0][0], paper[label][0][1],
        paper[label][1]), flush=True)

  print('\nTable 1, Transformer-L on %s (%s per device), sequence 1024, batch %d, M = %d, 8 bytes '
        'per parameter' % (tpu3.name, units.FormatBytes(tpu3.memory), TRANSFORMER_BATCH,
                           TRANSFORMER_M))
  paper_l = {'Naive-1': 3, 'Pipeline-1': 13, 'Pipeline-8': 103, 'Pipeline-32': 415,
             'Pipeline-128': 1663}
  configs = _Configs((1, 8, 32, 128), TRANSFORMER_M)
  print('| config | the planner: L | parameters | peak per device | the paper: L |')
  print('|---|---:|---:|---:|---:|')
  for label, k, m, recompute in configs:
    num_layers = capacity.LargestFitting(
        lambda n, k=k, m=m, recompute=recompute: _Fits(
            TransformerProfiles(n), TRANSFORMER_BATCH, k, m, recompute, tpu3, 8), 0, 8192)
    if num_layers is None:
      print('| %s | none | | | %d |' % (label, paper_l[label]))
      continue
    profiles = TransformerProfiles(num_layers)
    peak = _Best(profiles, TRANSFORMER_BATCH, min(k, len(profiles)), m, recompute, tpu3,
                 8).peak_memory
    print('| %s | %d | %.2fB | %s | %d |' % (label, num_layers,
                                              sum(p.params for p in profiles) / 1e9,
                                              units.FormatBytes(peak), paper_l[label]), flush=True)


def _Ratios(profiles, batch, device, ks, ms, bytes_per_param):
  """{(K, M): predicted step time}, each the best split of that K and M (memory unbounded)."""
  roomy = dataclasses.replace(device, memory=1e15)
  return {(k, m): _Best(profiles, batch, k, m, 'always', roomy, bytes_per_param).step_time
          for k in ks for m in ms}


def Table2():
  tpu3, p100 = device_profiles.PROFILES['TPUv3-core'], device_profiles.PROFILES['P100-16GB-PCIe']
  paper = {
      'AmoebaNet-D (18, 256)': {1: (1, 1.13, 1.38), 4: (1.07, 1.26, 1.72), 32: (1.21, 1.84, 3.48)},
      'Transformer-48': {1: (1, 1.07, 1.3), 4: (1.7, 3.2, 4.8), 32: (1.8, 3.4, 6.3)}}
  models = {'AmoebaNet-D (18, 256)': (AmoebaProfiles(18, 256), AMOEBA_BATCH, 12),
            'Transformer-48': (TransformerProfiles(48), TRANSFORMER_BATCH, 8)}
  ks, ms = (2, 4, 8), (1, 4, 32)
  print('\nTable 2 on %s (peak %.1f Tflop/s x efficiency %.2f, link %.0f GB/s): throughput '
        'normalised to K = 2, M = 1, the planner / the paper' % (
            tpu3.name, tpu3.peak_flops / 1e12, tpu3.efficiency, tpu3.link_bandwidth / 1e9))
  for name, (profiles, batch, bpp) in models.items():
    times = _Ratios(profiles, batch, tpu3, ks, ms, bpp)
    print('\n%s, batch %d\n\n| M | K=2 | K=4 | K=8 |\n|---|---|---|---|' % (name, batch))
    for m in ms:
      print('| %d | %s |' % (m, ' | '.join(
          '%.2f / %s' % (times[(2, 1)] / times[(k, m)], paper[name][m][i])
          for i, k in enumerate(ks))), flush=True)
  gpu = {'AmoebaNet-D (18, 128)': (AmoebaProfiles(18, 128), AMOEBA_BATCH, 12, (1, 1.7, 2.7)),
         'Transformer-24': (TransformerProfiles(24), TRANSFORMER_BATCH, 8, (1, 1.8, 3.3))}
  print('\nTable 2, GPUs without NVLink: %s (%.1f Tflop/s x %.2f, PCIe %.1f GB/s), M = 32, '
        'normalised to K = 2: the planner / the paper\n' % (
            p100.name, p100.peak_flops / 1e12, p100.efficiency, p100.link_bandwidth / 1e9))
  print('| model | K=2 | K=4 | K=8 |\n|---|---|---|---|')
  for name, (profiles, batch, bpp, figures) in gpu.items():
    times = _Ratios(profiles, batch, p100, ks, (32,), bpp)
    print('| %s | %s |' % (name, ' | '.join(
        '%.2f / %s' % (times[(2, 32)] / times[(k, 32)], figures[i]) for i, k in enumerate(ks))),
          flush=True)


def main(unused_argv):
  args = command_line.Args()
  print(machine.Line(), flush=True)
  start = time.time()
  tables = args.tables
  if '1' in tables:
    Table1()
  if '2' in tables:
    Table2()
  print('\n(%.0f s)' % (time.time() - start))
  return 0


if __name__ == '__main__':
  command_line.Run(main, 'plan_paper')
