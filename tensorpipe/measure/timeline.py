"""Timeline: a picture of one pipelined step, one row per device (the paper's Figure 2c, measured).

Forward, re-computation, backward and weight-gradient time are coloured, other work is grey, idle
time is left blank; each pipeline task is labelled F/R/B/W with its micro-batch. It draws a traced
step (`profiling.Trace`) or a simulated one (`simulator.SimulatedStep`) the same way, so the two can
be compared.
"""

import collections
from typing import IO, Mapping, Sequence, Tuple, Union

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from tensorpipe.measure import profiling  # pylint: disable=g-import-not-at-top
from tensorpipe.measure import simulator  # pylint: disable=g-import-not-at-top

COLOURS = {
    'forward': '#4C72B0',
    'recompute': '#DD8452',
    'backward': '#55A868',
    'weight': '#8172B3',
    'setup': '#8C8C8C',
    'transfer': '#B0B0B0',
    'update': '#937860',
    'other': '#C8C8C8',
}
PathOrFile = Union[str, IO[bytes]]


def Draw(rows: Mapping[str, Mapping[str, Sequence[Tuple[float, float]]]], step_time: float,
         path: PathOrFile, title: str,
         tasks: Sequence[Tuple[str, str, int, float, float]] = ()) -> PathOrFile:
  """Writes a PNG; returns `path`.

  Args:
    rows: ordered {row label: {category: [(start, end)]}} in seconds.
    step_time: seconds, the x-axis length.
    path: output PNG path, or a binary file object (e.g. io.BytesIO, for a PNG in memory).
    title: figure title.
    tasks: [(row label, category, micro_batch, start, end)] to label.
  """
  labels = list(rows)
  fig, ax = plt.subplots(figsize=(12, 0.7 * len(labels) + 1.6))
  for i, label in enumerate(labels):
    for category, spans in rows[label].items():
      bars = [(start, end - start) for start, end in simulator.MergeSpans(spans)]
      ax.broken_barh(bars, (i - 0.38, 0.76), facecolors=COLOURS.get(category, '#C8C8C8'),
                     linewidth=0)
  row_of = {label: i for i, label in enumerate(labels)}
  min_width = step_time / 60.0
  for label, category, micro_batch, start, end in tasks:
    if category in profiling.TASK_LETTERS and end - start >= min_width and label in row_of:
      text = '%s%d' % (profiling.TASK_LETTERS[category], micro_batch)
      ax.text((start + end) / 2, row_of[label], text, ha='center', va='center', fontsize=7,
              color='white')
  ax.set_yticks(range(len(labels)))
  ax.set_yticklabels(labels)
  ax.invert_yaxis()
  ax.set_xlim(0, step_time)
  ax.set_xlabel('seconds from the start of the step (blank: idle)')
  ax.set_title(title, fontsize=10)
  handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[c]) for c in COLOURS]
  ax.legend(handles, list(COLOURS), ncol=len(COLOURS), fontsize=7, loc='upper center',
            bbox_to_anchor=(0.5, -0.28), frameon=False)
  fig.tight_layout()
  fig.savefig(path, dpi=110, format='png')
  plt.close(fig)
  return path


def DrawTrace(trace: profiling.Trace, path: PathOrFile, title: str) -> PathOrFile:
  """Draws a profiling.Trace: one row per device."""
  rows = collections.OrderedDict((d, collections.defaultdict(list)) for d in trace.devices)
  for op in trace.compute_ops:
    rows[op.device][op.category].append((op.start, op.end))
  device_of_partition = trace.PartitionDevices()
  tasks = []
  for pipeline in trace.pipelines or [None]:  # Each pipeline's tasks apart (see Trace.Tasks).
    tasks += [(device_of_partition[(pipeline, k)], kind, t, start, end)
              for k, kind, t, start, end in trace.Tasks(pipeline)]
  return Draw(rows, trace.step_time, path, title, tasks)


def DrawSimulated(result: simulator.SimulatedStep, path: PathOrFile, title: str) -> PathOrFile:
  """Draws a simulator.SimulatedStep: one row per device (a device holds one or more partitions)."""
  rows = collections.OrderedDict(('device %d' % d, collections.defaultdict(list))
                                 for d in range(len(result.busy)))
  tasks = []
  for i in result.timeline:
    rows['device %d' % i.device][i.kind].append((i.start, i.end))
    tasks.append(('device %d' % i.device, i.kind, i.micro_batch, i.start, i.end))
  return Draw(rows, result.step_time, path, title, tasks)
