"""Planner: rankings on constructed costs, schedule-aware memory, pruning and errors."""

import dataclasses
import functools
import json
import os
import re

import pytest

from tensorpipe import disk_cache
from tensorpipe.partitioner import cost_model
from tensorpipe.measure import device_profiles
from tensorpipe.measure import planner
from tensorpipe.measure import ranking
from tensorpipe import progress as progress_lib
from tensorpipe import schedule_builders
from tensorpipe import units

# An accelerator-like device: 1 Gflop/s, no per-op or per-call costs, a link so fast that
# transfers cost nothing.
_DEVICE = device_profiles.DeviceProfile('test', peak_flops=1e9, memory=1e9, link_bandwidth=1e18,
                                        source='constructed', efficiency=1.0, op_overhead=0.0,
                                        call_overhead=0.0)


def _Profiles(num_layers=8, flops=1e9, params=1000, activations=100000, boundary=10000):
  """Equal layers for a mini-batch: `flops` each, `activations` held, `boundary` in and out."""
  return [cost_model.LayerProfile('l%d' % i, flops, params, 0, boundary, boundary, activations,
                                  forward_ops=10, backward_ops=20) for i in range(num_layers)]


def _Plan(memory=1e9, **kwargs):
  args = dict(schedules=('gpipe', '1f1b', 'zero_bubble'), micro_batches=(1, 2, 4), replicas=(1,))
  args.update(kwargs)
  return planner.PlanPipeline(_Profiles(), 16, 4, _DEVICE, memory, **args)


@functools.lru_cache(maxsize=None)
def _Least():
  """The least per-device memory any configuration of _Plan needs."""
  return min(c.peak_memory for c in _Plan(memory=1e12).configurations)


class TestRanking:

  def testFittingFirstByStepTimeThenTheRestMarked(self):
    memory = 1.5 * _Least()
    ranking = _Plan(memory=memory)
    configs = ranking.configurations
    fits = [c.fits for c in configs]
    assert fits[0] and not all(fits)
    assert fits == sorted(fits, reverse=True)  # Every fitting one before every other.
    times = [c.step_time for c in configs if c.fits]
    assert times == sorted(times)
    for c in configs:
      assert c.fits == (c.peak_memory <= memory)
      if not c.fits:
        assert c.why == 'needs %s > %s' % (units.FormatBytes(c.peak_memory),
                                          units.FormatBytes(memory))
    assert 'no: needs' in str(ranking)

  def testMoreMemoryNeverMakesTheBestWorse(self):
    best = [_Plan(memory=_Least() * f).best.step_time for f in (1.0, 1.3, 2.0, 100.0)]
    assert best == sorted(best, reverse=True) and best[-1] < best[0]

  def testEqualStagesGiveTheTextbookBubble(self):
    for k, m in ((2, 4), (4, 4), (4, 8)):
      c = planner.Evaluate(_Profiles(), _DEVICE, 1e12, 1, k, m, 'gpipe', 'always')
      assert c.bubble == pytest.approx(schedule_builders.FillDrainBubbleFraction(k, m))
      # Re-computation: each micro-batch's task takes forward + (forward + 2 x forward) flops.
      per_stage = 8 / k * 1.0 * 4 / m
      assert c.step_time == pytest.approx((m + k - 1) * per_stage)

  def testPipeliningBeatsOneDeviceAndReplicasAddTheirAllReduce(self):
    one = planner.Evaluate(_Profiles(), _DEVICE, 1e12, 1, 1, 8, 'gpipe', 'never')
    four = planner.Evaluate(_Profiles(), _DEVICE, 1e12, 1, 4, 8, 'gpipe', 'never')
    assert four.step_time < one.step_time / 2
    slow = device_profiles.DeviceProfile('slow link', 1e9, 1e9, 1e3, 'constructed', efficiency=1.0,
                                 op_overhead=0.0, call_overhead=0.0)
    half = planner.ScaledProfiles(_Profiles(), 0.5)
    alone = planner.Evaluate(half, _DEVICE, 1e12, 1, 1, 1, 'gpipe', 'never')
    two = planner.Evaluate(half, slow, 1e12, 2, 1, 1, 'gpipe', 'never')
    # Ring all-reduce of 8000 float32 gradients over 1 kB/s: 2 (S - 1) / S x 32 kB = 32 s.
    assert two.step_time == pytest.approx(alone.step_time + 32.0)


