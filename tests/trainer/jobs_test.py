"""The jobs a trainer process runs and what each reads (tensorpipe.trainer.jobs)."""

from absl.testing import flagsaver
from lingvo import compat as tf
from lingvo.core import test_utils

from tensorpipe.trainer import jobs


class JobsTest(test_utils.TestCase):

  def testJobFlagOrLingvosDefaults(self):
    with flagsaver.flagsaver(job='controller,,evaler_test', run_locally='cpu', mode='sync'):
      self.assertEqual(jobs.Jobs(), ['controller', 'evaler_test'])
    with flagsaver.flagsaver(job='', run_locally='cpu', mode='sync'):
      self.assertEqual(jobs.Jobs(), ['controller', 'trainer_client'])
    with flagsaver.flagsaver(job='', run_locally='cpu', mode='async'):
      self.assertEqual(jobs.Jobs(), ['controller', 'trainer'])
    with flagsaver.flagsaver(job='', run_locally='tpu', mode='sync'):
      self.assertEqual(jobs.Jobs(), ['trainer_client'])
    with flagsaver.flagsaver(job='', run_locally='', mode='sync'):
      self.assertEqual(jobs.Jobs(), [])

  def testDatasetOfJob(self):
    self.assertEqual(jobs.DatasetOfJob('trainer_client'), 'Train')
    self.assertEqual(jobs.DatasetOfJob('evaler_Test'), 'Test')
    self.assertEqual(jobs.DatasetOfJob('evaler_once_test@750'), 'test')
    self.assertEqual(jobs.DatasetOfJob('decoder_dev'), 'dev')
    self.assertIsNone(jobs.DatasetOfJob('worker'))

  def testEvalOnlyJobs(self):
    self.assertTrue(jobs.IsEvalOnlyJob('evaler_once_test@5'))
    self.assertTrue(jobs.IsEvalOnlyJob('decoder_test'))
    self.assertFalse(jobs.IsEvalOnlyJob('controller'))

  def testStartsServerOnlyForAClusterTask(self):
    spec = 'worker=127.0.0.1:1'
    with flagsaver.flagsaver(cluster_spec=spec, run_locally='', tpu='', use_eager=False,
                             tf_master=''):
      self.assertTrue(jobs.StartsServer())
    with flagsaver.flagsaver(cluster_spec=spec, run_locally='cpu'):
      self.assertFalse(jobs.StartsServer())
    with flagsaver.flagsaver(cluster_spec=''):
      self.assertFalse(jobs.StartsServer())


if __name__ == '__main__':
  tf.test.main()
