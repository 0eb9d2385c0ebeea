"""A pipeline's entries and the state that flows between them.

An entry is one place in the pipeline's layer list: a layer, or a `SharedLayer` that runs a shared
layer's method there; a loss_layer is the last partition's last entry. Between entries flows a
state (main value, loss inputs or None, {skip connection: tensor}): each entry gets the main value
as its inputs (the loss layer gets it and then the loss inputs), then the skip connections it is
the destination of; its output becomes the main value and the value of the skip connections it is
the source of. Across partitions, a skip connection goes straight from the partition it starts in
to the one it ends in (`Entries.PartitionInputs`). TensorPipeLayer creates the layers; this module
checks the names and connections and turns the entries into the functions a partition runs.
"""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from lingvo.core import hyperparams

from tensorpipe import decode_state
from tensorpipe import shared_layer

# (entry name, function (theta, state) -> state), in order: what a partition runs.
LayerFunctions = List[Tuple[str, Callable[[Any, Any], Any]]]


def ToTuple(x: Any) -> tuple:
  """`x` as a tuple of arguments: a list or tuple as one, anything else as the only one."""
  return tuple(x) if isinstance(x, (list, tuple)) else (x,)


def WithLossLayer(partitions: List[List[hyperparams.Params]],
                  loss_layer: Optional[hyperparams.Params], where: str
                  ) -> Tuple[List[List[hyperparams.Params]], Optional[str]]:
  """(`partitions` with `loss_layer`, if any, as the last partition's last entry, its name)."""
  if loss_layer is None:
    return partitions, None
  name = loss_layer.name or 'loss'
  if any(name == e.name for partition in partitions for e in partition):
    raise ValueError('%s: loss_layer name %r is also a layer name; give it another name' %
                     (where, name))
  return partitions[:-1] + [partitions[-1] + [loss_layer.Copy().Set(name=name)]], name


def CheckSharedNames(partitions: Sequence[Sequence[hyperparams.Params]], where: str) -> None:
  """Refuses a shared layer named like a layer, and two shared layers of one name that differ."""
  entries = [e for partition in partitions for e in partition]
  own = {e.name for e in entries if not issubclass(e.cls, shared_layer.SharedLayer)}
  shared: Dict[str, hyperparams.Params] = {}
  first_use: Dict[str, str] = {}
  for e in entries:
    if not issubclass(e.cls, shared_layer.SharedLayer):
      continue
    if e.layer is None or not e.layer.name:
      raise ValueError('%s: SharedLayer %r needs `layer`, the Params of a named layer' %
                       (where, e.name))
    name = e.layer.name
    if name in own:
      raise ValueError('%s: SharedLayer %r runs a layer named %r, which is also the name of a '
                       'layer of the pipeline; give the shared layer another name' %
                       (where, e.name, name))
    if name in shared and shared[name].ToText() != e.layer.ToText():
      raise ValueError('%s: SharedLayer entries %r and %r run layers both named %r but with '
                       'different Params; entries that share a layer need equal Params' %
                       (where, first_use[name], e.name, name))
    shared.setdefault(name, e.layer)
    first_use.setdefault(name, e.name)


def Target(entry: hyperparams.Params) -> Tuple[str, str, hyperparams.Params]:
  """(the child an entry runs, the method it calls, that child's Params): a SharedLayer entry runs
  its shared layer's method, any other entry its own FProp."""
  if issubclass(entry.cls, shared_layer.SharedLayer):
    return entry.layer.name, entry.method, entry.layer
  return entry.name, 'FProp', entry


def _CheckSkipConnections(order, skip_connections, where):
  """{key: (source, destination)} of `skip_connections` between the entries `order`, checked;
  keys in declaration order."""
  skips: Dict[str, Tuple[str, str]] = {}
  for i, pair in enumerate(skip_connections or []):
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
      raise ValueError('%s: skip_connections[%d] is %r; each skip connection is a pair '
                       '(source layer name, destination layer name)' % (where, i, pair))
    source, destination = pair
    for name in pair:
      if name not in order:
        raise ValueError('%s: skip connection %r names %r, which is not a layer of the pipeline '
                         '(layers: %s)' % (where, tuple(pair), name, ', '.join(order)))
    if order.index(source) >= order.index(destination):
      raise ValueError('%s: skip connection %r goes from %r to a layer that does not come after '
                       'it; the destination must run after the source' %
                       (where, tuple(pair), source))
    if tuple(pair) in skips.values():
      raise ValueError('%s: skip connection %r is declared twice' % (where, tuple(pair)))
    skips['skip%03d' % i] = tuple(pair)
  return skips


