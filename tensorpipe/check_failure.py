"""How TensorPipe's in-step checks fail, and how a caller gets their one line back first.

Some checks can only run inside a training step, where the values they check exist: the batch_dim
check (`batch_dim_check`), a run-time batch smaller than M (`layer`), the shapes the loss gradient
read early (`early_shapes`). Each fails as an Assert op, so TensorFlow raises a
`tf.errors.OpError` whose message starts with its own text ("Graph execution error:", the stack of
the node) and holds TensorPipe's line somewhere inside. So every such check builds its message with
`Assert`, which wraps TensorPipe's one line in the delimiters `OPEN` and `CLOSE` (messages hold
brackets, e.g. shapes [20, 8], so brackets cannot delimit them); `OneLine` finds the line in any
error, and `Raising` / `Run` turn a session error from such a check into `CheckFailure(line)`, whose
message is that line alone (TensorFlow's error stays available as its `error` attribute).
"""

import contextlib
import re
from typing import Any, Iterator, Optional, Sequence, Union

from lingvo import compat as tf

OPEN = '<<TensorPipe check>> '
CLOSE = ' <</TensorPipe check>>'


class CheckFailure(Exception):
  """A TensorPipe check that ran inside a step failed; the message is the check's one line.

  Attributes:
    error: the error the session raised (a tf.errors.OpError), or None.
  """

  def __init__(self, message: str, error: Optional[BaseException] = None):
    super().__init__(message)
    self.error = error


def _Text(piece: Union[str, tf.Tensor]) -> tf.Tensor:
  """A message piece as a scalar string tensor."""
  if isinstance(piece, str):
    return tf.constant(piece)
  if piece.dtype == tf.string:
    return piece
  if piece.shape.rank == 0:
    return tf.strings.as_string(piece)
  return tf.strings.join(
      ['[', tf.strings.reduce_join(tf.strings.as_string(tf.reshape(piece, [-1])), separator=', '),
       ']'])


def Message(pieces: Sequence[Union[str, tf.Tensor]]) -> tf.Tensor:
  """The check's one line from strings and tensors (scalars as numbers, others as [a, b, ...]),
  between the delimiters `OneLine` looks for."""
  return tf.strings.join([OPEN] + [_Text(p) for p in pieces] + [CLOSE])


def Assert(condition: tf.Tensor, pieces: Sequence[Union[str, tf.Tensor]],
           name: Optional[str] = None) -> tf.Operation:
  """An Assert op that fails with the one line made of `pieces` (see `Message`) unless
  `condition`."""
  return tf.debugging.Assert(condition, [Message(pieces)], summarize=1, name=name)


_ESCAPE = re.compile(rb'\\([0-7]{3}|.)', re.DOTALL)
_ESCAPED = {b'n': b'\n', b't': b'\t', b'r': b'\r'}


def _Unescaped(text: str) -> str:
  """`text` without the C escapes TensorFlow's Assert adds to the strings it prints (\\', \\",
  \\\\, \\n, octal bytes)."""

  def Byte(match):
    code = match.group(1)
    return bytes([int(code, 8)]) if len(code) == 3 else _ESCAPED.get(code, code)

  return _ESCAPE.sub(Byte, text.encode('utf-8')).decode('utf-8', errors='replace')


def OneLine(error: BaseException) -> Optional[str]:
  """TensorPipe's one line if `error` (a session error, a CheckFailure, or an error caused by one)
  came from a TensorPipe in-step check, else None."""
  seen = set()
  current: Optional[BaseException] = error  # Then its cause (or context), and so on.
  while current is not None and id(current) not in seen:
    seen.add(id(current))
    if isinstance(current, CheckFailure):
      return str(current)
    text = current.message if isinstance(current, tf.errors.OpError) else str(current)
    start = text.find(OPEN)
    if start >= 0:
      end = text.find(CLOSE, start + len(OPEN))
      if end >= 0:
        return _Unescaped(text[start + len(OPEN):end])
    current = current.__cause__ or current.__context__
  return None


@contextlib.contextmanager
def Raising() -> Iterator[None]:
  """Within it, an error from a TensorPipe in-step check is raised as CheckFailure(its line), so
  the line is the first (and only) message the user sees; other errors pass unchanged."""
  try:
    yield
  except tf.errors.OpError as e:
    line = OneLine(e)
    if line is None:
      raise
    failure = CheckFailure(line, e)
    failure.add_note('(TensorFlow: %s at node %s; see the CheckFailure\'s error attribute)' %
                     (type(e).__name__, e.op.name if e.op is not None else '?'))
    raise failure from None


def Run(sess: Any, fetches: Any, *args: Any, **kwargs: Any) -> Any:
  """sess.run(fetches, ...), raising a failed TensorPipe in-step check as CheckFailure (see
  `Raising`)."""
  with Raising():
    return sess.run(fetches, *args, **kwargs)
