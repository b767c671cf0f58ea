"""jspec.recipes.answers: resumable, deduplicated shards of a target's answers, evaluation
prompts excluded. A tiny random model and a character-level "chat template" stand in for
SmolLM2 and its tokenizer."""

import hashlib
import json
import os

import numpy as np
import pytest

from conftest import numpy_drawn_target
from jspec.recipes import answers as A
from jspec.training import corpus

EOS = (3, 10, 17, 24, 31, 38, 45, 52, 59)  # the tiny model's end ids: most rows end early
SETTINGS = dict(batch=4, shard_batches=2, max_new=6, max_prompt=24, seed=7, eos_id=EOS,
                progress=False, log=lambda s: None)


class Interrupted(Exception):
  pass


def encode(text):
  """A stand-in chat template: a BOS id, then one id per character (ids 4..63)."""
  return [1] + [4 + ord(c) % 60 for c in text]


@pytest.fixture(scope="module")
def model():
  return numpy_drawn_target(64)


def chat_prompts():
  with open(os.path.join(os.path.dirname(__file__), "..", "checkpoints",
                         "chat_prompts.json")) as f:
    return [p["content"] for p in json.load(f)]


def pool(extra=()):
  """30 distinct short prompts (lengths vary), plus `extra`, one of which is too long."""
  words = ("alpha", "beta", "gamma", "delta", "eps", "zeta")
  texts = [f"{words[i % 6]} {i}" + "!" * (i % 9) for i in range(30)]
  texts.insert(5, "x" * 40)  # over max_prompt: skipped, never written
  texts.insert(11, texts[3].upper() + "  ")  # the same prompt once normalised: written once
  return [A.Prompt.of(i % len(A.SOURCES), t) for i, t in enumerate(list(texts) + list(extra))]


def shards(out):
  """Every row of every shard of `out`: {prompt hash: (prompt ids, answer ids, temperature)}."""
  manifest = A.read_manifest(out)
  rows = {}
  for entry in manifest["shards"]:
    z = A.load_shard(out, entry)
    for h, (p, a), t in zip(z["prompt_hash"].tolist(), A.rows_of(z), z["temperature"]):
      assert h not in rows, "a prompt written twice"
      rows[h] = (p.tolist(), a.tolist(), float(t))
  return manifest, rows


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_interrupted_and_resumed_equals_uninterrupted(model, tmp_path):
  prompts = pool()
  full = str(tmp_path / "full")
  result = A.generate_answers(model, prompts, encode, full, **SETTINGS)
  manifest, rows = shards(full)
  eligible = {p.hash for p in prompts if len(encode(p.text)) <= 24}
  assert set(rows) == eligible and len(eligible) == 30  # all answered, the long one not
  assert result["skipped"]["long"] == 1  # the normalised duplicate: skipped, once written
  # 20 greedy and 10 sampled prompts (bits of their hashes): the sampled run out first.
  assert [e["rows"] for e in manifest["shards"]] == [8, 8, 6, 4, 4]
  for h, (p, a, t) in rows.items():
    text = next(q.text for q in prompts if q.hash == h)
    assert p == encode(text) and 1 <= len(a) <= 6 and t == np.float32(A.row_settings(h, 7, 0.8)[0])
    assert not set(EOS) & set(a[:-1])  # EOS-terminated: nothing after it
  temps = [t for _, _, t in rows.values()]
  assert 0.0 in temps and np.float32(0.8) in temps
  assert any(a[-1] in EOS for _, a, _ in rows.values())

  # Killed in the second batch of the second shard (the first shard is written), then a
  # kill between a shard's write and its manifest (an orphan file) and a half-written
  # temporary file: the next run redoes the unfinished shard and writes the same files.
  part = str(tmp_path / "part")

  def hook(n):
    if n == 4:
      raise Interrupted

  with pytest.raises(Interrupted):
    A.generate_answers(model, prompts, encode, part, on_batch=hook, **SETTINGS)
  assert [e["rows"] for e in A.read_manifest(part)["shards"]] == [8]
  assert not os.path.exists(os.path.join(part, ".lock"))
  with open(os.path.join(part, "shard-00001.npz"), "wb") as f:
    f.write(b"orphan")
  with open(os.path.join(part, "shard-00002.npz.tmp"), "wb") as f:
    f.write(b"half")
  resumed = A.generate_answers(model, prompts, encode, part, **SETTINGS)
  assert resumed["batches"] == 6  # 8 batches in all, 2 of them in the first run
  again, rows_again = shards(part)
  assert rows_again == rows
  assert [e["sha256"] for e in again["shards"]] == [e["sha256"] for e in manifest["shards"]]
  assert sorted(os.listdir(part)) == sorted(os.listdir(full)) == sorted(
      [".gitignore", A.EXCLUDED, A.MANIFEST] + [e["file"] for e in manifest["shards"]])
  assert A.verify(part) == A.verify(full) == {"shards": 5, "rows": 30,
                                              "answer_tokens": manifest["totals"]["answer_tokens"]}

  # Nothing left: a third run answers nothing and writes nothing.
  done = A.generate_answers(model, prompts, encode, part, **SETTINGS)
  assert done["batches"] == 0 and len(A.read_manifest(part)["shards"]) == 5


