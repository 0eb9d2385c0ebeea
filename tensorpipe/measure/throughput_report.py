"""Text reports of pipeline throughput: measured step times beside the simulator's predictions.

The GPipe paper's Table 2 gives throughput for K x M grids. Measured here on logical CPU devices,
each cell sits beside the simulator's two machine models (independent devices, shared cores), with
their errors, so a reader can judge how far to trust the simulator where it predicts what cannot be
measured here: `DeepPredictionTable` stacks one measured block 128 deep, for K up to 128.
"""

from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from tensorpipe.measure import profiling
from tensorpipe.measure import simulator
from tensorpipe.partitioner import balancing

GridTimes = Mapping[Tuple[int, int], float]  # {(K, M): step seconds}


def ThroughputTable(ks: Sequence[int], ms: Sequence[int], measured: GridTimes,
                    independent: GridTimes, shared: GridTimes, cores: float,
                    tracing: Optional[Mapping[int, float]] = None,
                    shared_tasks: Optional[GridTimes] = None) -> str:
  """Text: the K x M grid of measured and simulated throughput and step times, and the mean errors.

  Args:
    ks, ms: the grid's K and M values.
    measured, independent, shared: {(K, M): step seconds} measured, simulated with independent
      devices, and simulated with `cores` shared cores.
    cores: C of the shared-core model.
    tracing: optional {M: timed / traced step time of K=1}: adds the errors of the predictions
      scaled by it (the tracing's own cost taken out), over K > 1 only, since K = 1 set the scale.
    shared_tasks: optional {(K, M): step seconds} of the shared-core model fed with per-task costs
      (profiling.Trace.GroupTimes) instead of summed per-layer ones: adds its errors.
  """
  base_k = 2 if 2 in ks else ks[0]
  lines = ['throughput normalised to K=%d, M=1: measured / independent devices / shared cores '
           '(C=%s); in brackets the step ms of each' % (base_k, cores)]
  lines.append('%4s ' % 'M' + ''.join('%35s' % ('K=%d' % k) for k in ks))
  for m in ms:
    row = ''
    for k in ks:
      row += '  %5.2f / %4.2f / %4.2f (%3.0f/%3.0f/%3.0f)' % (
          tuple(v[(base_k, 1)] / v[(k, m)] for v in (measured, independent, shared)) +
          tuple(1e3 * v[(k, m)] for v in (measured, independent, shared)))
    lines.append('%4d ' % m + row)

  def Errors(model, keys):
    errors = [abs(model[key] - measured[key]) / measured[key] for key in keys]
    return 100 * float(np.mean(errors)), 100 * float(np.max(errors))

  keys = sorted(measured)
  lines.append('step time error over %d configurations: independent devices mean %.0f%% '
               '(max %.0f%%), shared cores mean %.0f%% (max %.0f%%)' % (
                   (len(keys),) + Errors(independent, keys) + Errors(shared, keys)))
  few = [key for key in keys if key[0] <= cores]
  if len(few) < len(keys):
    lines.append('  with K <= %s only (%d configurations): independent devices mean %.0f%%, shared '
                 'cores mean %.0f%%' % (cores, len(few), Errors(independent, few)[0],
                                        Errors(shared, few)[0]))
  if shared_tasks:
    lines.append('  shared cores fed per-task spans and parallelism: mean %.0f%% (max %.0f%%)' %
                 Errors(shared_tasks, keys))
  if tracing:
    scaled = [key for key in keys if key[0] > 1 and key[1] in tracing]

    def Scaled(model):
      return {key: model[key] * tracing[key[1]] for key in scaled}

    lines.append('  scaled by timed/traced K=1 step (%s), K > 1 only (%d configurations): '
                 'independent devices mean %.0f%%, shared cores mean %.0f%%%s' % (
                     ', '.join('M=%d: %.2f' % (m, tracing[m]) for m in sorted(tracing)),
                     len(scaled), Errors(Scaled(independent), scaled)[0],
                     Errors(Scaled(shared), scaled)[0],
                     ', per-task %.0f%%' % Errors(Scaled(shared_tasks), scaled)[0]
                     if shared_tasks else ''))
  return '\n'.join(lines)


def TraceNote(num_micro_batches: int, trace: profiling.Trace,
              layer_costs: Sequence[simulator.TaskTimes], timed: Optional[float]) -> str:
  """One line on a traced K=1 step that fed the simulator: its time, work and spans.

  The traced step against the timed one (seconds, or None) shows the tracing's own cost; the
  layers' spans summed against the tasks' (F, R, B per micro-batch, first op to last) show how much
  layers overlap each other, which per-layer costs cannot carry; the other ops' work is outside the
  simulated tasks.
  """
  work = sum(sum(by_cat.values()) for by_cat in trace.WorkByCategory().values())
  layer_work = sum(c.Work(kind) for c in layer_costs for kind in simulator.TASK_KINDS)
  layer_span = sum(getattr(c, kind) for c in layer_costs for kind in simulator.TASK_KINDS)
  task_span = sum(end - start for _, kind, _, start, end in trace.Tasks()
                  if kind in simulator.TASK_KINDS)
  return ('  traced K=1 M=%d step %.0f ms (timed %s): layers\' F, R, B ops %.0f core-ms, their '
          'spans %.0f ms, the tasks\' %.0f ms; other ops %.0f core-ms' % (
              num_micro_batches, 1e3 * trace.step_time,
              '%.0f ms' % (1e3 * timed) if timed else '-', 1e3 * layer_work, 1e3 * layer_span,
              1e3 * task_span, 1e3 * (work - layer_work)))


DEEP_KS = (2, 4, 8, 16, 32, 64, 128)


def DeepPredictionTable(costs_by_m: Dict[int, Sequence[simulator.TaskTimes]], name: str,
                        depth: int = 128, ks: Sequence[int] = DEEP_KS) -> str:
  """Simulated throughput of a stack `depth` blocks deep, normalised to the first K at the least M.

  Args:
    costs_by_m: {M: per-layer costs of a measured stack (an embedding, blocks, a softmax) for the
      whole mini-batch}. The deep stack keeps the first and last layers and repeats the median
      block `depth` times.
    name: the measured model's name; its first word names the blocks in the title.
    depth: blocks of the simulated stack.
    ks: the partition counts of the columns, each at most depth + 2.
  """
  if max(ks) > depth + 2:
    raise ValueError('DeepPredictionTable: K=%d partitions for %d layers' % (max(ks), depth + 2))
  lines = ['Simulated: %s blocks stacked %d deep (+ embedding and softmax), normalised to K=%d, '
           'M=%d' % (name.split(' ')[0], depth, ks[0], min(costs_by_m))]
  lines.append('%4s ' % 'M' + ''.join('%8s' % ('K=%d' % k) for k in ks))
  base = None
  for m, costs in sorted(costs_by_m.items()):
    block = costs[1:-1]
    mean_block = simulator.TaskTimes(*[float(np.median([getattr(c, f) for c in block]))
                                       for f in ('forward', 'backward', 'recompute')])
    deep = [costs[0]] + [mean_block] * depth + [costs[-1]]
    row = []
    for k in ks:
      sizes = balancing.OptimalSplit([c.forward + c.backward + c.recompute for c in deep], k)
      step = simulator.SimulateFillDrain(simulator.SplitCosts(deep, sizes, m), m).step_time
      if base is None:
        base = step
      row.append(base / step)
    lines.append('%4d ' % m + ''.join('%8.2f' % v for v in row))
  return '\n'.join(lines)
