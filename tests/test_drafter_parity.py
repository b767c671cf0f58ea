"""Published drafters against their reference code (slow lane; pyproject's `parity` extra).

For each kind, a drafter is built at random with the reference package over a tiny random
verifier saved by transformers (Llama and Qwen3), saved with the reference's own save, loaded
by `jspec.load_drafter`, and run on the same target hidden states: per-position draft logits
within 1e-4 of the logit scale and the same drafted ids, teacher-forced and over three drafting
steps (jspec's cached `propose` against the reference layer rerun on the growing sequence).
Then jspec exports the head and the reference loads it back: the same comparison. The aux-layer
convention is checked on its own: jspec's features for the head's layers equal the Hugging Face
`hidden_states` entries each layout names. speculators' EAGLE-3 options (more decoder layers,
norm_before_fc, fc_norm, norm_output, sliding-window layers) are each compared that way and
against the reference's own training forward as well.

    python -m pytest -q -p no:xdist -m slow tests/test_drafter_parity.py -s   # prints its rows
"""

import copy
import json
import os

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jspec
from jspec.core.drafter import DraftContext, target_for
from jspec.io import drafter_layouts as PD
from conftest import assert_measure_rows, require

pytestmark = pytest.mark.slow

V, D, H, HKV, DH, F, LAYERS, N, T, K = 64, 32, 4, 2, 8, 64, 4, 24, 10, 3
TOL = 1e-4
DRAFT_IDS = np.sort(np.random.default_rng(0).choice(V, N, replace=False))


@pytest.fixture(scope="module")
def torch():
  torch = require("torch")
  require("transformers")
  return torch


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def verifier(request, torch, tmp_path_factory):
  """(family, HF model, its directory, the jspec target loaded from it)."""
  import transformers as tf

  torch.manual_seed(0)
  kw = dict(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=LAYERS,
            num_attention_heads=H, num_key_value_heads=HKV, head_dim=DH,
            max_position_embeddings=256, tie_word_embeddings=False, initializer_range=0.3)
  if request.param == "llama":
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**kw))
  else:
    model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**kw))
  path = str(tmp_path_factory.mktemp(f"verifier-{request.param}"))
  model.eval().save_pretrained(path)
  _word_tokenizer(path)
  return request.param, model, path, jspec.load(path, dtype="float32")


def _word_tokenizer(path):
  """A word-level tokenizer.json ("w0" .. "w63") beside the verifier, so that the command
  line (`jspec measure`) can encode text prompts for it."""
  from tokenizers import Tokenizer, models, pre_tokenizers

  tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w0"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.save(os.path.join(path, "tokenizer.json"))


def _measure(vpath, drafter_dir, tmp_path):
  """`jspec measure --target VERIFIER --drafter DIR --k 4 --json out.json` on a reference-
  written drafter folder: it runs, its answers equal plain greedy's, and its tau and acceptance
  agree with the rounds it counted (`assert_measure_rows`)."""
  from jspec.tools import cli

  prompts = tmp_path / "prompts.txt"
  prompts.write_text("w1 w2 w3 w1 w2 w3 w4\n---\nw5 w6 w7 w8 w5 w6\n")
  out = tmp_path / "measure.json"
  assert cli.main(["measure", "--target", vpath, "--drafter", str(drafter_dir), "--k", "4",
                   "--prompts", str(prompts), "--max-new-tokens", "16", "--repeats", "1",
                   "--json", str(out)]) == 0
  with open(out) as f:
    report = json.load(f)
  assert_measure_rows(report, [4], prompts=2, max_new_tokens=16)
  return report["rows"][0]["tau"]


