"""GGUF files kept quantized (`jspec.load(path, weights="gguf")`, `gguf_file.read_blocks`).

Each type `gguf_file.KEPT` lists decodes into values and block scales that give back the
`gguf` package's own dequantised weights exactly; a tiny llama file whose layers mix
types (Q4_K and Q6_K layers of one param, as a Q4_K_M file has; Q8_0, Q4_0, Q5_1, an F16
matrix) loads as quantized weights that compute the logits of the same file dequantised,
holds about the file's bytes, and decodes speculatively to its own greedy output. Files
are written with `gguf.GGUFWriter`: the types the package can quantise from floats, and the
K-quants as random blocks with small scales (the package only decodes those).
"""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

import gguf

import jspec
from conftest import assert_greedy_match
from jspec.core import quant
from jspec.models import gguf_file
from test_bench_real import CHATML, PIECES, SPECIALS, VOCAB

Q = gguf.GGMLQuantizationType
# K-quant rows are whole 256-input super-blocks: every matrix here has 256 inputs.
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 256, 256, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS


def blocks(rng, qtype: Q, rows: int, width: int) -> np.ndarray:
  """[rows, bytes per row] of `qtype`: floats quantised by the package where it can,
  random blocks otherwise (each f16 scale field set small, so weights are about 0.1)."""
  try:
    return gguf.quants.quantize((rng.standard_normal((rows, width)) * 0.1).astype(np.float32),
                                qtype)
  except NotImplementedError:
    pass
  block, size = gguf.GGML_QUANT_SIZES[qtype]
  raw = rng.integers(0, 256, (rows * width // block, size), dtype=np.uint8)
  fields = {Q.Q4_K: ((0, 1e-4), (2, 1e-3)), Q.Q5_K: ((0, 5e-5), (2, 1e-3)),
            Q.Q6_K: ((208, 2.5e-5),)}[qtype]
  for at, size_ in fields:
    d = rng.uniform(0.5, 1.0, raw.shape[0]) * size_
    raw[:, at:at + 2] = np.frombuffer(d.astype("<f2").tobytes(), np.uint8).reshape(-1, 2)
  return raw.reshape(rows, -1)


def _close(w) -> None:
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def write(path, rng, types: dict, tie: bool = True) -> str:
  """A llama GGUF with the tokenizer of test_bench_real; `types` {tensor name: qtype}
  (matrices not named: Q8_0)."""
  w = gguf.GGUFWriter(str(path), "llama")
  for call, value in (("add_context_length", 256), ("add_embedding_length", HIDDEN),
                      ("add_block_count", LAYERS), ("add_feed_forward_length", FFN),
                      ("add_head_count", HEADS), ("add_head_count_kv", KV_HEADS),
                      ("add_layer_norm_rms_eps", 1e-5), ("add_rope_freq_base", 10000.0),
                      ("add_rope_dimension_count", HEAD_DIM), ("add_vocab_size", VOCAB),
                      ("add_tokenizer_model", "gpt2"), ("add_tokenizer_pre", "gpt2"),
                      ("add_token_list", SPECIALS + PIECES),
                      ("add_token_types", [3] * len(SPECIALS) + [1] * len(PIECES)),
                      ("add_token_merges", ["a b"]), ("add_bos_token_id", 1),
                      ("add_eos_token_id", 2), ("add_add_bos_token", False),
                      ("add_chat_template", CHATML)):
    getattr(w, call)(value)

  def matrix(name, rows, width):
    qtype = types.get(name, Q.Q8_0)
    if qtype == Q.F16:
      w.add_tensor(name, (rng.standard_normal((rows, width)) * 0.1).astype(np.float16))
    else:
      w.add_tensor(name, blocks(rng, qtype, rows, width), raw_dtype=qtype)

  matrix("token_embd.weight", VOCAB, HIDDEN)
  if not tie:
    matrix("output.weight", VOCAB, HIDDEN)
  w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
  for i in range(LAYERS):
    b = f"blk.{i}."
    w.add_tensor(b + "attn_norm.weight", np.ones(HIDDEN, np.float32))
    w.add_tensor(b + "ffn_norm.weight", np.ones(HIDDEN, np.float32))
    for name, rows, width in (("attn_q", HEADS * HEAD_DIM, HIDDEN),
                              ("attn_k", KV_HEADS * HEAD_DIM, HIDDEN),
                              ("attn_v", KV_HEADS * HEAD_DIM, HIDDEN),
                              ("attn_output", HIDDEN, HEADS * HEAD_DIM),
                              ("ffn_gate", FFN, HIDDEN), ("ffn_up", FFN, HIDDEN),
                              ("ffn_down", HIDDEN, FFN)):
      matrix(b + name + ".weight", rows, width)
  _close(w)
  return str(path)


# Q4_K_M's pattern: Q4_K matrices, Q6_K for half the layers' attn_v and ffn_down (so one
# param's layers differ in type: Q4_K and Q6_K groups of 32 and 16, with and without
# offsets), a Q6_K head; plus the simpler types on the other matrices.
MIXED = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q6_K,
         **{f"blk.{i}.{n}.weight": Q.Q4_K for i in range(LAYERS)
            for n in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up", "ffn_down")},
         "blk.0.attn_v.weight": Q.Q6_K, "blk.0.ffn_down.weight": Q.Q6_K,
         "blk.0.attn_output.weight": Q.Q4_0, "blk.1.attn_output.weight": Q.Q5_1}


@pytest.mark.parametrize("qtype", sorted(gguf_file.KEPT))
def test_each_kept_type_decodes_to_the_packages_weights(qtype, tmp_path):
  rng = np.random.default_rng(0)
  kind = Q[qtype]
  w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
  w.add_tensor("w", blocks(rng, kind, 6, 512), raw_dtype=kind)
  _close(w)
  f = gguf_file.read_header(tmp_path / "t.gguf")
  assert gguf_file.kept(f, "w")
  got = gguf_file.read_blocks(f, "w")
  group, storage, (lo, hi) = gguf_file.KEPT[qtype]
  assert got.q.shape == (6, 512) and got.scale.shape == (6, 512 // group)
  assert np.dtype(got.q.dtype).name == storage
  values = got.q.astype(np.int32)
  assert lo <= values.min() and values.max() <= hi
  assert values.max() - values.min() >= (hi - lo) // 2  # the range is used, not a constant
  assert (got.offset is not None) == (qtype in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"))
  np.testing.assert_array_equal(quant.dequantize(got, np.float32),
                                gguf_file.read_tensor(f, "w"))


def test_a_block_that_does_not_decode_is_refused(tmp_path):
  """Q4_0 values are 4 bits; a block whose scale field is NaN cannot be solved for them."""
  rng = np.random.default_rng(0)
  raw = blocks(rng, Q.Q4_0, 2, 64)
  raw[0, :2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
  w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
  w.add_tensor("w", raw, raw_dtype=Q.Q4_0)
  _close(w)
  with pytest.raises(gguf_file.GGUFFormatError, match="does not decode"):
    gguf_file.read_blocks(gguf_file.read_header(tmp_path / "t.gguf"), "w")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
  """(path, kept model, dequantised model) of the MIXED file, untied head."""
  path = write(tmp_path_factory.mktemp("gguf") / "m.gguf", np.random.default_rng(1), MIXED,
               tie=False)
  return path, jspec.load(path, weights="gguf"), jspec.load(path)


def _tree(params):
  return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(
      params, is_leaf=lambda x: isinstance(x, quant.QuantWeight))[0]}


def test_the_mixed_file_loads_as_quantized_weights_in_one_form_per_param(mixed):
  _, kept, _ = mixed
  p = kept.params
  assert all(isinstance(p["layers"][n], quant.QuantWeight)
             for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"))
  assert isinstance(p["embed"], quant.QuantWeight) and isinstance(p["lm_head"], quant.QuantWeight)
  wq, wv = p["layers"]["wq"], p["layers"]["wv"]
  # Q4_K in both layers: uint4 values, a scale and an offset per 32 inputs (D = 256 -> 8).
  assert wq.q.dtype == jax.numpy.uint4 and wq.scale.shape == (LAYERS, HIDDEN // 32, HEADS,
                                                                  HEAD_DIM)
  assert wq.offset is not None
  # attn_v: Q6_K in layer 0, Q4_K in layer 1 -> int8 values, groups of 16, offsets (0 for
  # the Q6_K layer).
  assert wv.q.dtype == jax.numpy.int8 and wv.scale.shape == (LAYERS, HIDDEN // 16, KV_HEADS,
                                                                 HEAD_DIM)
  np.testing.assert_array_equal(np.asarray(wv.offset[0]), 0)
  assert np.any(np.asarray(wv.offset[1]) != 0)
  # wo [H, Dh, D]: its inputs are H x Dh, so its groups lie along Dh.
  assert p["layers"]["wo"].scale.shape == (LAYERS, HEADS, HEAD_DIM // 32, HIDDEN)
  assert p["embed"].scale.shape == (VOCAB, HIDDEN // 32) and p["embed"].offset is None
  assert p["lm_head"].scale.shape == (HIDDEN // 16, VOCAB)


def test_the_kept_model_computes_the_dequantised_files_logits(mixed):
  _, kept, floats = mixed
  tokens = np.random.default_rng(0).integers(0, VOCAB, size=(2, 12)).astype(np.int32)
  want = np.asarray(floats.logits(tokens))
  got = np.asarray(kept.logits(tokens))
  assert np.max(np.abs(want)) > 0.1  # logits that say something
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.max(np.abs(want)))
  # Every weight the kept model computes with is the dequantised file's, exactly.
  flat_k, flat_f = _tree(kept.params), _tree(floats.params)
  assert flat_k.keys() == flat_f.keys()
  for k, x in flat_k.items():
    np.testing.assert_array_equal(np.asarray(quant.dequantize(x)), np.asarray(flat_f[k]), k)


def test_the_kept_model_holds_about_the_files_bytes(mixed):
  path, kept, floats = mixed
  assert kept.num_params() == floats.num_params()
  # Q4_K is 4.5 bits a weight in the file; held as 4-bit values, f32 scale and offset per
  # 32 inputs (6 bits a weight), or int8 with both per 16 (12 bits) where layers mix.
  assert kept.num_bytes() < 0.35 * floats.num_bytes(), (kept.num_bytes(), floats.num_bytes())
  assert kept.num_bytes() < 3 * os.path.getsize(path)


@pytest.mark.parametrize("k", [2, 4])
def test_speculative_decoding_of_the_kept_model_is_its_own_greedy_output(mixed, k):
  _, kept, _ = mixed
  prompts = [[3, 4, 5, 3, 4, 5, 3, 4], [10, 11, 12, 13]]
  base = jspec.generate(kept, prompts, max_new_tokens=16)
  spec = jspec.speculative_generate(kept, jspec.NGram(VOCAB), prompts, num_draft_tokens=k,
                                    max_new_tokens=16)
  assert_greedy_match(kept, prompts, np.asarray(base.tokens), np.asarray(spec.tokens))


def test_a_float_layer_among_quantized_ones_and_a_tied_head(tmp_path):
  """One F16 layer of attn_v: that param is held as floats (all its layers dequantised,
  exactly); the tied embedding is the head."""
  types = dict(MIXED, **{"blk.1.attn_v.weight": Q.F16})
  path = write(tmp_path / "f.gguf", np.random.default_rng(2), types, tie=True)
  kept, floats = jspec.load(path, weights="gguf"), jspec.load(path)
  assert not isinstance(kept.params["layers"]["wv"], quant.QuantWeight)
  assert isinstance(kept.params["layers"]["wq"], quant.QuantWeight)
  assert "lm_head" not in kept.params
  tokens = np.asarray([[5, 6, 7, 8, 9, 10]], np.int32)
  want = np.asarray(floats.logits(tokens))
  np.testing.assert_allclose(np.asarray(kept.logits(tokens)), want, rtol=0,
                             atol=1e-5 * np.max(np.abs(want)))


def test_weights_gguf_is_for_gguf_files_only(tmp_path):
  model = jspec.models.init(jspec.models.TransformerConfig(
      vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
      num_attention_heads=4, num_key_value_heads=2, head_dim=8), seed=0)
  jspec.save(model, tmp_path / "native")
  with pytest.raises(ValueError, match="is not a GGUF file"):
    jspec.load(tmp_path / "native", weights="gguf")
  with pytest.raises(ValueError, match="is not a GGUF file"):
    jspec.load(tmp_path / "missing.gguf", weights="gguf")
  with pytest.raises(ValueError, match="weights must be None"):
    jspec.models.quantize_model(model, "gguf")  # a load-time choice, not a mode


def test_the_kept_model_places_on_a_mesh(mixed):
  """With a mesh, each quantized param is placed as it is stacked: values, scales and
  offsets each get the param's sharding; the logits are the unsharded model's."""
  from jspec.core import sharding

  path, kept, _ = mixed
  mesh = sharding.make_mesh(1, 1, jax.devices()[:1])
  placed = jspec.load(path, weights="gguf", mesh=mesh)
  assert jax.tree_util.tree_structure(placed.params) == jax.tree_util.tree_structure(
      kept.params)
  assert all(isinstance(x.sharding, jax.sharding.NamedSharding)
             for x in jax.tree_util.tree_leaves(placed.params))
  tokens = np.asarray([[1, 2, 3, 4, 5]], np.int32)
  np.testing.assert_array_equal(np.asarray(placed.logits(tokens)),
                                np.asarray(kept.logits(tokens)))


def test_the_command_line_generates_with_the_files_blocks(mixed, capsys):
  """`jspec generate --weights gguf` on a GGUF target: the kept model's greedy text."""
  from jspec.tools import cli

  path, kept, _ = mixed
  assert cli.main(["generate", "--target", path, "--prompt", "abc", "--max-new-tokens", "6",
                   "--weights", "gguf"]) == 0
  printed = capsys.readouterr().out
  want = jspec.generate_text(kept, "abc", max_new_tokens=6)
  assert want[0] and want[0] in printed, (want, printed)
