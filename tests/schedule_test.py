"""The fill-drain schedule as plain data (no TensorFlow)."""

import itertools
import subprocess
import sys
import unittest

from tensorpipe import schedule


class FillDrainScheduleTest(unittest.TestCase):

  def testEveryTaskRunsOnceAndAtMostOneTaskPerCellPerTick(self):
    for k, m in itertools.product(range(1, 6), range(1, 9)):
      s = schedule.FillDrainSchedule(k, m)
      tasks = [t for tick in s.Ticks() for t in tick]
      expected = {schedule.Task(kind, c, b) for kind in (schedule.FORWARD, schedule.BACKWARD)
                  for c in range(k) for b in range(m)}
      self.assertEqual(len(tasks), len(expected))
      self.assertEqual(set(tasks), expected)
      for tick in s.Ticks():
        cells = [t.cell for t in tick]
        self.assertEqual(len(cells), len(set(cells)))
      self.assertEqual(len(s.Ticks()), 2 * (m + k - 1))

  def testDependenciesAreRespected(self):
    for k, m in itertools.product(range(1, 5), range(1, 7)):
      s = schedule.FillDrainSchedule(k, m)
      when = {t: i for i, tick in enumerate(s.Ticks()) for t in tick}
      f = lambda c, b: when[schedule.Task(schedule.FORWARD, c, b)]
      b_ = lambda c, b: when[schedule.Task(schedule.BACKWARD, c, b)]
      for c, t in itertools.product(range(k), range(m)):
        if c > 0:
          self.assertLess(f(c - 1, t), f(c, t))  # Needs the previous cell's output.
        if c < k - 1:
          self.assertLess(b_(c + 1, t), b_(c, t))  # Needs the next cell's input gradient.
        self.assertLess(f(c, t), b_(c, t))
        self.assertLess(max(f(x, y) for x in range(k) for y in range(m)), b_(c, t))  # Fill, then drain.

  def testForwardTicksFollowThePaper(self):
    s = schedule.FillDrainSchedule(3, 4)
    self.assertEqual([[str(t) for t in tick] for tick in s.ForwardTicks()],
                     [['F0,0'], ['F0,1', 'F1,0'], ['F0,2', 'F1,1', 'F2,0'], ['F0,3', 'F1,2', 'F2,1'],
                      ['F1,3', 'F2,2'], ['F2,3']])
    self.assertEqual([str(t) for t in s.DeviceOrder(1)],
                     ['F1,0', 'F1,1', 'F1,2', 'F1,3', 'B1,3', 'B1,2', 'B1,1', 'B1,0'])
    self.assertEqual(s.ForwardOrder()[:3], [schedule.Task('F', 0, 0), schedule.Task('F', 0, 1),
                                            schedule.Task('F', 1, 0)])

  def testBubble(self):
    self.assertEqual(schedule.BubbleFraction(1, 1), 0.0)
    self.assertAlmostEqual(schedule.BubbleFraction(4, 8), 3 / 11)
    self.assertAlmostEqual(schedule.BubbleFraction(8, 32), 7 / 39)
    for k, m in itertools.product(range(1, 6), range(1, 9)):
      s = schedule.FillDrainSchedule(k, m)
      idle = sum(1 for tick in s.Ticks() for c in range(k) if c not in {t.cell for t in tick})
      self.assertAlmostEqual(idle / (k * len(s.Ticks())), s.BubbleFraction())
    self.assertLess(schedule.BubbleFraction(4, 16), 0.16)  # Negligible once M >= 4K.

  def testRender(self):
    self.assertEqual(schedule.FillDrainSchedule(2, 2).Render().split('\n'),
                     ['cell 0 | F0,0 F0,1 .    .    B0,1 B0,0',
                      'cell 1 | .    F1,0 F1,1 B1,1 B1,0 .   '])

  def testImportsWithoutTensorFlow(self):
    code = ('import sys, tensorpipe.schedule; '
            'assert "tensorflow" not in sys.modules and "lingvo" not in sys.modules')
    subprocess.run([sys.executable, '-c', code], check=True)

  def testBadSizes(self):
    with self.assertRaisesRegex(ValueError, 'num_cells must be a positive integer, got 0'):
      schedule.FillDrainSchedule(0, 4)
    with self.assertRaisesRegex(ValueError, 'num_micro_batches must be a positive integer, got 2.5'):
      schedule.FillDrainSchedule(2, 2.5)
    with self.assertRaisesRegex(ValueError, r'cell 3 is not in \[0, 2\)'):
      schedule.FillDrainSchedule(2, 2).DeviceOrder(3)


if __name__ == '__main__':
  unittest.main()
