"""Runs decoding on simulated CPU devices; driven by test_sharding.py in a subprocess.

    python sharded_worker.py meshes OUT.json            # 8 devices: meshes (1,8), (2,4), (8,1)
    python sharded_worker.py process ID PORT OUT.json   # one of two processes, 2 devices each

Writes every run's tokens, lengths and stats as JSON, with the same runs made on
one device (meshes mode) for comparison by the test.
"""

import json
import os
import sys

MODE = sys.argv[1]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=" + ("8" if MODE == "meshes" else "2")
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
if MODE == "process":
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{sys.argv[3]}", num_processes=2,
                             process_id=int(sys.argv[2]))

import numpy as np  # noqa: E402

import jspec  # noqa: E402
from jspec.core import sharding  # noqa: E402

CONFIG = jspec.models.TransformerConfig(
    vocab_size=256, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
    initializer_range=0.3)
rng = np.random.default_rng(0)
PROMPTS = [rng.integers(0, 256, size=int(n)).tolist() for n in rng.integers(1, 12, size=8)]
PROMPTS[3] = [7, 8, 9, 7, 8, 9, 7, 8]  # something for an n-gram drafter to copy
SAMPLED = dict(temperature=[1.0, 0.0, 0.7, 1.0, 1.3, 0.0, 1.0, 0.9], top_p=0.95, seed=11)


def runs(mesh):
  target = jspec.models.init(CONFIG, seed=0)
  # A draft that agrees with the target part of the time: the target plus noise.
  noise = jspec.models.init(CONFIG, seed=1).params
  draft = jspec.Model(params=jax.tree_util.tree_map(lambda t, n: t + 0.5 * n, target.params, noise),
                      config=CONFIG, apply_fn=target.apply_fn, init_cache_fn=target.init_cache_fn,
                      axes_fn=target.axes_fn)
  kw = dict(max_new_tokens=16, mesh=mesh)
  out = {
      "greedy": jspec.generate(target, PROMPTS, **kw),
      "sampled": jspec.generate(target, PROMPTS, **kw, **SAMPLED),
      "spec_greedy": jspec.speculative_generate(target, draft, PROMPTS, num_draft_tokens=3, **kw),
      "spec_sampled": jspec.speculative_generate(target, draft, PROMPTS, num_draft_tokens=3,
                                                 **kw, **SAMPLED),
  }
  try:
    from jspec.drafters.ngram import NGram
  except ImportError:
    NGram = None
  if NGram is not None:
    ngram = NGram(vocab_size=256, max_ngram=3, min_ngram=1)
    out["ngram_sampled"] = jspec.speculative_generate(target, ngram, PROMPTS, num_draft_tokens=3,
                                                      **kw, **SAMPLED)
  return {name: {"tokens": np.asarray(o.tokens).tolist(), "lengths": np.asarray(o.lengths).tolist(),
                 "accepted": np.asarray(o.stats.accepted).tolist(),
                 "target_calls": np.asarray(o.stats.target_calls).tolist()}
          for name, o in out.items()}


def param_bytes(mesh):
  target = sharding.shard_model(jspec.models.init(CONFIG, seed=0),
                                sharding.as_layout(mesh, sharding.TENSOR_PARALLEL))
  per_device = sharding.per_device_bytes(target.params)
  total = sum(x.nbytes for x in jax.tree_util.tree_leaves(target.params))
  return {"total": total, "per_device": sorted(per_device.values())}


def load_sharded(mesh):
  """jspec.load(mesh=...) places params shard by shard, from both checkpoint formats."""
  import tempfile
  from jspec.io import checkpoint
  target = jspec.models.init(CONFIG, seed=0)
  tokens = np.asarray([PROMPTS[1]], np.int32)
  want = np.asarray(target.logits(tokens))
  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    jspec.save(target, os.path.join(tmp, "native"))
    checkpoint.save_hf(target, os.path.join(tmp, "hf"))
    for kind in ("native", "hf"):
      model = jspec.load(os.path.join(tmp, kind), mesh=mesh, rules=sharding.TENSOR_PARALLEL)
      spec = model.params["layers"]["wq"].sharding.spec
      out[kind] = {"wq_spec": [str(a) for a in spec],
                   "per_device": sorted(sharding.per_device_bytes(model.params).values()),
                   # Split heads sum their partial products in another order: on an
                   # AVX-512 CPU the logits (up to about 9) moved by up to 2.2e-5.
                   "logits_equal": bool(np.allclose(np.asarray(model.logits(tokens)), want,
                                                    atol=1e-4, rtol=1e-5))}
  return out


if MODE == "meshes":
  result = {"one": runs(None)}
  for shape in [(1, 8), (2, 4), (8, 1)]:
    result[f"{shape[0]}x{shape[1]}"] = runs(sharding.make_mesh(*shape))
  result["bytes_tp4"] = param_bytes(sharding.make_mesh(2, 4))
  result["load_tp4"] = load_sharded(sharding.make_mesh(2, 4))
  out_file = sys.argv[2]
else:
  assert jax.device_count() == 4 and jax.local_device_count() == 2
  result = {"multi": runs(sharding.make_mesh(2, 2))}
  out_file = sys.argv[4]
with open(out_file, "w") as f:
  json.dump(result, f)
print("done")
