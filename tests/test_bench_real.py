"""`jspec bench --target`: the real-model bench end to end on a tiny random llama GGUF.

The file is written here as llama.cpp's converter writes one (llama tensor names,
q/k rows permuted, F32 tensors, a byte-level BPE vocabulary and a ChatML template),
so jspec and transformers both read it with their own GGUF loaders. Timings mean
nothing at this size; what is checked is that every section runs and reports sane
numbers, that jspec's n-gram answers equal its greedy ones, and that the report,
the figure and the summary are written.
"""

import json
import math
import os

import numpy as np
import pytest

import gguf

from conftest import require

import jspec  # noqa: E402
from jspec.tools import bench_real, real_report, real_sections  # noqa: E402

pytestmark = pytest.mark.slow  # the real-model bench, end to end

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS = 64, 32, 2, 4, 2
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'"
          " + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Byte-level spellings: letters stand for themselves, "Ġ" is a space, "Ċ" a newline.
PIECES = (list("abcdefghijklmnopqrstuvwxyz") + ["Ġ", "Ċ", "ab"]
          + list("ABCDEFGHIJKLMNOPQRSTUVWXYZ") + list("012345"))


def _permute(w, n_head):
  """llama.cpp's q/k row order: per head, rows (2, Dh/2) -> (Dh/2, 2)."""
  return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
      w.shape)


def write_tiny_llama(path, seed=0):
  """A random llama GGUF (tied embeddings, like SmolLM2) with a 64-token vocabulary."""
  tokens = SPECIALS + PIECES
  assert len(tokens) == VOCAB
  rng = np.random.default_rng(seed)
  mat = lambda *shape: (rng.standard_normal(shape) * 0.3).astype(np.float32)
  head_dim = HIDDEN // HEADS
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_name("tiny llama")
  w.add_context_length(256)
  w.add_embedding_length(HIDDEN)
  w.add_block_count(LAYERS)
  w.add_feed_forward_length(2 * HIDDEN)
  w.add_head_count(HEADS)
  w.add_head_count_kv(KV_HEADS)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_rope_freq_base(10000.0)
  w.add_rope_dimension_count(head_dim)
  w.add_vocab_size(VOCAB)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("gpt2")
  w.add_token_list(tokens)
  w.add_token_types([3] * len(SPECIALS) + [1] * len(PIECES))
  w.add_token_merges(["a b"])
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  w.add_pad_token_id(2)
  w.add_add_bos_token(False)
  w.add_chat_template(CHATML)
  w.add_tensor("token_embd.weight", mat(VOCAB, HIDDEN))
  w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
  for i in range(LAYERS):
    blk = f"blk.{i}."
    w.add_tensor(blk + "attn_norm.weight", np.ones(HIDDEN, np.float32))
    w.add_tensor(blk + "ffn_norm.weight", np.ones(HIDDEN, np.float32))
    w.add_tensor(blk + "attn_q.weight", _permute(mat(HEADS * head_dim, HIDDEN), HEADS))
    w.add_tensor(blk + "attn_k.weight", _permute(mat(KV_HEADS * head_dim, HIDDEN), KV_HEADS))
    w.add_tensor(blk + "attn_v.weight", mat(KV_HEADS * head_dim, HIDDEN))
    w.add_tensor(blk + "attn_output.weight", mat(HIDDEN, HEADS * head_dim))
    w.add_tensor(blk + "ffn_gate.weight", mat(2 * HIDDEN, HIDDEN))
    w.add_tensor(blk + "ffn_up.weight", mat(2 * HIDDEN, HIDDEN))
    w.add_tensor(blk + "ffn_down.weight", mat(HIDDEN, 2 * HIDDEN))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


def _has_transformers():
  """Whether the transformers side runs: torch and transformers importable (under CI,
  which installs them, a missing one fails the test instead)."""
  return all(require(name, optional=True) is not None for name in ("torch", "transformers"))


