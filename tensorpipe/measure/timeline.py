"""Timeline: a picture of one pipelined step, one row per device (the paper's Figure 2c, measured).

Forward, re-computation, backward and weight-gradient time are coloured, other work is grey, idle
time is left blank; each pipeline task is labelled F/R/B/W with its micro-batch. It draws a traced
step (`profiling.Trace`) or a simulated one (`simulator.SimulatedStep`) the same way, so the two can
be compared. `Figure` and `TraceFigure` give the picture as a matplotlib Figure (for an image
summary, lingvo.core.plot.FigureToSummary), `Draw` and `DrawTrace` write it as a PNG. Figures are
made without pyplot: drawing leaves no figure open in pyplot's global state.
"""

import collections
from typing import IO, Mapping, Sequence, Tuple, Union

from matplotlib import figure as mpl_figure
from matplotlib import patches

from tensorpipe.measure import profiling
from tensorpipe.measure import simulator

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


Rows = Mapping[str, Mapping[str, Sequence[Tuple[float, float]]]]
Tasks = Sequence[Tuple[str, str, int, float, float]]


def Figure(rows: Rows, step_time: float, title: str, tasks: Tasks = ()) -> mpl_figure.Figure:
  """The timeline as a matplotlib Figure.

  Args:
    rows: ordered {row label: {category: [(start, end)]}} in seconds.
    step_time: seconds, the x-axis length.
    title: figure title.
    tasks: [(row label, category, micro_batch, start, end)] to label.
  """
  labels = list(rows)
  fig = mpl_figure.Figure(figsize=(12, 0.7 * len(labels) + 1.6), dpi=110)
  ax = fig.add_subplot()
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
  handles = [patches.Rectangle((0, 0), 1, 1, color=COLOURS[c]) for c in COLOURS]
  ax.legend(handles, list(COLOURS), ncol=len(COLOURS), fontsize=7, loc='upper center',
            bbox_to_anchor=(0.5, -0.28), frameon=False)
  fig.tight_layout()
  return fig


def Draw(rows: Rows, step_time: float, path: PathOrFile, title: str,
         tasks: Tasks = ()) -> PathOrFile:
  """Writes the timeline (`Figure`) as a PNG at `path`, a path or a binary file object (e.g.
  io.BytesIO, for a PNG in memory); returns `path`."""
  Figure(rows, step_time, title, tasks).savefig(path, format='png')
  return path


def TraceFigure(trace: profiling.Trace, title: str) -> mpl_figure.Figure:
  """The timeline of a profiling.Trace as a matplotlib Figure: one row per device."""
  rows = collections.OrderedDict((d, collections.defaultdict(list)) for d in trace.devices)
  for op in trace.compute_ops:
    rows[op.device][op.category].append((op.start, op.end))
  device_of_partition = trace.PartitionDevices()
  tasks = []
  for pipeline in trace.pipelines or [None]:  # Each pipeline's tasks apart (see Trace.Tasks).
    tasks += [(device_of_partition[(pipeline, k)], kind, t, start, end)
              for k, kind, t, start, end in trace.Tasks(pipeline)]
  return Figure(rows, trace.step_time, title, tasks)


def DrawTrace(trace: profiling.Trace, path: PathOrFile, title: str) -> PathOrFile:
  """Writes the timeline of a profiling.Trace (`TraceFigure`) as a PNG at `path`; returns it."""
  TraceFigure(trace, title).savefig(path, format='png')
  return path


def DrawSimulated(result: simulator.SimulatedStep, path: PathOrFile, title: str) -> PathOrFile:
  """Draws a simulator.SimulatedStep: one row per device (a device holds one or more partitions)."""
  rows = collections.OrderedDict(('device %d' % d, collections.defaultdict(list))
                                 for d in range(len(result.busy)))
  tasks = []
  for i in result.timeline:
    rows['device %d' % i.device][i.kind].append((i.start, i.end))
    tasks.append(('device %d' % i.device, i.kind, i.micro_batch, i.start, i.end))
  return Draw(rows, result.step_time, path, title, tasks)
