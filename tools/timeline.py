"""Draws one real training step of a registered model as a per-device timeline; writes its trace.

Builds the model's training graph with its TensorPipeLayer partitions on K logical CPU devices (or
the devices Lingvo's cluster gives), runs a few warm-up steps, traces one, and writes into
--out_dir (default: a new directory under $TMPDIR or /tmp, printed at the end):
  - PREFIX.png: the traced step, one row per device: forward, re-computation, backward, other work,
    idle;
  - PREFIX_simulated.png: the same step as `simulator` predicts it from the traced per-partition
    times;
  - PREFIX.json: the traced step in the Trace Event Format, its tasks with TensorFlow's ops
    nested under them and each device's step memory, the file the trainer writes as
    LOGDIR/train/tensorpipe_trace-STEP.json: open it in ui.perfetto.dev ("Open trace file") or
    chrome://tracing ("Load");
and prints each device's busy time by category and each pipeline's per-partition times (the
trainer's profile tables).

  python -m tools.timeline --model=digits.TinyConvPipeline --out_dir=/tmp/timeline

Run time: about 7 s on a 2-core CPU for digits.TinyConvPipeline (its build, 3 warm-up steps and
the traced step); a larger model builds and steps for longer. Progress goes to stderr: a line when
the build, the warm-up and the trace start and one with its time when each ends.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import tempfile  # pylint: disable=g-import-not-at-top

from absl import flags  # pylint: disable=g-import-not-at-top
from lingvo import compat as tf
from lingvo.core import cluster_factory

from tensorpipe import layer as layer_lib
from tensorpipe import progress as progress_lib
from tensorpipe.measure import chrome_trace
from tensorpipe.measure import machine
from tensorpipe.measure import profiling
from tensorpipe.measure import simulator
from tensorpipe.measure import timeline
from tensorpipe import placement
from tensorpipe.trainer import preflight
from tensorpipe.trainer import registry
from tensorpipe.trainer import command_line

flags.DEFINE_string('model', None, 'Registered model, e.g. digits.TinyConvPipeline.', required=True)
flags.DEFINE_string('out_dir', None,
                    'Directory for PREFIX.png, PREFIX_simulated.png and PREFIX.json, created if '
                    'missing (default: a new directory under $TMPDIR or /tmp).')
flags.register_validator('out_dir', command_line.WritableDir)
flags.DEFINE_string('prefix', 'timeline', 'File name stem of the outputs, e.g. timeline_digits.')
flags.register_validator(
    'prefix', lambda prefix: prefix and os.path.sep not in prefix,
    message='give a file name stem, e.g. timeline_digits: no directory (that is --out_dir), not '
    'empty')
flags.DEFINE_integer('warmup', 3, 'Untraced steps first.')
flags.DEFINE_integer('inter_op_threads', 2,
                     "The session's inter-op threads (1: one op at a time in the process, so each "
                     'task runs alone).', lower_bound=1)
FLAGS = flags.FLAGS


def TraceModel(model, warmup=3, intra_op_threads=1, inter_op_threads=2,
               progress=progress_lib.QUIET):
  """(Trace, pipelines' Params) of a training step of registered `model` after `warmup` steps;
  `progress` gets a phase each for the build, the warm-up and the trace."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  registry.ImportModel(model)
  cfg = registry.ModelParams(model, 'Train')
  pipelines = layer_lib.Pipelines(cfg)
  if not pipelines:
    raise ValueError('model %s has no TensorPipeLayer to draw' % model)
  num_devices = max(k for _, _, k in preflight.PipelineDevices(cfg))
  graph = tf.Graph()
  with progress.Phase('timeline: building the training graph of %s on %d devices' %
                      (model, num_devices)):
    with graph.as_default(), cluster_factory.ForTestingWorker(
        mode='sync', job='trainer_client', cpus=num_devices, split_size=num_devices):
      net = cfg.Instantiate()
      net.ConstructFPropBPropGraph()
      task = net.GetTask()
      init = tf.global_variables_initializer()
  config = placement.SessionConfig(num_devices, intra_op_threads, inter_op_threads)
  with tf.Session(graph=graph, config=config) as sess:
    fetches = [task.train_op, task.eval_metrics]
    with progress.Phase('timeline: initialising the variables and the input, then the warm-up '
                        'steps', warmup) as phase:
      sess.run(init)
      task.input.Initialize(sess)
      for _ in range(warmup):
        sess.run(fetches)
        phase.Step()
    with progress.Phase('timeline: tracing one step'):
      _, meta = profiling.TracedRun(sess, fetches)
  names = [p.name for _, p in pipelines]
  return profiling.Trace(meta, pipeline_scope=names), [p for _, p in pipelines]


def main(unused_argv):
  args = command_line.Args()
  print(machine.Line(), flush=True)
  try:
    progress = progress_lib.Progress(lambda line: print(line, file=sys.stderr, flush=True))
    trace, pipelines = TraceModel(args.model, args.warmup, inter_op_threads=args.inter_op_threads,
                                  progress=progress)
  except (ValueError, registry.UsageError) as e:
    print('timeline: error: %s' % e, file=sys.stderr)
    return 2
  out_dir = args.out_dir or tempfile.mkdtemp(prefix='tensorpipe_timeline_')
  out = os.path.join(out_dir, args.prefix)
  first = pipelines[0]
  num_micro = first.num_micro_batches
  title = '%s: one traced training step (M = %d)' % (args.model, num_micro)
  timeline.DrawTrace(trace, out + '.png', title)
  chrome_trace.Write(trace, out + '.json', title)
  print(profiling.Summary(trace))
  print(profiling.PipelineSummary(trace.PipelinePartitionTimes()))
  print('wrote %s.png and %s.json (open the .json in ui.perfetto.dev or chrome://tracing)' %
        (out, out))
  partitions = trace.PartitionTimes()  # Several pipelines' partitions k together.
  predicted = simulator.SimulateFillDrain(partitions, num_micro,
                                          forward_overlap=first.forward_overlap)
  print('simulator, fed with the traced per-partition times: pipeline part %.1f ms, idle %.1f%% '
        '(traced step %.1f ms, including input, loss and update)' %
        (1e3 * predicted.step_time, 100 * predicted.idle_fraction, 1e3 * trace.step_time))
  timeline.DrawSimulated(predicted, out + '_simulated.png', '%s: simulated step (M = %d)' %
                         (args.model, num_micro))
  print('wrote %s_simulated.png' % out)
  return 0


if __name__ == '__main__':
  command_line.Run(main, 'timeline')
