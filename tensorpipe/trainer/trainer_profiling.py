"""Per-partition times, per-device peak memory and the step's timeline in Lingvo's trainer logdir.

A user tuning partitions wants to see, while the model trains, which partition is slowest and which
device is fullest. `ProfilingTrainer` is Lingvo's CPU/GPU trainer whose session traces one training
step now and then (step 2, then every --tensorpipe_profile_every_n_steps); `StepProfile` turns the
trace into:
  - a log table per device: busy time by category (forward, re-computation, backward, ...), idle
    share and the peak of memory allocated during the step (profiling.Trace.PeakMemory);
  - a log table per pipeline (TensorPipeLayer, e.g. a translation model's encoder and decoder) and
    partition: mean forward, backward and re-computation milliseconds per micro-batch;
  - scalar summaries next to Lingvo's own: tensorpipe/<pipeline>/partition<k>/{forward,backward,
    recompute}_ms (<pipeline>: the TensorPipeLayer's name), tensorpipe/<device>/
    {peak_step_memory_mib,busy_fraction}.
The trainer also writes, for each traced step STEP:
  - LOGDIR/train/tensorpipe_trace-STEP.json, the step in the Trace Event Format (chrome_trace):
    its tasks with TensorFlow's ops nested under them and each device's step memory, to open in
    Perfetto or chrome://tracing;
  - the step's timeline PNG (timeline.TraceFigure) as the image summary tensorpipe/timeline;
  - the step's RunMetadata, tagged step_STEP, which TensorBoard's Graphs tab lays over the training
    graph (each op's compute time and memory in that step); the graph goes with the first traced
    step (Lingvo's trainer writes none into LOGDIR/train).
Only the traced step pays for the trace; the others run as before. Summaries and files come from
the trainer task that writes Lingvo's summaries (task 0).
"""

import os

from absl import flags
from lingvo import compat as tf
from lingvo import runners
from lingvo.core import metrics
from lingvo.core import plot

from tensorpipe import layer as layer_lib
from tensorpipe.measure import chrome_trace
from tensorpipe.measure import profiling
from tensorpipe.measure import timeline

flags.DEFINE_integer(
    'tensorpipe_profile_every_n_steps', 100,
    'Trace training step 2 and then every N-th step and log/summarise per-partition times and '
    'per-device peak memory, and write the step as LOGDIR/train/tensorpipe_trace-STEP.json '
    '(0: never). Only traced steps are slower.', lower_bound=0)

FLAGS = flags.FLAGS
FIRST_TRACED_STEP = 2


TRACE_FILE = 'tensorpipe_trace-%d.json'  # In LOGDIR/train, per traced step.
TIMELINE_TAG = 'tensorpipe/timeline'
RUN_METADATA_TAG = 'step_%d'  # The traced step's "Run" in TensorBoard's Graphs tab.


def StepProfile(trace):
  """(log text, {summary tag: value}) for one traced step.

  Partition times are per pipeline where the trace knows the pipelines' names (`Trace.pipelines`),
  tagged tensorpipe/<pipeline>/partition<k>/...; else tensorpipe/partition<k>/....
  """
  values = {}
  busy = trace.Busy()
  peaks = trace.PeakMemory() if trace.HasMemory() else {}
  for device in trace.devices:
    tag = device.replace(':', '_')
    values['tensorpipe/%s/busy_fraction' % tag] = busy.get(device, 0.0) / trace.step_time
    if device in peaks:
      values['tensorpipe/%s/peak_step_memory_mib' % tag] = peaks[device] / 2.0**20
  text = profiling.Summary(trace)
  pipeline_times = trace.PipelinePartitionTimes()
  if pipeline_times:
    text += '\n' + profiling.PipelineSummary(pipeline_times)
  for pipeline, partitions in pipeline_times:
    prefix = 'tensorpipe/' if pipeline is None else 'tensorpipe/%s/' % pipeline
    for k, partition in enumerate(partitions):
      for name in ('forward', 'backward', 'recompute'):
        values['%spartition%d/%s_ms' % (prefix, k, name)] = 1e3 * getattr(partition, name)
  return text, values


def TimelineSummary(trace, title):
  """A tf.Summary holding the timeline of `trace` (timeline.TraceFigure) as the PNG image
  TIMELINE_TAG, rendered by Lingvo's plot.FigureToSummary."""
  summary = plot.FigureToSummary(TIMELINE_TAG, timeline.TraceFigure(trace, title))
  # FigureToSummary tags the image '<name>/image'; the trainer has always written it as
  # TIMELINE_TAG, and TensorBoard keeps one series per tag across runs.
  summary.value[0].tag = TIMELINE_TAG
  return summary


class _TracingSession:
  """A session that traces the runs whose first fetch is a train op, on the steps it is told to."""

  def __init__(self, sess, trainer):
    self._sess = sess
    self._trainer = trainer
    self._train_runs = 0

  def __enter__(self):
    self._sess.__enter__()
    return self

  def __exit__(self, *args):
    return self._sess.__exit__(*args)

  def __getattr__(self, name):
    return getattr(self._sess, name)

  def run(self, fetches, *args, **kwargs):  # pylint: disable=invalid-name
    first = fetches[0] if isinstance(fetches, (list, tuple)) and fetches else None
    if first is None or not self._trainer.IsTrainOp(first) or 'options' in kwargs:
      return self._sess.run(fetches, *args, **kwargs)
    self._train_runs += 1
    if not self._trainer.ShouldTrace(self._train_runs):
      return self._sess.run(fetches, *args, **kwargs)
    out, meta = profiling.TracedRun(self._sess, fetches, *args, **kwargs)
    self._trainer.Report(self._sess, meta)
    return out


class ProfilingTrainer(runners.Trainer):
  """Lingvo's Trainer that logs and summarises a traced step (see the module docstring)."""

  _graph_written = False  # Whether the summary writer holds the training graph yet.

  def IsTrainOp(self, fetch):
    return any(fetch is task.train_op for task in self._model.tasks)

  def ShouldTrace(self, run):
    every = FLAGS.tensorpipe_profile_every_n_steps
    return every > 0 and (run == FIRST_TRACED_STEP or run % every == 0)

  def Report(self, sess, run_metadata):
    """Logs the traced step's profile; with a summary writer, also its scalars, timeline image,
    run metadata and Chrome-trace JSON."""
    step = int(sess.run(self._model.global_step))
    names = [p.name for _, p in layer_lib.Pipelines(self.params)]
    trace = profiling.Trace(run_metadata, pipeline_scope=names)
    text, values = StepProfile(trace)
    tf.logging.info('TensorPipe profile of step %d (one traced step):\n%s', step, text)
    if self._summary_writer:
      for tag, value in sorted(values.items()):
        self._summary_writer.add_summary(metrics.CreateScalarSummary(tag, value), step)
      title = 'step %d: one traced training step' % step
      self._summary_writer.add_summary(TimelineSummary(trace, title), step)
      if not self._graph_written:
        self._summary_writer.add_graph(sess.graph)
        self._graph_written = True
      self._summary_writer.add_run_metadata(run_metadata, RUN_METADATA_TAG % step, step)
      self._summary_writer.flush()
      path = chrome_trace.Write(trace, os.path.join(self.GetTrainDir(), TRACE_FILE % step), title)
      tf.logging.info('TensorPipe trace of step %d: %s (open it in ui.perfetto.dev or '
                      'chrome://tracing)', step, path)

  def _GetSession(self, **kwargs):
    return _TracingSession(super()._GetSession(**kwargs), self)