def test_hours_stops_after_a_batch_and_keeps_its_rows(model, tmp_path):
  prompts = pool()
  out = str(tmp_path / "out")
  first = A.generate_answers(model, prompts, encode, out, hours=0.0, **SETTINGS)
  assert first["stopped_by_time"] and first["batches"] == 1
  manifest, rows = shards(out)
  assert [e["rows"] for e in manifest["shards"]] == [4]  # the batch done, in a shard
  assert manifest["shards"][0]["greedy_rows"] == 4  # an empty store: the greedy batch first
  # The store now holds more greedy rows, so the next shard starts with the sampled batch:
  # runs stopped after one batch each do not leave the store greedy only.
  A.generate_answers(model, prompts, encode, out, hours=0.0, **SETTINGS)
  second = A.read_manifest(out)["shards"][1]
  assert second["rows"] == 4 and second["greedy_rows"] == 0
  A.generate_answers(model, prompts, encode, out, **SETTINGS)
  _, rows = shards(out)
  assert len(rows) == 30  # none lost, none twice (shards() checks)


def test_manifest_records_what_the_files_hold(model, tmp_path):
  out = str(tmp_path / "out")
  A.generate_answers(model, pool()[:12], encode, out, **SETTINGS)
  manifest = A.read_manifest(out)
  for entry in manifest["shards"]:
    with open(os.path.join(out, entry["file"]), "rb") as f:
      raw = f.read()
    assert hashlib.sha256(raw).hexdigest() == entry["sha256"] and len(raw) == entry["bytes"]
    z = A.load_shard(out, entry)
    assert z["tokens"].dtype == np.uint16 and z["offsets"][-1] == len(z["tokens"])
    assert sum(entry["sources"].values()) == entry["rows"] == len(z["sources"])
    assert entry["machine"]["backend"] == "cpu" and entry["seconds"] > 0
  t = manifest["totals"]
  assert t["rows"] == sum(e["rows"] for e in manifest["shards"]) == 10  # one long, one twice
  assert t["answer_tokens"] == sum(e["answer_tokens"] for e in manifest["shards"])
  with open(os.path.join(out, manifest["shards"][0]["file"]), "r+b") as f:
    f.seek(40)
    f.write(b"\xff")
  with pytest.raises(ValueError, match="sha256"):
    A.verify(out)


def test_head_is_a_store_of_the_first_shards(model, tmp_path):
  """`answers head`: the first N shards copied (checked), totals over them, the source
  named; the copy verifies and reads as a store; bad N or a taken folder is refused."""
  out = str(tmp_path / "out")
  A.generate_answers(model, pool()[:24], encode, out, **SETTINGS)
  full = A.read_manifest(out)
  assert len(full["shards"]) >= 2
  to = str(tmp_path / "head")
  totals = A.head(out, 1, to)
  copy = A.read_manifest(to)
  assert copy["shards"] == full["shards"][:1] and copy["totals"] == totals
  assert totals["rows"] == full["shards"][0]["rows"] < full["totals"]["rows"]
  assert copy["head_of"] == {"store": os.path.normpath(out), "shards": 1,
                             "of": len(full["shards"])}
  assert A.verify(to)["rows"] == totals["rows"]
  _, rows = shards(to)
  _, every = shards(out)
  assert set(rows) < set(every) and all(every[h] == r for h, r in rows.items())
  with pytest.raises(FileExistsError):
    A.head(out, 1, to)
  with pytest.raises(ValueError, match="--shards"):
    A.head(out, len(full["shards"]) + 1, str(tmp_path / "h2"))
  with open(os.path.join(out, full["shards"][0]["file"]), "r+b") as f:
    f.seek(40)
    f.write(b"\xff")
  with pytest.raises(ValueError, match="sha256"):
    A.head(out, 1, str(tmp_path / "h3"))


