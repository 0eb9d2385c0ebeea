"""TensorPipe: GPipe-style pipeline parallelism for Lingvo.

`tensorpipe.TensorPipeLayer` is the entry point (see tensorpipe/layer.py). It is loaded lazily so
that TF-free modules such as `tensorpipe.schedule` import without TensorFlow.
"""

__all__ = ['TensorPipeLayer']


def __getattr__(name):
  if name == 'TensorPipeLayer':
    from tensorpipe.layer import TensorPipeLayer  # pylint: disable=g-import-not-at-top
    return TensorPipeLayer
  raise AttributeError('module tensorpipe has no attribute %r' % name)
