"""`jspec bench --target` (jspec.bench.real), the transformers backend of the runner and the
assisted-generation study, end to end on a tiny random llama GGUF.

The file is written here as llama.cpp's converter writes one (llama tensor names,
q/k rows permuted, F32 tensors, a byte-level BPE vocabulary and a ChatML template),
so jspec and transformers both read it with their own GGUF loaders. Timings mean
nothing at this size; what is checked is that every section runs and its records hold
sane numbers, that jspec's speculative answers equal its greedy ones, that the records,
the figures and the summary are written, and that transformers' runs are counted.
"""

import math
import os
import types

import numpy as np
import pytest

import gguf

from conftest import require

import jspec  # noqa: E402
from jspec.bench import metrics as M  # noqa: E402
from jspec.bench import real, records, runner, workloads  # noqa: E402

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


def chat(*rows) -> workloads.Workload:
  """A chat workload of (kind, text) rows, one prompt each."""
  return workloads.Workload("chat", tuple(
      workloads.Prompt(f"{kind}-1", kind, workloads.user(text)) for kind, text in rows))


# Chat prompts in the vocabulary's letters; one repeats itself, so the lookup finds
# something to draft from.
CHAT = chat(("restate", "abab cdcd abab cdcd abab"), ("explain", "explain this code"),
            ("question", "why is the sky blue"))


@pytest.mark.slow
def test_real_bench_end_to_end(tmp_path, monkeypatch):
  monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path / "cache"))
  path = write_tiny_llama(tmp_path / "tiny.gguf")
  target = jspec.load(path, dtype="float32")
  assert target.vocab_size == VOCAB and 2 in target.eos_ids
  ids = workloads.encode(target.tokenizer, CHAT.prompts[0].messages)
  assert ids[:1] == [1] and len(ids) > 8
  hf = _has_transformers()
  s = real.Settings(k=2, max_new_tokens=6, repeats=2, batches=(2,), steady_tokens=16,
                    cost_calls=2, transformers=hf)
  out = tmp_path / "out"
  studies = real.run(path, s, str(out), workload=CHAT, target=target, progress=False)
  assert set(studies) == set(real.SECTIONS) - ({"transformers"} if not hf else set())
  for section, (head, recs) in studies.items():
    assert records.read(real.path_of(str(out), section))[1] == recs, section
    assert head["study"] == f"real-{section}" and head["settings"]["k"] == 2
    assert {r.study for r in recs} == {head["study"]}

  _, ng = studies["ngram"]
  spec = {"plain", "ngram@k=2", "ngram@k=auto"}
  assert set(M.group(ng, "method")) == spec | ({"transformers", "transformers-prompt-lookup@k=2"}
                                               if hf else set())
  assert set(M.group(ng, "kind")) == {"restate", "explain", "question"}
  for r in ng:
    assert len(r.seconds) == 2 and r.tokens > 0 and r.axes["batch"] == 1
    assert r.axes["library"] == ("transformers" if r.method.startswith("transformers")
                                 else "jspec")
  for name in ("ngram@k=2", "ngram@k=auto"):
    mine = M.select(ng, method=name)
    assert M.all_equal(mine) is True, name  # jspec's speculative answers equal greedy
    assert sum(r.tokens for r in mine) == sum(r.tokens for r in M.select(ng, method="plain"))
    assert 1.0 <= M.tau(mine) <= 3.0 and math.isfinite(M.speedup(
        M.select(ng, method="plain"), mine))
    assert len(mine[0].judged) == 2 or name == "ngram@k=auto"
  if hf:
    greedy = M.select(ng, method="transformers")
    assert M.tau(greedy) == 1.0  # a forward call per token, counted by the hook
    lookup = M.select(ng, method="transformers-prompt-lookup@k=2")
    assert all(r.judged == () and r.calls <= r.tokens for r in lookup)
    assert math.isfinite(M.speedup(greedy, lookup))
    from jspec.bench import report
    table = report.real_ngram_transformers(studies["ngram"][0], ng)
    assert "restating given text or code" in table and "tok/s" in table
    _, tr = studies["transformers"]
    assert set(M.group(tr, "method")) == {"plain", "transformers"}
    for r in M.select(tr, method="transformers"):
      # Same file, same f32 values: identical answers, or answers that part where the
      # target's top-2 logits nearly tie (the near-tie rule of assert_greedy_match).
      if r.equal:
        assert "first_difference" not in r.extra, r
      else:
        assert r.extra["top2_gap_at_divergence"] < 1e-4, r
    assert studies["transformers"][0]["torch_threads"] >= 1
    assert studies["transformers"][0]["jax_threads"] >= 1

  _, bt = studies["batch"]
  assert {r.axes["batch"] for r in bt} == {2} and set(M.group(bt, "method")) == spec
  assert all(r.equal for r in bt if r.method != "plain")
  assert all(len(r.extra["rows"]) == 2 for r in bt)

  head, fl = studies["floor"]
  assert head["bandwidth_bytes_per_s"] > 0
  by = M.group(fl, "dtype", "length")
  assert set(by) == {(d, x) for d in ("float32", "bfloat16") for x in ("short", "long")}
  weights = sum(x.nbytes for x in __import__("jax").tree_util.tree_leaves(target.params))
  assert by[("float32", "long")][0].extra["weight_bytes"] == weights
  assert by[("bfloat16", "short")][0].extra["weight_bytes"] == weights // 2
  assert {(r.axes["length"], r.tokens) for r in fl} == {("short", 4), ("long", 16)}  # no EOS
  # A steady-state step is the difference of two timed calls: at this size it is noise and
  # may come out negative, so only its definition is checked.
  assert math.isfinite(M.steady_seconds(by[("float32", "short")], by[("float32", "long")]))

  _, vf = studies["verify"]
  assert {(r.axes["timing"], r.axes["block"]) for r in vf} == {
      (t, b) for t in ("in-loop", "single-call") for b in (1, 3)}
  assert all(len(r.seconds) == 3 for r in vf if r.axes["timing"] == "in-loop")
  assert real.ideal_speedup(studies) > 0

  text = real.summary(real.read(str(out)))
  assert "ngram@k=2" in text and "floor, float32" in text and "verify of 3 tokens" in text
  assert "jspec n-gram answers equal greedy: yes" in text
  assert [os.path.basename(p) for p in real.plot(studies, str(out))] == list(real.FIGURES)

  # A section run alone rewrites its file and keeps the others.
  again = real.run(path, s, str(out), sections=("batch",), workload=CHAT, target=target,
                   progress=False)
  assert set(again) == {"batch"}
  kept = real.read(str(out))
  assert kept["ngram"][1] == ng and kept["verify"][1] == vf and kept["batch"][1] != bt


