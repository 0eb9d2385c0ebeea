"""Micro-batching: M, splitting and joining nested inputs, and the errors for bad batches."""

import numpy as np
from lingvo import compat as tf
from lingvo.core import py_utils
from lingvo.core import test_utils

from tensorpipe import micro_batching


class NumMicroBatchesTest(test_utils.TestCase):

  def testValues(self):
    self.assertEqual(micro_batching.NumMicroBatches(16, 8), 8)
    self.assertEqual(micro_batching.NumMicroBatches(16, None, 4), 4)
    self.assertEqual(micro_batching.NumMicroBatches(16, 4, 4), 4)
    self.assertEqual(micro_batching.NumMicroBatches(None, 4), 4)
    # M need not divide the batch; micro_batch_size gives the fewest micro-batches that fit.
    self.assertEqual(micro_batching.NumMicroBatches(30, 8), 8)
    self.assertEqual(micro_batching.NumMicroBatches(16, None, 3), 6)
    self.assertEqual(micro_batching.NumMicroBatches(16, None, 5), 4)

  def testSizesDifferByAtMostOne(self):
    self.assertEqual(micro_batching.Sizes(30, 8), [4, 4, 4, 4, 4, 4, 3, 3])
    self.assertEqual(micro_batching.Sizes(16, 4), [4] * 4)
    self.assertEqual(micro_batching.Offsets(micro_batching.Sizes(10, 4)), [0, 3, 6, 8])
    self.assertTrue(micro_batching.IsEven([4, 4]))
    self.assertFalse(micro_batching.IsEven([4, 3]))
    for n in range(1, 40):
      for m in range(1, n + 1):
        sizes = micro_batching.Sizes(n, m)
        self.assertEqual(sum(sizes), n)
        self.assertLessEqual(max(sizes) - min(sizes), 1)
    with self.session(graph=tf.Graph()) as sess:
      n = tf.placeholder(tf.int32, [])
      sizes = micro_batching.Sizes(n, 4)
      offsets = micro_batching.Offsets(sizes)
      self.assertFalse(micro_batching.IsEven(sizes))
      self.assertEqual(offsets[0], 0)
      got_sizes, got_offsets = sess.run([sizes, offsets[1:]], {n: 10})
    self.assertEqual(list(got_sizes), [3, 3, 2, 2])
    self.assertEqual(list(got_offsets), [3, 6, 8])

  def testErrorsNameTheValues(self):
    cases = [((4, 8), 'num_micro_batches 8 is larger than the batch 4'),
             ((4, 0), 'num_micro_batches must be an integer >= 1, got 0'),
             ((4, None), 'set num_micro_batches or micro_batch_size'),
             ((16, 2, 4), 'num_micro_batches=2 and micro_batch_size=4 disagree for batch 16'),
             ((None, None, 4), 'micro_batch_size=4 needs a static batch size'),
             ((16, None, 0), 'micro_batch_size must be a positive integer, got 0')]
    for args, message in cases:
      with self.assertRaisesRegex(ValueError, message):
        micro_batching.NumMicroBatches(*args)


