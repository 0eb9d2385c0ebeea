"""Simulator: fill-drain timing from per-cell task times (plain data, no TensorFlow run)."""

import unittest

from tensorpipe import schedule
from tensorpipe import simulator


def _Equal(num_cells, forward=1.0, backward=2.0, recompute=0.0):
  return [simulator.CellCost(forward, backward, recompute) for _ in range(num_cells)]


class SimulateTest(unittest.TestCase):

  def testEqualCellsGiveTheTextbookBubble(self):
    for k in (1, 2, 4, 8, 128):
      for m in (1, 4, 32):
        result = simulator.Simulate(_Equal(k, 1.0, 2.0, 1.0), m)
        self.assertAlmostEqual(result.step_time, (m + k - 1) * (1.0 + 2.0 + 1.0))
        self.assertAlmostEqual(result.idle_fraction, (k - 1) / (m + k - 1))
        self.assertAlmostEqual(result.idle_fraction, schedule.BubbleFraction(k, m))

  def testDevicesFollowTheScheduleOrder(self):
    k, m = 3, 4
    result = simulator.Simulate(_Equal(k, 1.0, 1.0, 0.5), m)
    for cell in range(k):
      mine = sorted((i for i in result.timeline if i.cell == cell), key=lambda i: i.start)
      for a, b in zip(mine, mine[1:]):
        self.assertLessEqual(a.end, b.start + 1e-12)  # One task at a time.
      forward = [(i.kind, i.micro_batch) for i in mine if i.kind == simulator.FORWARD]
      backward = [(i.kind, i.micro_batch) for i in mine if i.kind == simulator.BACKWARD]
      order = schedule.FillDrainSchedule(k, m).DeviceOrder(cell)
      self.assertEqual([t.micro_batch for t in order if t.kind == schedule.FORWARD],
                       [t for _, t in forward])
      self.assertEqual([t.micro_batch for t in order if t.kind == schedule.BACKWARD],
                       [t for _, t in backward])
      # Each re-computation immediately precedes its backward pass on the device.
      kinds = [(i.kind, i.micro_batch) for i in mine if i.kind != simulator.FORWARD]
      self.assertEqual(kinds[::2], [(simulator.RECOMPUTE, t) for _, t in backward])

  def testTheSlowestCellPacesThePipeline(self):
    costs = [simulator.CellCost(1.0, 1.0), simulator.CellCost(3.0, 3.0)]
    result = simulator.Simulate(costs, 4)
    # Cell 1 runs 4 forwards back to back after cell 0's first (1 s), the loss, then 4 backwards;
    # cell 0's last backward follows cell 1's.
    self.assertAlmostEqual(result.step_time, 1.0 + 4 * 3.0 + 4 * 3.0 + 1.0)
    self.assertEqual(result.busy, [8.0, 24.0])

  def testTransferDelaysEveryBoundaryCrossing(self):
    without = simulator.Simulate(_Equal(2), 1).step_time
    with_transfer = simulator.Simulate(_Equal(2), 1, transfer=0.5).step_time
    self.assertAlmostEqual(with_transfer - without, 2 * 0.5)

  def testSplitCostsScalesByMicroBatch(self):
    layers = [simulator.CellCost(4.0, 8.0, 4.0), simulator.CellCost(2.0, 4.0, 2.0),
              simulator.CellCost(6.0, 12.0, 0.0)]
    cells = simulator.SplitCosts(layers, [2, 1], 2, overhead=0.1)
    self.assertEqual(cells[0], simulator.CellCost(3.1, 6.1, 3.1))
    self.assertEqual(cells[1], simulator.CellCost(3.1, 6.1, 0.0))
    with self.assertRaisesRegex(ValueError, r'cell sizes \[1, 1\] do not add up to 3 layers'):
      simulator.SplitCosts(layers, [1, 1], 2)

  def testBadInputIsNamed(self):
    with self.assertRaisesRegex(ValueError, 'cell 1 has backward time -1'):
      simulator.Simulate([simulator.CellCost(1, 1), simulator.CellCost(1, -1)], 2)
    with self.assertRaisesRegex(ValueError, 'num_micro_batches must be a positive integer, got 0'):
      simulator.Simulate(_Equal(2), 0)
    with self.assertRaisesRegex(ValueError, 'no cells'):
      simulator.Simulate([], 2)


if __name__ == '__main__':
  unittest.main()
