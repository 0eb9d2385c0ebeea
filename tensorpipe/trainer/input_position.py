"""The trainer's input position is a function of the global step.

Lingvo's Trainer (re)starts its tasks' inputs in `_Loop`, before it restores the variables: when the
job starts, when it restarts after a fault, and when it retries a step that failed with an expected
error (a network blip that outlives a step's RPC ends the step with UnavailableError; Lingvo runs
`_Loop` again, which restores the last checkpoint). An input that starts at its first batch then
feeds the step after the restored step c the batch of step 1, and training goes on differently from
a run without the fault, silently. `InputAtStep` starts each input where a run from step 0 is after
c steps instead, before the first step of every `_Loop` run, through the input's
`StartAtStep(sess, global_step)` (tensorpipe.tasks.array_input.ArrayInput and
tensorpipe.tasks.mt.mt_input.MultilingualInput have one). So a retried step, a restart after a
killed task or a preemption trains on the same batches, and ends with the same losses, as a run
without the fault.

An input without `StartAtStep` restarts from its own beginning, as in Lingvo; the trainer says so
in a warning naming the input's class whenever that happens past step 0. A model of several tasks
keeps Lingvo's behaviour too (which task a step trains is sampled, so a task's position is not a
function of the global step), with the same warning.
"""

import threading

from lingvo import compat as tf

from tensorpipe.trainer import runner_mixin


def StartInputs(tasks, sess, global_step):
  """Starts the input of each of `tasks` (Lingvo tasks) in session `sess` at the batch training step
  `global_step` + 1 reads; returns the names of the inputs that could not (they start at their own
  beginning)."""
  unmoved = []
  single = len(tasks) == 1  # Several tasks: which one a step trains is drawn (module docstring).
  for task in tasks:
    start = getattr(task.input, 'StartAtStep', None) if single else None
    if start is None:
      unmoved.append('%s (%s)' % (task.input.params.name, type(task.input).__name__))
      continue
    start(sess, global_step)
    tf.logging.info('TensorPipe: input %s starts at the batch of step %d (restored global step %d)',
                    task.input.params.name, global_step + 1, global_step)
  if unmoved and global_step > 0:
    why = ('a model of %d tasks samples the task each step trains' % len(tasks) if len(tasks) > 1
           else 'it has no StartAtStep(sess, global_step) method')
    tf.logging.warning(
        'TensorPipe: input %s restarts from its first batch at global step %d: %s, so the steps '
        'from here read other batches than a run without this restart (see '
        'tensorpipe.tasks.array_input.ArrayInput.StartAtStep for an input that can start at any '
        'step)', ', '.join(unmoved), global_step, why)
  return unmoved


class InputAtStep(runner_mixin.RunnerMixin):
  """Mixin for Lingvo's Trainer: after every restore, before the first step of each run of
  `_Loop`, each input starts at the restored global step (see the module docstring)."""

  _input_start_thread = None  # The thread of a run of _Loop whose inputs are still to start.

  def _Loop(self):
    self._input_start_thread = threading.get_ident()
    return super()._Loop()  # pylint: disable=no-member  # Lingvo's Trainer.

  def _ShouldStop(self, sess=None, step=None, check_early_stop=True):
    # Lingvo's _Loop calls this before every step with the current global step; the first call of a
    # run of _Loop comes after the restore and before any step. (Lingvo's enqueue loops call it
    # too, from threads of their own, with sessions of their own.) A run that stops at once
    # (training already done) reads no batch: its inputs are left alone.
    stop = super()._ShouldStop(sess, step, check_early_stop)  # pylint: disable=no-member
    if (self._input_start_thread == threading.get_ident() and sess is not None and
        step is not None):
      self._input_start_thread = None
      if not stop:
        StartInputs(self._model.tasks, sess, int(step))  # pylint: disable=no-member
    return stop
