"""Byte sizes as people write them: '1.50 GiB' for a report, '8GiB' or '500MB' from a flag."""

import re

_UNITS = {'': 1, 'B': 1, 'KB': 1e3, 'MB': 1e6, 'GB': 1e9, 'TB': 1e12,
          'KIB': 2**10, 'MIB': 2**20, 'GIB': 2**30, 'TIB': 2**40}


def FormatBytes(num: float) -> str:
  """'1.50 GiB', '12.00 KiB', '512 B'."""
  for unit, scale in (('GiB', 2**30), ('MiB', 2**20), ('KiB', 2**10)):
    if num >= scale:
      return '%.2f %s' % (num / scale, unit)
  return '%d B' % num


def ParseBytes(text: str) -> float:
  """'8GiB', '1.5GB', '1e9' -> bytes.

  Raises:
    ValueError: naming `text` if it is not a size.
  """
  match = re.fullmatch(r'\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*', text or '')
  unit = match.group(2).upper() if match else None
  if not match or unit not in _UNITS:
    raise ValueError('memory budget %r is not a size such as 8GiB, 500MB or 1e9' % text)
  try:
    return float(match.group(1)) * _UNITS[unit]
  except ValueError:
    raise ValueError('memory budget %r is not a size such as 8GiB, 500MB or 1e9' % text) from None
