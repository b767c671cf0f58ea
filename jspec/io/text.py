"""Text in, text out: `generate_text` over the model's own tokenizer.

A thin host-side layer: encode with `model.tokenizer`, run `jspec.generate`
(or `jspec.speculative_generate` when a draft is given), decode each row.
Everything about decoding itself, exactness included, is the token-id API's.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jspec.planner.api import generate, speculative_generate
from jspec.core.model import Model


def generate_text(model: Model, texts: str | Sequence[str], *, draft=None, num_draft_tokens=4,
                  max_new_tokens, **sampling) -> list[str]:
  """Continuations of `texts` (a string is a batch of one), one string per row.

  Prompts get the tokenizer's special tokens (e.g. BOS); outputs drop the
  stop token and special tokens. `sampling` takes the keyword arguments of
  `jspec.generate` (temperature, top_k, top_p, min_p, the penalties, logit_bias,
  eos_id, seed, cache_length); EOS ids default to the model's own, read from its
  checkpoint.
  """
  tokenizer = model.tokenizer
  if tokenizer is None:
    raise ValueError("model has no tokenizer: load a checkpoint directory that holds "
                     "tokenizer.json (jspec.load), or attach one with "
                     "dataclasses.replace(model, tokenizer=jspec.Tokenizer(...))")
  prompts = tokenizer.encode(texts)
  if draft is None:
    out = generate(model, prompts, max_new_tokens=max_new_tokens, **sampling)
  else:
    out = speculative_generate(model, draft, prompts, num_draft_tokens=num_draft_tokens,
                               max_new_tokens=max_new_tokens, **sampling)
  eos_id = sampling.get("eos_id")
  stop = set(np.asarray(model.eos_ids if eos_id is None else eos_id).reshape(-1).tolist())
  texts_out = []
  for row, n in zip(np.asarray(out.tokens), np.asarray(out.lengths)):
    ids = row[:int(n)].tolist()
    if ids and ids[-1] in stop:
      ids = ids[:-1]
    texts_out.append(tokenizer.decode(ids))
  return texts_out
