"""TensorPipeLayer: a sequential list of Lingvo layers run as a GPipe pipeline over K devices.

The L layers are cut into K partitions (explicitly, or balanced by estimated cost); partition k and
its variables live on device k. With virtual stages v (schedules 'interleaved_1f1b' and 'zbv') they
are cut into K v partitions and each device holds v of them, as
`schedule_builders.PartitionDevices` places them. FProp splits the mini-batch into M
micro-batches and runs the
schedule's actions (see `schedule`): each forward action F(k, t) is one call of partition k's
forward function and each backward action B(k, t) one call of its backward function, which
re-computes the partition from its saved boundary input (see `partition_function`). The functions
are traced once per partition, so the graph does not grow with M. `executor` builds the calls in
the schedule's order and joins the outputs on the last device; the weight gradients of the M
micro-batches are summed on each partition's device (see `accumulation`) and Lingvo's learner
applies them once per mini-batch.

The construction is step (0) and the batch-norm updates are step (7) of docs/design.md, "One
training step"; the executor builds steps (1)-(6) in between. Variables are named
`<pipeline>/<layer>/...` whatever K is, so a checkpoint loads for any partitioning.
"""

import weakref
from typing import List, Tuple

from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import hyperparams
from lingvo.core import py_utils

from tensorpipe import batch_norm
from tensorpipe import check_failure
from tensorpipe import decode_state
from tensorpipe import executor
from tensorpipe import micro_batching
from tensorpipe import nested_params
from tensorpipe.partitioner import cost_model
from tensorpipe.partitioner import partition_report
from tensorpipe.partitioner import partitioning
from tensorpipe import partition_function
from tensorpipe import partition_trace
from tensorpipe import placement
from tensorpipe import randomness
from tensorpipe import schedule
from tensorpipe import schedule_builders
from tensorpipe import selective_recompute
from tensorpipe import shared_layer
from tensorpipe import stateful_ops



def _ToTuple(x):
  return tuple(x) if isinstance(x, (list, tuple)) else (x,)


def _SkipIndices(layer_params, skip_connections):
  """(source, destination) indices in `layer_params` of the skip connections between its layers
  (the cost model feeds each destination its source's output); the rest are checked later."""
  index = {layer.name: i for i, layer in enumerate(layer_params)}
  pairs = []
  for pair in skip_connections or []:
    if isinstance(pair, (list, tuple)) and len(pair) == 2 and all(n in index for n in pair):
      if index[pair[0]] < index[pair[1]]:
        pairs.append((index[pair[0]], index[pair[1]]))
  return pairs


RECOMPUTE_MODES = schedule.RECOMPUTE_MODES


def _OutermostGraph():
  """The graph being built, or the one a loop body being built belongs to."""
  with tf.init_scope():
    return tf.get_default_graph()


