"""The trainer's own progress lines around a run: what runs where (`LogPlan`), and what came out
(`LogOutcome`: the latest checkpoint, each evaler's latest scores, `LatestScore`).
"""

import glob
import os
import re

import lingvo.compat as tf

from tensorpipe.trainer import flags as trainer_flags
from tensorpipe.trainer import jobs as jobs_lib
from tensorpipe.trainer import preflight

FLAGS = trainer_flags.FLAGS


def _Log(msg, *args):
  tf.logging.info('TensorPipe: ' + msg, *args)


def LogPlan(jobs):
  """Logs what runs where: the model, `jobs`, the devices of a model split, what each writes."""
  logdir = FLAGS.logdir
  _Log('model %s, jobs %s, mode %s, logdir %s', FLAGS.model, ','.join(jobs) or '(none)', FLAGS.mode,
       logdir)
  if FLAGS.worker_tasks_per_replica and FLAGS.cluster_spec:
    tasks = len(preflight.ParseClusterSpec(FLAGS.cluster_spec)['worker'])
    per = FLAGS.worker_tasks_per_replica
    _Log(
        '%d worker tasks of %d CPU devices, %d per replica (%d data-parallel replica%s): '
        'partition k of replica r runs on worker task r*%d + k//%d', tasks, FLAGS.cpu_devices or 1,
        per, tasks // per, '' if tasks // per == 1 else 's', per, FLAGS.cpu_devices or 1)
  elif FLAGS.cpu_devices:
    splits = FLAGS.cpu_devices // FLAGS.worker_split_size
    _Log('%d logical CPU devices in this process; %d model split%s of %d devices (partition k of a '
         'TensorPipeLayer on /device:CPU:%sk)%s', FLAGS.cpu_devices, splits,
         '' if splits == 1 else 's', FLAGS.worker_split_size,
         '' if splits == 1 else '%d*s+' % FLAGS.worker_split_size,
         '' if splits == 1 else ', data parallel: split s gets 1/%d of each batch' % splits)
  if any(j in jobs_lib.TRAIN_JOBS for j in jobs):
    _Log('checkpoints and train summaries -> %s; params, model analysis and controller summaries '
         '-> %s', os.path.join(logdir, 'train'), os.path.join(logdir, 'control'))
    _Log('progress: Lingvo logs "step: N, steps/sec: .., examples/sec: .. loss:.." for every '
         'training step and "Save checkpoint done: PATH" for every checkpoint')
  for job in jobs:
    if jobs_lib.IsEvalOnlyJob(job):
      kind, dataset = ('eval', jobs_lib.DatasetOfJob(job)) if job.startswith('evaler') else (
          'decoder', jobs_lib.DatasetOfJob(job))
      out = os.path.join(logdir, '%s_%s' % (kind, dataset.lower()) if kind == 'eval' else
                         'decoder_%s' % dataset.lower())
      _Log('%s results -> %s (summaries and score-STEP.txt)', job, out)
  _Log('view with: tensorboard --logdir=%s', logdir)


def LatestScore(logdir, dataset='test'):
  """(step, {metric: value}) from the newest eval_<dataset>/score-STEP.txt, or None."""
  files = glob.glob(os.path.join(logdir, 'eval_%s' % dataset.lower(), 'score-*.txt'))
  if not files:
    return None
  path = max(files, key=lambda f: int(re.findall(r'score-(\d+)\.txt$', f)[0]))
  step = int(re.findall(r'score-(\d+)\.txt$', path)[0])
  metrics = {}
  with open(path, encoding='utf-8') as f:
    for line in f:
      parts = line.replace(':', ' ').split()
      if len(parts) >= 2:
        try:
          metrics[parts[0]] = float(parts[-1])
        except ValueError:
          pass
  return step, metrics


def LogOutcome(jobs):
  """Logs what `jobs` produced: the latest checkpoint of training, each evaler's latest scores."""
  logdir = FLAGS.logdir
  if any(j in jobs_lib.TRAIN_JOBS for j in jobs):
    ckpt = tf.train.latest_checkpoint(os.path.join(logdir, 'train'))
    _Log('training done; latest checkpoint %s', ckpt)
  for job in jobs:
    if job.startswith('evaler_'):
      dataset = jobs_lib.DatasetOfJob(job)
      score = LatestScore(logdir, dataset)
      if score:
        step, metrics = score
        _Log('eval %s at step %d: %s', dataset, step,
             ', '.join('%s %.4f' % kv for kv in sorted(metrics.items())))
