"""Throughput report: the measured/simulated grid with its errors; the deep-stack predictions."""

import re

from lingvo.core import test_utils

from tensorpipe.measure import simulator
from tensorpipe.measure import throughput_report


class ThroughputReportTest(test_utils.TestCase):

  def testThroughputTableNormalisesAndGivesBothErrors(self):
    ks, ms = (1, 2, 4), (1, 4)
    measured = {(k, m): 0.1 * (1 + k + m) for k in ks for m in ms}
    independent = {key: 1.5 * value for key, value in measured.items()}
    shared = dict(measured)
    shared[(4, 4)] = 1.9 * measured[(4, 4)]
    lines = throughput_report.ThroughputTable(ks, ms, measured, independent, shared,
                                              cores=2).splitlines()
    self.assertIn('K=2, M=1', lines[0])
    self.assertEqual(lines[1].split(), ['M', 'K=1', 'K=2', 'K=4'])
    cells = [re.findall(r'([\d.]+) / ([\d.]+) / ([\d.]+) \((\d+)/(\d+)/(\d+)\)', line)
             for line in lines[2:4]]
    self.assertEqual(cells[0][1], ('1.00', '1.00', '1.00', '400', '600', '400'))  # K=2, M=1.
    self.assertEqual(cells[1][2], ('0.44', '0.44', '0.23', '900', '1350', '1710'))  # K=4, M=4.
    self.assertIn('independent devices mean 50% (max 50%), shared cores mean 15% (max 90%)',
                  lines[4])
    self.assertIn('with K <= 2 only (4 configurations): independent devices mean 50%, shared '
                  'cores mean 0%', lines[5])
    scaled = throughput_report.ThroughputTable(ks, ms, measured, independent, shared, 2,
                                               tracing={1: 0.7, 4: 0.9}).splitlines()[-1]
    # Scaled, independent is 5% off at M=1 and 35% at M=4; shared 30% at M=1, 10% and 71% at M=4.
    self.assertIn('M=1: 0.70, M=4: 0.90), K > 1 only (4 configurations): independent devices mean '
                  '20%, shared cores mean 35%', scaled)
    tasks = {key: 1.2 * value for key, value in measured.items()}
    with_tasks = throughput_report.ThroughputTable(ks, ms, measured, independent, shared, 2,
                                                   shared_tasks=tasks).splitlines()
    self.assertIn('shared cores fed per-task spans and parallelism: mean 20% (max 20%)',
                  with_tasks[-1])

  def testDeepPredictionsAreATable(self):
    block = simulator.TaskTimes(1.0, 2.0, 1.0)
    costs = [block] * 10
    lines = throughput_report.DeepPredictionTable({1: costs, 4: costs},
                                                  'Transformer-8 (tiny)').splitlines()
    self.assertIn('Transformer-8 blocks stacked 128 deep', lines[0])
    self.assertIn('normalised to K=2, M=1', lines[0])
    self.assertIn('K=128', lines[1])
    k2_m1 = float(lines[2].split()[1])
    self.assertEqual(k2_m1, 1.0)  # Normalised to K=2, M=1.
    k128_m4 = float(lines[3].split()[-1])
    self.assertGreater(k128_m4, 1.0)
    with self.assertRaisesRegex(ValueError, 'K=128 partitions for 10 layers'):
      throughput_report.DeepPredictionTable({1: costs}, 'T', depth=8)


if __name__ == '__main__':
  test_utils.main()