class PlanTest(test_utils.TestCase):

  def testStaticBatch(self):
    with tf.Graph().as_default():
      args = (tf.ones([10, 3]), py_utils.NestedMap(ids=tf.ones([10], tf.int32), scale=tf.ones([])))
      asked = []

      def NumMicro(batch):
        asked.append(batch)
        return 4

      plan = micro_batching.Plan(args, 0, NumMicro)
      self.assertEqual(asked, [10])
      self.assertIs(plan.args, args)
      self.assertEqual((plan.batch_size, plan.num_micro_batches), (10, 4))
      self.assertEqual((plan.sizes, plan.offsets, plan.even), ([3, 3, 2, 2], [0, 3, 6, 8], False))
      even = micro_batching.Plan(tf.ones([3, 8, 2]), 1, lambda batch: batch // 2)
      self.assertEqual((even.sizes, even.offsets, even.even), ([2, 2, 2, 2], [0, 2, 4, 6], True))

  def testBadInputsFailBeforeMIsAsked(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError, "pipe: inputs disagree on the batch size along "
                                  'batch_dim 0: args\\[0\\]=4, args\\[1\\]=5'):
        micro_batching.Plan((tf.ones([4, 2]), tf.ones([5, 2])), 0, self.fail, 'pipe')

  def testRunTimeBatchIsCheckedWhenRun(self):
    with self.session(graph=tf.Graph()) as sess:
      x = tf.placeholder(tf.float32, [None, 2])
      plan = micro_batching.Plan([x, None], 0, lambda batch: 1 if batch else 3, 'pipe')
      self.assertIsNone(plan.batch_size)
      self.assertFalse(plan.even)
      self.assertIsNone(plan.args[1])
      self.assertEqual(plan.offsets[0], 0)
      self.assertEqual(sess.run(plan.sizes + plan.offsets[1:], {x: np.ones([7, 2])}),
                       [3, 2, 2, 3, 5])
      with self.assertRaisesRegex(
          tf.errors.InvalidArgumentError, 'pipe: this batch has 2 examples along batch_dim=0, '
          'fewer than its num_micro_batches=3 \\(each micro-batch needs one\\): feed batches of at '
          'least 3 examples or lower num_micro_batches'):
        sess.run(plan.args[0], {x: np.ones([2, 2])})
      one = micro_batching.Plan(x, 0, lambda batch: 1)
      self.assertIs(one.args, x)  # One micro-batch needs no check.
      self.assertEqual(sess.run(one.sizes, {x: np.ones([2, 2])}), [2])


class SplitConcatTest(test_utils.TestCase):

  def testRoundTripOfANestedMap(self):
    with self.session(graph=tf.Graph()):
      x = np.arange(24, dtype=np.float32).reshape([6, 4])
      nmap = py_utils.NestedMap(x=tf.constant(x), nothing=None, scale=tf.constant(2.0),
                                inner=py_utils.NestedMap(ids=tf.constant(np.arange(6))))
      self.assertEqual(micro_batching.BatchSize((nmap,), 0), 6)
      parts = micro_batching.Split((nmap,), 3, 0)
      self.assertLen(parts, 3)
      self.assertIsNone(parts[1][0].nothing)
      self.assertIs(parts[2][0].scale, nmap.scale)  # Unbatched tensors are shared.
      self.assertAllEqual(self.evaluate(parts[1][0].x), x[2:4])
      self.assertAllEqual(self.evaluate(parts[2][0].inner.ids), [4, 5])
      joined = micro_batching.Concat([(p[0].x, p[0].inner.ids, None) for p in parts], 0)
      self.assertAllEqual(self.evaluate(joined[0]), x)
      self.assertAllEqual(self.evaluate(joined[1]), np.arange(6))
      self.assertIsNone(joined[2])

  def testUnevenSplitStaticAndRunTime(self):
    x = np.arange(20, dtype=np.float32).reshape([10, 2])
    with self.session(graph=tf.Graph()) as sess:
      parts = micro_batching.Split(tf.constant(x), 4, 0, micro_batching.Sizes(10, 4))
      self.assertEqual([p.shape.as_list()[0] for p in parts], [3, 3, 2, 2])
      placeholder = tf.placeholder(tf.float32, [None, 2])
      dynamic = micro_batching.Split(placeholder, 4, 0,
                                     micro_batching.Sizes(tf.shape(placeholder)[0], 4))
      static_values, dynamic_values = sess.run([parts, dynamic], {placeholder: x})
      joined = sess.run(micro_batching.Concat(dynamic, 0), {placeholder: x})
    for got in (static_values, dynamic_values):
      self.assertAllEqual(np.concatenate(got), x)
      self.assertEqual([len(p) for p in got], [3, 3, 2, 2])
    self.assertAllEqual(joined, x)

  def testOutputAxis(self):
    with tf.Graph().as_default():
      self.assertEqual(micro_batching.OutputAxis(tf.ones([3, 4, 5]), 1), 1)
      # Per-example values [B] of a time-major pipeline join along their only axis.
      self.assertEqual(micro_batching.OutputAxis(tf.ones([4]), 1), 0)
      with self.assertRaisesRegex(ValueError, r'outputs\.x has rank 2, so it has no batch '
                                  r'dimension 2 .* set output_batch_dim'):
        micro_batching.OutputAxis(tf.ones([3, 4]), 2, 'outputs.x')
      parts = [tf.ones([4]), 2 * tf.ones([4])]
      self.assertEqual(micro_batching.Concat(parts, 1).shape.as_list(), [8])

  def testBatchDimOne(self):
    with self.session(graph=tf.Graph()):
      x = np.arange(24, dtype=np.float32).reshape([2, 6, 2])
      parts = micro_batching.Split(tf.constant(x), 2, 1)
      self.assertAllEqual(self.evaluate(parts[0]), x[:, :3])
      self.assertAllEqual(self.evaluate(micro_batching.Concat(parts, 1)), x)

  def testErrors(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError, r'disagree .* args\[0\]=4, args\[1\]=6'):
        micro_batching.BatchSize((tf.ones([4, 2]), tf.ones([6])), 0)
      with self.assertRaisesRegex(ValueError, 'no input has a batch dimension 1'):
        micro_batching.BatchSize((tf.ones([4]),), 1)
      with self.assertRaisesRegex(TypeError, r'input args\[0\]\[0\] is of type int'):
        micro_batching.BatchSize(([1, 2],), 0)
      with self.assertRaisesRegex(ValueError, r'outputs\.loss has rank 0'):
        micro_batching.Concat([py_utils.NestedMap(loss=tf.constant(1.0))] * 2, 0)

  def testSplitGradientGivesEachMicroBatchACopyOfItsSlice(self):
    rng = np.random.RandomState(0)
    for batch_dim, shape in ((0, [3, 2, 4]), (1, [2, 3, 4])):
      with tf.Graph().as_default() as g:
        parts = [tf.constant(rng.normal(size=shape).astype(np.float32)) for _ in range(4)]
        joined = micro_batching.Concat(parts, batch_dim)
        dy = tf.constant(rng.normal(size=joined.shape.as_list()).astype(np.float32))
        grads = micro_batching.SplitGradient(dy, parts, batch_dim)
        reference = tf.gradients(joined, parts, grad_ys=dy)
        copies = [op for op in g.get_operations() if op.type == 'DeepCopy']
        with tf.Session(graph=g) as sess:
          got, want = sess.run([grads, reference])
      for a, b in zip(got, want):
        self.assertAllEqual(a, b)
      # Along the first dimension TF's slices would alias the whole gradient (keeping all of it
      # alive until the last micro-batch's backward pass): each slice is copied instead.
      self.assertLen(copies, 4 if batch_dim == 0 else 0)

  def testLeafNames(self):
    names = micro_batching.LeafNames((py_utils.NestedMap(b=1, a=py_utils.NestedMap(c=2)), 3))
    self.assertEqual(names, ['args[0].a.c', 'args[0].b', 'args[1]'])


if __name__ == '__main__':
  test_utils.main()
