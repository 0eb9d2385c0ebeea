"""pytest setup: absl flags (used by tf.test, Lingvo's test_utils) count as parsed with defaults."""
from absl import flags

flags.FLAGS.mark_as_parsed()
