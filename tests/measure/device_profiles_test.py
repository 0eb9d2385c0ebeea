"""Device profiles and their measurement: each distinct layer measured once (cached), the
measuring a time budget allows, the CPU profile measured once per cache, spec-sheet profiles."""

import dataclasses
import json
import os

import pytest

from tensorpipe import disk_cache
from tensorpipe import progress as progress_lib
from tensorpipe.measure import device_profiles
from tensorpipe.partitioner import cost_model
from tensorpipe.partitioner import measured_cost
from tests import layer_helpers
from tests import trace_helpers

# An accelerator-like device: 1 Gflop/s, no per-op or per-call costs.
_DEVICE = device_profiles.DeviceProfile('test', peak_flops=1e9, memory=1e9, link_bandwidth=1e18,
                                        source='constructed', efficiency=1.0, op_overhead=0.0,
                                        call_overhead=0.0)


def _Profiles(num_layers=8, flops=1e9, params=1000):
  """Equal layers for a mini-batch: `flops` and `params` each."""
  return [cost_model.LayerProfile('l%d' % i, flops, params, 0, 10000, 10000, 100000,
                                  forward_ops=10, backward_ops=20) for i in range(num_layers)]


def _Dense(name, seed, dim=8):
  return layer_helpers.Dense.Params().Set(name=name, dim=dim, seed=seed)