def _randomise(torch, module, seed):
  """Every parameter N(0, 0.3), norms 1 + N(0, 0.1): logits with a real spread."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in module.named_parameters():
      if "embed_tokens" in name:
        continue
      noise = torch.randn(p.shape, generator=g)
      p.copy_(1 + 0.1 * noise if "norm" in name else 0.3 * noise)


def _tokens():
  return np.random.default_rng(1).integers(0, V, size=(1, T)).astype(np.int64)


def _hf_states(torch, model, tokens):
  with torch.no_grad():
    out = model.model(input_ids=torch.from_numpy(tokens), output_hidden_states=True)
  return [h for h in out.hidden_states], out.last_hidden_state


def _causal(torch, n):
  mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)
  return mask[None, None]


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _compare(key, jspec_logits, ref_logits, jspec_ids, ref_ids):
  """Logits within TOL of their scale, argmax ids equal; prints a row of the parity table
  (`-s`): | layout | direction | verifier | worst relative logit difference |."""
  worst = _rel(jspec_logits, ref_logits)
  print(f"\n| {' | '.join(key)} | {worst:.1e} |", end="")
  assert worst <= TOL, f"{key}: logits differ by {worst:.2e} of their scale"
  np.testing.assert_array_equal(np.asarray(jspec_ids), np.asarray(ref_ids), err_msg=str(key))


# ----------------------------------------------------------------------------- EAGLE heads


def _eagle_jspec(eagle, target, tokens):
  """(teacher-forced draft logits [T, N or V], drafted ids [K]) from jspec: the head over the
  prompt's true pairs, then `propose` after a prefill of two tokens and one catch-up."""
  feats = np.asarray(target_for(target, eagle).apply(jnp.asarray(tokens, jnp.int32),
                                                     None, jnp.zeros((1,), jnp.int32))[1])
  f = eagle.fuse(eagle.params, jnp.asarray(feats))
  prev = jnp.concatenate([jnp.zeros((1, 1, eagle.config.hidden_size)), f[:, :-1]], axis=1)
  slots = jnp.arange(T, dtype=jnp.int32)[None]
  visible = slots[:, :, None] >= slots[:, None, :]
  out, _ = eagle.forward(eagle.params, prev, jnp.asarray(tokens, jnp.int32), None, slots, slots,
                         visible)
  logits = np.asarray(eagle.draft_scores(out)[0])
  S, P0 = 32, 2
  toks = jnp.zeros((1, S), jnp.int32).at[:, :T].set(jnp.asarray(tokens, jnp.int32))
  cache = eagle.init(toks[:, :P0], jnp.asarray([P0]), S, jnp.asarray(feats[:, :P0 - 1]))
  context = DraftContext(tokens=toks, lengths=jnp.asarray([T], jnp.int32),
                         features=jnp.asarray(feats[:, P0 - 1:T - 1]),
                         feature_start=jnp.asarray([P0 - 1], jnp.int32))
  drafts, _, _ = eagle.propose(cache, context, K, None, jax.random.split(jax.random.key(0), 1))
  return logits, np.asarray(drafts[0]), feats


def _eagle_reference(torch, layer_fn, head_fn, to_target, fuse, feats, tokens):
  """The same through the reference's modules: `layer_fn(ids, hidden, mask, positions)`
  runs its decoder layer over a whole sequence (no cache), `head_fn` gives draft logits,
  `to_target` maps draft ids to target ids. The sequence is what the reference engines feed:
  the pairs (h_j, e(t_{j+1})), no pair for t_0; drafting reruns the layer on the growing
  sequence, true pairs then (predicted feature, drafted token) pairs."""
  with torch.no_grad():
    hidden = fuse(torch.from_numpy(feats))[:, :-1]
    ids = torch.from_numpy(tokens)[:, 1:]

    def run(hidden, ids):
      n = ids.shape[1]
      return layer_fn(ids, hidden, _causal(torch, n), torch.arange(n)[None])

    out = run(hidden, ids)
    logits = head_fn(out)[0].numpy()
    drafts = []
    for _ in range(K):
      d = int(to_target(int(head_fn(out)[0, -1].argmax())))
      drafts.append(d)
      hidden = torch.cat([hidden, out[:, -1:]], dim=1)
      ids = torch.cat([ids, torch.tensor([[d]])], dim=1)
      out = run(hidden, ids)
  return logits, np.asarray(drafts)


def _check_eagle(torch, key, eagle, target, tokens, layer_fn, head_fn, to_target, fuse):
  logits, drafts, feats = _eagle_jspec(eagle, target, tokens)
  ref_logits, ref_drafts = _eagle_reference(torch, layer_fn, head_fn, to_target, fuse, feats,
                                            tokens)
  logits = logits[1:]  # slot 0 holds the zero pair, which the published heads never see
  _compare(key, logits, ref_logits, logits.argmax(-1), ref_logits.argmax(-1))
  np.testing.assert_array_equal(drafts, ref_drafts, err_msg=f"{key}: drafted ids")


