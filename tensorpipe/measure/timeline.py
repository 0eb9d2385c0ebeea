"""Timeline: a picture of one pipelined step, one row per device (the paper's Figure 2c, measured).

Forward, re-computation, backward and weight-gradient time are coloured, other work is grey, idle
time is left blank; each pipeline task is labelled F/R/B/W with its micro-batch (and its partition
on a device that runs several), where the label fits. It draws a traced
step (`profiling.Trace`) or a simulated one (`simulator.SimulatedStep`) the same way, so the two can
be compared. `Figure` and `TraceFigure` give the picture as a matplotlib Figure (for an image
summary, lingvo.core.plot.FigureToSummary), `Draw` and `DrawTrace` write it as a PNG. Figures are
made without pyplot: drawing leaves no figure open in pyplot's global state.
"""

import collections
from typing import IO, DefaultDict, Dict, List, Mapping, Sequence, Tuple, Union

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
# (row label, category, partition, micro_batch, start, end) of each pipeline task.
Tasks = Sequence[Tuple[str, str, int, int, float, float]]
Label = Tuple[str, float, str, int]  # (row label, x in seconds, text, rotation in degrees)

WIDTH_IN = 12.0  # Figure width, inches.
AXES_POINTS = 0.85 * WIDTH_IN * 72  # About the x-axis length, points.
_CHAR_POINTS, _LINE_POINTS, _BAR_POINTS = 4.6, 9.0, 34.0  # At LABEL_SIZE; a bar's height.
LABEL_SIZE = 7


def Labels(tasks: Tasks, step_time: float) -> List[Label]:
  """Where each task's label goes, and which text: F/R/B/W and the micro-batch ('F3'), with the
  partition too ('F(5,3)': partition 5, micro-batch 3) on a row that runs several partitions (a
  device with virtual stages), so every label says which task runs. A label goes along its bar
  where it fits, across it (rotated 90 degrees) where only that fits, and nowhere else."""
  partitions = collections.defaultdict(set)
  for row, _, partition, _, _, _ in tasks:
    partitions[row].add(partition)
  seconds_per_point = step_time / AXES_POINTS
  out = []
  for row, category, partition, micro_batch, start, end in tasks:
    if category not in profiling.TASK_LETTERS:
      continue
    letter = profiling.TASK_LETTERS[category]
    text = ('%s(%d,%d)' % (letter, partition, micro_batch) if len(partitions[row]) > 1 else
            '%s%d' % (letter, micro_batch))
    width = (end - start) / seconds_per_point  # Points.
    if width >= len(text) * _CHAR_POINTS + 2:
      out.append((row, (start + end) / 2, text, 0))
    elif width >= _LINE_POINTS and len(text) * _CHAR_POINTS <= _BAR_POINTS:
      out.append((row, (start + end) / 2, text, 90))
  return out


def Figure(rows: Rows, step_time: float, title: str, tasks: Tasks = ()) -> mpl_figure.Figure:
  """The timeline as a matplotlib Figure: a row per device, time in milliseconds, the tasks'
  labels (`Labels`), and a legend of the categories drawn.

  Args:
    rows: ordered {row label: {category: [(start, end)]}} in seconds.
    step_time: seconds, the x-axis length.
    title: figure title.
    tasks: [(row label, category, partition, micro_batch, start, end)] to label.
  """
  labels = list(rows)
  fig = mpl_figure.Figure(figsize=(WIDTH_IN, 0.7 * len(labels) + 1.3), dpi=110,
                          layout='constrained')
  ax = fig.add_subplot()
  drawn = set()
  ms = 1e3  # The axis is in milliseconds.
  for i, label in enumerate(labels):
    for category, spans in rows[label].items():
      bars = [(ms * start, ms * (end - start)) for start, end in simulator.MergeSpans(spans)]
      if bars:
        drawn.add(category)
      ax.broken_barh(bars, (i - 0.38, 0.76), facecolors=COLOURS.get(category, '#C8C8C8'),
                     linewidth=0)
  row_of = {label: i for i, label in enumerate(labels)}
  for label, x, text, rotation in Labels(tasks, step_time):
    if label in row_of:
      ax.text(ms * x, row_of[label], text, ha='center', va='center', fontsize=LABEL_SIZE,
              color='white', rotation=rotation)
  ax.set_yticks(range(len(labels)))
  ax.set_yticklabels(labels)
  ax.invert_yaxis()
  ax.set_xlim(0, ms * step_time)
  ax.set_xlabel('milliseconds from the start of the step (blank: idle)')
  ax.set_title(title, fontsize=10)
  shown = [c for c in COLOURS if c in drawn]
  handles = [patches.Rectangle((0, 0), 1, 1, color=COLOURS[c]) for c in shown]
  fig.legend(handles, shown, ncol=max(1, len(shown)), fontsize=8, loc='outside lower center',
             frameon=False)
  return fig


def Draw(rows: Rows, step_time: float, path: PathOrFile, title: str,
         tasks: Tasks = ()) -> PathOrFile:
  """Writes the timeline (`Figure`) as a PNG at `path`, a path or a binary file object (e.g.
  io.BytesIO, for a PNG in memory); returns `path`."""
  Figure(rows, step_time, title, tasks).savefig(path, format='png')
  return path


def TraceFigure(trace: profiling.Trace, title: str) -> mpl_figure.Figure:
  """The timeline of a profiling.Trace as a matplotlib Figure: one row per device."""
  rows: Dict[str, DefaultDict[str, List[Tuple[float, float]]]] = collections.OrderedDict(
      (d, collections.defaultdict(list)) for d in trace.devices)
  for op in trace.compute_ops:
    rows[op.device][op.category].append((op.start, op.end))
  device_of_partition = trace.DeviceOfPartition()
  tasks = []
  for pipeline in trace.PipelineKeys():  # Each pipeline's tasks apart (see Trace.Tasks).
    tasks += [(device_of_partition[(pipeline, k)], kind, k, t, start, end)
              for k, kind, t, start, end in trace.Tasks(pipeline)]
  return Figure(rows, trace.step_time, title, tasks)


def DrawTrace(trace: profiling.Trace, path: PathOrFile, title: str) -> PathOrFile:
  """Writes the timeline of a profiling.Trace (`TraceFigure`) as a PNG at `path`; returns it."""
  TraceFigure(trace, title).savefig(path, format='png')
  return path


def DrawSimulated(result: simulator.SimulatedStep, path: PathOrFile, title: str) -> PathOrFile:
  """Draws a simulator.SimulatedStep: one row per device (a device holds one or more partitions)."""
  rows: Dict[str, DefaultDict[str, List[Tuple[float, float]]]] = collections.OrderedDict(
      ('device %d' % d, collections.defaultdict(list)) for d in range(len(result.busy)))
  tasks = []
  for i in result.timeline:
    rows['device %d' % i.device][i.kind].append((i.start, i.end))
    tasks.append(('device %d' % i.device, i.kind, i.partition, i.micro_batch, i.start, i.end))
  return Draw(rows, result.step_time, path, title, tasks)