@pytest.mark.slow
def test_the_gap_where_answers_part_is_the_targets_own(tmp_path):
  """Where transformers' answer parts from jspec's, the top-2 logit gap recorded is the
  target's own at jspec's answer up to there (an unpadded forward)."""
  path = write_tiny_llama(tmp_path / "tiny.gguf")
  target = jspec.load(path, dtype="float32")
  wl = chat(("explain", "explain this code"))
  ids = workloads.encode(target.tokenizer, wl.prompts[0].messages)
  said = np.asarray(jspec.generate(target, np.asarray([ids], np.int32),
                                   max_new_tokens=2).tokens)[0, :2].tolist()
  rec = lambda method, at: records.Record("real", method, "chat", "explain-1", extra={
      "first_difference": [at]} if at is not None else {})
  got = real.top2_gaps(target, wl, [rec("transformers", 2), rec("transformers", None),
                                     rec("plain", 2)], 6)
  top2 = np.sort(np.asarray(target.logits(np.asarray([ids + said], np.int32)))[0, -1])
  assert got[0].extra["top2_gap_at_divergence"] == pytest.approx(top2[-1] - top2[-2],
                                                                 rel=1e-4, abs=1e-5)
  assert "top2_gap_at_divergence" not in got[1].extra  # identical answers: no gap
  assert "top2_gap_at_divergence" not in got[2].extra  # only transformers' records


class _Out(types.SimpleNamespace):
  pass


def test_a_variant_compared_with_another_reference_without_being_held_to_it(capsys):
  """`Variant.reference` / `exact`: a transformers run is compared with its own library's
  greedy run; a difference is recorded with where each row parts, not a mismatch; jspec's
  methods are still held to plain decoding."""
  answer = {"plain": [5, 6, 7, 8], "transformers": [5, 6, 7, 8], "lookup": [5, 9, 7, 8],
            "jspec": [5, 6, 7, 3]}

  def call(target, built, rows, n, temperature, seed, eos, memory, carried):
    name = "plain" if built is None else built.name
    stats = types.SimpleNamespace(target_calls=np.array([n]), position_judged=np.zeros((1, 0)),
                                  position_accepted=np.zeros((1, 0)))
    return lambda k: _Out(tokens=np.array([answer[name][:k]]), lengths=np.array([k]),
                          stats=stats, rounds_by_k=None)

  built = lambda name: types.SimpleNamespace(name=name, drafter=None)
  variants = [runner.plain(), runner.Variant("transformers", built("transformers"), exact=False),
              runner.Variant("lookup", built("lookup"), reference="transformers", exact=False),
              runner.Variant("jspec", built("jspec"))]
  target = types.SimpleNamespace(eos_ids=(0,), tokenizer=None)
  wl = workloads.from_ids("w", [[1, 2, 3]])
  res = runner.run(target, variants, wl, runner.Settings(max_new_tokens=4, repeats=1,
                                                         progress=False), "s", call=call)
  by = {r.method: r for r in res.records}
  assert by["transformers"].equal is True and by["transformers"].extra == {}
  assert by["lookup"].equal is False and by["lookup"].extra == {"first_difference": [1]}
  assert by["jspec"].equal is False and "first_difference" not in by["jspec"].extra
  assert res.mismatches == [{"prompt": "0", "row": 0, "method": "jspec",
                             "first_difference": 3}]
  err = capsys.readouterr().err
  assert "MISMATCH: jspec" in err and "lookup" not in err


