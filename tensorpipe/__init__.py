"""TensorPipe: GPipe-style pipeline parallelism for Lingvo.

`tensorpipe.TensorPipeLayer` is the entry point (see tensorpipe/layer.py), and
`tensorpipe.SharedLayer` an entry of its layer list that runs a shared layer (tied weights). They
are loaded lazily so that TF-free modules such as `tensorpipe.schedule` import without TensorFlow.
"""

# Defined on first use by __getattr__.
__all__ = ['TensorPipeLayer', 'SharedLayer']  # pylint: disable=undefined-all-variable


def __getattr__(name):
  if name == 'TensorPipeLayer':
    from tensorpipe.layer import TensorPipeLayer  # pylint: disable=g-import-not-at-top
    return TensorPipeLayer
  if name == 'SharedLayer':
    from tensorpipe.shared_layer import SharedLayer  # pylint: disable=g-import-not-at-top
    return SharedLayer
  raise AttributeError('module tensorpipe has no attribute %r' % name)
