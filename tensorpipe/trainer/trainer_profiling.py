"""Per-partition times and per-device peak memory in Lingvo's trainer logs and summaries.

A user tuning partitions wants to see, while the model trains, which partition is slowest and which
device is fullest. `ProfilingTrainer` is Lingvo's CPU/GPU trainer whose session traces one training
step now and then (step 2, then every --tensorpipe_profile_every_n_steps); `StepProfile` turns the
trace into:
  - a log table per device: busy time by category (forward, re-computation, backward, ...), idle
    share and the peak of memory allocated during the step (profiling.Trace.PeakMemory);
  - a log table per partition: mean forward, backward and re-computation milliseconds per
    micro-batch (partitions of several pipelines with the same index, e.g. an encoder's and a
    decoder's, together);
  - scalar summaries next to Lingvo's own: tensorpipe/partition<k>/{forward,backward,recompute}_ms,
    tensorpipe/<device>/{peak_step_memory_mib,busy_fraction}.
Only the traced step pays for the trace; the others run as before.
"""

from absl import flags
from lingvo import compat as tf
from lingvo import runners
from lingvo.core import metrics

from tensorpipe.measure import profiling

flags.DEFINE_integer(
    'tensorpipe_profile_every_n_steps', 100,
    'Trace training step 2 and then every N-th step and log/summarise per-partition times and '
    'per-device peak memory (0: never). Only traced steps are slower.', lower_bound=0)

FLAGS = flags.FLAGS
FIRST_TRACED_STEP = 2


def StepProfile(trace):
  """(log text, {summary tag: value}) for one traced step."""
  values = {}
  busy = trace.Busy()
  peaks = trace.PeakMemory() if trace.HasMemory() else {}
  for device in trace.devices:
    tag = device.replace(':', '_')
    values['tensorpipe/%s/busy_fraction' % tag] = busy.get(device, 0.0) / trace.step_time
    if device in peaks:
      values['tensorpipe/%s/peak_step_memory_mib' % tag] = peaks[device] / 2.0**20
  text = profiling.Summary(trace)
  try:
    partitions = trace.PartitionTimes()
  except ValueError:  # No TensorPipeLayer in the model.
    partitions = []
  if partitions:
    text += '\n' + profiling.PartitionSummary(partitions)
  for k, partition in enumerate(partitions):
    for name in ('forward', 'backward', 'recompute'):
      values['tensorpipe/partition%d/%s_ms' % (k, name)] = 1e3 * getattr(partition, name)
  return text, values


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

  def IsTrainOp(self, fetch):
    return any(fetch is task.train_op for task in self._model.tasks)

  def ShouldTrace(self, run):
    every = FLAGS.tensorpipe_profile_every_n_steps
    return every > 0 and (run == FIRST_TRACED_STEP or run % every == 0)

  def Report(self, sess, run_metadata):
    step = int(sess.run(self._model.global_step))
    text, values = StepProfile(profiling.Trace(run_metadata))
    tf.logging.info('TensorPipe profile of step %d (one traced step):\n%s', step, text)
    if self._summary_writer:
      for tag, value in sorted(values.items()):
        self._summary_writer.add_summary(metrics.CreateScalarSummary(tag, value), step)
      self._summary_writer.flush()

  def _GetSession(self, **kwargs):
    return _TracingSession(super()._GetSession(**kwargs), self)