@pytest.mark.slow
def test_transformers_backend_runs_beside_jspec_in_one_runner(tmp_path):
  """The backend's `call`: transformers' greedy and prompt-lookup runs timed with jspec's,
  interleaved; tokens, forward calls counted, answers compared with the right reference."""
  require("torch")
  require("transformers")
  from jspec.bench import methods
  from jspec.bench import transformers_backend as T

  path = write_tiny_llama(tmp_path / "tiny.gguf")
  target = jspec.load(path, dtype="float32")
  hf = T.load(path)
  vs = [runner.plain(), runner.Variant("ngram@k=2", methods.build("ngram@k=2", target)),
        T.greedy(hf), T.prompt_lookup(hf, 2, 3)]
  res = runner.run(target, vs, chat(("restate", "abab cdcd abab cdcd abab")),
                   runner.Settings(max_new_tokens=8, repeats=3, progress=False), "s",
                   call=T.call)
  assert res.mismatches == []
  by = {r.method: r for r in res.records}
  assert by["transformers"].axes["library"] == "transformers"
  assert len(by["transformers"].seconds) == 3 and all(t > 0 for t in by["transformers"].seconds)
  assert by["transformers"].tokens == by["transformers"].calls > 0  # one forward per token
  lookup = by["transformers-prompt-lookup@k=2"]
  assert 0 < lookup.calls <= lookup.tokens and lookup.judged == () and lookup.axes["k"] == 2
  assert lookup.equal is not None  # compared with transformers' greedy answer
  with pytest.raises(ValueError, match="batch 1"):
    T.call(target, vs[2].built, [[1, 2], [1, 2]], 4, 0.0, 0, True)
  with pytest.raises(ValueError, match="greedy"):
    T.call(target, vs[2].built, [[1, 2]], 4, 1.0, 0, True)


@pytest.mark.slow
def test_assisted_bench_against_transformers(tmp_path, monkeypatch):
  """`jspec.bench.assisted` on the tiny GGUF with a draft model that borrows its embedding:
  every variant runs in one runner, jspec's speculative answers equal its greedy ones,
  rates and ratios are finite, and the docs' table renders from the records."""
  require("torch")
  require("transformers")
  from jspec.bench import assisted, report
  from jspec.io import draft_checkpoint
  from jspec.recipes import smollm2_draft as recipe_draft

  monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path / "cache"))
  path = write_tiny_llama(tmp_path / "tiny.gguf")
  target = jspec.load(path, dtype="float32")
  config = recipe_draft.draft_config(target.config, 1)
  draft = jspec.models.make_model(config, {**recipe_draft.init_from_target(target.params, [0]),
                                           "embed": target.params["embed"]})
  draft_checkpoint.save_draft(draft, tmp_path / "draft")
  wl = chat(("restate", "abab cdcd abab"), ("question", "why is the sky blue"))
  head, recs = assisted.run(path, str(tmp_path / "draft"), 2, 1, 6, 2, workload=wl,
                            target=target, progress=False)
  assert head["mismatches"] == [] and head["settings"]["k"] == 2
  names = ["plain", "draft@k=2", "draft@k=auto", "transformers", "transformers-assisted@k=2",
           "transformers-assisted@k=2+confidence"]
  assert list(M.group(recs, "method")) == names
  assert set(M.group(recs, "kind")) == {"restate", "question"}
  for name in names:
    mine = M.select(recs, method=name)
    assert sum(r.tokens for r in mine) > 0 and M.tokens_per_s(mine) > 0, name
  for name in ("draft@k=2", "draft@k=auto"):
    assert M.all_equal(M.select(recs, method=name)) is True, name
  assert 1.0 <= M.tau(M.select(recs, method="draft@k=2")) <= 3.0
  for name in names[4:]:
    mine = M.select(recs, method=name)
    assert math.isfinite(M.speedup(M.select(recs, method="transformers"), mine))
    assert all(r.equal is not None for r in mine)  # compared with transformers' greedy
  table = report.assisted_tokens_per_s(head, recs)
  assert len(table.splitlines()) == 2 + 3  # heading, rule, two kinds and "all"
  path_ = records.write(str(tmp_path / "a.jsonl"), head, recs)
  assert records.read(path_)[1] == recs
