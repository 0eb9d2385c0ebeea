"""Partition report: per partition, its layers, cost, share, parameters and estimated memory.

Shows a user why a partitioning is what it is, and what it predicts: the imbalance (max/mean
partition cost) and the fraction of device time spent working once the fill-drain bubble
(`schedule_builders.FillDrainBubbleFraction`) and the imbalance are paid. With several partitions
per device (virtual stages), each row names its device and each device's memory is the sum of
its partitions'.
"""

import dataclasses
from typing import List, Optional

from tensorpipe.partitioner import balancing
from tensorpipe.partitioner import partitioning
from tensorpipe import schedule_builders
from tensorpipe import units


@dataclasses.dataclass
class PartitionRow:
  """One partition of the report."""
  index: int
  first: str
  last: str
  num_layers: int
  cost: float
  share: float
  params: Optional[int]  # Trainable parameters (None without input shapes).
  param_bytes: Optional[float]  # Parameters with optimizer slots and other variables.
  # Stashed boundary input + activations held in the backward (by the recompute mode).
  activation_bytes: Optional[float]
  device: int  # The device that holds the partition.


@dataclasses.dataclass
class PartitionReport:
  """What `Build` found; `str()` formats it as a table."""
  title: str
  cost_source: str
  algorithm: str
  num_micro_batches: int
  rows: List[PartitionRow]
  imbalance: float
  bubble: float
  efficiency: float
  device_bytes: Optional[List[float]] = None  # Per device, with several partitions on a device.
  recompute: str = 'always'  # The recompute mode the activation memory is estimated for.

  def __str__(self) -> str:
    return Format(self)


def _Sum(values):
  return float(sum(values))


def Build(plan: partitioning.Plan, title: str = 'pipeline') -> PartitionReport:
  """A PartitionReport of `plan` (a partitioning.Plan)."""
  costs = plan.PartitionCosts()
  total = sum(costs) or 1.0
  profiles = plan.Profiles()
  mem = plan.Memory()
  devices = plan.devices
  rows, start = [], 0
  for k, size in enumerate(plan.sizes):
    layers = plan.layer_params[start:start + size]
    params = param_bytes = act_bytes = None
    if profiles is not None and mem is not None:  # Both or neither (Plan.Memory).
      partition = profiles[start:start + size]
      params = sum(p.params for p in partition)
      param_bytes = _Sum(p.params * plan.bytes_per_param + p.state * 4 for p in partition)
      act_bytes = mem.Of(start, start + size) - param_bytes
    rows.append(PartitionRow(k, layers[0].name, layers[-1].name, size, costs[k], costs[k] / total,
                             params, param_bytes, act_bytes, devices[k]))
    start += size
  num_micro = plan.num_micro_batches
  shared = len(set(devices)) < len(devices)
  return PartitionReport(title, plan.cost_source, plan.algorithm, num_micro, rows,
                         balancing.Imbalance(costs),
                         schedule_builders.FillDrainBubbleFraction(len(plan.sizes), num_micro),
                         balancing.Efficiency(costs, num_micro),
                         plan.DeviceMemory() if shared and profiles is not None else None,
                         plan.recompute)


def _Num(value):
  if value is None:
    return '-'
  for unit, scale in (('T', 1e12), ('G', 1e9), ('M', 1e6), ('k', 1e3)):
    if abs(value) >= scale:
      return '%.2f%s' % (value / scale, unit)
  return '%.3g' % value


def _Bytes(value):
  return '-' if value is None else units.FormatBytes(value)


def Format(report: PartitionReport) -> str:
  """The report as a fixed-width table with a summary line."""
  lines = [
      '%s: %d partitions, cost %r, algorithm %r, M = %d, recompute %r' %
      (report.title, len(report.rows), report.cost_source, report.algorithm,
       report.num_micro_batches, report.recompute)
  ]
  header = ('partition', 'layers', 'device', 'n', 'cost', 'share', 'params', 'param mem', 'act mem')
  table = [header]
  for r in report.rows:
    layers = r.first if r.num_layers == 1 else '%s .. %s' % (r.first, r.last)
    table.append((str(r.index), layers, str(r.device), str(r.num_layers), _Num(r.cost),
                  '%.1f%%' % (100 * r.share), _Num(r.params), _Bytes(r.param_bytes),
                  _Bytes(r.activation_bytes)))
  widths = [max(len(row[i]) for row in table) for i in range(len(header))]
  for row in table:
    lines.append('  '.join(partition.ljust(w) if i < 2 else partition.rjust(w)
                           for i, (partition, w) in enumerate(zip(row, widths))).rstrip())
  lines.append('imbalance (max/mean cost) %.3f; fill-drain bubble %.1f%%; predicted efficiency '
               '%.1f%%' % (report.imbalance, 100 * report.bubble, 100 * report.efficiency))
  if report.device_bytes is not None:
    lines.append('memory per device (its partitions together): %s' % ', '.join(
        '%d: %s' % (d, _Bytes(b)) for d, b in enumerate(report.device_bytes)))
  return '\n'.join(lines)
