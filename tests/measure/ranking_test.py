"""Ranking: the table a ranking prints and the trainer flags that run a configuration."""

from tensorpipe.measure import device_profiles
from tensorpipe.measure import ranking

_GPU = device_profiles.DeviceProfile('test', peak_flops=1e9, memory=1e9, link_bandwidth=1e9,
                                     source='constructed')


def _Configuration(**kwargs):
  args = dict(replicas=1, pipeline_devices=2, micro_batches=8, schedule='1f1b', recompute='always',
              sizes=[3, 5], step_time=0.25, examples_per_second=64.0, bubble=0.1,
              device_memory=[2.0**20, 3.0 * 2**20], fits=True, virtual_stages=1)
  args.update(kwargs)
  return ranking.Configuration(**args)


class TestFormat:

  def testRowsInRankOrderThenTheBestThatDoNotFit(self):
    fits = _Configuration()
    unsimulated = _Configuration(micro_batches=4, step_time=None, examples_per_second=None,
                                 bubble=None)
    too_big = _Configuration(pipeline_devices=1, sizes=[8], device_memory=[2.0**31], fits=False,
                             why='needs 2 GiB > 1 GiB')
    ranked = ranking.Ranking('dense', _GPU, 2.0**30, 16, [fits, unsimulated, too_big])
    lines = ranking.Format(ranked, limit=2).splitlines()
    assert lines[0].startswith('dense: batch 16, devices test (independent), 1.00 GiB each')
    assert lines[1].split() == ['rank', 'S', 'K', 'v', 'M', 'schedule', 'recompute', 'step',
                                'ms', 'examples/s', 'bubble', 'peak/device', 'fits']
    assert lines[2].split() == ['1', '1', '2', '1', '8', '1f1b', 'always', '250.000', '64.0',
                                '10.0%', '3.00', 'MiB', 'yes']
    assert lines[3].split()[:8] == ['2', '1', '2', '1', '4', '1f1b', 'always', '-']
    # Cut by `limit`, the best configuration that does not fit is still shown, with its rank.
    assert lines[4].split()[:3] == ['3', '1', '1'] and lines[4].endswith('no: needs 2 GiB > 1 GiB')
    assert len(lines) == 5
    assert str(ranked) == ranking.Format(ranked)
    assert ranked.best is fits

  def testRowsLeftOutAreCounted(self):
    ranked = ranking.Ranking('dense', _GPU, 2.0**30, 16, [_Configuration()] * 4)
    assert ranking.Format(ranked, limit=1).splitlines()[-1] == (
        '(3 more configurations not shown)')


class TestFlags:

  def testOverridesAndTrainerFlags(self):
    best = _Configuration(pipeline_devices=4, micro_batches=16, schedule='interleaved_1f1b',
                          virtual_stages=2, replicas=2)
    assert ranking.Overrides(best, 'task.encoder') == (
        'task.encoder.num_devices: 4; task.encoder.num_micro_batches: 16; '
        'task.encoder.schedule: interleaved_1f1b; task.encoder.recompute: always; '
        'task.encoder.virtual_stages: 2')
    cpu = device_profiles.DeviceProfile('cpu', 1e9, 1e9, 1e9, 'constructed', cores=2.0)
    assert ranking.TrainerFlags(best, cpu) == (
        '--cpu_devices=8 --worker_split_size=4 --model_params_override="%s"' %
        ranking.Overrides(best))
    assert ranking.TrainerFlags(best, _GPU).startswith('--worker_gpus=8 --worker_split_size=4 ')
    tpu = device_profiles.PROFILES['TPUv3-core']
    assert ranking.TrainerFlags(best, tpu).startswith('--worker_tpus=8 --worker_split_size=4 ')
