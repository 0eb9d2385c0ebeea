"""Where a traced pipeline step's device time goes: setup, bubble, imbalance, recompute, update.

The GPipe paper's Figure 4 splits a step into its overheads to show which one to attack: the bubble
shrinks with more micro-batches, imbalance with better partitions, re-computation only by giving up
memory. `OverheadShares` reads the busy time of each category from a `profiling.Trace` and splits
the idle time between bubble and imbalance with the simulator.
"""

from typing import Dict

import numpy as np

from tensorpipe.measure import profiling
from tensorpipe.measure import simulator

SHARES = ('setup', 'bubble', 'imbalance', 'recompute', 'update', 'other', 'work')


def OverheadShares(trace: profiling.Trace, num_micro_batches: int) -> Dict[str, float]:
  """Shares of (devices x step time), adding up to 1, for each of SHARES.

  Busy time by category comes from the trace: setup (the micro-batch split and concat), recompute,
  update, work (forward, backward and weight-gradient passes) and other (everything else,
  transfers included).
  Idle time is split into bubble and imbalance: the idle share that TensorPipeLayer's default
  schedule has with every partition at the mean partition time is bubble; the rest of the idle time
  is put down to imbalance (and to dependencies the schedule does not model, such as transfers).

  Args:
    trace: a traced step of a TensorPipeLayer (with partition calls).
    num_micro_batches: the step's M.
  """
  devices = trace.devices
  total = len(devices) * trace.step_time
  by_cat = trace.BusyByCategory()
  busy = trace.Busy()
  shares = {c: sum(by_cat[d].get(c, 0.0) for d in devices) / total
            for c in ('setup', 'recompute', 'update', 'forward', 'backward', 'weight', 'transfer',
                      'other')}
  idle = 1.0 - sum(busy.values()) / total
  partitions = trace.PartitionTimes()
  mean = simulator.TaskTimes(*[float(np.mean([getattr(c, f) for c in partitions]))
                               for f in ('forward', 'backward', 'recompute')])
  bubble = simulator.SimulateFillDrain([mean] * len(partitions), num_micro_batches).idle_fraction
  bubble = min(bubble, idle)
  return {'setup': shares['setup'], 'bubble': bubble, 'imbalance': idle - bubble,
          'recompute': shares['recompute'], 'update': shares['update'],
          'other': shares['other'] + shares['transfer'],
          'work': shares['forward'] + shares['backward'] + shares['weight']}