def _OldLayerTimes(layers, shapes, batch_dim=0, small=8):
  """The planner's layer times as they were measured before distinct layers were: every layer in
  the chain of the layers before it (measured_cost.MeasureSeconds), at the batch and 1/small of
  it."""
  batch = shapes[0][batch_dim]
  low = max(1, batch // small)
  full, part = [measured_cost.MeasureSeconds(
      layers, [[b if i == batch_dim else d for i, d in enumerate(s)] for s in shapes],
      timer=trace_helpers.MatMulElementsRun) for b in (batch, low)]
  out = []
  for t_full, t_low in zip(full, part):
    per_example = max(0.0, (t_full - t_low) / (batch - low)) if batch > low else 0.0
    out.append(device_profiles.LayerTime(max(0.0, t_low - per_example * low), per_example))
  return out


class TestMeasuring:

  def testDistinctLayersAreMeasuredOnceAndThenReadFromTheCache(self, tmp_path):
    layers = [_Dense('a', 0), _Dense('b', 0), _Dense('c', 1), _Dense('d', 0, dim=8)]
    calls = []

    def Timer(sess, step, repeats):
      calls.append(repeats)
      return trace_helpers.MatMulElementsRun(sess, step)

    cache = disk_cache.DiskCache(str(tmp_path))
    lines = []
    progress = progress_lib.Progress(lines.append, interval=1e9)
    times = device_profiles.MeasureLayerTimes(layers, [[16, 8]], cache=cache, progress=progress,
                                              timer=Timer)
    # Two distinct layers (a, b, d alike; c's seed differs), each at 16 and 2 examples.
    assert calls == [5] * 4
    assert times == _OldLayerTimes(layers, [[16, 8]])
    # Dense: 2 B D + D^2 elements written by its MatMuls; fitted exactly.
    assert times[0] == device_profiles.LayerTime(64.0, 16.0)
    assert lines[-1] == 'measuring the distinct layers of 4 at 16 and 2 examples: 0 of 2 read from ' \
        'the cache'
    del calls[:]
    assert device_profiles.MeasureLayerTimes(layers, [[16, 8]], cache=cache, timer=Timer) == times
    assert calls == []
    # Other batch sizes are other measurements; a bad entry is measured again.
    device_profiles.MeasureLayerTimes(layers, [[16, 8]],
                                      measuring=device_profiles.Measuring(4, 1, 2), cache=cache,
                                      timer=Timer)
    assert calls == [2] * 4
    for name in os.listdir(tmp_path / 'layer_seconds'):
      (tmp_path / 'layer_seconds' / name).write_text(json.dumps({'format': 1, 'key': 'x'}))
    del calls[:]
    assert device_profiles.MeasureLayerTimes(layers, [[16, 8]], cache=cache, timer=Timer) == times
    assert calls == [5] * 4

  def testTheBudgetPicksTheLargestBatchesThenFewerRuns(self):
    profiles = _Profiles(num_layers=4, flops=64e9)  # 1 Gflop per example at batch 64.
    device = dataclasses.replace(_DEVICE, op_overhead=0.0)
    distinct = [0, 1]
    full = device_profiles.Measuring(64, 8)
    setup = 2 * 30 * device_profiles.SETUP_SECONDS_PER_OP
    # Two layers, each 6 runs of (64 + 8) examples at 6 s per example (6 x flops at 1 Gflop/s).
    assert device_profiles.MeasuringSeconds(profiles, distinct, device, 64, full) == pytest.approx(
        setup + 2 * 6 * 72 * 6.0)

    def Choose(budget):
      return device_profiles.ChooseMeasuring(profiles, distinct, device, 64, budget)[0]

    assert Choose(1e9) == full
    assert Choose(2 * 6 * 36 * 6.0 + setup) == device_profiles.Measuring(32, 4)
    assert Choose(2 * 6 * 3 * 6.0 + setup) == device_profiles.Measuring(2, 1)
    assert Choose(2 * 4 * 3 * 6.0 + setup) == device_profiles.Measuring(2, 1, 3)
    assert Choose(2 * 2 * 3 * 6.0 + setup) == device_profiles.Measuring(2, 1, 1)
    measuring, least = device_profiles.ChooseMeasuring(profiles, distinct, device, 64, 1.0)
    assert measuring is None and least == pytest.approx(2 * 2 * 3 * 6.0 + setup)

  def testAMicroBatchIsEstimatedToAddItsWeightGradients(self):
    device = dataclasses.replace(_DEVICE, link_bandwidth=12e3)
    # 8 layers of 1000 parameters: 3 float32 moved per parameter at 12 kB/s.
    assert device_profiles.MicroBatchSecondsEstimate(_Profiles(), device) == pytest.approx(8.0)

  def testTheCpuProfileIsMeasuredOncePerCache(self, tmp_path, monkeypatch):
    measured = []
    cpu = dataclasses.replace(_DEVICE, name=device_profiles.CPU, cores=2.0)
    monkeypatch.setattr(device_profiles, 'MeasureCpu', lambda: measured.append(1) or cpu)
    cache = disk_cache.DiskCache(str(tmp_path))
    lines = []
    progress = progress_lib.Progress(lines.append)
    assert device_profiles.Profile(device_profiles.CPU, cache, progress) == cpu
    assert device_profiles.Profile(device_profiles.CPU, cache, progress) == cpu
    assert (measured, lines) == ([1], ['measuring this machine\'s CPU devices'])
    [name] = os.listdir(tmp_path / 'cpu_profile')
    entry = json.loads((tmp_path / 'cpu_profile' / name).read_text())
    entry['value']['peak_flops'] = 'fast'  # Not a profile: measured again.
    (tmp_path / 'cpu_profile' / name).write_text(json.dumps(entry))
    assert device_profiles.Profile(device_profiles.CPU, cache) == cpu and measured == [1, 1]
    assert device_profiles.Profile(device_profiles.CPU) == cpu and measured == [1, 1, 1]


class TestProfiles:

  def testUnknownProfileListsTheKnownOnes(self):
    with pytest.raises(ValueError, match="unknown device profile 'V200'; known profiles: cpu, "
                       'A100-40GB'):
      device_profiles.Profile('V200')
    assert device_profiles.Profile('TPUv3-core').memory == 16 * 2**30

  def testProfilesHaveSources(self):
    for p in device_profiles.PROFILES.values():
      assert p.source.startswith('https://') and p.peak_flops > 0 and p.memory > 0
