"""Training windows from an answer store (`jspec.recipes.answer_windows`) and the EAGLE recipe
trained on them in the published layer form, on a tiny target and a store written here."""

import hashlib
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.drafters import eagle as E
from jspec.recipes import answer_windows as W
from jspec.recipes import answers as A
from jspec.recipes import smollm2_eagle3 as R
from jspec.training import train_eagle as TE
from conftest import tiny_config

V = 32


def write_store(out, rows_per_shard=(5, 4), seed=0):
  """A store of two shards in the answers format: random prompts of 3-8 ids and answers of
  0-20 ids, sources cycling through A.SOURCES. Returns its rows [(prompt, answer, source)]."""
  rng = np.random.default_rng(seed)
  os.makedirs(out)
  entries, every = [], []
  for s, n in enumerate(rows_per_shard):
    rows = [(rng.integers(1, V, rng.integers(3, 9)), rng.integers(1, V, rng.integers(0, 21)),
             (s * 7 + i) % len(A.SOURCES)) for i in range(n)]
    every += [(p, a, A.SOURCES[k]) for p, a, k in rows]
    seqs = [np.concatenate([p, a]) for p, a, _ in rows]
    raw = A.npz_bytes({
        "tokens": np.concatenate(seqs).astype(np.uint16),
        "offsets": np.concatenate([[0], np.cumsum([len(x) for x in seqs])]).astype(np.int64),
        "prompt_lengths": np.asarray([len(p) for p, _, _ in rows], np.int32),
        "sources": np.asarray([k for _, _, k in rows], np.uint8)})
    name = f"shard-{s:05d}.npz"
    with open(os.path.join(out, name), "wb") as f:
      f.write(raw)
    entries.append({"file": name, "rows": n, "sha256": hashlib.sha256(raw).hexdigest(),
                    "answer_tokens": int(sum(len(a) for _, a, _ in rows))})
  totals = {"rows": len(every), "answer_tokens": int(sum(len(a) for _, a, _ in every))}
  with open(os.path.join(out, A.MANIFEST), "w") as f:
    json.dump({"format": A.FORMAT, "sources": list(A.SOURCES), "shards": entries,
               "totals": totals}, f)
  return every