def test_corpus_writes_every_stored_answer_as_text(model, tmp_path):
  out = str(tmp_path / "out")
  A.generate_answers(model, pool()[:6], encode, out, **SETTINGS)

  class Ids:  # a tokenizer stand-in: ids written out, so the text shows what was decoded
    @staticmethod
    def decode(ids):
      return " ".join(map(str, ids))

  path = str(tmp_path / "corpus.jsonl")
  summary = A.write_corpus(out, Ids, path)
  with open(path) as f:
    texts = [json.loads(line)["text"] for line in f]
  stored = [answer for entry in A.read_manifest(out)["shards"]
            for _, answer in A.rows_of(A.load_shard(out, entry))]
  assert texts == [" ".join(map(str, a.tolist())) for a in stored]
  assert summary == {"rows": len(stored), "answer_tokens": sum(len(a) for a in stored)}
  assert summary["rows"] > 0 and summary["answer_tokens"] > 0


def test_evaluation_prompts_are_never_answered(model, tmp_path):
  chat = chat_prompts()
  bench = tmp_path / "question.jsonl"
  bench.write_text("".join(json.dumps({"question_id": i, "turns": [f"bench q{i}", f"then {i}"]})
                           + "\n" for i in range(3)))
  exclusion = A.exclusion_from_files(
      [os.path.join(os.path.dirname(__file__), "..", "checkpoints", "chat_prompts.json"),
       str(bench)],
      [os.path.join(os.path.dirname(__file__), "..", "checkpoints", "chat_prompts.json")])
  # Exact (up to case and spacing), and the checkpoints' prompts also inside a longer one.
  planted = ["BENCH  Q1", "then 2", chat[6].upper(), "  " + chat[8],
             "Please answer this. " + chat[7] + " Thanks!"]
  assert all(t in exclusion for t in planted + chat)
  assert "bench q9" not in exclusion and "alpha 0" not in exclusion
  out = str(tmp_path / "out")
  # Prompts too long for the tiny model's limit would be skipped anyway: allow them here.
  settings = dict(SETTINGS, max_prompt=400)
  result = A.generate_answers(model, pool(planted), encode, out, exclusion=exclusion, **settings)
  assert result["skipped"]["excluded"] == len(planted)
  _, rows = shards(out)
  assert len(rows) == 31 and not set(rows) & exclusion.hashes
  # Stored next to the shards, the exclusion holds for a later run given none.
  with open(os.path.join(out, A.EXCLUDED)) as f:
    stored = {int(line, 16) for line in f}
  assert stored == set(exclusion.hashes)
  later = A.generate_answers(model, pool([chat[0], "bench q0"]), encode, out, **settings)
  assert later["skipped"] == {"excluded": 2} and later["batches"] == 0


def test_default_exclusion_reads_the_checkpoints_prompts(model, tmp_path):
  files = [os.path.basename(f) for f in A.default_exclusion_files()]
  assert files[:2] == ["chat_prompts.json", "demo_prompts.json"]
  exclusion = A.evaluation_exclusion()
  assert all(t in exclusion for t in chat_prompts())
  # A default file given again as `extra` (by a relative path) is read once.
  again = os.path.relpath(A.default_exclusion_files()[0])
  assert A.evaluation_exclusion([again]).files == exclusion.files
  # Given no exclusion, a run excludes these (and stores them for later runs).
  out = str(tmp_path / "out")
  result = A.generate_answers(model, pool(chat_prompts()[:2])[-6:], encode, out,
                              **dict(SETTINGS, max_prompt=400))
  assert result["skipped"]["excluded"] == 2 and A.read_manifest(out)["totals"]["rows"] == 4
  with open(os.path.join(out, A.EXCLUDED)) as f:
    assert {int(line, 16) for line in f} == set(exclusion.hashes)


