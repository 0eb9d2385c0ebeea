"""Start training as soon as the model is ready, instead of after a fixed 30 s sleep.

Lingvo's Controller and Trainer call `_WaitUntilInit` before their first step. Lingvo's version
sleeps 30 s unconditionally, then reads the global step, retrying while it is uninitialised
(FailedPreconditionError: another task has not initialised or restored the variables yet). The
retry is what actually waits for the model; the sleep only delays every run (half of a one-minute
demo, and a 54 s wait before the first step of a small model). `PromptStart` keeps the retry and
drops the sleep: it polls the global step at once, then with delays growing from `FIRST_DELAY_S`
to `MAX_DELAY_S`, so a trainer whose controller is still restoring a checkpoint waits as long as
that takes and no longer.
"""

import time
from typing import Callable, Optional

from lingvo import compat as tf
from lingvo.core import py_utils

from tensorpipe.trainer import runner_mixin

FIRST_DELAY_S = 0.1  # The first wait after an uninitialised read.
MAX_DELAY_S = 2.0  # The longest wait between two reads.
_GROWTH = 1.5


def WaitForGlobalStep(read_step: Callable[[], int], min_step: Optional[int] = None,
                      sleep: Callable[[float], None] = time.sleep,
                      log: Callable[..., None] = tf.logging.info) -> int:
  """Returns the global step once it can be read (and is at least `min_step`, if given).

  It logs one line when a condition starts to hold it (the variables not initialised yet, the
  step below start_up_delay_steps), not one per read, and one line when the wait ends.

  Args:
    read_step: reads the global step; raises tf.errors.FailedPreconditionError while it is not
      initialised.
    min_step: Lingvo's start_up_delay_steps: wait until the global step reaches it.
    sleep: called with the seconds to wait between reads (a fake clock in tests).
    log: where the lines go (printf-style arguments).
  """
  delay = FIRST_DELAY_S
  waited, holding = 0.0, None  # Seconds slept; the condition last logged.
  while True:
    try:
      step = read_step()
      if not min_step or step >= min_step:
        if waited:
          log('TensorPipe: the global step is %d after %.1f s of waiting; starting', step, waited)
        return step
      if holding != 'delay':
        holding = 'delay'
        log('TensorPipe: waiting for the global step (%d) to reach start_up_delay_steps (%d)',
            step, min_step)
    except tf.errors.FailedPreconditionError:
      # TensorFlow's message (a multi-line graph execution error) says only this.
      if holding != 'uninitialised':
        holding = 'uninitialised'
        log('TensorPipe: waiting for the model\'s variables, which another task initialises or '
            'restores (the global step is not initialised yet)')
    sleep(delay)
    waited += delay
    delay = min(MAX_DELAY_S, delay * _GROWTH)


class PromptStart(runner_mixin.RunnerMixin):
  """Mixin for Lingvo's Controller and Trainer: `_WaitUntilInit` without the fixed 30 s sleep."""

  def _WaitUntilInit(self, sess=None, start_up_delay_steps=None):
    if py_utils.IsEagerMode():
      read = lambda: int(py_utils.GetGlobalStep().numpy())
    else:
      global_step = py_utils.GetGlobalStep()
      read = lambda: int(sess.run(global_step))
    step = WaitForGlobalStep(read, start_up_delay_steps)
    self._SetStatusMessage('step:%6d' % step)  # pylint: disable=no-member  # Lingvo's runner's.
    return step