def random_windows(n, seed, width=24):
  """n windows [n, width] of random ids, each row 3-19 ids long, zeros after: (windows, lengths)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, 20, size=(n,))
  windows = np.zeros((n, width), np.int32)
  for i, k in enumerate(lengths):
    windows[i, :k] = rng.integers(1, V, size=(k,))
  return windows, lengths


def test_store_rows_and_seeded_split(tmp_path):
  rows = write_store(str(tmp_path / "store"))
  got = W.store_rows(str(tmp_path / "store"))
  assert len(got) == len(rows) == 9
  for (p, a, s), (q, b, t) in zip(got, rows):
    np.testing.assert_array_equal(p, q)
    np.testing.assert_array_equal(a, b)
    assert s == t
  held, train = W.split(9, 2, None, seed=3)
  assert len(held) == 2 and len(train) == 7 and not set(held) & set(train)
  again = W.split(9, 2, 4, seed=3)
  np.testing.assert_array_equal(again[0], held)  # the cap never moves held-out rows
  assert len(again[1]) == 4 and set(again[1]) <= set(train)
  assert not np.array_equal(W.split(9, 2, None, seed=4)[0], held)
  with pytest.raises(ValueError, match="heldout"):
    W.split(9, 9, None, seed=0)
  with pytest.raises(FileNotFoundError, match="not an answer store"):
    W.store_rows(str(tmp_path))


def test_windows_mask_the_prompt_and_cut_at_the_width():
  prompt, answer = np.arange(1, 6), np.arange(10, 17)  # P = 5, A = 7
  d = W.windows_of([(prompt, answer, "code"), (prompt, answer[:0], "chat")], window=9)
  np.testing.assert_array_equal(d["windows"][0], [1, 2, 3, 4, 5, 10, 11, 12, 13])
  # loss at positions whose next token is an answer token inside the window: 4..7
  np.testing.assert_array_equal(np.flatnonzero(d["valid"][0]), [4, 5, 6, 7])
  assert (d["prompt_lengths"][0], d["answer_lengths"][0]) == (5, 4)
  assert not d["valid"][1].any() and d["answer_lengths"][1] == 0
  assert list(d["kinds"]) == ["code", "chat"]


def test_features_are_the_targets_and_cached(tmp_path):
  """Chunked features at each chunk's own width equal one full-width pass at every position
  a row holds; a second call reads the cache."""
  store = str(tmp_path / "store")
  write_store(store)
  target = jspec.models.init(tiny_config(vocab_size=V, scale=0.5), seed=2)
  data = W.ensure_answer_data(target, str(tmp_path / "work"), store, R.layer_features, window=24,
                              heldout=2, max_windows=None, layers=(0, 1, 1), progress=False)
  assert len(data["heldout_rows"]) == 2 and len(data["train_rows"]) == 7
  feats, logits = TE.target_features(target.with_features((0, 1, 1)),
                                     jnp.asarray(data["windows"]))
  lengths = data["prompt_lengths"] + data["answer_lengths"]
  for i, n in enumerate(lengths):
    np.testing.assert_allclose(np.asarray(data["features"][i, :n], np.float32),
                               np.asarray(feats[i, :n]), rtol=1e-2, atol=1e-2)  # bf16
    np.testing.assert_array_equal(data["labels"][i, :n], np.asarray(jnp.argmax(logits[i, :n], -1)))
  files = sorted(os.listdir(tmp_path / "work"))
  assert len([f for f in files if f.endswith(".npz")]) == 1
  again = W.ensure_answer_data(target, str(tmp_path / "work"), store, None, window=24,
                               heldout=2, max_windows=None, layers=(0, 1, 1), progress=False)
  np.testing.assert_array_equal(again["labels"], data["labels"])
  # Fewer training windows read the same cache (no features computed: None would fail) and
  # train on the split's first rows: nested parts, the held-out rows unchanged.
  rows = data["rows"]
  parts = [W.ensure_answer_data(target, str(tmp_path / "work"), store, None, window=24,
                                heldout=2, max_windows=m, layers=(0, 1, 1), progress=False)
           for m in (2, 5)]
  small, large = (set(rows[p["train_rows"]].tolist()) for p in parts)
  assert len(small) == 2 and len(large) == 5 and small < large
  assert large < set(rows[data["train_rows"]].tolist())
  for p in parts:
    np.testing.assert_array_equal(rows[p["heldout_rows"]], rows[data["heldout_rows"]])
  _, expected = W.split(9, 2, 5, 0)
  assert large == set(expected.tolist())
  assert len([f for f in os.listdir(tmp_path / "work") if f.endswith(".npz")]) == 1


def test_accelerator_prefill_shape_gives_the_cpu_shapes_features():
  """Full-width chunks of 64 rows (an accelerator's shape) and the CPU's short chunks at their
  own widths give the same features and labels at every position a row holds (causal
  attention: padding after a row never reaches it)."""
  assert W.prefill_shape("cpu") == (8, W.WIDTH_STEP) and W.prefill_shape("gpu") == (64, None)
  target = jspec.models.init(tiny_config(vocab_size=V, scale=0.5), seed=2)
  windows, lengths = random_windows(11, seed=0)
  runs = [W.chunked_features(R.layer_features, target, windows, lengths, (0, 1), chunk=c,
                             width_step=w, progress=False) for c, w in ((3, 8), (64, None))]
  (f_cpu, l_cpu), (f_acc, l_acc) = runs
  for i, n in enumerate(lengths):
    np.testing.assert_allclose(np.asarray(f_cpu[i, :n], np.float32),
                               np.asarray(f_acc[i, :n], np.float32), rtol=1e-2, atol=1e-2)
    np.testing.assert_array_equal(l_cpu[i, :n], l_acc[i, :n])


def test_feature_windows_cache_only_what_the_largest_part_trains_on(tmp_path):
  """`feature_windows`: the held-out rows and the split's first N training rows only, under
  their own key; smaller parts read it and hold the same rows as from a full cache; a part
  past N is refused."""
  store = str(tmp_path / "store")
  write_store(store)
  target = jspec.models.init(tiny_config(vocab_size=V, scale=0.5), seed=2)
  kw = dict(window=24, heldout=2, layers=(0, 1), progress=False)
  part = W.ensure_answer_data(target, str(tmp_path / "work"), store, R.layer_features,
                              max_windows=5, feature_windows=5, **kw)
  assert len(part["heldout_rows"]) == 2 and len(part["train_rows"]) == 5
  assert part["features"].shape[0] == 7  # no row beyond the part was prefilled
  full = W.ensure_answer_data(target, str(tmp_path / "work"), store, R.layer_features,
                              max_windows=None, **kw)
  assert len([f for f in os.listdir(tmp_path / "work") if f.endswith(".npz")]) == 2
  small = W.ensure_answer_data(target, str(tmp_path / "work"), store, None, max_windows=3,
                               feature_windows=5, **kw)  # read from the part's cache
  ref = W.ensure_answer_data(target, str(tmp_path / "work"), store, None, max_windows=3, **kw)
  np.testing.assert_array_equal(part["rows"][part["train_rows"]], W.split(9, 2, 5, 0)[1])
  np.testing.assert_array_equal(small["rows"][small["train_rows"]], ref["rows"][ref["train_rows"]])
  for a in (part, small):
    np.testing.assert_array_equal(a["rows"][a["heldout_rows"]], full["rows"][full["heldout_rows"]])
  by_row = {int(r): i for i, r in enumerate(full["rows"])}
  for i, r in enumerate(part["rows"]):
    np.testing.assert_array_equal(part["labels"][i], full["labels"][by_row[int(r)]])
  for bad in (6, None):
    with pytest.raises(ValueError, match="feature_windows"):
      W.ensure_answer_data(target, str(tmp_path / "work"), store, None, max_windows=bad,
                           feature_windows=5, **kw)


@pytest.mark.slow  # training
def test_recipe_trains_the_published_form_on_a_store(tmp_path):
  """`--answers DIR --form published`: a head with the published layer (concat input, no zero
  pair), the store's windows, a manifest that says how much of the store was used."""
  store = str(tmp_path / "store")
  write_store(store)
  target = jspec.models.init(tiny_config(vocab_size=V, layers=4, scale=0.5), seed=2)
  jspec.save(target, str(tmp_path / "target"))
  out = tmp_path / "head"
  rc = R.main(["--out", str(out), "--target", str(tmp_path / "target"), "--work",
               str(tmp_path / "work"), "--answers", store, "--form", "published",
               "--window", "24", "--heldout", "2", "--max-windows", "5", "--vocab", "16",
               "--steps", "3", "--batch-size", "2", "--stages", "data,train", "--no-progress"])
  assert rc == 0
  manifest = json.loads((out / "manifest.json").read_text())
  assert manifest["config"]["input_form"] == "concat" and manifest["config"]["zero_pair"] is False
  data = manifest["data"]
  assert (data["train_windows"], data["heldout_windows"], data["max_windows"]) == (5, 2, 5)
  assert 0 < data["loss_positions"] <= data["train_answer_tokens"]
  head = E.load_eagle(str(out), target)
  assert head.config.input_form == "concat" and not head.config.zero_pair
  assert int(head.ids.shape[0]) == 16
  with pytest.raises(SystemExit, match="--kind eagle3"):
    R.main(["--out", str(out), "--target", str(tmp_path / "target"), "--work",
            str(tmp_path / "work"), "--answers", store, "--form", "published", "--kind",
            "eagle1"])


def test_a_killed_prefill_resumes_at_its_next_chunk(tmp_path):
  """`partial`: the chunks written before a kill are kept on disk and not computed again;
  the result equals an uninterrupted prefill's, and `ensure_answer_data` removes the files
  once its cache is written."""
  target = jspec.models.init(tiny_config(vocab_size=V, scale=0.5), seed=2)
  windows, lengths = random_windows(10, seed=1)
  kw = dict(chunk=3, width_step=8, progress=False)
  f_ref, l_ref = W.chunked_features(R.layer_features, target, windows, lengths, (0, 1), **kw)
  calls = []

  def killed_after(n):
    def fn(*args):
      if len(calls) == n:
        raise KeyboardInterrupt
      calls.append(args[1].shape)
      return R.layer_features(*args)
    return fn

  partial = str(tmp_path / "p")
  with pytest.raises(KeyboardInterrupt):  # 4 chunks of 3 rows: killed in the third
    W.chunked_features(killed_after(2), target, windows, lengths, (0, 1), partial=partial, **kw)
  with open(partial + ".json") as f:
    assert json.load(f)["chunks"] == 2
  calls.clear()
  f, l = W.chunked_features(killed_after(99), target, windows, lengths, (0, 1),
                            partial=partial, **kw)
  assert len(calls) == 2  # the last two chunks only
  np.testing.assert_array_equal(np.asarray(f).view(np.uint16), np.asarray(f_ref).view(np.uint16))
  np.testing.assert_array_equal(l, l_ref)
  # Other windows under the same prefix start over rather than reuse the chunks.
  calls.clear()
  W.chunked_features(killed_after(99), target, windows[::-1].copy(), lengths[::-1].copy(),
                     (0, 1), partial=partial, **kw)
  assert len(calls) == 4
  # The cache of a store: written, then its partial files gone.
  store = str(tmp_path / "store")
  write_store(store)
  work = str(tmp_path / "work")
  W.ensure_answer_data(target, work, store, R.layer_features, window=24, heldout=2,
                       max_windows=None, layers=(0, 1), progress=False)
  assert not [n for n in os.listdir(work) if ".partial" in n]
