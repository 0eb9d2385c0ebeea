"""--tensorpipe_plan: the planner's ranked configurations of the model, logged at start-up.

The trainer's flags for it, and the call that plans the model through `model_plan` (which the
repository's `tools.plan` also uses) with progress lines and the on-disk cache of what was built
and measured.
"""

from absl import flags
import lingvo.compat as tf

from tensorpipe import disk_cache
from tensorpipe import progress as progress_lib
from tensorpipe.measure import device_profiles
from tensorpipe.trainer import model_plan
from tensorpipe.trainer import registry

flags.DEFINE_integer(
    'tensorpipe_plan', 0,
    'Log the planner\'s ranked configurations (replicas x partitions, M, schedule, '
    're-computation) of the model\'s TensorPipeLayers for this many devices at start-up, with '
    'the flags that apply the best; 0: off. See --tensorpipe_plan_device.', lower_bound=0)
flags.DEFINE_string(
    'tensorpipe_plan_device', 'cpu',
    'Device profile --tensorpipe_plan plans for: cpu (this machine, measured) or an accelerator '
    'profile: %s.' % ', '.join(device_profiles.KnownProfiles()[1:]))
flags.DEFINE_string(
    'tensorpipe_plan_memory', '',
    'Memory per device for --tensorpipe_plan, e.g. 16GiB; empty: the profile\'s.')
flags.DEFINE_string(
    'tensorpipe_plan_cache_dir', '',
    'Where --tensorpipe_plan keeps the layers it built and measured for the next start-up; empty: '
    '$XDG_CACHE_HOME/tensorpipe or ~/.cache/tensorpipe; none: no cache.')
flags.DEFINE_boolean(
    'tensorpipe_plan_quick', False,
    'With --tensorpipe_plan_device=cpu, measure no layer: costs from flops and the profile, a '
    'plan in seconds (less faithful than measured times).')

FLAGS = flags.FLAGS


def _Log(msg, *args):
  tf.logging.info('TensorPipe: ' + msg, *args)


def LogModelPlan(cfg, model_name):
  """Logs the plan of model params `cfg` (registered as `model_name`) for --tensorpipe_plan
  devices and returns it as text (registry.UsageError on a bad profile, memory or cache directory,
  or a model that fits no configuration)."""
  try:
    cache = disk_cache.Open(FLAGS.tensorpipe_plan_cache_dir)
  except ValueError as e:
    raise registry.UsageError('--tensorpipe_plan_cache_dir: %s; give a writable directory, or '
                              '--tensorpipe_plan_cache_dir=none' % e) from e
  try:
    text = model_plan.PlanText(cfg, FLAGS.tensorpipe_plan, FLAGS.tensorpipe_plan_device,
                               FLAGS.tensorpipe_plan_memory or None, model_name,
                               quick=FLAGS.tensorpipe_plan_quick, cache=cache,
                               progress=progress_lib.Progress(
                                   lambda line: _Log('planning: %s', line)))
  except ValueError as e:
    raise registry.UsageError('--tensorpipe_plan: %s' % e) from e
  for line in text.splitlines():
    _Log('plan: %s', line)
  return text
