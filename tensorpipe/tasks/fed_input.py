"""An input generator fed from host arrays that can (re)start at any position of its stream.

The example tasks' inputs keep their data in host memory and feed it to an initializable tf.data
iterator whose dataset begins at a placeholder position, so the graph holds no copy of the data.
`FedInput` holds what they share: `Initialize(sess)` / `Reset(sess)` (called by Lingvo's runners)
start the stream at its beginning, and `StartAtStep(sess, global_step)` (called by the trainer
after every restore, tensorpipe.trainer.input_position) starts it at the batch training step
`global_step` + 1 reads in a run without interruption. A subclass builds `_iterator`, `_first` (the
placeholder of the start position, or None for a stream that always starts at its beginning) and
gives `_Feeds` and `_Position`.
"""

from typing import Any, Dict

from lingvo.core import base_input_generator


class FedInput(base_input_generator.BaseInputGenerator):
  """Batches from an initializable iterator fed host arrays (see the module docstring)."""

  def __init__(self, params):
    super().__init__(params)
    self._iterator: Any = None  # tf.data's initializable iterator, made with the input batch.
    self._first: Any = None  # Placeholder of the stream's start position, made with the batch.

  def _Feeds(self) -> Dict[Any, Any]:
    """{placeholder: host array} that the iterator's initializer is fed."""
    raise NotImplementedError

  def _Position(self, global_step: int) -> int:
    """The start position (the value of `_first`) at which the next batch is the one training step
    `global_step` + 1 reads."""
    raise NotImplementedError

  def Initialize(self, sess=None):
    super().Initialize(sess)
    self.Reset(sess)

  def Reset(self, sess=None):
    """(Re)starts the iterator at the beginning of the split."""
    self._Start(sess, 0)

  def StartAtStep(self, sess, global_step):
    """(Re)starts the iterator where a run from global step 0 would be after `global_step`
    training steps (see `_Position`)."""
    self._Start(sess, self._Position(global_step))

  def _Start(self, sess, position):
    if self._iterator is None or sess is None:
      return
    feeds = self._Feeds()
    if self._first is not None:
      feeds[self._first] = position
    sess.run(self._iterator.initializer, feed_dict=feeds)