@pytest.mark.slow
def test_real_bench_end_to_end(tmp_path, monkeypatch):
  monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path / "cache"))
  path = write_tiny_llama(tmp_path / "tiny.gguf")
  target = jspec.load(path, dtype="float32")
  assert target.vocab_size == VOCAB and 2 in target.eos_ids
  # Chat prompts in the vocabulary's letters, through the file's chat template; one
  # repeats itself, so the lookup finds something to draft from.
  chat = [{"kind": "restate", "content": "abab cdcd abab cdcd abab"},
          {"kind": "explain", "content": "explain this code"},
          {"kind": "question", "content": "why is the sky blue"}]
  prompts = bench_real.chat_ids(target.tokenizer, chat)
  assert prompts[0][1][:1] == [1] and all(len(ids) > 8 for _, ids in prompts)
  hf = _has_transformers()
  # Batch 1 in the batch section reuses the programs the batch-1 sections compiled.
  s = bench_real.Settings(k=2, max_new_tokens=6, repeats=1, batches=(1,), steady_tokens=16,
                          cost_calls=2, transformers=hf)
  out = tmp_path / "out"
  report = bench_real.run(path, s, str(out), prompts=prompts, target=target)

  ng = report["ngram"]
  assert ng["mismatches"] == [] and set(ng["kinds"]) == {"restate", "explain", "question", "all"}
  for kind, row in ng["kinds"].items():
    assert row["jspec_greedy"]["tokens_per_s"] > 0 and row["jspec_greedy"]["time_s"] > 0
    for name in ("jspec_ngram@2", "jspec_ngram@auto"):
      assert row[name]["equal_to_greedy"], (kind, name)
      assert row[name]["tokens"] == row["jspec_greedy"]["tokens"]
      assert math.isfinite(row[name]["speedup"]) and row[name]["speedup"] > 0
      assert 1.0 <= row[name]["tau"] <= 3.0
    if hf:
      pl = row["transformers_prompt_lookup"]
      assert pl["tokens_per_s"] > 0 and math.isfinite(pl["speedup"])
      assert all(math.isfinite(v) and v > 0
                 for v in row["jspec_over_transformers_prompt_lookup"].values())
  if hf:
    tr = report["transformers"]
    assert tr["torch_threads"] >= 1 and tr["jax_threads"] >= 1
    for kind in ("restate", "explain", "question"):
      row = tr["kinds"][kind]
      assert row["transformers_greedy"]["tokens_per_s"] > 0
      assert math.isfinite(row["jspec_over_transformers"])
      for a in row["agreement"]:
        assert 0 <= a["leading_equal"] <= min(a["tokens_jspec"], a["tokens_transformers"])
        # Same file, same f32 values: identical answers, or answers that part where the
        # target's top-2 logits nearly tie (the near-tie rule of assert_greedy_match).
        if a["identical"]:
          assert "top2_gap_at_divergence" not in a, a
        else:
          assert a.get("top2_gap_at_divergence", float("inf")) < 1e-4, (kind, a)
    # Same file, same f32 values: the answers agree unless a near-tie flips.
    assert tr["answers"] == 3
  else:
    assert "transformers" not in report

  rows = report["batch"]["1"]["rows"]
  assert set(rows) == {"ngram@2", "ngram@auto"}
  assert all(r["equal_to_baseline"] and r["time_s"] > 0 and math.isfinite(r["speedup"])
             for r in rows.values())
  fl = report["floor"]
  assert fl["float32"]["weight_bytes"] == 2 * fl["bfloat16"]["weight_bytes"] == sum(
      x.nbytes for x in __import__("jax").tree_util.tree_leaves(target.params))
  for f in (fl["float32"], fl["bfloat16"]):
    assert f["bandwidth_gb_s"] > 0 and f["floor_ms"] > 0
    # A steady-state step is the difference of two timed calls: at this size it is
    # noise and may come out negative, so only its definition is checked here.
    assert math.isfinite(f["baseline_ms_per_token"])
    assert f["baseline_over_floor"] == pytest.approx(f["baseline_ms_per_token"] / f["floor_ms"])
  vf = report["verify"]
  assert vf["verify_tokens"] == 3
  assert vf["in_loop"]["ratio"] > 0 and vf["single_calls"]["ratio"] > 0
  assert vf["ideal_speedup"] == pytest.approx(vf["ngram_tau"] / vf["in_loop"]["ratio"])

  with open(out / bench_real.REPORT) as f:
    assert set(json.load(f)) >= {"ngram", "batch", "floor", "verify", "settings", "prompts"}
  assert [os.path.basename(p) for p in report["figures"]] == [real_report.FIGURE]
  text = real_report.summary(report)
  assert "ngram@2" in text and "floor, float32" in text and "verify of 3 tokens" in text

  # A section run alone keeps the others from the last report.
  again = bench_real.run(path, s, str(out), sections=("batch",), prompts=prompts, target=target)
  assert again["ngram"] == json.loads(json.dumps(report["ngram"]))
  assert again["verify"] == json.loads(json.dumps(report["verify"]))
  assert again["batch"]["1"]["baseline_tokens_per_s"] > 0

  # Answers that part: the leading run, and the top-2 logit gap where they part, which is
  # the target's own (an unpadded forward over the prompt and the shared run).
  kind, ids = prompts[1]
  [row, same] = real_sections._agreement(target, [(kind, ids)] * 2, [[5, 6, 7, 8], [5, 6]],
                                         [[5, 6, 9], [5, 6]], 64)
  assert row["leading_equal"] == 2 and not row["identical"]
  top2 = np.sort(np.asarray(target.logits(np.asarray([list(ids) + [5, 6]], np.int32)))[0, -1])
  assert row["top2_gap_at_divergence"] == pytest.approx(top2[-1] - top2[-2], rel=1e-4,
                                                        abs=1e-5)
  assert same["identical"] and same["leading_equal"] == 2 and "top2_gap_at_divergence" not in same


