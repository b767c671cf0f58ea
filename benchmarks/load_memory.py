"""Peak host memory of `jspec.load` on a Hugging Face checkpoint, as a multiple of its size.

    python benchmarks/load_memory.py [--size-mb 500] [--dtype bfloat16] [--shards 1]

Writes a random-init Llama checkpoint (safetensors in Hugging Face naming,
torch Linear layout [out, in], a matching config.json) of about --size-mb into
a temp directory, then loads it with `jspec.load` in a fresh subprocess under
`/usr/bin/time -v` and reports that process's peak resident set size; then the
same for the native (orbax) checkpoint `jspec convert` makes of it. A
subprocess that only imports jspec and initialises the CPU backend gives the
baseline, so the script prints both the raw peak and (peak - baseline) as
ratios of the checkpoint size. A loader that never holds more than one extra
copy of the weights stays near 1x (net); 2x or more means a second full copy.

Needs /usr/bin/time (Debian: apt-get install -y time).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

VOCAB, HIDDEN, INTERMEDIATE, HEADS, KV_HEADS = 32000, 1024, 2816, 16, 4

LOAD = """
import sys, jax, jspec
model = jspec.load(sys.argv[1])
jax.block_until_ready(model.params)
print(model.num_params(), model.dtype)
"""
BASELINE = """
import jax, jax.numpy as jnp, jspec
jax.block_until_ready(jnp.zeros(1))
"""


def layer_shapes(i: int) -> dict[str, tuple[int, int]]:
  head_dim = HIDDEN // HEADS
  p = f"model.layers.{i}."
  return {
      p + "self_attn.q_proj.weight": (HEADS * head_dim, HIDDEN),
      p + "self_attn.k_proj.weight": (KV_HEADS * head_dim, HIDDEN),
      p + "self_attn.v_proj.weight": (KV_HEADS * head_dim, HIDDEN),
      p + "self_attn.o_proj.weight": (HIDDEN, HEADS * head_dim),
      p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
      p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
      p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
      p + "input_layernorm.weight": (HIDDEN,),
      p + "post_attention_layernorm.weight": (HIDDEN,),
  }


def shapes_for(size_bytes: int, itemsize: int) -> tuple[int, dict[str, tuple[int, ...]]]:
  """The layer count whose checkpoint comes closest to size_bytes, and its tensor shapes."""
  top = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,),
         "lm_head.weight": (VOCAB, HIDDEN)}
  count = lambda shapes: sum(int(np.prod(s)) for s in shapes.values())
  per_layer = count(layer_shapes(0)) * itemsize
  layers = max(1, round((size_bytes - count(top) * itemsize) / per_layer))
  shapes = dict(top)
  for i in range(layers):
    shapes.update(layer_shapes(i))
  return layers, shapes


def write_checkpoint(path: str, size_mb: float, dtype: str, shards: int) -> int:
  import ml_dtypes  # numpy has no bfloat16; jax ships this package
  from safetensors.numpy import save_file

  np_dtype = np.dtype(np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
  layers, shapes = shapes_for(int(size_mb * 2**20), np_dtype.itemsize)
  config = {
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
      "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": layers,
      "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-5,
      "rope_theta": 10000.0, "max_position_embeddings": 2048, "tie_word_embeddings": False,
      "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": dtype,
  }
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
  rng = np.random.default_rng(0)
  names = list(shapes)
  groups = [names[i::shards] for i in range(shards)]
  weight_map = {}
  for k, group in enumerate(groups):
    file = "model.safetensors" if shards == 1 else f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
    tensors = {}
    for name in group:
      shape = shapes[name]
      values = (np.ones(shape, np.float32) if len(shape) == 1
                else rng.standard_normal(shape, np.float32) * 0.02)
      tensors[name] = values.astype(np_dtype)
      weight_map[name] = file
    save_file(tensors, os.path.join(path, file), metadata={"format": "pt"})
    del tensors
  if shards > 1:
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {}, "weight_map": weight_map}, f)
  return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
             if f.endswith(".safetensors"))


def peak_rss(code: str, *args: str) -> tuple[int, str]:
  """Peak RSS in bytes of `python -c code args` under /usr/bin/time -v, and its stdout."""
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  proc = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", code, *args],
                        capture_output=True, text=True, env=env)
  if proc.returncode:
    raise RuntimeError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
  match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
  if match is None:
    raise RuntimeError(f"no peak RSS in /usr/bin/time output:\n{proc.stderr[-2000:]}")
  return int(match.group(1)) * 1024, proc.stdout.strip()


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size-mb", type=float, default=500)
  parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
  parser.add_argument("--shards", type=int, default=1)
  parser.add_argument("--keep", action="store_true", help="keep the temp checkpoint")
  args = parser.parse_args(argv)
  if not os.path.exists("/usr/bin/time"):
    print("needs /usr/bin/time: apt-get update && apt-get install -y time", file=sys.stderr)
    return 2

  path = tempfile.mkdtemp(prefix="jspec_load_memory_")
  try:
    size = write_checkpoint(path, args.size_mb, args.dtype, args.shards)
    base, _ = peak_rss(BASELINE)
    mb = 2**20
    print(f"checkpoint {size / mb:.0f} MiB ({args.dtype}, {args.shards} file(s)) in {path}")
    print(f"baseline (import jspec + CPU backend): {base / mb:.0f} MiB peak RSS")
    native = os.path.join(path, "native")
    subprocess.run([sys.executable, "-m", "jspec.tools.cli", "convert", path, native], check=True,
                   stdout=subprocess.DEVNULL)
    for name, src in (("Hugging Face", path), ("native", native)):
      peak, out = peak_rss(LOAD, src)
      print(f"jspec.load, {name} ({out}): {peak / mb:.0f} MiB peak RSS = {peak / size:.2f}x "
            f"the checkpoint; net of baseline {(peak - base) / mb:.0f} MiB = "
            f"{(peak - base) / size:.2f}x")
  finally:
    if args.keep:
      print(f"kept {path}")
    else:
      shutil.rmtree(path, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
