"""Temperature-based sampling of languages for multilingual training (GPipe paper, Section 5).

With D_l examples of language l and p_l = D_l / sum(D), language l is sampled with probability
proportional to p_l^(1/T). T = 1 samples in proportion to the data (high-resource languages
dominate); T -> infinity samples uniformly (low-resource languages are over-sampled); the paper uses
T = 5.
"""

import numpy as np


def LanguageProbabilities(sizes, temperature):
  """Returns q with q_l = p_l^(1/T) / sum_k p_k^(1/T), p_l = D_l / sum(D), for D = `sizes`.

  Raises ValueError naming the bad value for an empty/negative size list or temperature <= 0.
  """
  sizes = np.asarray(sizes, dtype=np.float64)
  if sizes.ndim != 1 or sizes.size == 0:
    raise ValueError('LanguageProbabilities: sizes must be a non-empty list of example counts, '
                     'got %r' % (sizes.tolist(),))
  if np.any(sizes <= 0):
    raise ValueError('LanguageProbabilities: every language needs at least one example, '
                     'got sizes %r' % (sizes.tolist(),))
  if not temperature > 0:
    raise ValueError('LanguageProbabilities: temperature must be > 0, got %r' % (temperature,))
  p = sizes / sizes.sum()
  # In log space: p^(1/T) underflows for tiny p and small T otherwise.
  logits = np.log(p) / float(temperature)
  q = np.exp(logits - logits.max())
  return q / q.sum()