def testScaledProfilesScaleEveryBatchSizedFactAndNoOther():
  profile = cost_model.LayerProfile('l', 8e9, 1000, 10, 400, 200, 800, forward_ops=10,
                                    backward_ops=20, gradient_elements=100, kept_elements=300,
                                    kept_flops=6e9)
  (third,) = planner.ScaledProfiles([profile], 1 / 3)
  assert dataclasses.astuple(third) == pytest.approx(dataclasses.astuple(dataclasses.replace(
      profile, flops=8e9 / 3, in_elements=400 / 3, out_elements=200 / 3,
      activation_elements=800 / 3, gradient_elements=100 / 3, kept_elements=100, kept_flops=2e9)))
  # What selective re-computation leaves to re-compute is the same share of every replica's work.
  assert cost_model.SelectiveShare(third) == pytest.approx(
      cost_model.SelectiveShare(profile))


class TestPruning:
  """exact=N simulates only what can rank among the first N: the same first N ranks, the same
  table of N rows, fewer simulations."""

  @staticmethod
  def _Uneven():
    return [cost_model.LayerProfile('l%d' % i, 1e9 * (1 + i % 3), 1000 * (i + 1), 0, 10000,
                                    10000, 100000 * (1 + i % 2), forward_ops=10, backward_ops=20)
            for i in range(8)]

  @pytest.mark.parametrize('device', [
      _DEVICE,
      device_profiles.DeviceProfile('shared', 1e9, 1e9, 1e9, 'constructed', efficiency=1.0,
                            op_overhead=1e-4, call_overhead=1e-3, cores=2.0,
                            backward_parallelism=2.0)])
  def testTheFirstRanksAndTheTableAreTheExhaustiveSearchs(self, device, monkeypatch):
    simulate = planner.simulator.Simulate
    calls = []
    monkeypatch.setattr(planner.simulator, 'Simulate',
                        lambda *a, **k: calls.append(1) or simulate(*a, **k))
    args = dict(schedules=('gpipe', '1f1b', 'zero_bubble', 'interleaved_1f1b', 'zbv'),
                micro_batches=(1, 4), replicas=(1, 2))
    least = min(c.peak_memory for c in planner.PlanPipeline(self._Uneven(), 16, 4, device, 1e12,
                                                             **args).configurations)
    for memory_share in (1.05, 100.0):  # Few fit, all fit.
      memory = memory_share * least
      del calls[:]
      full = planner.PlanPipeline(self._Uneven(), 16, 4, device, memory, **args)
      everything = len(calls)
      assert everything == len(full.configurations)
      for rows in (1, 6):
        del calls[:]
        pruned = planner.PlanPipeline(self._Uneven(), 16, 4, device, memory, exact=rows, **args)
        assert ranking.Format(pruned, rows) == ranking.Format(full, rows)
        assert pruned.configurations[:rows] == full.configurations[:rows]
        assert len(pruned.configurations) == everything == len(calls) + sum(
            not c.simulated for c in pruned.configurations)
        if memory_share == 100.0:
          assert len(calls) < everything / 2, (rows, len(calls), everything)
        # Those not simulated fit, and follow every simulated one that fits.
        ranks = [(c.fits, c.simulated) for c in pruned.configurations]
        assert ranks == sorted(ranks, key=lambda r: (not r[0], not r[1]))

  def testASearchWithTheSameInputsIsReadFromTheCache(self, tmp_path, monkeypatch):
    simulate = planner.simulator.Simulate
    calls = []
    monkeypatch.setattr(planner.simulator, 'Simulate',
                        lambda *a, **k: calls.append(1) or simulate(*a, **k))
    cache = disk_cache.DiskCache(str(tmp_path))
    first = _Plan(1e12, exact=4, cache=cache)
    assert calls
    del calls[:]
    lines = []
    again = _Plan(1e12, exact=4, cache=cache, progress=progress_lib.Progress(lines.append))
    assert (calls, again.configurations) == ([], first.configurations)
    assert ranking.Format(again, 4) == ranking.Format(first, 4)
    assert lines == ['search: %d configurations read from the cache (a run with the same inputs '
                     'ranked them)' % len(first.configurations)]
    assert _Plan(1e12, exact=5, cache=cache).configurations[:4] == first.configurations[:4]
    assert calls  # Other arguments: another search.
    [name] = [n for n in os.listdir(tmp_path / 'search')
              if json.loads((tmp_path / 'search' / n).read_text())['key'].endswith('4)')]
    entry = json.loads((tmp_path / 'search' / name).read_text())
    entry['value'][0]['step_time'] = 'fast'  # Not a configuration: searched again.
    (tmp_path / 'search' / name).write_text(json.dumps(entry))
    del calls[:]
    assert _Plan(1e12, exact=4, cache=cache).configurations == first.configurations and calls

  def testExactMustBePositive(self):
    with pytest.raises(ValueError, match='exact must be None or a positive number of ranks, got 0'):
      _Plan(exact=0)

  def testProgressNamesThePhasesAndWhatWasSkipped(self):
    lines = []
    clock = iter(range(1000)).__next__
    progress = progress_lib.Progress(lines.append, interval=1e9, clock=lambda: float(clock()))
    ranking = _Plan(memory=1e12, exact=3, progress=progress)
    n = len(ranking.configurations)
    assert lines[0] == ('splitting and sizing configurations (S x K x M x schedule x recompute): '
                        '%d to do' % n)
    assert re.fullmatch(r'splitting and sizing .*: done in ([0-9]+ min )?[0-9.]+ s; %d fit the '
                        r'memory' % n, lines[1])
    simulated = sum(c.simulated for c in ranking.configurations)
    assert lines[2] == 'simulating steps, best first by a lower bound: %d to do' % n
    assert lines[3].endswith('; %d simulated; %d skipped: a lower bound of their step time shows '
                             'they rank below the first 3' % (simulated, n - simulated))
    assert len(lines) == 4