def _speculators_fns(torch, m):
  """speculators' Eagle3DraftModel as vLLM runs it on a sequence: fuse (its input_norm or
  fc_norm, then fc), every decoder layer (the window layers under the reference's own
  sliding-window mask), the final norm fed back under norm_output, else before the LM head."""
  from speculators.models.attention import create_float_mask
  from speculators.models.eagle3.attention import create_combined_mask_mod

  def window_mask(n):
    mod = create_combined_mask_mod(torch.zeros(n, dtype=torch.long), n,
                                   sliding_window=m.sliding_window)
    return create_float_mask(mod, Q_LEN=n, KV_LEN=n, device="cpu", dtype=torch.float32)

  def layer_fn(ids, hidden, mask, pos):
    x = torch.cat([m.embed_tokens(ids), hidden], dim=-1)
    embeddings = m.rotary_emb(x, pos)
    windowed = window_mask(ids.shape[1]) if m.uses_sliding_window_attn else None
    for i, layer in enumerate(m.layers):
      x = layer(x, attention_mask=windowed if i in m.sliding_window_indices else mask,
                position_ids=pos, position_embeddings=embeddings)
    return m.norm(x) if m.config.norm_output else x

  def fuse(x):
    if m.input_norm is not None:
      x = m.input_norm(x)
    if m.fc_norm is not None:
      x = torch.cat([norm(c) for norm, c in zip(m.fc_norm, x.chunk(len(m.fc_norm), dim=-1))],
                    dim=-1)
    return m.fc(x)

  d2t = m.d2t.numpy()
  head_fn = m.lm_head if m.config.norm_output else (lambda h: m.lm_head(m.norm(h)))
  return layer_fn, head_fn, lambda i: i + int(d2t[i]), fuse


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_speculators_eagle3(torch, verifier, tmp_path, norm_before_residual):
  require("speculators")
  from speculators.models.eagle3 import Eagle3DraftModel

  family, hf, vpath, target = verifier
  layer_cfg = copy.deepcopy(hf.config)
  layer_cfg.num_hidden_layers = 1
  t2d = torch.zeros(V, dtype=torch.bool)
  t2d[torch.from_numpy(DRAFT_IDS)] = True
  ids = [1, 2, 3]  # hidden_states entries: outputs of layers 0, 1, 2
  m = Eagle3DraftModel.from_training_args(
      verifier_config=layer_cfg, verifier_name_or_path=vpath, draft_vocab_size=N,
      norm_before_residual=norm_before_residual, ttt_steps=3, t2d=t2d,
      d2t=torch.from_numpy(DRAFT_IDS - np.arange(N)), target_layer_ids=ids,
      draft_attn_impl="eager")
  _randomise(torch, m, 1)
  m.eval().save_pretrained(tmp_path / "ref")
  eagle = jspec.load_drafter(tmp_path / "ref", target)
  assert eagle.feature_layers == (0, 1, 2) and eagle.config.qk_norm == (family == "qwen3")
  if not norm_before_residual:
    _measure(vpath, tmp_path / "ref", tmp_path)
  tokens = _tokens()
  # the convention: jspec's features are hidden_states[id] for each id
  states, _ = _hf_states(torch, hf, tokens)
  feats = _eagle_jspec(eagle, target, tokens)[2]
  np.testing.assert_allclose(feats, np.concatenate([states[i].numpy() for i in ids], -1),
                             rtol=1e-4, atol=1e-4)
  name = "speculators" + (" (norm_before_residual)" if norm_before_residual else "")
  _check_eagle(torch, (name, "load", family), eagle, target, tokens,
               *_speculators_fns(torch, m))
  out = PD.export_drafter(eagle, tmp_path / "out", "speculators", verifier=vpath)
  back = Eagle3DraftModel.from_pretrained(out).eval()
  back.config.transformer_layer_config._attn_implementation = "eager"  # CPU: no flex attention
  _check_eagle(torch, (name, "export", family), eagle, target, tokens,
               *_speculators_fns(torch, back))


# speculators' Eagle3DraftModel options, each on its own (plus the layer count the option is
# read with): (changes to the decoder layers' config, the model's flags).
SLIDING, FULL = "sliding_attention", "full_attention"
EAGLE3_OPTIONS = {
    "3 decoder layers": (dict(num_hidden_layers=3), {}),
    "norm_before_fc": ({}, dict(norm_before_fc=True)),
    "fc_norm": ({}, dict(fc_norm=True)),
    "norm_output, 2 layers": (dict(num_hidden_layers=2), dict(norm_output=True)),
    "sliding window, 2 layers": (dict(num_hidden_layers=2, layer_types=[SLIDING, FULL],
                                      sliding_window=3), {}),
}


