"""DFlash drafters against their reference code (slow lane; pyproject's `parity` extra).

A drafter is built at random with vLLM speculators (`DFlashDraftModel.from_training_args`)
over a tiny random verifier saved by transformers (Llama and Qwen3), at the full vocabulary
and over a reduced draft vocabulary, saved with the reference's own save, loaded by
`jspec.load_drafter`, and run on the same target hidden states for one anchor: the
reference's `_backbone_forward` with a loss mask holding exactly that anchor, against jspec's
`propose` after a prefill and one round's feature window. Block logits within 1e-4 of their
scale, drafted ids equal. Then jspec exports the drafter and the reference loads it back with
`from_pretrained`: the same comparison. z-lab's layout is checked against z-lab's own code
(the `dflash` package, 0.1.0): its `DFlashDraftModel` built at random from a z-lab config and
saved by its `save_pretrained`, run as its engine (`dflash_generate`) runs it, over two rounds
through its draft cache. Last, `jspec measure` runs on the saved drafter.

    python -m pytest -q -p no:xdist -m slow tests/test_dflash_parity.py -s   # prints its rows
"""

import copy
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jspec
from jspec.core.drafter import DraftContext, target_for
from jspec.io import drafter_layouts as PD
from conftest import assert_measure_rows, require

pytestmark = pytest.mark.slow

V, D, H, HKV, DH, F, LAYERS, N, T = 64, 32, 4, 2, 8, 64, 4, 24, 14
BS, ANCHOR, MASK, DRAFT_LAYERS = 4, 7, 63, 2
IDS = [1, 3]  # hidden_states entries: outputs of target layers 0 and 2
TOL = 1e-4
DRAFT_IDS = np.sort(np.random.default_rng(0).choice(V, N, replace=False))


@pytest.fixture(scope="module")
def torch():
  torch = require("torch")
  require("transformers")
  require("speculators")
  return torch


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def verifier(request, torch, tmp_path_factory):
  """(family, HF model, its directory, the jspec target loaded from it)."""
  return _verifier(torch, request.param, tmp_path_factory)


def _verifier(torch, family, tmp_path_factory):
  import transformers as tf

  torch.manual_seed(0)
  kw = dict(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=LAYERS,
            num_attention_heads=H, num_key_value_heads=HKV, head_dim=DH,
            max_position_embeddings=256, tie_word_embeddings=False, initializer_range=0.3)
  if family == "llama":
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**kw))
  else:
    model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**kw))
  path = str(tmp_path_factory.mktemp(f"verifier-{family}"))
  model.eval().save_pretrained(path)
  return family, model, path, jspec.load(path, dtype="float32")