class TestScheduleMemory:

  @pytest.mark.parametrize('k,m', [(2, 3), (4, 8), (4, 2), (3, 16)])
  def testInFlightCountsAreTheClosedForms(self, k, m):
    assert schedule_builders.FillDrainSchedule(k, m, 2).InFlight() == [m] * k
    in_flight = schedule_builders.OneFOneBSchedule(k, m, 2).InFlight()
    assert in_flight == [min(k - i, m) for i in range(k)]
    zb = schedule_builders.ZeroBubbleSchedule(k, m, 2)
    assert zb.InFlight() == [min(k - i, m) for i in range(k)]
    assert zb.AwaitingWeights() == [min(i + 1, m) for i in range(k)]
    assert schedule_builders.FillDrainSchedule(k, m).AwaitingWeights() == [0] * k

  def testDeviceMemoryFollowsTheSchedule(self):
    profiles = _Profiles(activations=0, params=0)  # Only stashed boundary inputs and gradients.
    k, m = 4, 8
    gpipe = planner.Evaluate(profiles, _DEVICE, 1e12, 1, k, m, 'gpipe', 'always')
    ofob = planner.Evaluate(profiles, _DEVICE, 1e12, 1, k, m, '1f1b', 'always')
    gradients = 2 * 10000 * 4 / m  # One micro-batch's input and output gradient of a layer.
    stash = 10000 * 4 / m  # One micro-batch's boundary input.
    # Re-computed outputs of the one micro-batch a device back-propagates, for its 2 layers.
    outputs = 2 * 10000 * 4 / m
    for i in range(k):
      assert gpipe.device_memory[i] == pytest.approx(m * stash + gradients + outputs)
      assert ofob.device_memory[i] == pytest.approx((k - i) * stash + gradients + outputs)

  def testMicroBatchOverheadGoesToBackwardTasksByParameterShare(self):
    seconds = [(1.0, 2.0), (1.0, 2.0)]
    device = device_profiles.DeviceProfile('test', 1e9, 1e9, 1e18, 'constructed', call_overhead=0.0)
    plain = planner.PartitionTaskTimes(seconds, [1, 1], device, 'never', 4, False)
    extra = planner.PartitionTaskTimes(seconds, [1, 1], device, 'never', 4, False,
                                       micro_batch_overhead=0.4, params=[3, 1])
    # Per micro-batch (M - 1) / M of the overhead, so M micro-batches pay it M - 1 times; the
    # partition with three quarters of the parameters (and their gradient additions) takes 3/4.
    assert extra[0].backward - plain[0].backward == pytest.approx(0.4 * 0.75 * 0.75)
    assert extra[1].backward - plain[1].backward == pytest.approx(0.4 * 0.25 * 0.75)
    assert [c.forward for c in extra] == [c.forward for c in plain]
    one = planner.PartitionTaskTimes(seconds, [2], device, 'never', 1, False,
                                     micro_batch_overhead=0.4, params=[3, 1])
    assert one[0].backward == planner.PartitionTaskTimes(seconds, [2], device, 'never', 1,
                                                         False)[0].backward

  def testSelectiveRecomputesEachLayersShareOfItsForwardPass(self):
    seconds = [(1.0, 2.0), (3.0, 6.0), (2.0, 4.0)]
    device = device_profiles.DeviceProfile('test', 1e9, 1e9, 1e18, 'constructed', call_overhead=0.0)
    always = planner.PartitionTaskTimes(seconds, [2, 1], device, 'always', 4, False)
    selective = planner.PartitionTaskTimes(seconds, [2, 1], device, 'selective', 4, False,
                                           selective_shares=[0.5, 0.1, 0.25])
    assert [c.recompute for c in always] == [4.0, 2.0]
    assert [c.recompute for c in selective] == pytest.approx([1.0 * 0.5 + 3.0 * 0.1, 2.0 * 0.25])
    assert [(c.forward, c.backward) for c in selective] == [(c.forward, c.backward) for c in always]
    # Without shares, as 'always'.
    unknown = planner.PartitionTaskTimes(seconds, [2, 1], device, 'selective', 4, False)
    assert [c.recompute for c in unknown] == [4.0, 2.0]

  def testMicroBatchOverheadMakesMoreMicroBatchesSlower(self):
    # One partition: its tasks run one after another, so the step is their sum.
    times = [device_profiles.LayerTime(0.0, 1e-3)] * 8
    at = {}
    for overhead in (0.0, 0.01):
      ranking = _Plan(1e12, pipeline_devices=(1,), recomputes=('never',), schedules=('gpipe',),
                      layer_times=times, micro_batch_overhead=overhead)
      at[overhead] = {c.micro_batches: c.step_time for c in ranking.configurations}
    for m in (1, 2, 4):
      assert at[0.01][m] - at[0.0][m] == pytest.approx((m - 1) * 0.01)

  def testZeroBubbleHoldsWhatWeightGradientTasksKeep(self):
    k, m = 4, 8
    ofob = planner.Evaluate(_Profiles(), _DEVICE, 1e12, 1, k, m, '1f1b', 'always')
    zb = planner.Evaluate(_Profiles(), _DEVICE, 1e12, 1, k, m, 'zero_bubble', 'always')
    assert zb.sizes == ofob.sizes == [2, 2, 2, 2]
    # Both keep K - k micro-batches in flight; zero-bubble adds, for each micro-batch waiting for
    # its weight-gradient task while a backward pass runs (one fewer than the k + 1 that wait at
    # most), each weighted layer's input and output gradient: 2 layers x (10000 + 10000) x 4 / M.
    for i in range(k):
      kept = min(i + 1, m) - 1
      assert zb.device_memory[i] - ofob.device_memory[i] == pytest.approx(
          kept * 2 * 20000 * 4 / m)

  def testVirtualStagesSumTheirPartitionsOnEachDevice(self):
    profiles = _Profiles(activations=0, params=0)  # Only stashed boundary inputs and gradients.
    k, m = 2, 4
    gradients, stash, outputs = 2 * 10000 * 4 / m, 10000 * 4 / m, 2 * 10000 * 4 / m
    for name in ('interleaved_1f1b', 'zbv'):
      c = planner.Evaluate(profiles, _DEVICE, 1e12, 1, k, m, name, 'always', virtual_stages=2)
      assert (c.virtual_stages, c.sizes) == (2, [2, 2, 2, 2])
      in_flight = schedule_builders.Build(name, k, m, 2).InFlight()
      for d in range(k):
        # Both partitions' re-computed outputs; each stashed (partition, micro-batch) pair its
        # boundary input (weight-gradient tasks keep nothing here: no layer has weights).
        assert c.device_memory[d] == pytest.approx(in_flight[d] * stash + gradients + 2 * outputs)

  def testVirtualStagesShrinkTheBubble(self):
    ranking = _Plan(1e12, schedules=('1f1b', 'interleaved_1f1b', 'zbv'), pipeline_devices=(2,),
                    micro_batches=(4,), recomputes=('always',))
    bubble = {(c.schedule, c.virtual_stages): c.bubble for c in ranking.configurations}
    assert sorted(bubble) == [('1f1b', 1), ('interleaved_1f1b', 2), ('zbv', 2)]
    assert bubble[('interleaved_1f1b', 2)] < bubble[('1f1b', 1)]
    assert bubble[('zbv', 2)] < bubble[('interleaved_1f1b', 2)]

  def testMemoryCostDefaultsToFillDrain(self):
    profiles = _Profiles()
    default = cost_model.MemoryCost(profiles, 8, 'never')
    explicit = cost_model.MemoryCost(profiles, 8, 'never', stashed=8)
    assert default.Partitions([4, 4]) == explicit.Partitions([4, 4])
    fewer = cost_model.MemoryCost(profiles, 8, 'never', stashed=2)
    assert fewer.Partitions([8])[0] < default.Partitions([8])[0]


