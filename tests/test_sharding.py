"""Sharded decoding gives the one-device results (simulated CPU devices, subprocesses).

The worker (sharded_worker.py) runs in its own process because the number of
CPU devices is fixed when JAX starts.
"""

import json
import os
import re
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import jspec
from jspec.core import decode, sharding
from conftest import tiny_config

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "sharded_worker.py")


def _env():
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  return env


@pytest.fixture(scope="module")
def meshes(tmp_path_factory):
  out = tmp_path_factory.mktemp("meshes") / "result.json"
  proc = subprocess.run([sys.executable, WORKER, "meshes", str(out)], cwd=HERE, env=_env(),
                        capture_output=True, text=True, timeout=1200)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["1x8", "2x4", "8x1"])
def test_sharded_runs_equal_one_device(meshes, mesh):
  one = meshes["one"]
  assert set(meshes[mesh]) == set(one)
  assert "ngram_sampled" in one, "a second drafter (n-gram) must be covered"
  for run, want in one.items():
    got = meshes[mesh][run]
    assert got == want, f"{mesh} {run}: differs from one device"
  # The runs exercise acceptance, not just rejection.
  assert sum(one["spec_sampled"]["accepted"]) > 0


@pytest.mark.slow
def test_tensor_parallel_param_bytes(meshes):
  info = meshes["bytes_tp4"]
  quarter = info["total"] / 4
  for per_device in info["per_device"]:
    assert abs(per_device - quarter) <= 0.1 * quarter, (per_device, quarter)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["native", "hf"])
def test_load_places_params_on_the_mesh(meshes, kind):
  info = meshes["load_tp4"][kind]
  assert info["wq_spec"] == ["None", "None", "model", "None"]  # heads split 4 ways
  assert info["per_device"] == meshes["bytes_tp4"]["per_device"]
  assert info["logits_equal"]


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_single_process(meshes, tmp_path):
  port = str(_free_port())
  outs = [tmp_path / f"p{i}.json" for i in range(2)]
  procs = [subprocess.Popen([sys.executable, WORKER, "process", str(i), port, str(outs[i])],
                            cwd=HERE, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  for p in procs:
    _, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-4000:]
  for out in outs:
    got = json.loads(out.read_text())["multi"]
    assert got == meshes["one"], "a process of the two-process run differs from one device"


# ----------------------------------------------------------------------------- no host transfer

def _host_transfers(hlo_text):
  """Instructions in compiled HLO that move data between device and host: infeed /
  outfeed, send / recv (host transfers), and custom calls into Python callbacks.
  Metadata (source names and lines) is stripped first so it cannot match."""
  code = re.sub(r"metadata=\{[^}]*\}", "", hlo_text)
  ops = re.findall(r"=\s*\S+\s+(infeed|outfeed|send|recv|send-done|recv-done)\(", code)
  calls = [t for t in re.findall(r'custom_call_target="([^"]+)"', code) if "callback" in t]
  return ops + calls


@pytest.mark.slow  # compiles for 8 devices
def test_compiled_round_has_no_host_transfer(target, close_draft):
  config = decode.DecodeConfig(num_draft_tokens=3, cache_length=64)
  params = jspec.SamplingParams(temperature=jnp.asarray([0.0, 1.0]), top_k=jnp.zeros((2,), jnp.int32),
                                top_p=jnp.ones((2,)))
  drafter = jspec.DraftModel(close_draft)
  state = jax.jit(decode.init_state, static_argnames="config")(
      target, drafter, jnp.ones((2, 8), jnp.int32), jnp.asarray([3, 8]),
      jnp.asarray([10, 10]), params, jnp.asarray([-1]), jnp.asarray([0, 1]), config=config)
  round_fn = jax.jit(decode.decode_round, static_argnames="config")
  text = round_fn.lower(target, drafter, state, config=config).compile().as_text()
  assert "while" in text.lower() or "fusion" in text.lower()  # real compiled HLO
  assert _host_transfers(text) == []

  # The detector can fail: a round with a debug callback is flagged.
  def noisy_round(target, drafter, state, config):
    jax.debug.callback(lambda x: None, state.lengths)
    return decode.decode_round(target, drafter, state, config)[0]

  noisy = jax.jit(noisy_round, static_argnames="config")
  assert _host_transfers(noisy.lower(target, drafter, state, config=config).compile().as_text())


def test_layout_rules():
  mesh = sharding.make_mesh(1, 1)
  layout = sharding.Layout(mesh, sharding.HYBRID)
  # A one-device mesh replicates everything.
  assert layout.spec((8, 4), ("batch", "heads")) == jax.sharding.PartitionSpec(None, None)
  with pytest.raises(ValueError, match="unknown logical axes"):
    sharding.Rules.of(hidden="model")
  with pytest.raises(ValueError, match="does not use the"):
    sharding.make_mesh(3, 1)
  with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
    jspec.generate(jspec.models.init(tiny_config(), seed=0), [[1]], max_new_tokens=2,
                   mesh="data")
