"""Small JSON entries that outlive the process: what the planner built or measured once (a layer's
cost-model facts, its measured seconds) for the next run to read.

An entry is the file <directory>/<kind>/<sha256 of its key>.json holding {format, key, value}. Get
returns the value only when the file parses, has this module's FORMAT and holds the very key asked
for; anything else (no file, a truncated or corrupt one, an entry of another format, a hash
collision) is a miss, so a bad entry is built again and overwritten, never a crash. A key names
everything the value depends on (the caller's job: versions, the code's digest, the machine), so an
entry that no longer applies is never asked for again: it is stale but harmless. Writes go to a
temporary file renamed into place, so a reader sees a whole entry or none; a write that fails (a
full disk) is counted and skipped.

The default directory is $XDG_CACHE_HOME/tensorpipe, or ~/.cache/tensorpipe; a flag's value 'none'
turns the cache off (Open).
"""

import hashlib
import json
import os
import tempfile
from typing import Any, Dict, Iterable, Optional

FORMAT = 1


def DefaultDirectory() -> str:
  """$XDG_CACHE_HOME/tensorpipe, or ~/.cache/tensorpipe without XDG_CACHE_HOME."""
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'tensorpipe')


_DIGESTS: Dict[str, str] = {}  # Per process: path -> sha256 of its contents.


def FilesDigest(paths: Iterable[str]) -> str:
  """A digest of the files' contents (each read once per process): part of a key whose value the
  code in those files computes, so that changed code misses the old entries."""
  total = hashlib.sha256()
  for path in sorted(set(paths)):
    if path not in _DIGESTS:
      try:
        with open(path, 'rb') as f:
          _DIGESTS[path] = hashlib.sha256(f.read()).hexdigest()
      except OSError:
        _DIGESTS[path] = 'unreadable'
    total.update(('%s %s\n' % (path, _DIGESTS[path])).encode('utf-8'))
  return total.hexdigest()[:16]


OFF = 'none'  # The directory name that turns the cache off (a flag's value).


def Open(directory: str) -> Optional['DiskCache']:
  """The cache a flag names: '' the default directory, OFF none, else that directory.

  Raises:
    ValueError: as DiskCache does.
  """
  if directory == OFF:
    return None
  return DiskCache(directory or DefaultDirectory())


class DiskCache:
  """The entries under `directory` (created if missing).

  Raises:
    ValueError: naming the directory and why, when it cannot be created or written.
  """

  def __init__(self, directory: str):
    self.directory = os.path.abspath(os.path.expanduser(directory))
    try:
      os.makedirs(self.directory, exist_ok=True)
    except OSError as e:
      raise ValueError('cache directory %r cannot be created (%s)' %
                       (directory, e.strerror or e)) from None
    if not os.access(self.directory, os.W_OK | os.X_OK):
      raise ValueError('cache directory %r is not writable' % (directory,))
    self.hits = 0
    self.misses = 0
    self.failed_writes = 0

  def _Path(self, kind: str, key: str) -> str:
    return os.path.join(self.directory, kind,
                        hashlib.sha256(key.encode('utf-8')).hexdigest() + '.json')

  def Get(self, kind: str, key: str) -> Any:
    """The value stored under (kind, key), or None."""
    try:
      with open(self._Path(kind, key), encoding='utf-8') as f:
        entry = json.load(f)
      if (isinstance(entry, dict) and entry.get('format') == FORMAT and entry.get('key') == key and
          'value' in entry):
        self.hits += 1
        return entry['value']
    except (OSError, ValueError):
      pass
    self.misses += 1
    return None

  def Put(self, kind: str, key: str, value: Any) -> None:
    """Stores a JSON-serialisable value under (kind, key), replacing what was there."""
    path = self._Path(kind, key)
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), suffix='.tmp')
      try:
        with os.fdopen(fd, 'w', encoding='utf-8') as f:
          json.dump({'format': FORMAT, 'key': key, 'value': value}, f)
        os.replace(temporary, path)
      except BaseException:
        os.unlink(temporary)
        raise
    except OSError:
      self.failed_writes += 1
