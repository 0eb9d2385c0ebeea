"""The machine a figure was measured on, in one line: the CPU, its cores, TensorFlow's CPU kernels.

Step times on a CPU depend on which kernels TensorFlow runs: TensorFlow 2.13 turns its oneDNN
kernels (and their BFC allocator) on by default only on CPUs with AVX-512 VNNI or BF16, AVX-VNNI or
AMX, and TF_ENABLE_ONEDNN_OPTS overrides that; elsewhere it runs its Eigen kernels. A figure
without this line cannot be compared with another machine's. Every benchmark tool prints `Line()`
first, and the planner keys what it measured by `Key()`.
"""

import dataclasses
import os
import platform
from typing import Optional, Set

from tensorpipe import tf_internals


@dataclasses.dataclass(frozen=True)
class Machine:
  """What a measured figure depends on, besides the code and the load."""
  cpu: str  # The CPU model, as /proc/cpuinfo names it.
  cores: int  # Cores this process may use.
  avx512: bool  # Whether the CPU has AVX-512 (the avx512f flag).
  onednn: bool  # Whether TensorFlow runs its oneDNN kernels in this process.
  onednn_opts: str  # TF_ENABLE_ONEDNN_OPTS as set, or 'unset'.
  tensorflow: str  # TensorFlow's version.


def _CpuInfo():
  """(model name, flags) of the first processor in /proc/cpuinfo; ('', set()) without it."""
  model = ''
  cpu_flags: Set[str] = set()
  try:
    with open('/proc/cpuinfo', encoding='utf-8', errors='replace') as f:
      for line in f:
        key, _, value = line.partition(':')
        key = key.strip()
        if key == 'model name' and not model:
          model = value.strip()
        elif key == 'flags' and not cpu_flags:
          cpu_flags = set(value.split())
  except OSError:
    pass
  return model, cpu_flags


def This() -> Machine:
  """This machine and process."""
  model, cpu_flags = _CpuInfo()
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  return Machine(cpu=model or platform.processor() or platform.machine(), cores=cores or 1,
                 avx512='avx512f' in cpu_flags, onednn=tf_internals.OneDnnEnabled(),
                 onednn_opts=os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset'),
                 tensorflow=tf_internals.Version())


def Line(machine: Optional[Machine] = None) -> str:
  """'machine: CPU AMD EPYC 9B14, 2 cores, AVX-512; TensorFlow 2.13.1 with its oneDNN kernels
  (TF_ENABLE_ONEDNN_OPTS unset: the default on this CPU)'."""
  m = machine or This()
  kernels = 'its oneDNN kernels' if m.onednn else 'its Eigen kernels (oneDNN off)'
  why = ('TF_ENABLE_ONEDNN_OPTS unset: the default on this CPU' if m.onednn_opts == 'unset' else
         'TF_ENABLE_ONEDNN_OPTS=%s' % m.onednn_opts)
  return 'machine: CPU %s, %d core%s, %s; TensorFlow %s with %s (%s)' % (
      m.cpu, m.cores, '' if m.cores == 1 else 's', 'AVX-512' if m.avx512 else 'no AVX-512',
      m.tensorflow, kernels, why)


def Key(machine: Optional[Machine] = None) -> str:
  """This machine as measured times depend on it: a part of cache keys."""
  m = machine or This()
  return 'cpu %s; %d cores; tensorflow %s; onednn %s' % (m.cpu, m.cores, m.tensorflow, m.onednn)