def test_leading_agreement():
  assert real_sections.leading_agreement([1, 2, 3], [1, 2, 4, 5]) == 2
  assert real_sections.leading_agreement([1, 2], [1, 2, 3]) == 2
  assert real_sections.leading_agreement([], [7]) == 0


@pytest.mark.slow
def test_assisted_bench_against_transformers(tmp_path, monkeypatch):
  """`jspec.tools.bench_assisted` on the tiny GGUF with a draft model that borrows its
  embedding: every variant runs, jspec's and transformers' speculative answers equal
  their greedy ones, rates and ratios are finite."""
  require("torch")
  require("transformers")
  from jspec.io import draft_checkpoint
  from jspec.recipes import smollm2_draft as recipe_draft
  from jspec.tools import bench_assisted

  monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path / "cache"))
  path = write_tiny_llama(tmp_path / "tiny.gguf")
  target = jspec.load(path, dtype="float32")
  config = recipe_draft.draft_config(target.config, 1)
  draft = jspec.models.make_model(config, {**recipe_draft.init_from_target(target.params, [0]),
                                           "embed": target.params["embed"]})
  draft_checkpoint.save_draft(draft, tmp_path / "draft")
  chat = [{"kind": "restate", "content": "abab cdcd abab"},
          {"kind": "question", "content": "why is the sky blue"}]
  prompts = bench_real.chat_ids(target.tokenizer, chat)
  report = bench_assisted.run(path, str(tmp_path / "draft"), 2, 1, 6, 1, prompts=prompts,
                              target=target)
  assert set(report["kinds"]) == {"restate", "question", "all"}
  for kind, row in report["kinds"].items():
    assert row["jspec_equal_to_greedy"] and row["transformers_equal_to_greedy"], kind
    assert 1.0 <= row["tau"] <= 3.0
    for name in ("jspec_greedy", "jspec_draft@2", "jspec_draft@auto", "transformers_greedy",
                 "transformers_assisted@2", "transformers_assisted@2+confidence"):
      assert row[name]["tokens"] > 0 and row[name]["tokens_per_s"] > 0, (kind, name)
    assert all(math.isfinite(row[k]) and row[k] > 0 for k in (
        "jspec_speedup", "transformers_speedup", "jspec_over_transformers_assisted",
        "auto_speedup", "confidence_speedup", "jspec_auto_over_transformers_confidence"))
