"""The base of TensorPipe's mixins for Lingvo's runners (Trainer, Controller, Evaler, Decoder).

A mixin overrides runner methods, calls the runner's own through super() and reads the runner's
attributes. Lingvo's classes carry no type information, so to mypy `RunnerMixin` is Any: those
calls and attributes are the runner's, unchecked, instead of errors on a class that derives from
object. At run time it is an empty class: it adds nothing to the runner.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  RunnerMixin = Any
else:

  class RunnerMixin:
    """Base of a mixin for a Lingvo runner (see the module docstring)."""