def _jspec_ttt(eagle, target, tokens, steps):
  """jspec's draft scores for speculators' training forward: step s at position j is the head
  after a catch-up over the true pairs up to slot j + 1 (the pair (h_j, e(t_{j+1}))), then s
  pairs (its previous output, e(t_{j+1+r})) at slots j + 1 + r, through the cache (one
  catch-up over every true pair serves each j: a slot's output depends on slots up to its
  own, and each step overwrites the slot it writes before anything attends to it).
  Returns [step] of [j, N] for every j the step reaches within the tokens."""
  T = tokens.shape[1]
  feats = jnp.asarray(target_for(target, eagle).apply(jnp.asarray(tokens, jnp.int32), None,
                                                      jnp.zeros((1,), jnp.int32))[1])
  fused = eagle.fuse(eagle.params, feats)
  toks = jnp.asarray(tokens, jnp.int32)
  forward = jax.jit(eagle.forward)
  S = T + steps
  prev = jnp.concatenate([jnp.zeros((1, 1, eagle.config.hidden_size)), fused[:, :-1]], axis=1)
  slots = jnp.arange(T, dtype=jnp.int32)[None]
  caught, full = forward(eagle.params, prev, toks, eagle.init_cache(1, S), slots, slots,
                         slots[:, :, None] >= jnp.arange(S)[None, None, :])
  out = [[] for _ in range(steps)]
  for j in range(T - 1):
    f, cache = caught[:, j + 1:j + 2], full
    for s in range(steps):
      if j + 1 + s >= T:
        break
      if s:
        slot = jnp.asarray([[j + 1 + s]], jnp.int32)
        f, cache = forward(eagle.params, f, toks[:, j + 1 + s:j + 2 + s], cache, slot, slot,
                           jnp.arange(S)[None, None, :] <= j + 1 + s)
      out[s].append(np.asarray(eagle.draft_scores(f)[0, 0]))
  return [np.stack(rows) for rows in out]


def _reference_ttt(torch, m, feats, tokens, steps):
  """speculators' own training forward (`Eagle3DraftModel.forward`, teacher forcing, eager
  masks) on the pairs (h_j, e(t_{j+1})): each step's draft logits, read at its LM head."""
  logits = []
  hook = m.lm_head.register_forward_hook(lambda mod, args, out: logits.append(out[0].detach()))
  try:
    with torch.no_grad():
      n = tokens.shape[1] - 1
      m(hidden_states=torch.from_numpy(np.asarray(feats))[:, :-1],
        input_ids=torch.from_numpy(tokens)[:, 1:], document_ids=torch.zeros(1, n, dtype=torch.long),
        ttt_steps=steps)
  finally:
    hook.remove()
  return [x.numpy() for x in logits]


