"""How the trainer ends with an error: one line `tensorpipe.trainer.train: error: ...`, status 2.

`Fail` writes the line, `Exit` ends the process from any thread, and `EndJob` ends the whole job of
a --cluster_spec run: it records the line in --logdir (tensorpipe.trainer.job_failure), where the
other tasks find it (`RecordedJobFailure`) and end with it (cluster_task.ClusterTask).
"""

import logging
import os
import sys
import threading

import lingvo.compat as tf

from tensorpipe.trainer import flags as trainer_flags
from tensorpipe.trainer import job_failure

FLAGS = trainer_flags.FLAGS

ERROR_EXIT_CODE = 2

STARTED = job_failure.ProcessStart()
ENDING = threading.Event()  # Set once this process ends the job with a line (EndJob).

_RECORDS = {}  # {--logdir: its job_failure.Records}, each made at the first call below.
_RECORDS_LOCK = threading.Lock()


def RecordedJobFailure():
  """The line another task of this run of the job ended the job with (recorded in --logdir by
  EndJob: a failed check, a stuck step, a task at another task's address), or None. The first call
  is this process's first look at the record (job_failure.Records)."""
  if not FLAGS.logdir:
    return None
  with _RECORDS_LOCK:
    if FLAGS.logdir not in _RECORDS:
      _RECORDS[FLAGS.logdir] = job_failure.Records(FLAGS.logdir, STARTED)
    records = _RECORDS[FLAGS.logdir]
  return records.Line()


def EndJob(line, record):
  """Ends the process with `line` as its last output; with `record`, first writes it to --logdir,
  where the other tasks of a --cluster_spec job find it and end with it too
  (cluster_task.ClusterTask)."""
  ENDING.set()
  if record and FLAGS.logdir:
    try:
      job_failure.Record(FLAGS.logdir, line)
    except OSError as e:
      tf.logging.warning('TensorPipe: cannot record the line for the other tasks of the job: %s', e)
  # No other thread logs after the line: hold every logging handler's lock until the process ends.
  for handler in logging.getLogger().handlers + logging.getLogger('absl').handlers:
    handler.acquire()
  Fail(line)
  Exit(ERROR_EXIT_CODE)


def Fail(message):
  sys.stdout.flush()  # Anything printed before comes before the error line, never after it.
  sys.stderr.write('tensorpipe.trainer.train: error: %s\n' % message)
  sys.stderr.flush()
  return ERROR_EXIT_CODE


def Exit(status):
  """Ends the process now, from any thread (the main thread may be inside TensorFlow)."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access
