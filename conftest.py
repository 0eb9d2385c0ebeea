"""pytest setup, before any test module imports TensorFlow.

- TF_CPU_ALLOCATOR_USE_BFC=true: the memory tests read the CPU allocator's statistics
  (tf.config.experimental.get_memory_info). TensorFlow 2.13 keeps them only in its BFC allocator,
  which it uses by default only where oneDNN is on (CPUs with AVX-512 VNNI/BF16 or AMX, and
  TF_ENABLE_ONEDNN_OPTS unset or 1); this makes every CPU, and every process the tests start, use it.
- absl flags (used by tf.test, Lingvo's test_utils) count as parsed with defaults.
"""
import os

os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')

from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

flags.FLAGS.mark_as_parsed()