@pytest.mark.parametrize("option", list(EAGLE3_OPTIONS))
def test_speculators_eagle3_options(torch, verifier, tmp_path, option):
  """Each option of speculators' Eagle3DraftModel (more decoder layers, norm_before_fc,
  fc_norm, norm_output, sliding-window layers), built and saved by the reference, loads into
  jspec and drafts as the reference does: against its layers rerun on the growing sequence
  (as vLLM drafts), and against its own training forward (step 0 for every option; the later
  teacher-forced steps too, except under a window: there the training forward counts the
  window from the step's first position while vLLM and jspec count it from the draft's own).
  Exported back and loaded by `from_pretrained`: the same. A reference-built three-layer head
  through `jspec measure`: answers equal to plain greedy decoding."""
  require("speculators")
  from speculators.models.eagle3 import Eagle3DraftModel

  family, hf, vpath, target = verifier
  layer_changes, flags = EAGLE3_OPTIONS[option]
  layer_cfg = copy.deepcopy(hf.config)
  layer_cfg.num_hidden_layers = 1
  for key, value in layer_changes.items():
    setattr(layer_cfg, key, value)
  if "sliding_window" in layer_changes and family == "qwen3":
    layer_cfg.use_sliding_window = True  # else Qwen3Config drops the window when it is read back
  t2d = torch.zeros(V, dtype=torch.bool)
  t2d[torch.from_numpy(DRAFT_IDS)] = True
  m = Eagle3DraftModel.from_training_args(
      verifier_config=layer_cfg, verifier_name_or_path=vpath, draft_vocab_size=N,
      norm_before_residual=False, ttt_steps=K, t2d=t2d,
      d2t=torch.from_numpy(DRAFT_IDS - np.arange(N)), target_layer_ids=[1, 2, 3],
      draft_attn_impl="eager", **flags)
  _randomise(torch, m, 6)
  m.eval().save_pretrained(tmp_path / "ref")
  eagle = jspec.load_drafter(tmp_path / "ref", target)
  c = eagle.config
  assert (c.num_layers, c.norm_before_fc, c.fc_norm, c.norm_output) == (
      layer_changes.get("num_hidden_layers", 1), flags.get("norm_before_fc", False),
      flags.get("fc_norm", False), flags.get("norm_output", False))
  windowed = "sliding_window" in layer_changes
  assert (c.sliding_window, c.window_layers) == ((3, (0,)) if windowed else (None, ()))
  if option == "3 decoder layers":
    _measure(vpath, tmp_path / "ref", tmp_path)
  tokens = _tokens()
  name = f"speculators ({option})"
  for direction, model in (("load", m), ("export", None)):
    if model is None:
      out = PD.export_drafter(eagle, tmp_path / "out", "speculators", verifier=vpath)
      model = Eagle3DraftModel.from_pretrained(out).eval()
      # CPU: eager attention and its float masks, as from_training_args(draft_attn_impl=
      # "eager") set them on the model built above (from_pretrained picks flex attention)
      model.config.transformer_layer_config._attn_implementation = "eager"
      model._attn_impl, model._create_mask_fn = m._attn_impl, m._create_mask_fn
    _check_eagle(torch, (name, direction, family), eagle, target, tokens,
                 *_speculators_fns(torch, model))
    feats = _eagle_jspec(eagle, target, tokens)[2]
    ref = _reference_ttt(torch, model, feats, tokens, K)
    got = _jspec_ttt(eagle, target, tokens, K)
    for s in range(1 if windowed else K):
      n = got[s].shape[0]
      _compare((name, f"{direction}, training step {s}", family), got[s], ref[s][:n],
               got[s].argmax(-1), ref[s][:n].argmax(-1))


def _specforge_fns(torch, m):
  def layer_fn(ids, hidden, mask, pos):
    return m.backbone(input_embeds=m.embed_input_ids(ids), hidden_states=hidden,
                      cache_hidden=None, attention_mask=mask, position_ids=pos, use_cache=False)
  d2t = m.d2t.numpy()
  return layer_fn, m.compute_logits, lambda i: i + int(d2t[i]), m.project_hidden_states


def test_specforge_eagle3(torch, verifier, tmp_path):
  require("specforge")
  import transformers as tf
  from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3

  family, hf, vpath, target = verifier
  ids = [0, 1, 2]  # layer outputs: hidden_states entries 1, 2, 3
  config = tf.LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=1,
                          num_attention_heads=H, num_key_value_heads=HKV, head_dim=DH,
                          max_position_embeddings=256, draft_vocab_size=N,
                          eagle_config={"eagle_aux_hidden_state_layer_ids": ids},
                          architectures=["LlamaForCausalLMEagle3"])
  with torch._dynamo.config.patch(disable=True):  # its norms are torch.compile'd
    m = LlamaForCausalLMEagle3(config)
    _randomise(torch, m, 2)
    with torch.no_grad():
      m.embed_tokens.weight.copy_(hf.model.embed_tokens.weight)
      m.t2d.zero_()
      m.t2d[torch.from_numpy(DRAFT_IDS)] = True
      m.d2t.copy_(torch.from_numpy(DRAFT_IDS - np.arange(N)))
    m.eval().save_pretrained(tmp_path / "ref")
    eagle = jspec.load_drafter(tmp_path / "ref", target)
    assert eagle.feature_layers == tuple(ids)
    tokens = _tokens()
    states, _ = _hf_states(torch, hf, tokens)
    feats = _eagle_jspec(eagle, target, tokens)[2]
    np.testing.assert_allclose(feats, np.concatenate([states[i + 1].numpy() for i in ids], -1),
                               rtol=1e-4, atol=1e-4)
    _check_eagle(torch, ("specforge", "load", family), eagle, target, tokens,
                 *_specforge_fns(torch, m))
    out = PD.export_drafter(eagle, tmp_path / "out", "specforge")
    # SpecForge's from_pretrained under transformers 5 leaves its rotary tables (buffers
    # outside the state dict) uninitialised, for its own saves too: build the model from the
    # exported config and load the exported tensors strictly instead
    from safetensors.torch import load_file

    back = LlamaForCausalLMEagle3(tf.LlamaConfig.from_pretrained(out))
    back.load_state_dict(load_file(os.path.join(out, "model.safetensors")), strict=True)
    back.eval()
    _check_eagle(torch, ("specforge", "export", family), eagle, target, tokens,
                 *_specforge_fns(torch, back))


