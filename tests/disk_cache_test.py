"""disk_cache: entries read back, bad and foreign entries read as misses, bad directories named."""

import json
import os

import pytest

from tensorpipe import disk_cache


def testAnEntryIsReadBackByItsKeyOnly(tmp_path):
  cache = disk_cache.DiskCache(str(tmp_path / 'new' / 'dir'))
  assert cache.Get('facts', 'layer a') is None
  cache.Put('facts', 'layer a', [1, 2.5, None])
  cache.Put('facts', 'layer b', {'x': 3})
  again = disk_cache.DiskCache(str(tmp_path / 'new' / 'dir'))
  assert again.Get('facts', 'layer a') == [1, 2.5, None]
  assert again.Get('facts', 'layer b') == {'x': 3}
  assert again.Get('seconds', 'layer a') is None  # Another kind.
  assert (again.hits, again.misses) == (2, 1)


def _Only(directory):
  [name] = os.listdir(directory)
  return os.path.join(directory, name)


@pytest.mark.parametrize('content', [
    '{"format": 1, "key": "layer a", "val',  # Truncated.
    'not json at all',
    '[1, 2]',
    '{"format": 0, "key": "layer a", "value": 7}',  # Another format.
    '{"format": 1, "key": "layer z", "value": 7}',  # Another key under the same file name.
])
def testABadEntryIsAMissAndIsRewritten(tmp_path, content):
  cache = disk_cache.DiskCache(str(tmp_path))
  cache.Put('facts', 'layer a', 1)
  with open(_Only(str(tmp_path / 'facts')), 'w') as f:
    f.write(content)
  assert cache.Get('facts', 'layer a') is None
  cache.Put('facts', 'layer a', 2)
  assert cache.Get('facts', 'layer a') == 2
  with open(_Only(str(tmp_path / 'facts'))) as f:
    assert json.load(f) == {'format': 1, 'key': 'layer a', 'value': 2}


def testAFailedWriteIsCountedNotRaised(tmp_path):
  cache = disk_cache.DiskCache(str(tmp_path))
  (tmp_path / 'facts').write_text('a file where the kind\'s directory would be')
  cache.Put('facts', 'layer a', 1)
  assert cache.failed_writes == 1 and cache.Get('facts', 'layer a') is None


def testADirectoryThatCannotBeMadeIsNamed(tmp_path):
  (tmp_path / 'plain_file').write_text('x')
  bad = str(tmp_path / 'plain_file' / 'cache')
  with pytest.raises(ValueError, match=r"^cache directory '%s' cannot be created \(Not a "
                     r"directory\)$" % bad):
    disk_cache.DiskCache(bad)


def testTheDefaultDirectoryFollowsXdgCacheHome(monkeypatch, tmp_path):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  assert disk_cache.DefaultDirectory() == str(tmp_path / 'tensorpipe')
  monkeypatch.delenv('XDG_CACHE_HOME')
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  assert disk_cache.DefaultDirectory() == str(tmp_path / 'home' / '.cache' / 'tensorpipe')


def testTheDigestFollowsTheFilesContents(tmp_path):
  for name, text in (('a.py', 'x = 1\n'), ('b.py', 'x = 2\n'), ('c.py', 'x = 1\n')):
    (tmp_path / name).write_text(text)
  a, b, c = (str(tmp_path / n) for n in ('a.py', 'b.py', 'c.py'))
  assert disk_cache.FilesDigest([a]) != disk_cache.FilesDigest([b])
  assert disk_cache.FilesDigest([a, b]) == disk_cache.FilesDigest([b, a, a])
  assert disk_cache.FilesDigest([a]) != disk_cache.FilesDigest([c])  # Paths count too.


def testAFlagOpensTheDefaultNamedOrNoCache(monkeypatch, tmp_path):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
  assert disk_cache.Open('').directory == str(tmp_path / 'xdg' / 'tensorpipe')
  assert disk_cache.Open(str(tmp_path / 'mine')).directory == str(tmp_path / 'mine')
  assert disk_cache.Open('none') is None
