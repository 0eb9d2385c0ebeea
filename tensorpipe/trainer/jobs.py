"""The jobs this process runs (--job, or Lingvo's defaults for --run_locally), and what each does.

Which dataset a job reads (`DatasetOfJob`), which jobs train (`TRAIN_JOBS`) or only evaluate
(`IsEvalOnlyJob`), which write into LOGDIR/train (`WRITING_JOBS`), and whether this process starts a
TensorFlow server of a --cluster_spec job (`StartsServer`).
"""

import re

from tensorpipe.trainer import flags as trainer_flags

FLAGS = trainer_flags.FLAGS

TRAIN_JOBS = ('controller', 'trainer', 'trainer_client', 'train_summaries', 'executor_tpu',
               'host_driven_executor_tpu')
# Jobs that write into LOGDIR/train: checkpoints (controller, trainer client, trainer) or the
# shards of the variables they hold (worker, ps).
WRITING_JOBS = ('controller', 'trainer', 'trainer_client', 'worker', 'ps')


def Jobs():
  """The jobs this process will run (Lingvo's defaults for --run_locally)."""
  if FLAGS.job:
    return [j for j in FLAGS.job.split(',') if j]
  if FLAGS.run_locally == 'tpu':
    return ['trainer_client']
  if FLAGS.run_locally:
    return ['controller', 'trainer'] if FLAGS.mode == 'async' else ['controller', 'trainer_client']
  return []


def DatasetOfJob(job):
  """The dataset a job reads ('Train', 'Test', ...), or None for server-only jobs."""
  if job in TRAIN_JOBS:
    return 'Train'
  m = re.match(r'(?:evaler_once|evaler|decoder)_([^@]+)', job)
  if m:
    return m.group(1)
  return None


def IsEvalOnlyJob(job):
  return job.startswith('evaler_') or job.startswith('decoder_')



def StartsServer():
  """Whether Lingvo starts a TensorFlow server for --job/--task of --cluster_spec in this process
  (trainer.RunnerManager.MaybeLaunchTensorFlow)."""
  return bool(FLAGS.cluster_spec) and not (FLAGS.run_locally or FLAGS.tpu or FLAGS.use_eager or
                                           FLAGS.tf_master.startswith('localhost'))
