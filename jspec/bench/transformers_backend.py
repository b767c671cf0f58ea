"""A second library behind the runner: Hugging Face transformers' `generate`, timed by the same
runner as jspec, interleaved with it, on the same prompts.

    hf = transformers_backend.load(path)              # the same GGUF file, f32, eval mode
    variants = [runner.plain(), transformers_backend.greedy(hf),
                transformers_backend.prompt_lookup(hf, k=4, max_ngram=3)]
    result = runner.run(target, variants, workload, settings, study,
                        call=transformers_backend.call)

`call` is `runner.jspec_call` for jspec's variants and transformers' `generate` for a
variant built here (`HF`): batch 1, greedy, ending at the target's EOS ids or after
max_new_tokens as jspec's answers do. A transformers variant is compared with jspec's
plain greedy answer (or, for a speculative one, with transformers' own greedy: its
`reference`) without being held to it: float sums in another order can flip a near-tie,
so a difference is recorded (`Record.equal`, `extra["first_difference"]`), not a mismatch.

What a transformers run's record holds, beside its tokens and seconds:

  calls             the target model's forward calls during the run, counted by a hook on
                    the model: one per token of greedy decoding, one per verify of prompt
                    lookup or assisted generation (the assistant's own forwards are not
                    the target's and are not counted), so tau = tokens / calls as jspec's;
  rounds            = calls (one row);
  judged, accepted  empty, and rounds_by_k empty: transformers does not expose what it
                    accepted at each draft position, nor its assistant's K per round.

torch and transformers are imported only when a model is loaded or run here (the `bench`
extra: `pip install 'jspec[bench]'`); nothing else in jspec imports this module.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

import numpy as np

from jspec.bench import runner

NAME = "transformers"  # the greedy variant; a speculative one is compared with it


@dataclasses.dataclass(frozen=True)
class HF:
  """A transformers variant's method: the model, its generation settings beyond greedy
  (prompt lookup's, an assistant's), and the assistant model, if any. The fields the runner
  reads of a jspec method (`drafter`, `with_memory`, `tree`) say it carries none."""

  model: Any
  settings: dict = dataclasses.field(default_factory=dict)
  assistant: Any = None
  k: Any = None
  drafter: Any = None
  with_memory: bool = False
  tree: Any = None


@dataclasses.dataclass
class Stats:
  """The counters `records.from_output` reads, as far as transformers says them."""

  target_calls: np.ndarray  # [1]
  position_judged: np.ndarray  # [1, 0]
  position_accepted: np.ndarray  # [1, 0]


@dataclasses.dataclass
class Output:
  """A transformers answer in jspec's output form: tokens [1, N] (-1 after the end)."""

  tokens: np.ndarray
  lengths: np.ndarray
  stats: Stats
  rounds_by_k: dict | None = None
  memory: Any = None


def load(path: str):
  """The GGUF file at `path` through transformers' own GGUF loader, f32, in eval mode (the
  weights dequantised as jspec's loader dequantises them)."""
  import torch
  import transformers

  return transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path),
      dtype=torch.float32).eval()


def from_jspec(model):
  """A jspec model (a draft model) as a transformers model, f32, eval mode, through
  `jspec.save_hf`: the same weights."""
  import torch
  import transformers

  from jspec.io.checkpoint import save_hf

  with tempfile.TemporaryDirectory() as tmp:
    save_hf(model, tmp)
    return transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()


def greedy(hf, name: str = NAME, **axes) -> runner.Variant:
  """transformers' greedy `generate`, compared with jspec's plain greedy answers."""
  return runner.Variant(name, HF(hf), axes={"library": "transformers", **axes}, exact=False)


def prompt_lookup(hf, k: int, max_ngram: int, name: str | None = None,
                  **axes) -> runner.Variant:
  """transformers' prompt-lookup decoding (`prompt_lookup_num_tokens=k`, n-grams up to
  `max_ngram`), compared with transformers' greedy answers."""
  return runner.Variant(
      name or f"transformers-prompt-lookup@k={k}",
      HF(hf, {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": max_ngram}, k=k),
      axes={"library": "transformers", "k": k, **axes}, reference=NAME, exact=False)


def assisted(hf, assistant, k: int, confidence: float = 0.0, name: str | None = None,
             **axes) -> runner.Variant:
  """transformers' assisted generation with `assistant` drafting k tokens a round
  (`num_assistant_tokens_schedule="constant"`); confidence > 0 ends a round's drafting once
  the assistant's confidence falls below an adaptive threshold starting there
  (transformers' default rule, from 0.4), 0 always drafts k. transformers keeps the adapted
  threshold on the assistant across calls: give each such variant its own assistant."""
  return runner.Variant(
      name or f"transformers-assisted@k={k}" + ("+confidence" if confidence else ""),
      HF(hf, {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
              "assistant_confidence_threshold": confidence}, assistant, k),
      axes={"library": "transformers", "k": k, **axes}, reference=NAME, exact=False)


def call(target, built, rows, max_new_tokens: int, temperature: float, seed: int, eos: bool,
         memory=None, carried=None):
  """`runner.run`'s `call`: jspec's for a jspec method, transformers' for an `HF` one."""
  if not isinstance(built, HF):
    return runner.jspec_call(target, built, rows, max_new_tokens, temperature, seed, eos,
                             memory, carried)
  if len(rows) != 1:
    raise ValueError(f"the transformers backend runs batch 1 (prompt lookup and assisted "
                     f"generation take one row), got {len(rows)} rows")
  if temperature != 0 or not eos:
    raise ValueError("the transformers backend runs greedy answers that end at EOS")
  return _generate(built, list(rows[0]), tuple(int(e) for e in target.eos_ids))


def _generate(built: HF, ids: list[int], eos_ids: tuple[int, ...]):
  import torch
  import transformers

  hf, count = built.model, _counter(built.model)
  x = torch.tensor([ids])
  kw = {"assistant_model": built.assistant} if built.assistant is not None else {}

  def fn(n: int) -> Output:
    config = transformers.GenerationConfig(
        max_new_tokens=n, do_sample=False, eos_token_id=list(eos_ids) or None,
        pad_token_id=(list(eos_ids) or [0])[0], **built.settings)
    before = count[0]
    with torch.no_grad():
      seq = hf.generate(x, attention_mask=torch.ones_like(x), generation_config=config, **kw)
    new = seq[0, len(ids):].numpy().astype(np.int32)
    tokens = np.full((1, n), -1, np.int32)
    tokens[0, :len(new)] = new
    return Output(tokens, np.array([len(new)], np.int32),
                  Stats(np.array([count[0] - before]), np.zeros((1, 0), np.int32),
                        np.zeros((1, 0), np.int32)))
  return fn


def _counter(hf) -> list[int]:
  """[forward calls of `hf` so far], kept by a hook registered once per model."""
  if not hasattr(hf, "_jspec_forward_calls"):
    hf._jspec_forward_calls = [0]
    hf.register_forward_hook(lambda module, args, out: _bump(hf._jspec_forward_calls))
  return hf._jspec_forward_calls


def _bump(count: list[int]) -> None:
  count[0] += 1


def versions() -> dict:
  """transformers' and torch's versions and torch's intra-op threads (for a header)."""
  import torch
  import transformers

  return {"transformers": transformers.__version__, "torch": torch.__version__,
          "torch_threads": torch.get_num_threads()}
