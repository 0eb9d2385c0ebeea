"""The planner's answer: configurations ranked by predicted step time, as a table and as flags.

`planner.PlanPipeline` returns a `Ranking` of `Configuration`s. `Format` prints it as the table
`tools.plan` and the trainer's --tensorpipe_plan show; `TrainerFlags` and `Overrides` give the
trainer flags and the --model_params_override text that run a configuration.
"""

import dataclasses
from typing import List, Optional, Tuple

from tensorpipe import units
from tensorpipe.measure import device_profiles


@dataclasses.dataclass
class Configuration:
  """One configuration and what the planner predicts for it."""
  replicas: int  # S
  pipeline_devices: int  # K: the devices of one replica's pipeline
  micro_batches: int  # M
  schedule: str
  recompute: str
  sizes: List[int]  # Layers per partition.
  # Seconds per mini-batch (all replicas together), examples/s and the idle share of the devices
  # in the simulated step; None where the search did not simulate it (see PlanPipeline's `exact`).
  step_time: Optional[float]
  examples_per_second: Optional[float]
  bubble: Optional[float]
  device_memory: List[float]  # Predicted peak bytes of each partition's device.
  fits: bool
  why: str = ''  # Why it does not fit (empty if it does).
  virtual_stages: int = 1  # v: partitions per device ('interleaved_1f1b', 'zbv').

  @property
  def peak_memory(self) -> float:
    return max(self.device_memory)

  @property
  def devices(self) -> int:
    return self.replicas * self.pipeline_devices

  @property
  def simulated(self) -> bool:
    return self.step_time is not None

  def Label(self) -> str:
    v = ' v=%d' % self.virtual_stages if self.virtual_stages > 1 else ''
    return 'S=%d K=%d%s M=%d %s %s' % (self.replicas, self.pipeline_devices, v, self.micro_batches,
                                       self.schedule, self.recompute)


@dataclasses.dataclass
class Ranking:
  """Configurations, best first: those that fit by predicted step time, then those that do not."""
  title: str
  profile: device_profiles.DeviceProfile
  memory: float
  batch: int
  configurations: List[Configuration]

  @property
  def best(self) -> Configuration:
    return self.configurations[0]

  def __str__(self) -> str:
    return Format(self)


def Overrides(config: Configuration, pipeline_path: str = 'task.pipeline') -> str:
  """The --model_params_override text that sets `config` on the TensorPipeLayer at the path."""
  return '; '.join('%s.%s: %s' % (pipeline_path, key, value) for key, value in (
      ('num_devices', config.pipeline_devices), ('num_micro_batches', config.micro_batches),
      ('schedule', config.schedule), ('recompute', config.recompute),
      ('virtual_stages', config.virtual_stages)))


def TrainerFlags(config: Configuration, device: device_profiles.DeviceProfile,
                 pipeline_path: str = 'task.pipeline') -> str:
  """Trainer flags that run `config`: devices, split size and the params override."""
  n, k = config.devices, config.pipeline_devices
  if device.cores is not None:
    where = '--cpu_devices=%d --worker_split_size=%d' % (n, k)
  elif device.name.startswith('TPU'):
    where = '--worker_tpus=%d --worker_split_size=%d' % (n, k)
  else:
    where = '--worker_gpus=%d --worker_split_size=%d' % (n, k)
  return '%s --model_params_override="%s"' % (where, Overrides(config, pipeline_path))


def Format(ranking: Ranking, limit: Optional[int] = 20) -> str:
  """The ranking as a table (the first `limit` rows, and the best of those that do not fit)."""
  p = ranking.profile
  lines = ['%s: batch %d, devices %s (%s), %s each; %.3g Tflop/s, link %.3g GB/s' % (
      ranking.title, ranking.batch, p.name, 'shared %g cores' % p.cores if p.cores else
      'independent', units.FormatBytes(ranking.memory), p.rate / 1e12, p.link_bandwidth / 1e9)]
  header = ('rank', 'S', 'K', 'v', 'M', 'schedule', 'recompute', 'step ms', 'examples/s', 'bubble',
            'peak/device', 'fits')
  rows: List[Tuple[str, ...]] = [header]
  shown = ranking.configurations if limit is None else ranking.configurations[:limit]
  not_shown = [c for c in ranking.configurations[len(shown):] if not c.fits][:3]
  for i, c in enumerate(shown + not_shown):
    rank = str(i + 1) if i < len(shown) else str(ranking.configurations.index(c) + 1)
    predicted = _PredictedCells(c)
    rows.append(tuple([rank, str(c.replicas), str(c.pipeline_devices), str(c.virtual_stages),
                       str(c.micro_batches), c.schedule, c.recompute] + predicted +
                      [units.FormatBytes(c.peak_memory), 'yes' if c.fits else 'no: ' + c.why]))
  widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
  for r in rows:
    lines.append('  '.join(v.ljust(w) if i in (5, 6, 11) else v.rjust(w)
                           for i, (v, w) in enumerate(zip(r, widths))).rstrip())
  hidden = len(ranking.configurations) - len(shown) - len(not_shown)
  if hidden > 0:
    lines.append('(%d more configurations not shown)' % hidden)
  return '\n'.join(lines)


def _PredictedCells(config: Configuration) -> List[str]:
  """A table row's step ms, examples/s and bubble of `config`, or '-' if it was not simulated."""
  if config.step_time is None:  # Not simulated.
    return ['-'] * 3
  assert config.examples_per_second is not None and config.bubble is not None, (
      'a simulated configuration has its examples/s and bubble')
  return ['%.3f' % (1e3 * config.step_time), '%.1f' % config.examples_per_second,
          '%.1f%%' % (100 * config.bubble)]
