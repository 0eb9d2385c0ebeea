"""Progress lines on a fake clock: one when a phase starts, at most one per interval while it runs
(with what is left, estimated from the pace so far), one when it ends."""

from tensorpipe import progress as progress_lib


class _Clock:

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def _Progress(interval=10.0):
  lines, clock = [], _Clock()
  return progress_lib.Progress(lines.append, interval, clock), lines, clock


def testAPhaseSaysWhatItDoesItsPaceAndItsTime():
  progress, lines, clock = _Progress()
  with progress.Phase('measuring 8 layers', 8, estimate=12.0) as phase:
    for _ in range(8):
      clock.now += 3.0  # Each item takes 3 s: a line once 10 s have passed since the last one.
      phase.Step()
  assert lines == [
      'measuring 8 layers: 8 to do, about 12 s',
      'measuring 8 layers: 4 of 8 done, 12 s, about 12 s left',
      'measuring 8 layers: 8 of 8 done, 24 s',
      'measuring 8 layers: done in 24 s',
  ]


def testEndCarriesANoteOnce():
  progress, lines, clock = _Progress()
  with progress.Phase('simulating', 3) as phase:
    clock.now += 0.25
    phase.End('2 simulated; 1 skipped')
  progress.Say('cache: 3 of 4 layers read')
  assert lines == ['simulating: 3 to do', 'simulating: done in 0.2 s; 2 simulated; 1 skipped',
                   'cache: 3 of 4 layers read']


def testAFailedPhaseSaysNothingMore():
  progress, lines, _ = _Progress()
  try:
    with progress.Phase('building', 2):
      raise ValueError('bad layer')
  except ValueError:
    pass
  assert lines == ['building: 2 to do']


def testDurationsReadAsPeopleWriteThem():
  assert [progress_lib.Seconds(s) for s in (0.0404, 0.25, 9.94, 42.4, 125.0)] == [
      '40 ms', '0.2 s', '9.9 s', '42 s', '2 min 05 s']


def testQuietWritesNothing():
  with progress_lib.QUIET.Phase('anything', 1) as phase:
    phase.Step()


def testAnUncountedPhaseSaysHowManySoFar():
  progress, lines, clock = _Progress()
  with progress.Phase('building a model') as phase:
    for _ in range(5):
      clock.now += 4.0
      phase.Step()
  assert lines == ['building a model', 'building a model: 3 done, 12 s',
                   'building a model: done in 20 s']
