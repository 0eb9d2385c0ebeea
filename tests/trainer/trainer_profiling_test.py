"""The trainer's profile of a traced step: summary tags per pipeline, and the timeline image.

(The trainer run that traces steps and writes them into its logdir is train_test's.)
"""

import io

from lingvo import compat as tf
from lingvo.core import test_utils
from PIL import Image

from tensorpipe.measure import profiling
from tensorpipe.trainer import trainer_profiling


def _TwoPipelineTrace():
  """A Trace of an encoder's and a decoder's partitions 0 and 1, on CPU:0 and CPU:1."""
  meta = tf.compat.v1.RunMetadata()
  for k in range(2):
    dev = meta.step_stats.dev_stats.add(device='/job:localhost/replica:0/task:0/device:CPU:%d' % k)
    for i, pipeline in enumerate(('encoder', 'decoder')):
      t0 = 1000 + 100 * i + 40 * k
      for name, op_type, start, end in (
          ('m/%s/partition%d_mb0/forward' % (pipeline, k), 'PartitionedCall', t0, t0 + 20),
          ('fc0/MatMul', 'MatMul', t0 + 1, t0 + 19),
          ('gradients/m/%s/IdentityN_1_grad/partition%d_mb0/backward' % (pipeline, k),
           'PartitionedCall', t0 + 300, t0 + 330),
          ('recompute/fc0/MatMul', 'MatMul', t0 + 301, t0 + 310),
          ('gradients/recompute/fc0/MatMul_grad/MatMul', 'MatMul', t0 + 311, t0 + 329)):
        dev.node_stats.add(node_name=name, all_start_micros=start, all_end_rel_micros=end - start,
                           timeline_label='%s = %s(x)' % (name, op_type))
  return profiling.Trace(meta, pipeline_scope=['encoder', 'decoder'])


class StepProfileTest(test_utils.TestCase):

  def testTagsNameThePipeline(self):
    text, values = trainer_profiling.StepProfile(_TwoPipelineTrace())
    partition_tags = sorted(tag for tag in values if '/partition' in tag)
    self.assertEqual(partition_tags, sorted(
        'tensorpipe/%s/partition%d/%s_ms' % (pipeline, k, kind)
        for pipeline in ('encoder', 'decoder') for k in range(2)
        for kind in ('forward', 'backward', 'recompute')))
    self.assertIn('tensorpipe/CPU_1/busy_fraction', values)
    self.assertIn("partitions of pipeline 'encoder'\n", text)
    self.assertIn("partitions of pipeline 'decoder'\n", text)

  def testTimelineIsAPngImageSummary(self):
    summary = trainer_profiling.TimelineSummary(_TwoPipelineTrace(), 'step 2')
    value, = summary.value
    self.assertEqual(value.tag, trainer_profiling.TIMELINE_TAG)
    with Image.open(io.BytesIO(value.image.encoded_image_string)) as image:
      self.assertEqual(image.format, 'PNG')
      self.assertEqual(image.size, (value.image.width, value.image.height))


if __name__ == '__main__':
  test_utils.main()