class TensorPipeLayer(base_layer.BaseLayer):
  """Pipelines a sequence of layers over K devices with M micro-batches (GPipe).

  Its Params are its API (the README's table); docs/design.md explains how a step is built.
  """

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('partitions', None,
             'Explicit partitions: a list of K x virtual_stages lists of layer Params; partition '
             'k runs on device k (with virtual stages, on the device the schedule places it on). '
             'Set this or `layers`.')
    p.Define('layers', None,
             'Flat list of layer Params, cut automatically into `num_partitions` partitions. '
             'Set this or `partitions`. A tensorpipe.SharedLayer entry runs a layer that several '
             'entries share (tied weights).')
    p.Define('num_partitions', None,
             'K, the number of devices the pipeline runs on: `layers` is cut into K x '
             'virtual_stages partitions (with `partitions`, optional: their number / '
             'virtual_stages).')
    p.Define('virtual_stages', 1,
             "v, partitions per device: 1, or 2 or more with schedule='interleaved_1f1b' (device "
             "k holds partitions k, k + K, ...), exactly 2 with schedule='zbv' (device k holds "
             "partitions k and 2K - 1 - k). More partitions per device shrink the bubble.")
    p.Define('cost_input_shapes', None,
             'Shapes of the first layer\'s FProp inputs for one mini-batch (list of lists): needed '
             'to balance `layers` by flops, time or memory, and for the partition report.')
    p.Define('partition_cost', 'auto',
             "What `layers` are balanced by: 'count', 'flops' (FPropMeta), 'measured' (each "
             "layer's forward+backward time on the partitions' device type), 'memory' (estimated "
             "bytes), or 'auto' ('flops' with cost_input_shapes, else 'count').")
    p.Define('partition_algorithm', 'optimal',
             "'optimal' (least max partition cost, exactly) or 'min_variance' (the GPipe paper's "
             "heuristic).")
    p.Define('memory_budget', None,
             'Bytes each device may hold (parameters with optimizer slots and activations, as '
             'cost_model estimates them); the split of `layers` keeps every partition within it, '
             'explicit `partitions` are checked against it, or it raises. None: no limit.')
    p.Define('log_partition_report', False,
             'Log the partition report (per partition: layers, cost, parameters, estimated memory; '
             'imbalance, bubble) when the layer is built; needs cost_input_shapes, and takes a '
             'while for big models (it builds each distinct layer in a throwaway graph).')
    p.Define('bytes_per_param', cost_model.DEFAULT_BYTES_PER_PARAM,
             'Memory per trainable parameter including optimizer slots (12 = float32 weight + two '
             'slots, e.g. RMSProp or Adam); used by memory costs and budgets.')
    p.Define('num_micro_batches', 1,
             'M: each mini-batch is split into this many micro-batches (at most the batch size); '
             'if M does not divide the batch, their sizes differ by one example.')
    p.Define('micro_batch_size', None,
             'Examples per micro-batch at most; when set, M = ceil(batch / micro_batch_size) (then '
             'leave num_micro_batches at 1 or equal to that).')
    p.Define('batch_dim', 0,
             'The batch dimension of the inputs and outputs: 0 for batch-major [B, T, ...], 1 for '
             "Lingvo's time-major [T, B, ...] tensors (see check_batch_dim).")
    p.Define('output_batch_dim', None,
             'The batch dimension of the outputs if it is not batch_dim (e.g. 0 for [B, C] logits '
             'of a time-major pipeline); rank-1 outputs always join along axis 0.')
    p.Define('skip_connections', None,
             'Pairs (source, destination) of layer names: the source\'s output is also passed to '
             'the destination, after its usual inputs, as an extra FProp argument (across '
             'partitions it goes straight to the destination\'s device).')
    p.Define('check_batch_dim', True,
             'On the first training step of every run (a run resumed from a checkpoint '
             "included), check that changing one example of a partition's input changes no "
             "other example's output of any of its layers (so results cannot depend on M; batch "
             'norm is probed with its moving statistics) and fail naming batch_dim and the first '
             'layer that mixes examples if it does. False: skip the check.')
    p.Define('unpipelined', False,
             'Run the layers one after another in the caller\'s graph, with no micro-batches, '
             'partition functions or re-computation: the reference the consistency check '
             'compares the pipeline against. Same variables, dropout masks and batch-norm '
             'updates.')
    p.Define('recompute', 'always',
             "Backprop re-computation: 'always' (GPipe: keep only partition-boundary activations), "
             "'except_last' (the last micro-batch keeps its activations), 'never', or "
             "'selective' (keep the outputs of matmuls, einsums and convolutions, re-compute only "
             "the cheap ops: little extra time, most of the memory saving; not with "
             "'zero_bubble' or 'zbv').")
    p.Define('selective_kept_ops', None,
             "With recompute='selective', the op types whose outputs the forward pass keeps, "
             'e.g. [\'Einsum\'] to keep only einsums (less memory, more re-computation); each '
             'one of selective_recompute.KEPT_OP_TYPES. None: all of them.')
    p.Define('schedule', 'gpipe',
             "Order of the step's tasks: 'gpipe' (fill-drain: every forward pass, then every "
             "backward pass), '1f1b' (after a warm-up, each device alternates one backward and one "
             "forward pass, so at most K - k micro-batches wait on device k: less memory, same "
             "gradients) or 'zero_bubble' (1F1B with each backward pass split into an "
             "input-gradient and a later weight-gradient task that fills the bubble; needs "
             "recompute='always'); with virtual_stages >= 2, 'interleaved_1f1b' (Megatron-LM's: "
             "1/v of 1F1B's bubble, M a multiple of K) or 'zbv' (zero-bubble in a V, "
             "virtual_stages=2, recompute='always'). All but 'gpipe' need per-example losses from "
             "the last layer or a loss_layer (see schedule).")
    p.Define('loss_layer', None,
             'Optional layer Params run after the last layer, in the last partition, on each '
             'micro-batch: FProp(theta, last layer\'s output, *loss_inputs) returning per-example '
             'values (e.g. losses). With it, FProp takes (inputs, loss_inputs): loss_inputs (e.g. '
             'labels) are split into micro-batches and carried to the last partition. Lets the '
             '1f1b schedule run a micro-batch\'s backward pass as soon as its loss is known.')
    p.Define('forward_overlap', True,
             'True: a partition may run the forward passes of two neighbouring micro-batches at '
             'once, so a device whose neighbour is idle (filling the pipeline) can use a second '
             'core or stream. False: one forward pass at a time per partition.')
    p.Define('two_d_weight_gradients', True,
             'Inside the partitions, compute weight gradients of x [..., n] @ w [n, m] matmuls '
             '(projections of rank-3 activations) as one 2-D matmul instead of TF\'s '
             'per-leading-index products; same values, far less time when micro-batches are '
             'small. See matmul_gradient.')
    p.Define('devices', None,
             'Optional list of K device strings overriding cluster.WorkerDeviceInModelSplit(k).')
    p.Define('decode_micro_batches', None,
             'M of each incremental decode step (InitStates, ExtendStep): the step\'s batch '
             '(batch x beam) is split into this many micro-batches; None: as num_micro_batches '
             '(or micro_batch_size). Decode steps are small: fewer micro-batches may run faster.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    where = 'TensorPipeLayer %r' % p.name
    try:
      schedule.CheckRecompute('schedule=%r' % p.schedule, p.recompute,
                              schedule_builders.SplitsBackward(p.schedule, p.virtual_stages))
    except ValueError as e:
      raise ValueError('%s: %s' % (where, e)) from None
    try:
      self._kept_op_types = selective_recompute.KeptTypes(p.selective_kept_ops, p.recompute)
    except ValueError as e:
      raise ValueError('%s: %s' % (where, e)) from None
    if not isinstance(p.batch_dim, int) or p.batch_dim < 0:
      raise ValueError('%s: batch_dim must be a non-negative integer, got %r' %
                       (where, p.batch_dim))
    if p.output_batch_dim is not None and (not isinstance(p.output_batch_dim, int) or
                                           p.output_batch_dim < 0):
      raise ValueError('%s: output_batch_dim must be None or a non-negative integer, got %r' %
                       (where, p.output_batch_dim))
    if p.micro_batch_size is None:
      micro_batching.NumMicroBatches(None, p.num_micro_batches, None, where)
    # Step (0): cut the layers into partitions and create partition k's layers on device k.
    partitions = self._Partitions(where)
    self._placement = list(self._plan.devices)
    self._devices = self._OfPartitions(placement.VariableDevices(
        self.cluster, len(partitions) // p.virtual_stages, p.devices, where))
    self._loss_name = None
    if p.loss_layer is not None:
      self._loss_name = p.loss_layer.name or 'loss'
      if any(self._loss_name == e.name for partition in partitions for e in partition):
        raise ValueError('%s: loss_layer name %r is also a layer name; give it another name' %
                         (where, self._loss_name))
      partitions[-1] = partitions[-1] + [p.loss_layer.Copy().Set(name=self._loss_name)]
    self._CheckSharedNames(partitions, where)
    self._entries = {}  # entry name -> (the child it runs, the method it calls)
    self._partition_layers = []
    self._functions = weakref.WeakKeyDictionary()  # graph -> {input signature: PartitionFunctions}
    for k, partition in enumerate(partitions):
      with tf.device(self._devices[k]):
        for entry in partition:
          self._CreateEntry(entry, where)
      self._partition_layers.append([entry.name for entry in partition])
    self._skips = self._SkipConnections(where)
    self._state_axes = {}  # Entry -> its decoding states' batch axes (set by InitStates).
    if p.micro_batch_size is None:
      self.Schedule(None)  # Combinations of K, v and M that cannot run fail here, not in FProp.

  def _CheckSharedNames(self, partitions, where):
    """Refuses a shared layer named like a layer, and two shared layers of one name that differ."""
    entries = [e for partition in partitions for e in partition]
    own = {e.name for e in entries if not issubclass(e.cls, shared_layer.SharedLayer)}
    shared, first_use = {}, {}
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

  def _CreateEntry(self, entry, where):
    """Creates the child an entry runs (a shared layer only at its first use) on this device."""
    if issubclass(entry.cls, shared_layer.SharedLayer):
      child, method = entry.layer.name, entry.method
      params = entry.layer
    else:
      child, method, params = entry.name, 'FProp', entry
    if child not in self.children:
      self.CreateChild(child, params)
      stateful_ops.CheckAccumulators(self.children[child], where)
    self._entries[entry.name] = (child, method)

  def _SkipConnections(self, where):
    """{key: (source, destination)} of `skip_connections`, checked; keys in declaration order."""
    p = self.params
    order = [name for names in self._partition_layers for name in names]
    skips = {}
    for i, pair in enumerate(p.skip_connections or []):
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

  def _Partitions(self, where):
    """The K lists of layer Params, from `partitions` or by splitting `layers` (partitioning)."""
    p = self.params
    if (p.partitions is None) == (p.layers is None):
      raise ValueError('%s: set exactly one of `partitions` (explicit partitions) and `layers` '
                       '(cut into num_partitions partitions)' % where)
    sizes = None
    v = p.virtual_stages
    if p.partitions is not None:
      partitioning.CheckPartitions(p.partitions, where)
      if len(p.partitions) % v:
        raise ValueError('%s: `partitions` lists %d partitions, not a multiple of '
                         'virtual_stages=%d (K devices hold K x virtual_stages partitions)' %
                         (where, len(p.partitions), v))
      if p.num_partitions is not None and p.num_partitions * v != len(p.partitions):
        raise ValueError('%s: num_partitions=%r devices with virtual_stages=%d need %d partitions, '
                         'but `partitions` lists %d' % (where, p.num_partitions, v,
                                                        p.num_partitions * v, len(p.partitions)))
      sizes = [len(partition) for partition in p.partitions]
      layers = [layer_params for partition in p.partitions for layer_params in partition]
      num_partitions = len(sizes)
    else:
      if p.num_partitions is None:
        raise ValueError('%s: `layers` needs num_partitions (the number of devices K)' % where)
      layers, num_partitions = list(p.layers), p.num_partitions * v
    seen = set()
    for i, layer_params in enumerate(layers):
      if not layer_params.name:
        raise ValueError('%s: layer %d (%s) has no name; every layer needs a unique name' %
                         (where, i, layer_params.cls.__name__))
      if layer_params.name in seen:
        raise ValueError('%s: layer name %r appears twice; layer names must be unique' %
                         (where, layer_params.name))
      seen.add(layer_params.name)
    if p.micro_batch_size is None or p.cost_input_shapes is None:
      num_micro = p.num_micro_batches
    else:
      num_micro = self.NumMicroBatches(p.cost_input_shapes[0][p.batch_dim])
    device = None
    if p.partition_cost == 'measured':
      device = p.devices[0] if p.devices else self.cluster.WorkerDeviceInModelSplit(0)
    self._plan = partitioning.MakePlan(
        layers, num_partitions, p.cost_input_shapes, p.partition_cost, p.partition_algorithm,
        p.memory_budget, num_micro, p.recompute, p.bytes_per_param, device, sizes, where=where,
        skips=_SkipIndices(layers, p.skip_connections),
        partition_devices=schedule_builders.PartitionDevices(p.schedule, num_partitions // v, v))
    partitions = self._plan.Partitions()
    if sizes is None:
      tf.logging.info('%s: %d layers in partitions of %s by %s cost (%s), imbalance max/mean %.3f',
                      where,
                      len(layers), self._plan.sizes, self._plan.cost_source, p.partition_algorithm,
                      self._plan.Imbalance())
    if p.log_partition_report:
      if p.cost_input_shapes is None:
        raise ValueError('%s: log_partition_report needs cost_input_shapes' % where)
      tf.logging.info('%s', partition_report.Build(self._plan, where))
    return [[layer_params.Copy() for layer_params in partition] for partition in partitions]

  @property
  def num_partitions(self):
    """The number of partitions: K x virtual_stages."""
    return len(self._partition_layers)

  @property
  def num_devices(self):
    """K, the devices of a model split the partitions run on."""
    return self.num_partitions // self.params.virtual_stages

  def _OfPartitions(self, devices):
    """Per partition, its device among the K `devices` (as the schedule places partitions)."""
    return [devices[d] for d in self._placement]

  @property
  def partition_plan(self):
    """The partitioning.Plan: partition sizes and the per-layer costs behind them."""
    return self._plan

  def PartitionReport(self):
    """Per partition: layers, cost, share, parameters, estimated memory; imbalance, efficiency."""
    return partition_report.Build(self._plan, 'TensorPipeLayer %r' % self.params.name)

  @property
  def devices(self):
    """The device of each partition in the model split the layer was built in (its variables');
    with virtual stages a device appears once per partition it holds.

    FProp runs the partitions on the devices of the model split it is called in (see `FProp`).
    """
    return list(self._devices)

  @property
  def partition_layer_names(self):
    """The names of the layers in each partition."""
    return [list(names) for names in self._partition_layers]

  def MicroBatchDependence(self) -> list:
    """Why this pipeline's training results depend on M (empty if they do not), from the partitions
    FProp has traced in the current graph: batch norm's micro-batch statistics, dropout masks with
    no example axis. Results never depend on K."""
    reasons = []
    for functions in self._functions.get(_OutermostGraph(), {}).values():
      reasons.extend(r for r in functions.MicroBatchDependence() if r not in reasons)
    return reasons

  def _LayerFunctions(self, names, decoding=False):
    """The entries `names` as (name, function (theta, state) -> state), in order.

    A state is (main, loss inputs or None, {skip key: tensor}): an entry gets the main value as its
    inputs (the loss layer gets it and then the loss inputs), then the skip connections it is the
    destination of; its output becomes the main value and the value of the skip connections it is
    the source of. The pipeline's last entry returns its output alone.

    With `decoding`, a function takes and returns (state, {entry: decoding states}, time step): an
    entry with decoding states runs its ExtendStep on them and replaces them with what it returns
    (see `decode_state`); the others run as in FProp.
    """
    last = [name for names_k in self._partition_layers for name in names_k][-1]

    def Run(name):
      child, method = self._entries[name]
      layer = self.children[child]
      into = [key for key, (_, dst) in self._skips.items() if dst == name]
      out_of = [key for key, (src, _) in self._skips.items() if src == name]

      def Fn(theta, state):
        caches, time_step = {}, None
        if decoding:
          state, caches, time_step = state
        main, extra, carried = state
        args = (main,) + _ToTuple(extra) if name == self._loss_name else _ToTuple(main)
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

  def _ThetaNames(self, names):
    """The children whose weights the entries `names` read, in order of first use."""
    children = []
    for name in names:
      child = self._entries[name][0]
      if child not in children:
        children.append(child)
    return children

  def _PartitionOf(self, name):
    return [k for k, names in enumerate(self._partition_layers) if name in names][0]

  def _PartitionInputs(self, k, piece, earlier):
    """Partition k's input state for one micro-batch (see `_LayerFunctions`).

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
      source = self._PartitionOf(src)
      if self._PartitionOf(dst) == k and source < k:
        carried[key] = earlier[source][2][key]
    return (main, extra, carried)

  def _PartitionFunctions(self, k, device, theta, inputs, example_count, recomputes):
    """Partition k's graph functions on `device` for inputs like `inputs`.

    Traced once per graph, device, input signature, mode (layers compute differently in evaluation)
    and whether backward passes re-compute, so the graph does not grow with M (micro-batches of two
    sizes, when M does not divide the batch, trace twice).
    """
    p = self.params
    graph = _OutermostGraph()  # Where traces are made (graph_function.GraphFunction.Trace).
    leaves = tuple(None if x is None else (str(x.shape), x.dtype.name)
                   for x in tf.nest.flatten(inputs))
    kept_types = self._kept_op_types if recomputes and p.recompute == 'selective' else None
    signature = (k, device, self.do_eval, recomputes, kept_types, example_count, leaves,
                 str(tf.nest.map_structure(lambda _: 0, inputs)))
    cache = self._functions.setdefault(graph, {})
    if signature not in cache:
      cache[signature] = partition_function.PartitionFunctions(
          self._LayerFunctions(self._partition_layers[k]), theta, inputs, device,
          '%s_partition%d' % (p.name, k), p.two_d_weight_gradients, 'TensorPipeLayer %r' % p.name,
          site_prefix=randomness.LayerKey(self), example_axis=p.batch_dim,
          example_count=example_count, recomputes=recomputes, kept_op_types=kept_types)
    return cache[signature]

  def NumMicroBatches(self, batch_size):
    """M for a mini-batch of `batch_size` examples (checked: 1 <= M <= batch)."""
    p = self.params
    num = p.num_micro_batches
    if p.micro_batch_size is not None and num == 1:
      num = None  # The default defers to micro_batch_size.
    return micro_batching.NumMicroBatches(batch_size, num, p.micro_batch_size,
                                          'TensorPipeLayer %r' % p.name)

  def Schedule(self, batch_size):
    """The schedule.Schedule FProp follows for a mini-batch of `batch_size` examples."""
    p = self.params
    lag = 2 if p.forward_overlap else 1
    num_micro = self.NumMicroBatches(batch_size)
    try:
      return schedule_builders.Build(p.schedule, self.num_devices, num_micro, p.virtual_stages,
                                     lag, p.recompute)
    except ValueError as e:
      raise ValueError('TensorPipeLayer %r: %s' % (p.name, e)) from None

  def FProp(self, theta, *args):
    """Runs the pipeline on `args` (tensors, tuples or NestedMaps): the last partition's outputs.

    Partition k runs on its device of the current model split: device k
    (`cluster.WorkerDeviceInModelSplit(k)`, or `devices[k]`), or with virtual stages the device
    the schedule places it on (`schedule_builders.PartitionDevices`). With data parallelism,
    Lingvo calls FProp once per split, each on its own devices.
    """
    p = self.params
    where = 'TensorPipeLayer %r' % p.name
    if self._loss_name is not None and len(args) != 2:
      raise ValueError('%s: with a loss_layer, FProp takes (inputs, loss_inputs); got %d '
                       'arguments' % (where, len(args)))
    batch = micro_batching.BatchSize(args, p.batch_dim, where)
    num_micro = 1 if p.unpipelined else self.NumMicroBatches(batch)
    devices = self._OfPartitions(
        placement.PartitionDevices(self.cluster, self.num_devices, p.devices, where))
    partition_theta = [py_utils.NestedMap({name: theta[name] for name in self._ThetaNames(names)})
                       for names in self._partition_layers]
    with tf.name_scope(p.name):
      with tf.device(devices[0]):
        if batch is None:
          if num_micro > 1:
            args = self._AssertEnoughExamples(args, num_micro)
          sizes = micro_batching.Sizes(self._RunTimeBatch(args), num_micro)
        else:
          sizes = micro_batching.Sizes(batch, num_micro)
        offsets = micro_batching.Offsets(sizes)
      collector = batch_norm.StatsCollector(
          num_micro, where, None if micro_batching.IsEven(sizes) else sizes)
      if p.unpipelined:
        out = self._FPropUnpipelined(partition_theta, args, devices, sizes[0], collector)
      else:
        out = self._FPropPipelined(partition_theta, args, batch, devices, sizes, offsets,
                                   collector)
      # Step (7): one moving-average update per batch-norm variable, from the M micro-batches'
      # statistics; Lingvo's training step applies it with the gradients.
      with tf.device(devices[-1]):
        out = collector.Finish(out)
    return out

  def _FPropPipelined(self, partition_theta, args, batch, devices, sizes, offsets, collector):
    p = self.params
    num_micro = len(sizes)
    sched = self.Schedule(batch)
    recomputes = not self.do_eval and any(sched.Recomputes(t) for t in range(num_micro))

    def MakePartition(k, t, theta, inputs):
      count = sizes[t] if isinstance(sizes[t], int) else None
      return self._PartitionFunctions(k, devices[k], theta, inputs, count, recomputes)

    # Steps (1)-(6) (see `executor`).
    step = executor.PipelineStep(
        sched, MakePartition, devices, p.batch_dim,
        'TensorPipeLayer %r' % p.name, route=self._PartitionInputs,
        output_batch_dim=p.batch_dim if p.output_batch_dim is None else p.output_batch_dim,
        check_batch_dim=p.check_batch_dim)
    return step.Run(partition_theta, args, sizes, offsets, collector, training=not self.do_eval)

  def _FPropUnpipelined(self, partition_theta, args, devices, batch, collector):
    """The layers one after another, partition k's on device k, in the caller's graph."""
    p = self.params
    step = py_utils.GetGlobalStep()
    state = self._PartitionInputs(0, args, [])
    for k, names in enumerate(self._partition_layers):
      with tf.device(devices[k]):
        state = partition_trace.RunInline(
            self._LayerFunctions(names), partition_theta[k], state,
            None if step is None else tf.cast(step, tf.int64), collector,
            site_prefix=randomness.LayerKey(self), example_axis=p.batch_dim,
            example_count=batch if isinstance(batch, int) else None,
            two_d_weight_gradients=p.two_d_weight_gradients)
    return state

  # ------------------------------------------------------------------------------------------------
  # Incremental decoding (see `decode_state`): InitStates, then one ExtendStep per position.

  def DecodeMicroBatches(self, batch_size):
    """M of a decode step of `batch_size` examples (1 when unpipelined): decode_micro_batches, or
    as NumMicroBatches."""
    p = self.params
    if p.unpipelined:
      return 1
    if p.decode_micro_batches is None:
      return self.NumMicroBatches(batch_size)
    return micro_batching.NumMicroBatches(batch_size, p.decode_micro_batches, None,
                                          'TensorPipeLayer %r: decode_micro_batches' % p.name)

  def DecodeSchedule(self, batch_size):
    """The schedule_builders.DecodeSchedule of a decode step of `batch_size` examples."""
    p = self.params
    return schedule_builders.DecodeSchedule(self.num_partitions,
                                            self.DecodeMicroBatches(batch_size),
                                            2 if p.forward_overlap else 1, self._placement)

  def _DecodingEntries(self, where):
    """The names of the entries that decode with a state, each checked (see decode_state.Check)."""
    names = []
    for k, partition in enumerate(self._partition_layers):
      for name in partition:
        child, method = self._entries[name]
        decode_state.Check(self.children[child], method, name, k, where)
        if decode_state.Decodes(self.children[child], method):
          names.append(name)
    return names

  def InitStates(self, theta, batch_size, max_length, context=None):
    """The decoding states of `batch_size` examples (batch x beam) for up to `max_length` steps.

    Every entry whose layer has InitStates and ExtendStep makes its states on its partition's
    device, once per micro-batch of the decode steps (DecodeMicroBatches); the states stay there
    for the whole decode. `context` (tensors, tuples or NestedMaps with a batch axis, e.g. an
    encoder's output) is split into the same micro-batches, and each piece goes once to the
    devices whose entries' InitStates get it. Raises ValueError naming an entry that keeps state
    between positions but has no ExtendStep, before anything is built.

    Returns:
      states[k][t]: partition k's {entry: states} for micro-batch t, to pass to ExtendStep.
    """
    p = self.params
    where = 'TensorPipeLayer %r' % p.name
    decoding = self._DecodingEntries(where)
    static = batch_size if isinstance(batch_size, int) else None
    num_micro = self.DecodeMicroBatches(static)
    sizes = micro_batching.Sizes(batch_size, num_micro)
    devices = self._OfPartitions(
        placement.PartitionDevices(self.cluster, self.num_devices, p.devices, where))
    with tf.device(devices[0]):
      contexts = ([None] * num_micro if context is None else
                  micro_batching.Split(context, num_micro, p.batch_dim, sizes))
    self._state_axes = {}
    states = []
    with tf.name_scope(p.name):
      for k, names in enumerate(self._partition_layers):
        per_micro = [{} for _ in range(num_micro)]
        for name in names:
          if name not in decoding:
            continue
          child = self._entries[name][0]
          layer = self.children[child]

          def Init(size, piece, layer=layer, child=child):
            args = () if context is None else (piece,)
            return layer.InitStates(theta[child], size, max_length, *args)

          with tf.device(devices[k]), tf.name_scope('%s_init_states' % name):
            made = decode_state.Create(Init, sizes, contexts)
          for t, value in enumerate(made):
            per_micro[t][name] = value
          self._state_axes[name] = decode_state.BatchAxes(Init, contexts[0], p.batch_dim,
                                                          '%s: layer %r' % (where, name))
        states.append(per_micro)
    return states

  def ExtendStep(self, theta, step_inputs, states, t):
    """One decode step: the pipeline on one position of each example, given the states before it.

    Args:
      theta: the layer's weights.
      step_inputs: what FProp takes, for one position (e.g. [B, 1, D] batch-major, or [1, B, D]
        time-major); with a loss_layer, (inputs, loss_inputs), where loss_inputs may be None.
      states: what InitStates or the previous ExtendStep returned.
      t: the position's index (int32 scalar), 0 for the first step.

    The step's batch is split into the micro-batches of InitStates, and micro-batch t of a step
    runs on partition k while micro-batch t + 1 runs on partition k - 1 (a decode step's schedule,
    DecodeSchedule). Entries with states run ExtendStep on them, the others their FProp (or a
    SharedLayer's method); tied weights and skip connections work as in FProp.

    Returns:
      (the last entry's outputs, joined over micro-batches as FProp's, the new states).
    """
    p = self.params
    where = 'TensorPipeLayer %r' % p.name
    args = _ToTuple(step_inputs)
    if self._loss_name is not None and len(args) != 2:
      raise ValueError('%s: with a loss_layer, ExtendStep takes step_inputs=(inputs, loss_inputs) '
                       '(loss_inputs may be None); got %d' % (where, len(args)))
    batch = micro_batching.BatchSize(args, p.batch_dim, where)
    num_micro = self.DecodeMicroBatches(batch)
    if len(states) != self.num_partitions or any(len(s) != num_micro for s in states):
      raise ValueError('%s: ExtendStep got states for %s micro-batches of %d partitions, but a '
                       'step of %s examples has %d micro-batches of %d partitions; pass the states '
                       'InitStates made for this batch' %
                       (where, [len(s) for s in states], len(states), batch, num_micro,
                        self.num_partitions))
    devices = self._OfPartitions(
        placement.PartitionDevices(self.cluster, self.num_devices, p.devices, where))
    partition_theta = [py_utils.NestedMap({name: theta[name] for name in self._ThetaNames(names)})
                       for names in self._partition_layers]
    t = tf.convert_to_tensor(t, tf.int32)
    with tf.name_scope(p.name):
      with tf.device(devices[0]):
        sizes = micro_batching.Sizes(self._RunTimeBatch(args) if batch is None else batch,
                                     num_micro)
      if p.unpipelined:
        return self._ExtendStepUnpipelined(partition_theta, args, devices, states, t)
      sched = self.DecodeSchedule(batch)

      def MakePartition(k, unused_micro_batch, theta_k, inputs):
        return partition_trace.InlinePartition(partition_trace.PartitionBody(
            self._LayerFunctions(self._partition_layers[k], decoding=True), theta_k, inputs,
            '%s_partition%d_step' % (p.name, k), where, randomness.LayerKey(self), p.batch_dim,
            None, p.two_d_weight_gradients), devices[k])

      step = executor.PipelineStep(
          sched, MakePartition, devices, p.batch_dim, where, route=self._PartitionInputs,
          output_batch_dim=p.batch_dim if p.output_batch_dim is None else p.output_batch_dim)
      return step.DecodeStep(partition_theta, args, sizes, states, t)

  def _ExtendStepUnpipelined(self, partition_theta, args, devices, states, t):
    """A decode step without micro-batches or partition functions: partition k's entries, one
    after another, on device k (the reference of the pipelined decode step)."""
    p = self.params
    step = py_utils.GetGlobalStep()
    state = self._PartitionInputs(0, args, [])
    new_states = []
    for k, names in enumerate(self._partition_layers):
      with tf.device(devices[k]):
        state, caches, _ = partition_trace.RunInline(
            self._LayerFunctions(names, decoding=True), partition_theta[k],
            (state, states[k][0], t), None if step is None else tf.cast(step, tf.int64),
            batch_norm.Discarding(), site_prefix=randomness.LayerKey(self),
            example_axis=p.batch_dim, two_d_weight_gradients=p.two_d_weight_gradients)
      new_states.append([caches])
    return state, new_states

  def ReorderStates(self, states, rows):
    """`states` with row r of the step's batch taken from row rows[r] (beam search's parents),
    each partition's by a gather on its own device: no state moves between devices.

    Args:
      states: what InitStates or ExtendStep returned.
      rows: [batch] int32, the row each row's states come from.
    """
    p = self.params
    where = 'TensorPipeLayer %r' % p.name
    devices = self._OfPartitions(
        placement.PartitionDevices(self.cluster, self.num_devices, p.devices, where))
    batch = tf.compat.dimension_value(rows.shape[0])
    with tf.device(devices[0]):
      sizes = micro_batching.Sizes(tf.shape(rows)[0] if batch is None else batch,
                                   len(states[0]) if states else 1)
    out = []
    with tf.name_scope(p.name), tf.name_scope('reorder_states'):
      for k, per_micro in enumerate(states):
        names = sorted(per_micro[0])
        missing = [name for name in names if name not in self._state_axes]
        if missing:
          raise ValueError('%s: ReorderStates got states of layer %r, which this pipeline\'s '
                           'InitStates did not make' % (where, missing[0]))
        with tf.device(devices[k]):
          out.append(decode_state.Reorder(per_micro, {n: self._state_axes[n] for n in names},
                                          rows, sizes))
    return out

  def _RunTimeBatch(self, args):
    """The batch size of `args` when the graph runs (int32 scalar)."""
    p = self.params
    first = [x for x in tf.nest.flatten(args) if micro_batching.IsBatched(x, p.batch_dim)][0]
    return tf.shape(first)[p.batch_dim]

  def _AssertEnoughExamples(self, args, num_micro):
    """Run-time check for a batch size unknown when the graph is built: every micro-batch needs an
    example."""
    p = self.params
    batch = self._RunTimeBatch(args)
    check = check_failure.Assert(
        tf.greater_equal(batch, num_micro),
        ['TensorPipeLayer %r: this batch has ' % p.name, batch, ' examples along batch_dim=%d, '
         'fewer than its num_micro_batches=%d (each micro-batch needs one): feed batches of at '
         'least %d examples or lower num_micro_batches' % (p.batch_dim, num_micro, num_micro)])
    with tf.control_dependencies([check]):
      return tf.nest.map_structure(lambda x: None if x is None else tf.identity(x), args)

  @classmethod
  def FPropMeta(cls, p, *args):
    """The whole pipeline's cost: the sum of its layers' FPropMeta (for enclosing partitioners)."""
    layer_params = list(p.layers) if p.layers is not None else [l for c in p.partitions for l in c]
    metas, shapes = cost_model.ChainMeta(layer_params, args,
                                         _SkipIndices(layer_params, p.skip_connections))
    return py_utils.NestedMap(flops=sum(flops for flops, _ in metas), out_shapes=shapes)


def Pipelines(params: hyperparams.Params) -> List[Tuple[str, hyperparams.Params]]:
  """[(path, Params)] of every TensorPipeLayer's Params nested anywhere in `params` (e.g. a
  model's), in the order nested_params.Walk finds them."""
  out = []
  for path, p in nested_params.Walk(params):
    cls = p.Get('cls') if 'cls' in p else None
    if isinstance(cls, type) and issubclass(cls, TensorPipeLayer):
      out.append((path, p))
  return out