class Entries:
  """The entries of a pipeline's partitions, what each runs, and the skip connections between them.

  Args:
    partitions: the names of the entries of each partition, in order.
    targets: {entry name: (the child layer it runs, the method it calls)} (see `Target`).
    skip_connections: the pipeline's skip_connections Param (pairs of entry names), checked here.
    loss_name: the loss layer's entry name, or None.
    where: names the pipeline in messages.
  """

  def __init__(self, partitions: Sequence[Sequence[str]], targets: Dict[str, Tuple[str, str]],
               skip_connections: Any, loss_name: Optional[str], where: str):
    self._partitions = [list(names) for names in partitions]
    self._targets = dict(targets)
    self._loss_name = loss_name
    self._order = [name for names in self._partitions for name in names]
    self._skips = _CheckSkipConnections(self._order, skip_connections, where)

  @property
  def skips(self) -> Dict[str, Tuple[str, str]]:
    """{key: (source, destination)} of the skip connections, keys in declaration order."""
    return dict(self._skips)

  def Target(self, name: str) -> Tuple[str, str]:
    """(the child layer entry `name` runs, the method it calls)."""
    return self._targets[name]

  def ThetaNames(self, names: Sequence[str]) -> List[str]:
    """The children whose weights the entries `names` read, in order of first use."""
    children: List[str] = []
    for name in names:
      child = self._targets[name][0]
      if child not in children:
        children.append(child)
    return children

  def Decoding(self, children: Any, where: str) -> List[str]:
    """The names of the entries that decode with a state, each checked (see decode_state.Check);
    `children` are the pipeline's child layers by name."""
    names = []
    for k, partition in enumerate(self._partitions):
      for name in partition:
        child, method = self._targets[name]
        decode_state.Check(children[child], method, name, k, where)
        if decode_state.Decodes(children[child], method):
          names.append(name)
    return names

  def PartitionOf(self, name: str) -> int:
    """The index of the partition entry `name` is in."""
    return [k for k, names in enumerate(self._partitions) if name in names][0]

  def LayerFunctions(self, names: Sequence[str], children: Any,
                     decoding: bool = False) -> LayerFunctions:
    """The entries `names` as (name, function (theta, state) -> state), in order (see the module
    docstring); `children` are the pipeline's child layers by name. The pipeline's last entry
    returns its output alone.

    With `decoding`, a function takes and returns (state, {entry: decoding states}, time step): an
    entry with decoding states runs its ExtendStep on them and replaces them with what it returns
    (see `decode_state`); the others run as in FProp.
    """
    last = self._order[-1]

    def Run(name):
      child, method = self._targets[name]
      layer = children[child]
      into = [key for key, (_, dst) in self._skips.items() if dst == name]
      out_of = [key for key, (src, _) in self._skips.items() if src == name]

      def Fn(theta, state):
        caches, time_step = {}, None
        if decoding:
          state, caches, time_step = state
        main, extra, carried = state
        args = (main,) + ToTuple(extra) if name == self._loss_name else ToTuple(main)
        args += tuple(carried[key] for key in into)
        if name in caches:
          out, new = layer.ExtendStep(theta[child], *(args + (caches[name], time_step)))
          caches = dict(caches, **{name: new})
        else:
          out = shared_layer.Run(layer, method, theta[child], *args)
        if name != last:
          carried = {key: value for key, value in carried.items() if key not in into}
          carried.update((key, out) for key in out_of)
          out = (out, extra, carried)
        return (out, caches, time_step) if decoding else out

      return Fn

    return [(name, Run(name)) for name in names]

  def PartitionInputs(self, k: int, piece: Any, earlier: Sequence[Any]) -> Any:
    """Partition k's input state for one micro-batch.

    Partition 0 gets the micro-batch's piece of FProp's arguments; partition k > 0 gets partition
    k - 1's output, and every skip connection into partition k from the partition it starts in
    (`earlier`: the outputs of partitions 0 .. k - 1).
    """
    if k == 0:
      if self._loss_name is not None:
        return (piece[0], piece[1], {})
      return (piece, None, {})
    main, extra, _ = earlier[k - 1]
    carried = {}
    for key, (src, dst) in self._skips.items():
      source = self.PartitionOf(src)
      if self.PartitionOf(dst) == k and source < k:
        carried[key] = earlier[source][2][key]
    return (main, extra, carried)
