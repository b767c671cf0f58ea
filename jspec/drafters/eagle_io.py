"""Saving and loading EAGLE heads (`jspec.drafters.eagle`): params/ (orbax) and
eagle_config.json with the head's config, the reduced vocabulary it drafts over (if
any) and free-form meta. Loading checks the config, the fit to the target and every
tensor's shape before reading a tensor."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core.model import Model
from jspec.drafters import params_io
from jspec.drafters.eagle import CONFIG_FILE, FORMAT, FORMAT_VERSION, PARAMS_DIR, Eagle
from jspec.drafters.eagle_head import EagleConfig, check_params, param_shapes, target_head

def save_eagle(params, path, meta: dict | None = None, *, config: EagleConfig | None = None,
               dtype=None) -> None:
  """Write an EAGLE head into `path` (new or empty): params/ (orbax) and eagle_config.json.

  params: an `Eagle` (its head params and config are saved) or a head-params dict
  together with its `config`.
  meta: JSON-ready extra information kept in the config file.
  dtype: cast floating-point params to this dtype on disk (e.g. "bfloat16").
  The config file is written last (`jspec.drafters.params_io`): a directory without it never loads.
  """
  ids = None
  if isinstance(params, Eagle):
    config = params.config if config is None else config
    ids = None if params.ids is None else np.asarray(params.ids).tolist()
    params = params.params
  if not isinstance(params, dict):
    raise TypeError(f"save_eagle takes an Eagle or a head-params dict, got "
                    f"{type(params).__name__}")
  if config is None:
    raise ValueError("save_eagle needs config= (an EagleConfig) with a bare params dict: the "
                     "vocabulary size and constants are not in the shapes")
  check_params(params, config)
  if dtype is not None:
    dt = jnp.dtype(dtype)
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x).astype(dt), params)
  params_io.save_dir(path, PARAMS_DIR, params, CONFIG_FILE,
                     {"format": FORMAT, "version": FORMAT_VERSION, "config": config.to_dict(),
                      "meta": meta or {}, **({"draft_ids": ids} if ids is not None else {})})


def read_config(path) -> tuple[EagleConfig, dict]:
  """The `EagleConfig` and meta dict of a saved head, checked."""
  path, meta = params_io.open_dir(path, CONFIG_FILE, FORMAT, FORMAT_VERSION, "EAGLE head")
  config_path = os.path.join(path, CONFIG_FILE)
  if not isinstance(meta.get("config"), dict):
    raise ValueError(f"{config_path}: missing field 'config'")
  try:
    config = EagleConfig.from_dict(meta["config"])
  except (TypeError, ValueError) as e:
    raise ValueError(f"{config_path}: invalid EAGLE config: {e}") from e
  return config, meta.get("meta") or {}


def read_draft_ids(path) -> np.ndarray | None:
  """The reduced vocabulary a saved head drafts over (`Eagle.reduced`), or None: all ids."""
  path, meta = params_io.open_dir(path, CONFIG_FILE, FORMAT, FORMAT_VERSION, "EAGLE head")
  ids = meta.get("draft_ids")
  return None if ids is None else np.asarray(ids, np.int32)


def load_eagle(path, target: Model, dtype="float32") -> Eagle:
  """An `Eagle` for `target` from a directory written by `save_eagle`.

  Checks, before reading any tensor: the config file, that the head fits the
  target (hidden size and vocabulary), and every stored tensor's shape. A head saved
  with a reduced vocabulary comes back reduced to the same ids.
  dtype: floating-point params are cast to it (default f32; None keeps stored).
  """
  config, _ = read_config(path)
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  embed, _ = target_head(target)  # a clear error for a target without an output head
  V, D = embed.shape
  if config.hidden_size != D or config.vocab_size != V:
    raise ValueError(f"EAGLE head in {path} was made for hidden size {config.hidden_size} and "
                     f"vocab {config.vocab_size}; the target has hidden size {D} "
                     f"and vocab {V}")
  params = params_io.restore_checked(os.path.join(path, PARAMS_DIR), param_shapes(config), dtype,
                                     "params", CONFIG_FILE)
  eagle = Eagle.from_target(target, params, config)
  ids = read_draft_ids(path)  # saved with a reduced-vocabulary head: it drafts over them again
  return eagle if ids is None else eagle.reduced(ids)
