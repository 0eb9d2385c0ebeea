"""TensorPipeLayer: a sequential list of Lingvo layers run as a GPipe pipeline over K devices.

The L layers are cut into K partitions (explicitly, or balanced by estimated cost); partition k and
its variables live on device k. With virtual stages v (schedules 'interleaved_1f1b' and 'zbv') they
are cut into K v partitions and each device holds v of them, as `schedule_builders.PartitionDevices`
places them. FProp splits the mini-batch into M micro-batches and runs the schedule's actions (see
`schedule`): each forward action F(k, t) is one call of partition k's
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

import dataclasses
from typing import Any, Dict, List, Tuple

from lingvo import compat as tf
from lingvo.core import base_layer
from lingvo.core import hyperparams
from lingvo.core import py_utils

from tensorpipe import batch_norm
from tensorpipe import decode_state
from tensorpipe import entries
from tensorpipe import executor
from tensorpipe import micro_batching
from tensorpipe import nested_params
from tensorpipe.partitioner import cost_model
from tensorpipe.partitioner import partition_report
from tensorpipe.partitioner import partitioning
from tensorpipe import partition_function
from tensorpipe import partition_spec
from tensorpipe import partition_trace
from tensorpipe import per_graph
from tensorpipe import placement
from tensorpipe import randomness
from tensorpipe import schedule
from tensorpipe import schedule_builders
from tensorpipe import selective_recompute
from tensorpipe import stateful_ops

RECOMPUTE_MODES = schedule.RECOMPUTE_MODES
# Per graph: {layer: {(spec, do_eval, input leaves, input structure): PartitionFunctions}}.
_FUNCTIONS: per_graph.PerGraph[Dict[Any, Dict[Any, partition_function.PartitionFunctions]]] = (
    per_graph.PerGraph('layer_functions', dict))


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
             'Flat list of layer Params, cut automatically into num_devices x virtual_stages '
             'partitions. Set this or `partitions`. A tensorpipe.SharedLayer entry runs a layer '
             'that several entries share (tied weights).')
    p.Define('num_devices', None,
             'K, the number of devices the pipeline runs on: `layers` is cut into K x '
             'virtual_stages partitions (with `partitions`, optional: their number / '
             'virtual_stages).')
    p.Define('num_partitions', None, 'Deprecated: the old name of num_devices (K devices).')
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
    where = partition_spec.Where(p.name)
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
    partitions, self._loss_name = entries.WithLossLayer(partitions, p.loss_layer, where)
    entries.CheckSharedNames(partitions, where)
    targets = {}  # Entry name -> (the child it runs, the method it calls).
    for k, partition in enumerate(partitions):
      with tf.device(self._devices[k]):
        for entry in partition:
          child, method, child_params = entries.Target(entry)
          if child not in self.children:  # A shared layer is created at its first use.
            self.CreateChild(child, child_params)
            stateful_ops.CheckAccumulators(self.children[child], where)
          targets[entry.name] = (child, method)
    self._partition_layers = [[entry.name for entry in partition] for partition in partitions]
    self._entries = entries.Entries(self._partition_layers, targets, p.skip_connections,
                                    self._loss_name, where)
    self._state_axes = {}  # Entry -> its decoding states' batch axes (set by InitStates).
    if p.micro_batch_size is None:
      self.Schedule(None)  # Combinations of K, v and M that cannot run fail here, not in FProp.

  def _Partitions(self, where):
    """The K x virtual_stages lists of layer Params, from `partitions` or by splitting `layers`."""
    p = self.params
    if p.micro_batch_size is None or p.cost_input_shapes is None:
      num_micro = p.num_micro_batches
    else:
      num_micro = self.NumMicroBatches(p.cost_input_shapes[0][p.batch_dim])
    device = None
    if p.partition_cost == 'measured':
      device = p.devices[0] if p.devices else self.cluster.WorkerDeviceInModelSplit(0)
    self._plan = partitioning.PipelinePlan(p, placement.NumDevices(p, where), num_micro, device,
                                           where)
    partitions = self._plan.Partitions()
    if p.partitions is None:
      tf.logging.info('%s: %d layers in partitions of %s by %s cost (%s), imbalance max/mean %.3f',
                      where, len(self._plan.layer_params), self._plan.sizes, self._plan.cost_source,
                      p.partition_algorithm, self._plan.Imbalance())
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

  def _RunDevices(self, where):
    """Per partition, its device in the model split the layer is called in (see `FProp`)."""
    return self._OfPartitions(
        placement.SplitDevices(self.cluster, self.num_devices, self.params.devices, where))

  @property
  def partition_plan(self):
    """The partitioning.Plan: partition sizes and the per-layer costs behind them."""
    return self._plan

  def PartitionReport(self):
    """Per partition: layers, cost, share, parameters, estimated memory; imbalance, efficiency."""
    return partition_report.Build(self._plan, partition_spec.Where(self.params.name))

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

  def MicroBatchDependence(self) -> List[str]:
    """Why this pipeline's training results depend on M (empty if they do not), from the partitions
    FProp has traced in the current graph: batch norm's micro-batch statistics, dropout masks with
    no batch dimension. Results never depend on K."""
    reasons: List[str] = []
    for functions in (_FUNCTIONS.Peek(_OutermostGraph()) or {}).get(self, {}).values():
      reasons.extend(r for r in functions.MicroBatchDependence() if r not in reasons)
    return reasons

  def _PartitionTheta(self, theta):
    """Per partition, the weights its entries read (from the layer's `theta`)."""
    return [py_utils.NestedMap({name: theta[name] for name in self._entries.ThetaNames(names)})
            for names in self._partition_layers]

  def _Specs(self, devices, recomputes=False, decoding=False):
    """Each partition's PartitionSpec, partition k on `devices[k]`; `recomputes`: whether backward
    passes re-compute (then selectively with recompute='selective')."""
    p = self.params
    kept_types = self._kept_op_types if recomputes and p.recompute == 'selective' else None
    return [partition_spec.PartitionSpec(
        pipeline=p.name, index=k, device=device, scope=randomness.LayerKey(self),
        batch_dim=p.batch_dim, two_d_weight_gradients=p.two_d_weight_gradients,
        recomputes=recomputes, kept_op_types=kept_types, decoding=decoding)
            for k, device in enumerate(devices)]

  def _PartitionFunctions(self, spec, theta, inputs):
    """The graph functions of partition `spec` for inputs like `inputs`.

    Traced once per graph, spec (device, examples per micro-batch, whether backward passes
    re-compute), input signature and mode (layers compute differently in evaluation), so the graph
    does not grow with M (micro-batches of two sizes, when M does not divide the batch, trace
    twice).
    """
    graph = _OutermostGraph()  # Where traces are made (graph_function.GraphFunction.Trace).
    leaves = tuple(None if x is None else (str(x.shape), x.dtype.name)
                   for x in tf.nest.flatten(inputs))
    signature = (spec, self.do_eval, leaves, str(tf.nest.map_structure(lambda _: 0, inputs)))
    cache = _FUNCTIONS.Of(graph).setdefault(self, {})
    if signature not in cache:
      cache[signature] = partition_function.PartitionFunctions(
          self._entries.LayerFunctions(self._partition_layers[spec.index], self.children), theta,
          inputs, spec)
    return cache[signature]

  def NumMicroBatches(self, batch_size):
    """M for a mini-batch of `batch_size` examples (checked: 1 <= M <= batch)."""
    p = self.params
    num = p.num_micro_batches
    if p.micro_batch_size is not None and num == 1:
      num = None  # The default defers to micro_batch_size.
    return micro_batching.NumMicroBatches(batch_size, num, p.micro_batch_size,
                                          partition_spec.Where(p.name))

  def Schedule(self, batch_size):
    """The schedule.Schedule FProp follows for a mini-batch of `batch_size` examples."""
    p = self.params
    lag = 2 if p.forward_overlap else 1
    num_micro = self.NumMicroBatches(batch_size)
    try:
      return schedule_builders.Build(p.schedule, self.num_devices, num_micro, p.virtual_stages,
                                     lag, p.recompute)
    except ValueError as e:
      raise ValueError('%s: %s' % (partition_spec.Where(p.name), e)) from None

  def FProp(self, theta, *args):
    """Runs the pipeline on `args` (tensors, tuples or NestedMaps): the last partition's outputs.

    Partition k runs on its device of the current model split: device k
    (`cluster.WorkerDeviceInModelSplit(k)`, or `devices[k]`), or with virtual stages the device
    the schedule places it on (`schedule_builders.PartitionDevices`). With data parallelism,
    Lingvo calls FProp once per split, each on its own devices.
    """
    p = self.params
    where = partition_spec.Where(p.name)
    if self._loss_name is not None and len(args) != 2:
      raise ValueError('%s: with a loss_layer, FProp takes (inputs, loss_inputs); got %d '
                       'arguments' % (where, len(args)))
    devices = self._RunDevices(where)
    partition_theta = self._PartitionTheta(theta)
    with tf.name_scope(p.name):
      with tf.device(devices[0]):
        plan = micro_batching.Plan(
            args, p.batch_dim, lambda batch: 1 if p.unpipelined else self.NumMicroBatches(batch),
            where)
      collector = batch_norm.StatsCollector(plan.num_micro_batches, where,
                                            None if plan.even else plan.sizes)
      if p.unpipelined:
        out = self._FPropUnpipelined(partition_theta, plan.args, devices, plan.sizes[0],
                                     collector)
      else:
        out = self._FPropPipelined(partition_theta, devices, plan, collector)
      # Step (7): one moving-average update per batch-norm variable, from the M micro-batches'
      # statistics; Lingvo's training step applies it with the gradients.
      with tf.device(devices[-1]):
        out = collector.Finish(out)
    return out

  def _FPropPipelined(self, partition_theta, devices, plan, collector):
    p = self.params
    sizes = plan.sizes
    sched = self.Schedule(plan.batch_size)
    recomputes = not self.do_eval and any(
        sched.Recomputes(t) for t in range(plan.num_micro_batches))

    specs = self._Specs(devices, recomputes)

    def MakePartition(k, t, theta, inputs):
      count = sizes[t] if isinstance(sizes[t], int) else None
      return self._PartitionFunctions(dataclasses.replace(specs[k], example_count=count), theta,
                                      inputs)

    # Steps (1)-(6) (see `executor`).
    step = executor.PipelineStep(
        sched, MakePartition, devices, p.batch_dim,
        partition_spec.Where(p.name), route=self._entries.PartitionInputs,
        output_batch_dim=p.batch_dim if p.output_batch_dim is None else p.output_batch_dim,
        check_batch_dim=p.check_batch_dim)
    return step.Run(partition_theta, plan, collector, training=not self.do_eval)

  def _FPropUnpipelined(self, partition_theta, args, devices, batch, collector):
    """The layers one after another, partition k's on device k, in the caller's graph."""
    step = py_utils.GetGlobalStep()
    state = self._entries.PartitionInputs(0, args, [])
    count = batch if isinstance(batch, int) else None
    for spec, names in zip(self._Specs(devices), self._partition_layers):
      with tf.device(spec.device):
        state = partition_trace.RunInline(
            self._entries.LayerFunctions(names, self.children), partition_theta[spec.index], state,
            None if step is None else tf.cast(step, tf.int64), collector,
            dataclasses.replace(spec, example_count=count))
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
                                          '%s: decode_micro_batches' % partition_spec.Where(p.name))

  def DecodeSchedule(self, batch_size):
    """The schedule_builders.DecodeSchedule of a decode step of `batch_size` examples."""
    lag = 2 if self.params.forward_overlap else 1  # Two forward calls of a partition at once.
    return schedule_builders.DecodeSchedule(
        self.num_partitions, self.DecodeMicroBatches(batch_size), lag, self._placement)

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
    where = partition_spec.Where(p.name)
    decoding = self._entries.Decoding(self.children, where)
    static = batch_size if isinstance(batch_size, int) else None
    num_micro = self.DecodeMicroBatches(static)
    sizes = micro_batching.Sizes(batch_size, num_micro)
    devices = self._RunDevices(where)
    with tf.device(devices[0]):
      contexts = ([None] * num_micro if context is None else
                  micro_batching.Split(context, num_micro, p.batch_dim, sizes))
    self._state_axes = {}
    states = []
    with tf.name_scope(p.name):
      for k, names in enumerate(self._partition_layers):
        per_micro: List[Dict[str, Any]] = [{} for _ in range(num_micro)]  # Layer name -> states.
        for name in names:
          if name not in decoding:
            continue
          child = self._entries.Target(name)[0]
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
    where = partition_spec.Where(p.name)
    args = entries.ToTuple(step_inputs)
    if self._loss_name is not None and len(args) != 2:
      raise ValueError('%s: with a loss_layer, ExtendStep takes step_inputs=(inputs, loss_inputs) '
                       '(loss_inputs may be None); got %d' % (where, len(args)))
    devices = self._RunDevices(where)
    partition_theta = self._PartitionTheta(theta)
    t = tf.convert_to_tensor(t, tf.int32)
    with tf.name_scope(p.name):
      with tf.device(devices[0]):
        plan = micro_batching.Plan(args, p.batch_dim, self.DecodeMicroBatches, where)
      if len(states) != self.num_partitions or any(
          len(s) != plan.num_micro_batches for s in states):
        raise ValueError('%s: ExtendStep got states for %s micro-batches of %d partitions, but a '
                         'step of %s examples has %d micro-batches of %d partitions; pass the '
                         'states InitStates made for this batch' %
                         (where, [len(s) for s in states], len(states), plan.batch_size,
                          plan.num_micro_batches, self.num_partitions))
      if p.unpipelined:
        return self._ExtendStepUnpipelined(partition_theta, plan.args, devices, states, t)
      sched = self.DecodeSchedule(plan.batch_size)

      specs = self._Specs(devices, decoding=True)

      def MakePartition(k, unused_micro_batch, theta_k, inputs):
        return partition_trace.InlinePartition(partition_trace.PartitionBody(
            self._entries.LayerFunctions(self._partition_layers[k], self.children, decoding=True),
            theta_k, inputs, specs[k]))

      step = executor.PipelineStep(
          sched, MakePartition, devices, p.batch_dim, where, route=self._entries.PartitionInputs,
          output_batch_dim=p.batch_dim if p.output_batch_dim is None else p.output_batch_dim)
      return step.DecodeStep(partition_theta, plan, states, t)

  def _ExtendStepUnpipelined(self, partition_theta, args, devices, states, t):
    """A decode step without micro-batches or partition functions: partition k's entries, one
    after another, on device k (the reference of the pipelined decode step)."""
    step = py_utils.GetGlobalStep()
    state = self._entries.PartitionInputs(0, args, [])
    new_states = []
    for k, (spec, names) in enumerate(zip(self._Specs(devices, decoding=True),
                                          self._partition_layers)):
      with tf.device(spec.device):
        state, caches, _ = partition_trace.RunInline(
            self._entries.LayerFunctions(names, self.children, decoding=True), partition_theta[k],
            (state, states[k][0], t), None if step is None else tf.cast(step, tf.int64),
            batch_norm.Discarding(), spec)
      new_states.append([caches])
    return state, new_states

  def ReorderStates(self, states, rows):
    """`states` (what InitStates or ExtendStep returned) with row r of the step's batch taken from
    row rows[r] (`rows`: [batch] int32, beam search's parents), each partition's by a gather on its
    own device: no state moves between devices."""
    p = self.params
    where = partition_spec.Where(p.name)
    devices = self._RunDevices(where)
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

  @classmethod
  def FPropMeta(cls, p, *args):
    """The whole pipeline's cost: the sum of its layers' FPropMeta (for enclosing partitioners)."""
    layer_params = list(p.layers) if p.layers is not None else [l for c in p.partitions for l in c]
    metas, shapes = cost_model.ChainMeta(layer_params, args,
                                         partitioning.SkipIndices(layer_params, p.skip_connections))
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