def _eagle1_fns(torch, m, hf):
  def layer_fn(ids, hidden, mask, pos):
    del mask, pos  # the reference builds its own causal mask and positions
    return m(hidden, ids)

  return layer_fn, hf.lm_head, lambda i: i, lambda f: f


def test_eagle1(torch, verifier, tmp_path):
  require("eagle")
  from eagle.model.cnets import Model
  from eagle.model.configs import EConfig

  family, hf, vpath, target = verifier
  config = EConfig(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=1,
                   num_attention_heads=H, num_key_value_heads=HKV, max_position_embeddings=256)
  # transformers 5 fills rope_scaling with its default dict, which eagle-llm 1.2.1 reads as a
  # scaling of an unknown type; None is what it expects for plain rotary embeddings
  config.rope_scaling = None
  m = Model(config, bias=True)
  _randomise(torch, m, 3)
  with torch.no_grad():
    m.embed_tokens.weight.copy_(hf.model.embed_tokens.weight)  # eagle-llm's load_emb
  os.makedirs(tmp_path / "ref")
  torch.save(m.state_dict(), tmp_path / "ref" / "pytorch_model.bin")
  config.to_json_file(str(tmp_path / "ref" / "config.json"))
  m.eval()
  eagle = jspec.load_drafter(tmp_path / "ref", target)
  assert eagle.feature_layers == () and not eagle.config.attn_norm
  tokens = _tokens()
  _, last = _hf_states(torch, hf, tokens)
  feats = _eagle_jspec(eagle, target, tokens)[2]
  np.testing.assert_allclose(feats, last.numpy(), rtol=1e-4, atol=1e-4)  # the final hidden
  _check_eagle(torch, ("eagle1", "load", family), eagle, target, tokens, *_eagle1_fns(torch, m, hf))
  out = PD.export_drafter(eagle, tmp_path / "out", "eagle1")
  config = EConfig.from_pretrained(out)
  config.rope_scaling = None
  with open(os.path.join(out, "config.json")) as f:
    back = Model(config, bias=json.load(f)["bias"])
  back.load_state_dict(torch.load(os.path.join(out, "pytorch_model.bin")), strict=True)
  back.eval()
  _check_eagle(torch, ("eagle1", "export", family), eagle, target, tokens,
               *_eagle1_fns(torch, back, hf))


# ----------------------------------------------------------------------------- Medusa


def _medusa_heads(torch, heads, layers):
  from medusa.model.medusa_model import ResBlock

  return torch.nn.ModuleList([torch.nn.Sequential(*([ResBlock(D)] * layers),
                                                  torch.nn.Linear(D, V, bias=False))
                              for _ in range(heads)])


@pytest.mark.parametrize("layers", [1, 2])
def test_medusa(torch, verifier, tmp_path, layers):
  require("medusa")
  from medusa.model.medusa_model import MedusaConfig

  family, hf, vpath, target = verifier
  heads = _medusa_heads(torch, 3, layers)
  _randomise(torch, heads, 4)
  os.makedirs(tmp_path / "ref")
  torch.save(heads.state_dict(), tmp_path / "ref" / "medusa_lm_head.pt")
  MedusaConfig(medusa_num_heads=3, medusa_num_layers=layers,
               base_model_name_or_path=vpath).save_pretrained(str(tmp_path / "ref"))
  medusa = jspec.load_drafter(tmp_path / "ref", target)
  tokens = _tokens()
  _, last = _hf_states(torch, hf, tokens)
  h = jnp.asarray(last.numpy())

  def check(direction, module):
    with torch.no_grad():
      ref = torch.stack([module[k](last) for k in range(3)], dim=2)[0].numpy()  # [T, K, V]
    got = np.asarray(medusa.logits(h)[0])
    _compare((f"medusa ({layers} block{'s' if layers > 1 else ''})", direction, family), got,
             ref, got.argmax(-1), ref.argmax(-1))

  check("load", heads)
  out = PD.export_drafter(medusa, tmp_path / "out", "medusa", verifier=vpath)
  config = MedusaConfig.from_pretrained(out)
  assert (config.medusa_num_heads, config.medusa_num_layers) == (3, layers)
  back = _medusa_heads(torch, 3, layers)
  back.load_state_dict(torch.load(os.path.join(out, "medusa_lm_head.pt")), strict=True)
  check("export", back)


