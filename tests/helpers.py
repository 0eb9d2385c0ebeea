"""Helpers shared by the TensorPipe tests that import nothing but the standard library: the
repository root, running a tool, ports held for multi-process tests, Lingvo's loss lines."""

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # The repository root.


def TransformerParameterCount(num_layers,
                              model_dim,
                              ffn_dim,
                              num_heads,
                              vocab,
                              head_dim=64,
                              lm=False):
  """Parameters of PipelinedTransformer (or, lm=True, PipelinedTransformerLm) from its shapes."""
  d, att = model_dim, num_heads * head_dim
  ffn = 2 * d * ffn_dim + ffn_dim + d
  enc_layer = 4 * d * att + ffn + 2 * 2 * d
  dec_layer = 8 * d * att + ffn + 3 * 2 * d
  emb_softmax = vocab * d + d * vocab + vocab
  if lm:
    return num_layers * enc_layer + 2 * d + emb_softmax
  return num_layers * (enc_layer + dec_layer) + 2 * 2 * d + emb_softmax


@contextlib.contextmanager
def HeldPorts(count, listen=(), reuse=()):
  """Yields `count` loopback ports, each bound by a socket held for the whole block: no other
  process can take one meanwhile. Ports with an index in `listen` accept connections (as a running
  task's server does); those in `reuse` are bound with SO_REUSEADDR and not listening, so a
  TensorFlow server (and preflight.CheckPortFree, which binds as it does) could still bind them,
  while connections to them are refused."""
  with contextlib.ExitStack() as stack:
    ports = []
    for i in range(count):
      s = stack.enter_context(socket.socket())
      if i in reuse:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      s.bind(('127.0.0.1', 0))
      if i in listen:
        s.listen()
      ports.append(s.getsockname()[1])
    yield ports


def InPrivateNetwork(argv):
  """`argv` run in a network namespace of its own with only loopback up, or None where this user
  may not create one (not root, or no `unshare`/`ip`).

  Ports a job picks there cannot be taken by any process outside it, so multi-process tests that
  start servers on picked ports do not race with the rest of the machine.
  """
  if os.geteuid() != 0 or not (shutil.which('unshare') and shutil.which('ip')):
    return None
  return ['unshare', '--net', '--', 'sh', '-c', 'ip link set lo up && exec "$@"', 'sh'] + list(argv)


def StepLosses(log):
  """{step: [loss, ...]} from Lingvo's trainer lines 'step: N, steps/sec: ... loss:X ...' of `log`,
  in the order logged (a step trained again after a restore appears once per time)."""
  out = {}
  for m in re.finditer(r'\] step:\s*(\d+), steps/sec:.* loss:([0-9.eE+-]+)', log):
    out.setdefault(int(m.group(1)), []).append(float(m.group(2)))
  return out


def RunTool(name, *args, timeout=300):
  """Runs `python -m tools.<name> <args>` from the repository root, as a user would.

  Returns (exit code, stdout, stderr); a run longer than `timeout` seconds fails the test.
  """
  proc = subprocess.run([sys.executable, '-m', 'tools.' + name] + list(args), capture_output=True,
                        text=True, timeout=timeout, check=False, cwd=REPO)
  return proc.returncode, proc.stdout, proc.stderr


def OwnLines(err):
  """A tool's stderr lines less TensorFlow's own import-time warnings ('WARNING:tensorflow:...',
  e.g. Lingvo's 'Please fix your imports'), which no flag of the tool changes."""
  return [line for line in err.splitlines() if not line.startswith('WARNING:tensorflow:')]