class TestErrors:

  def testFitsNothingNamesTheLeastMemory(self):
    least = _Least()
    with pytest.raises(ValueError, match='least memory one needs is %s per device' %
                       units.FormatBytes(least)):
      _Plan(memory=least * 0.99)
    assert _Plan(memory=least).best.peak_memory == least

  @pytest.mark.parametrize('kwargs,message', [
      (dict(num_devices=0), 'number of devices must be a positive integer, got 0'),
      (dict(batch=0), 'batch must be a positive integer, got 0'),
      (dict(schedules=('fifo',)), "schedule 'fifo' is not one of"),
      (dict(recomputes=('sometimes',)), "recompute 'sometimes' is not one of"),
      (dict(schedules=('interleaved_1f1b',), interleaved_stages=(1,)),
       "schedule='interleaved_1f1b' needs virtual_stages >= 2"),
  ])
  def testBadArguments(self, kwargs, message):
    args = dict(profiles=_Profiles(), batch=16, num_devices=4, device=_DEVICE)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
      planner.PlanPipeline(**args)

  def testMeasuredLayerTimesNeedTheBatch(self):
    times = [device_profiles.LayerTime(fixed=0.0, per_example=1.0)] * 8
    with pytest.raises(ValueError, match='measured layer_times need `batch`.*got batch=None'):
      planner.LayerSeconds(_Profiles(), _DEVICE, 2, layer_times=times)
    assert planner.LayerSeconds(_Profiles(), _DEVICE, 2, layer_times=times, batch=6) == [
        (1.0, 2.0)] * 8

