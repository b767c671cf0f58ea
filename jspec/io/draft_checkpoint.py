"""Draft models that borrow their target's token embedding: a small on-disk form.

A draft model distilled for a target with a large vocabulary spends most of its
parameters on the token embedding (SmolLM2: 49,152 x 576 = 28M of 135M), and it can use
the target's own rows unchanged. Saving them again would make the draft larger than its
layers by several times, so this form leaves them out and `load_draft` takes them from
the target:

    path/
      params/              orbax: the draft's params without the borrowed ones
      draft_config.json    {"format": "jspec-draft", "version", "config_class",
                            "config", "borrowed": ["embed"], "draft_ids", "meta"}:
                            written last, so an interrupted save never loads

`draft_ids` (optional) is the reduced vocabulary the draft scores (FR-Spec,
`jspec.DraftModel.reduced`); a draft saved reduced loads reduced to the same ids.
Loading checks the config, that the draft fits the target (vocabulary, hidden size) and
every stored tensor's shape before reading one.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import quant
from jspec.core.model import Model
from jspec.drafters import params_io
from jspec.drafters.draft_model import DraftModel

CONFIG_FILE = "draft_config.json"
PARAMS_DIR = "params"
FORMAT = "jspec-draft"
FORMAT_VERSION = 1
BORROWABLE = ("embed",)  # params a draft may take from its target (the target's names)


def save_draft(draft: DraftModel | Model, path, *, borrowed=("embed",), meta: dict | None = None,
               dtype=None) -> None:
  """Write a draft model into `path` (new or empty) without the params it borrows.

  draft: a `jspec.DraftModel` (its reduced ids are kept) or a bare `jspec.Model`.
  borrowed: param names left out and taken from the target at load (default the
    token embedding; the draft must have been trained with the target's rows there).
  dtype: cast floating-point params on disk (e.g. "bfloat16").
  """
  ids = None
  if isinstance(draft, DraftModel):
    ids = None if draft.ids is None else np.asarray(draft.ids).tolist()
    draft = draft.model
  if not isinstance(draft, Model) or not dataclasses.is_dataclass(draft.config):
    raise TypeError(f"save_draft takes a jspec.DraftModel or a jspec.Model with a dataclass "
                    f"config, got {type(draft).__name__}")
  borrowed = tuple(borrowed)
  unknown = [b for b in borrowed if b not in BORROWABLE or b not in draft.params]
  if unknown:
    raise ValueError(f"cannot borrow {unknown}: a draft borrows only {BORROWABLE}, and only "
                     f"params it has")
  params = {k: v for k, v in draft.params.items() if k not in borrowed}
  if dtype is not None:
    dt = jnp.dtype(dtype)
    params = jax.tree_util.tree_map(
        lambda x: jnp.asarray(x).astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) else x,
        params)
  params_io.save_dir(path, PARAMS_DIR, params, CONFIG_FILE, {
      "format": FORMAT, "version": FORMAT_VERSION,
      "config_class": type(draft.config).__name__,
      "config": dataclasses.asdict(draft.config), "borrowed": list(borrowed),
      **({"draft_ids": ids} if ids is not None else {}), "meta": meta or {}})


def is_draft_dir(path) -> bool:
  """Whether `path` is a directory written by `save_draft`."""
  return os.path.isfile(os.path.join(os.fspath(path), CONFIG_FILE))


def read_meta(path) -> dict:
  """The free-form meta dict of a saved draft."""
  _, meta = params_io.open_dir(path, CONFIG_FILE, FORMAT, FORMAT_VERSION, "draft model")
  return meta.get("meta") or {}


def load_draft(path, target: Model, dtype="float32") -> DraftModel:
  """A `jspec.DraftModel` for `target` from a directory written by `save_draft`.

  The borrowed params come from `target` (`Model.head`); its vocabulary and hidden size
  must be the draft's. Checked before any tensor is read: the config file, the fit to
  the target and every stored tensor's shape.
  dtype: floating-point params are cast to it (default f32; None keeps stored).
  """
  from jspec import models
  from jspec.io.checkpoint import zoo_config

  path, meta = params_io.open_dir(path, CONFIG_FILE, FORMAT, FORMAT_VERSION, "draft model")
  config_path = os.path.join(path, CONFIG_FILE)
  config = zoo_config(meta, config_path, ("borrowed",))
  borrowed = meta["borrowed"]
  if not isinstance(borrowed, list) or any(b not in BORROWABLE for b in borrowed):
    raise ValueError(f"{config_path}: 'borrowed' must list params among {BORROWABLE}, got "
                     f"{borrowed!r}")
  embed = target.head().embed  # a clear error for a target without an output head
  V, D = embed.shape
  if config.vocab_size != V or (borrowed and config.hidden_size != D):
    raise ValueError(f"draft model in {path} was made for vocab {config.vocab_size} and hidden "
                     f"size {config.hidden_size}; the target has vocab {V} and hidden size {D}")
  shapes = jax.eval_shape(lambda: models.init_params(config, jax.random.key(0)))
  shapes = jax.tree_util.tree_map(lambda x: tuple(x.shape),
                                  {k: v for k, v in shapes.items() if k not in borrowed})
  params = params_io.restore_checked(os.path.join(path, PARAMS_DIR), shapes, dtype, "params",
                                     CONFIG_FILE)
  if "embed" in borrowed:
    # Shared as the target holds it (a quantized target's stays quantized) unless the
    # draft computes in another dtype: then a copy in the draft's.
    if dtype is not None and jnp.dtype(dtype) != jnp.dtype(embed.dtype):
      embed = quant.dequantize(embed).astype(dtype)
    params["embed"] = embed
  model = models.make_model(config, params, eos_ids=tuple(target.eos_ids))
  ids = meta.get("draft_ids")
  if ids is None:
    return DraftModel(model)
  return DraftModel.reduced(model, np.asarray(ids, np.int32))