def _randomise(torch, module, seed):
  """Every trained parameter N(0, 0.3), norms 1 + N(0, 0.1): logits with a real spread."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in module.named_parameters():
      if any(s in name for s in ("embed_tokens", "lm_head", "verifier")):
        continue
      noise = torch.randn(p.shape, generator=g)
      p.copy_(1 + 0.1 * noise if "norm" in name else 0.3 * noise)


def _tokens():
  return np.random.default_rng(1).integers(0, V - 1, size=(1, T)).astype(np.int64)


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _reference(torch, m, feats, tokens):
  """Block logits [BS - 1, N or V] of the reference at ANCHOR and its greedy drafts."""
  loss_mask = torch.zeros((1, T), dtype=torch.long)
  loss_mask[0, ANCHOR] = 1  # exactly one valid anchor: the reference picks it
  with torch.no_grad():
    _, logits, _, _, _ = m._backbone_forward(
        torch.from_numpy(feats), torch.from_numpy(tokens), loss_mask,
        torch.zeros((1, T, D)), torch.zeros((1, T), dtype=torch.long), max_anchors=1)
  logits = logits[0, 1:].float().numpy()  # slot 0 is the anchor's, which predicts nothing
  ids = logits.argmax(-1)
  if m.d2t is not None and m.use_draft_vocab:
    ids = ids + m.d2t.numpy()[ids]
  return logits, ids


def _jspec(drafter, feats, tokens):
  """The same from jspec: a prefill of 3 tokens, then one round whose feature window holds
  the rest of the context (slots 2 .. ANCHOR - 1), K = BS - 1 drafts."""
  S, P0 = 32, 3
  toks = jnp.zeros((1, S), jnp.int32).at[:, :T].set(jnp.asarray(tokens, jnp.int32))
  cache = drafter.init(toks[:, :P0], jnp.asarray([P0]), S, jnp.asarray(feats[:, :P0 - 1]))
  window = np.concatenate([feats[:, P0 - 1:ANCHOR], 7.0 * np.ones_like(feats[:, :2])], axis=1)
  context = DraftContext(tokens=toks, lengths=jnp.asarray([ANCHOR + 1], jnp.int32),
                         features=jnp.asarray(window),  # two scratch entries past h_{L-2}
                         feature_start=jnp.asarray([P0 - 1], jnp.int32))
  drafts, _, cache = drafter.propose(cache, context, BS - 1, None,
                                     jax.random.split(jax.random.key(0), 1))
  logits = np.asarray(drafter.block_logits(cache, context, BS - 1)[0])
  return logits, np.asarray(drafts[0])


def _check(key, drafter, m, torch, feats, tokens):
  logits, drafts = _jspec(drafter, feats, tokens)
  ref_logits, ref_ids = _reference(torch, m, feats, tokens)
  worst = _rel(logits, ref_logits)
  print(f"\n| {' | '.join(key)} | {worst:.1e} |", end="")
  assert worst <= TOL, f"{key}: logits differ by {worst:.2e} of their scale"
  np.testing.assert_array_equal(drafts, ref_ids, err_msg=str(key))


@pytest.mark.parametrize("reduced", [False, True], ids=["full-vocab", "draft-vocab"])
def test_speculators_dflash(torch, verifier, tmp_path, reduced):
  from speculators.models.dflash import DFlashDraftModel

  family, hf, vpath, target = verifier
  layer_cfg = copy.deepcopy(hf.config)
  layer_cfg.num_hidden_layers = DRAFT_LAYERS
  kw = {}
  if reduced:
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.from_numpy(DRAFT_IDS)] = True
    kw = dict(t2d=t2d, d2t=torch.from_numpy(DRAFT_IDS - np.arange(N)))
  m = DFlashDraftModel.from_training_args(
      verifier_config=layer_cfg, verifier_name_or_path=vpath,
      draft_vocab_size=N if reduced else V, block_size=BS, target_layer_ids=IDS,
      mask_token_id=MASK, draft_attn_impl="eager", **kw)
  _randomise(torch, m, 1)
  m.eval().save_pretrained(tmp_path / "ref")
  drafter = jspec.load_drafter(tmp_path / "ref", target)
  assert isinstance(drafter, jspec.DFlash)
  assert drafter.feature_layers == tuple(i - 1 for i in IDS)
  assert (drafter.ids is not None) == reduced
  tokens = _tokens()
  # the convention: jspec's features for the drafter's layers are hidden_states[id]
  with torch.no_grad():
    states = hf.model(input_ids=torch.from_numpy(tokens), output_hidden_states=True).hidden_states
  feats = np.asarray(target_for(target, drafter).apply(jnp.asarray(tokens, jnp.int32), None,
                                                       jnp.zeros((1,), jnp.int32))[1])
  np.testing.assert_allclose(feats, np.concatenate([states[i].numpy() for i in IDS], -1),
                             rtol=1e-4, atol=1e-4)
  name = "speculators DFlash" + (" (draft vocab)" if reduced else "")
  _check((name, "load", family), drafter, m, torch, feats, tokens)
  out = PD.export_drafter(drafter, tmp_path / "out", "speculators", verifier=vpath)
  back = DFlashDraftModel.from_pretrained(out).eval()
  back.config.transformer_layer_config._attn_implementation = "eager"  # CPU: no flex attention
  back._attn_impl = "eager"
  from speculators.models.attention import create_float_mask
  back._create_mask_fn = create_float_mask
  _check((name, "export", family), drafter, back, torch, feats, tokens)
  again = jspec.load_drafter(out, target)
  np.testing.assert_array_equal(_jspec(again, feats, tokens)[1], _jspec(drafter, feats, tokens)[1])


def _zlab_reference(torch, zm, hf, feats, tokens):
  """Block logits [BS - 1, V] of z-lab's `DFlashDraftModel` at ANCHOR and its greedy drafts,
  called as its engine (`dflash.model.dflash_generate`) calls it: a first round after a prefill
  of 3 tokens (context: their features; block: the token at slot 3, then mask tokens), the
  draft cache cropped to the context, then the round at ANCHOR whose context is the features of
  slots 3 .. ANCHOR - 1; block embeddings from the verifier's table, logits from its LM head."""
  from dflash.model import _crop_to, _make_cache

  P0 = 3
  f = torch.from_numpy(np.asarray(feats))
  positions = torch.arange(ANCHOR + BS)[None]

  def block(start):
    ids = torch.full((1, BS), MASK, dtype=torch.long)
    ids[0, 0] = int(tokens[0, start])
    return torch.nn.functional.embedding(ids, hf.get_input_embeddings().weight)

  with torch.no_grad():
    cache = _make_cache(zm.config)
    zm(target_hidden=f[:, :P0], noise_embedding=block(P0), position_ids=positions[:, :P0 + BS],
       past_key_values=cache, use_cache=True)
    _crop_to(cache, P0)
    hidden = zm(target_hidden=f[:, P0:ANCHOR], noise_embedding=block(ANCHOR),
                position_ids=positions[:, P0:ANCHOR + BS], past_key_values=cache,
                use_cache=True)[:, 1 - BS:]
    logits = zm.compute_logits(hidden, hf.lm_head)[0].float().numpy()
  return logits, logits.argmax(-1)


