"""Parameter counts of a layer sequence, from the shapes of the variables its layers create.

Each layer is instantiated in a fresh graph (graph mode: variables become ops, nothing is allocated or
initialised) and the shapes of its trainable variables are summed. Layers whose Params are identical up
to their name, position and regularisation settings (e.g. the normal cells of one AmoebaNet stack)
create identically shaped variables, so each distinct configuration is built once per process and
counted as often as it occurs; this keeps counting a billion-parameter model within seconds.
"""

import numpy as np
from lingvo import compat as tf

# Params fields that change neither the variables nor their shapes.
_IRRELEVANT_FIELDS = ('name', 'cell_index', 'num_cells', 'drop_path_keep_prob', 'drop_path_steps',
                      'dropout_keep_prob')


def _Key(p):
  p = p.Copy()
  for field in _IRRELEVANT_FIELDS:
    if field in p:
      p.Set(**{field: None})
  return p.ToText()


def LayerParamCount(layer_params):
  """Trainable parameters of one layer, built in its own graph."""
  with tf.Graph().as_default():
    layer_params.Copy().Instantiate()
    return sum(int(np.prod(v.shape.as_list())) for v in tf.trainable_variables())


_COUNTS = {}  # Configuration key -> parameter count, shared by all calls in the process.


def ParamCount(layer_params_list):
  """Total trainable parameters of a sequence of layer Params (distinct configurations built once)."""
  total = 0
  for p in layer_params_list:
    key = _Key(p)
    if key not in _COUNTS:
      _COUNTS[key] = LayerParamCount(p)
    total += _COUNTS[key]
  return total