def test_pool_is_distinct_and_seeded(tmp_path):
  """The pool over a small stand-in library: distinct prompts from every source, the same
  for the same seed; held-out files never read."""
  import itertools
  names = [f"m{i}.py" for i in range(200)]
  held = next(n for n in names if corpus.is_heldout(n))
  for i, name in enumerate([n for n in names if not corpus.is_heldout(n)][:40] + [held]):
    secret = "HELDOUT" if name == held else ""
    (tmp_path / name).write_text(
        f'"""Module {i}: {"it explains many things about numbers and the words for them. " * 4}'
        f'"""\n\n'
        f"def count_{i}{secret}(items, limit={i}):\n"
        f"  \"\"\"Return the sum of the items modulo {i}.\"\"\"\n  total = 0\n  for x in items:\n"
        f"    total += x % limit\n  return total\n\n\n"
        f"class Box{i}{secret}:\n  \"\"\"A box of things, number {i}.\"\"\"\n\n"
        f"  def put(self, thing):\n    self.things.append(thing)\n    return thing\n")
  root = str(tmp_path)
  docs = dict(A.train_documents(root))
  assert held not in docs and len(docs) == 40
  first = list(A.prompt_pool(0, root))
  assert len({p.hash for p in first}) == len(first) > 3000
  assert {A.SOURCES[p.source] for p in first} == set(A.SOURCES) - {"docs"}  # no topics.py
  assert not any("HELDOUT" in p.text for p in first)
  assert [p.text for p in itertools.islice(A.prompt_pool(0, root), 100)] == \
      [p.text for p in first[:100]]
  assert [p.text for p in itertools.islice(A.prompt_pool(1, root), 100)] != \
      [p.text for p in first[:100]]


def test_a_written_pool_continues_the_store_as_the_pool_would(model, tmp_path):
  # One store runs on; a copy stops after its first shard, writes its next prompts to a file
  # (as for an accelerator machine) and continues from the file: the same shards result.
  prompts = pool(extra=[chat_prompts()[0]])  # an evaluation prompt: never written out
  exclusion = A.exclusion_from_files(A.default_exclusion_files()[:1])
  straight = str(tmp_path / "straight")
  A.generate_answers(model, prompts, encode, straight, exclusion=exclusion, **SETTINGS)

  moved = str(tmp_path / "moved")
  A.generate_answers(model, prompts, encode, moved, exclusion=exclusion, hours=0.0, **SETTINGS)
  assert A.read_manifest(moved)["totals"]["rows"] == 4
  path = str(tmp_path / "next.jsonl")
  written = A.write_pool(path, 1000, moved, exclusion=exclusion, pool=prompts)
  assert written["prompts"] == 32 - 4 - 1  # distinct by hash, minus 4 answered, minus 1 held out
  rows = A.read_pool(path)
  assert chat_prompts()[0] not in [p.text for p in rows]
  assert [p.hash for p in rows] == [h for h in dict.fromkeys(p.hash for p in prompts)
                                    if h in {q.hash for q in rows}]  # pool order kept
  A.generate_answers(model, rows, encode, moved, exclusion=exclusion, **SETTINGS)
  assert shards(moved)[1] == shards(straight)[1]

  first = A.write_pool(str(tmp_path / "two.jsonl"), 2, moved, exclusion=exclusion, pool=prompts)
  assert first["prompts"] == 1  # only the long prompt, which generation skips, is left
  with pytest.raises(ValueError, match="count"):
    A.write_pool(path, 0, moved, pool=prompts)
  with open(path, "w") as f:
    f.write('{"source": "nowhere", "text": "x"}\n')
  with pytest.raises(ValueError, match="not a pool row"):
    A.read_pool(path)
  # With the chat template, the prompts generation would skip for length stay out.
  A.write_pool(path, 1000, str(tmp_path / "fresh"), exclusion=exclusion, pool=prompts,
               encode=encode, max_prompt=24)
  assert "x" * 40 not in [p.text for p in A.read_pool(path)]