def test_zlab_dflash(torch, verifier, tmp_path):
  """A DFlash drafter of z-lab's own code (`dflash` 0.1.0, the package of z-lab's repository):
  its `DFlashDraftModel` built at random over a Qwen3 config with z-lab's fields (block_size,
  num_target_layers, dflash_config: mask token, target layers in layer numbering), saved by
  its `save_pretrained`, recognised as the z-lab layout and loaded by jspec; jspec's block
  logits and drafts after a prefill and one round equal z-lab's drafter run as its engine runs
  it (two rounds through its cache)."""
  require("dflash")
  import transformers as tf
  from dflash.model import DFlashDraftModel

  family, hf, vpath, target = verifier
  config = tf.Qwen3Config(
      vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=DRAFT_LAYERS,
      num_attention_heads=H, num_key_value_heads=HKV, head_dim=DH, max_position_embeddings=256,
      tie_word_embeddings=False, block_size=BS, num_target_layers=LAYERS,
      dflash_config={"mask_token_id": MASK, "target_layer_ids": [i - 1 for i in IDS]})
  zm = DFlashDraftModel(config)
  _randomise(torch, zm, 2)
  zm.eval().save_pretrained(tmp_path / "zlab")
  assert PD.detect_layout(tmp_path / "zlab") == "zlab-dflash"
  drafter = jspec.load_drafter(tmp_path / "zlab", target)
  assert drafter.feature_layers == tuple(zm.target_layer_ids) == tuple(i - 1 for i in IDS)
  tokens = _tokens()
  feats = np.asarray(target_for(target, drafter).apply(jnp.asarray(tokens, jnp.int32), None,
                                                       jnp.zeros((1,), jnp.int32))[1])
  # z-lab's engine reads hidden_states[id + 1] (`extract_context_feature`): jspec's features
  from dflash.model import extract_context_feature
  with torch.no_grad():
    states = hf.model(input_ids=torch.from_numpy(tokens), output_hidden_states=True).hidden_states
  np.testing.assert_allclose(feats, extract_context_feature(states, zm.target_layer_ids).numpy(),
                             rtol=1e-4, atol=1e-4)
  logits, drafts = _jspec(drafter, feats, tokens)
  ref_logits, ref_ids = _zlab_reference(torch, zm, hf, feats, tokens)
  worst = _rel(logits, ref_logits)
  key = ("z-lab DFlash (z-lab's dflash 0.1.0)", "load", family)
  print(f"\n| {' | '.join(key)} | {worst:.1e} |", end="")
  assert worst <= TOL, f"{key}: logits differ by {worst:.2e} of their scale"
  np.testing.assert_array_equal(drafts, ref_ids, err_msg=str(key))


def _char_tokenizer(file):
  """A tokenizer.json that maps each character to one id below V (unknown ones to 0)."""
  from tokenizers import Regex, Tokenizer, models, pre_tokenizers

  chars = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,"[:V - 1]
  vocab = {"[UNK]": 0, **{c: i + 1 for i, c in enumerate(chars)}}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
  tok.save(str(file))


def test_measure_runs_on_a_speculators_dflash(torch, tmp_path_factory, tmp_path):
  """`jspec measure` on the tiny Llama verifier with a speculators DFlash directory (block 5):
  it runs, its answers equal plain greedy's, and its K = 4 row's tau, acceptance and per-prompt
  figures agree with the rounds it counted (`assert_measure_rows`; a random drafter: tau near
  1)."""
  from speculators.models.dflash import DFlashDraftModel

  _, hf, vpath, _ = _verifier(torch, "llama", tmp_path_factory)
  layer_cfg = copy.deepcopy(hf.config)
  layer_cfg.num_hidden_layers = 1
  m = DFlashDraftModel.from_training_args(
      verifier_config=layer_cfg, verifier_name_or_path=vpath, draft_vocab_size=V, block_size=5,
      target_layer_ids=IDS, mask_token_id=MASK, draft_attn_impl="eager")
  m.eval().save_pretrained(tmp_path / "ref")
  # the verifier with a character-level tokenizer, for the command's text prompts
  target_dir = tmp_path / "verifier"
  shutil.copytree(vpath, target_dir)
  _char_tokenizer(target_dir / "tokenizer.json")
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("abcabcabc\n---\nhello world\n")
  out = tmp_path / "measure.json"
  cmd = [sys.executable, "-m", "jspec.tools.cli", "measure", "--target", str(target_dir),
         "--drafter", str(tmp_path / "ref"), "--prompts", str(prompts), "--k", "4",
         "--max-new-tokens", "16", "--repeats", "1", "--json", str(out)]
  run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
  assert run.returncode == 0, run.stderr[-3000:]
  print("\n" + run.stdout)
  report = json.loads(out.read_text())
  assert_measure_rows(report, [4], prompts=2, max_new_tokens=16)