# ----------------------------------------------------------------------------- MTP


def _mtp_fns(torch, m):
  """speculators' MTP module as `_eagle_reference` runs it: its layer over the pairs
  (h_j, e(t_{j+1})), the verifier's LM head on its (final-normed) output, which is also the
  hidden state the next step reads."""
  def layer_fn(ids, hidden, mask, pos):
    return m.mtp_layers[0](hidden_states=hidden, token_embeddings=m.embed_tokens(ids),
                           attention_mask=mask, position_ids=pos,
                           position_embeddings=m.rotary_emb(hidden, pos))
  return layer_fn, m.lm_head, lambda i: i, lambda f: f


def test_speculators_mtp(torch, verifier, tmp_path):
  """An MTP module built by speculators (its layer is Qwen3's; over the Llama verifier too, a
  Qwen3 layer of the verifier's sizes), saved by its `save_pretrained` (without the
  verifier's embedding and LM head, which `from_pretrained` reloads from the verifier),
  loaded as a `jspec.MTP`; exported back and reloaded by `from_pretrained`."""
  require("speculators")
  import transformers as tf
  from speculators.config import SpeculatorsConfig, VerifierConfig
  from speculators.models.mtp import MTPDraftModel
  from speculators.models.mtp.config import MTPSpeculatorConfig
  from speculators.proposals.greedy import GreedyTokenProposalConfig

  family, hf, vpath, target = verifier
  layer = tf.Qwen3Config(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=1,
                         num_attention_heads=H, num_key_value_heads=HKV, head_dim=DH,
                         max_position_embeddings=256, tie_word_embeddings=False,
                         rope_theta=float(hf.config.rope_parameters["rope_theta"]))
  config = MTPSpeculatorConfig(
      transformer_layer_config=layer,
      speculators_config=SpeculatorsConfig(
          algorithm="mtp", default_proposal_method="greedy",
          proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=K)],
          verifier=VerifierConfig.from_pretrained(vpath)))
  m = MTPDraftModel(config)
  m.load_verifier_weights()
  g = torch.Generator().manual_seed(5)
  with torch.no_grad():  # the module's own weights at random; the verifier's stay
    for name, p in m.named_parameters():
      if name.startswith("mtp_layers."):
        noise = torch.randn(p.shape, generator=g)
        p.copy_(1 + 0.1 * noise if "norm" in name else 0.3 * noise)
  m.eval().save_pretrained(tmp_path / "ref")
  module = jspec.load_drafter(tmp_path / "ref", target)
  assert isinstance(module, jspec.MTP) and module.feature_layers == ()
  _measure(vpath, tmp_path / "ref", tmp_path)
  tokens = _tokens()
  _, last = _hf_states(torch, hf, tokens)
  feats = _eagle_jspec(module, target, tokens)[2]
  np.testing.assert_allclose(feats, last.numpy(), rtol=1e-4, atol=1e-4)  # the final hidden
  ref = MTPDraftModel.from_pretrained(tmp_path / "ref").eval()
  # The pairing, from the reference's own training forward: its first step's logits at
  # position j read (h_j, e(t_{j+1})), as jspec's pair at slot j + 1 does.
  with torch.no_grad():
    steps = ref(input_ids=torch.from_numpy(tokens), hidden_states=last)[0]
  first = steps[0][0].numpy()  # [T - K - 1, V]
  got = np.asarray(_eagle_jspec(module, target, tokens)[0])[1:1 + first.shape[0]]
  _compare(("speculators mtp", "training forward", family), got, first, got.argmax(-1),
           first.argmax(-1))
  _check_eagle(torch, ("speculators mtp", "load", family), module, target, tokens,
               *_mtp_fns(torch, ref))
  out = PD.export_drafter(module, tmp_path / "out", "speculators", verifier=vpath)
  back = MTPDraftModel.from_pretrained(out).eval()
  _check_eagle(torch, ("speculators mtp", "export", family), module, target, tokens,
               *_mtp_fns(torch, back))
