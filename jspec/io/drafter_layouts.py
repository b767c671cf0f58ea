"""Drafters published by other projects: `load_drafter(path, target)` and `export_drafter`.

The layout is read from the directory's config.json (and, for EAGLE-1, the tensor names):

    specforge     EAGLE-3, SafeAILab / SpecForge (`architectures: ["LlamaForCausalLMEagle3"]`)
    speculators   EAGLE-3, vLLM speculators (`speculators_model_type: "eagle3"`)
    eagle1        EAGLE-1/2, SafeAILab (`fc` over [embedding; hidden], `layers.0.*`)
    medusa        Medusa heads, medusa-llm (`medusa_num_heads`, medusa_lm_head.pt)
    speculators-mtp  MTP modules, vLLM speculators (`speculators_model_type: "mtp"`)
    speculators-dflash  DFlash, vLLM speculators (`speculators_model_type: "dflash"`)
    zlab-dflash   DFlash, z-lab (`architectures: ["DFlashDraftModel"]`, `dflash_config`)

Each loads into jspec's own drafters (`jspec.Eagle`, `jspec.Medusa`, `jspec.MTP`,
`jspec.DFlash`), checked against the target before any tracing: hidden size, vocabulary,
auxiliary layers, every tensor's name and shape, the draft vocabulary map.
docs/published_drafters.md lists what is verified.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np

from jspec.core.model import Model
from jspec.models.hf import CheckpointError
from jspec.io import layout_dflash as dflash
from jspec.io import layout_eagle1 as eagle1
from jspec.io import layout_eagle3 as eagle3
from jspec.io import layout_medusa as medusa
from jspec.io import layout_mtp as mtp
from jspec.io import layout_tensors as T

LAYOUTS = {
    eagle3.SPECFORGE: "EAGLE-3, SafeAILab/SpecForge (config architectures "
                      "[\"LlamaForCausalLMEagle3\"], tensors midlayer.*, fc, norm, lm_head, "
                      "d2t, t2d)",
    eagle3.SPECULATORS: "EAGLE-3, vLLM speculators (config speculators_model_type \"eagle3\")",
    eagle1.LAYOUT: "EAGLE-1/2, SafeAILab (tensors fc [D, 2D] and layers.0.*)",
    medusa.LAYOUT: "Medusa, medusa-llm (config medusa_num_heads, medusa_lm_head.pt or "
                   ".safetensors)",
    mtp.LAYOUT: "MTP module, vLLM speculators (config speculators_model_type \"mtp\", tensors "
                "mtp_layers.0.*)",
    dflash.SPECULATORS: "DFlash, vLLM speculators (config speculators_model_type \"dflash\")",
    dflash.ZLAB: "DFlash, z-lab (config architectures [\"DFlashDraftModel\"], dflash_config)",
}
FORMATS = (eagle3.SPECULATORS, eagle3.SPECFORGE, eagle1.LAYOUT, medusa.LAYOUT)


def _known() -> str:
  return "; ".join(f"{k}: {v}" for k, v in LAYOUTS.items())


def read_config(path) -> tuple[str, dict]:
  """(absolute path, parsed config.json) of a drafter directory."""
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if not os.path.isdir(path):
    raise FileNotFoundError(f"no drafter directory {path}")
  file = os.path.join(path, "config.json")
  if not os.path.isfile(file):
    raise FileNotFoundError(f"{path} has no config.json: not a published drafter directory "
                            f"(recognised layouts: {_known()})")
  try:
    with open(file) as f:
      cfg = json.load(f)
  except ValueError as e:
    raise CheckpointError(f"{file} is not valid JSON (truncated?): {e}") from None
  if not isinstance(cfg, dict):
    raise CheckpointError(f"{file} holds a {type(cfg).__name__}, not a config object")
  return path, cfg


def detect_layout(path) -> str | None:
  """The layout of directory `path` (a key of LAYOUTS), or None when its config.json is
  none of them (no tensors are read, except EAGLE-1's headers)."""
  path, cfg = read_config(path)
  kind = dflash.detect(cfg)
  if kind is not None:
    return kind
  if "speculators_model_type" in cfg:
    kind = cfg["speculators_model_type"]
    return {"eagle3": eagle3.SPECULATORS, "mtp": mtp.LAYOUT}.get(kind)
  if "LlamaForCausalLMEagle3" in (cfg.get("architectures") or ()):  # SafeAILab's and SGLang's name
    return eagle3.SPECFORGE
  if "medusa_num_heads" in cfg:
    return medusa.LAYOUT
  try:
    if eagle1.recognised(T.open_tensors(path)):
      return eagle1.LAYOUT
  except FileNotFoundError:
    pass
  return None


def is_published(path) -> bool:
  """Whether `path` is a directory in one of the recognised layouts. A damaged config.json
  or weights header raises (ValueError naming the file) rather than reading as "no"."""
  try:
    return detect_layout(path) is not None
  except FileNotFoundError:
    return False


# What a drafter folder on the Hub needs: its config, weights (safetensors, or the PyTorch
# pickles EAGLE-1 and Medusa heads were published in) and nothing else.
HUB_FILES = ("config.json", "*.safetensors", "*.safetensors.index.json", "pytorch_model.bin",
             "medusa_lm_head.pt")


def _local(name: str) -> str:
  """`name` itself when it is a local path; a Hub repo id ("org/name") downloaded with
  huggingface_hub (its weights and config only) when it is not."""
  from jspec.io.checkpoint import REPO_ID  # one rule for models and drafters

  if os.path.exists(name) or not REPO_ID.match(name) or ".." in name:
    return name
  try:
    import huggingface_hub
  except ImportError:
    raise FileNotFoundError(f"no drafter directory {name!r}; to download it from the Hugging "
                            f"Face Hub, install huggingface_hub: pip install 'jspec[hub]'") from None
  return huggingface_hub.snapshot_download(name, allow_patterns=list(HUB_FILES))


def load_drafter(path, target: Model, dtype=None):
  """The drafter in directory `path` (any layout of LAYOUTS; or a Hub repo id, downloaded when
  no such directory exists) for `target`: a `jspec.Eagle` (EAGLE-3 or EAGLE-1/2), a
  `jspec.MTP`, a `jspec.Medusa` or a `jspec.DFlash`.

  dtype: cast floating-point params to it (e.g. "float32"); None keeps the stored dtype.
  Raises a clear error naming the file, before any tracing, when the drafter does not fit
  the target or a tensor is missing, misshapen or truncated, and for an unknown layout.
  jspec's own head folders (`save_eagle`, `save_medusa`) load too.
  """
  from jspec.drafters import eagle, medusa as jspec_medusa

  if not isinstance(target, Model):
    raise TypeError(f"target must be a jspec.Model, got {type(target).__name__}")
  local = _local(os.path.expanduser(os.fspath(path)))
  if os.path.isfile(os.path.join(local, eagle.CONFIG_FILE)):
    head = eagle.load_eagle(local, target, dtype=dtype)
    if head.config.input_form == "mtp":  # an MTP module saved in jspec's format
      from jspec.drafters.mtp import MTP
      head = MTP(**{f.name: getattr(head, f.name) for f in dataclasses.fields(head)})
    return head
  if os.path.isfile(os.path.join(local, jspec_medusa.CONFIG_FILE)):
    return jspec_medusa.load_medusa(local, target, dtype=dtype)
  path, cfg = read_config(local)
  layout = detect_layout(path)
  if layout is None:
    raise CheckpointError(f"{os.path.join(path, 'config.json')} is not a drafter layout jspec "
                          f"recognises; recognised: {_known()}")
  dtype = None if dtype is None else jnp.dtype(dtype)
  if layout in (eagle3.SPECFORGE, eagle3.SPECULATORS):
    return eagle3.load(path, cfg, layout, target, dtype)
  if layout in (dflash.SPECULATORS, dflash.ZLAB):
    return dflash.load(path, cfg, layout, target, dtype)
  if layout == eagle1.LAYOUT:
    return eagle1.load(path, cfg, T.open_tensors(path), target, dtype)
  if layout == mtp.LAYOUT:
    return mtp.load(path, cfg, target, dtype)
  return medusa.load(path, cfg, target, dtype)


def export_drafter(drafter, out, fmt: str, *, dtype="float32", verifier: str | None = None):
  """Write `drafter` (a `jspec.Eagle`, `jspec.MTP`, `jspec.Medusa` or `jspec.DFlash`, e.g. from
  `jspec.io.shipped` or a saved head attached to its target) into the new directory `out` in
  layout `fmt` (FORMATS): "speculators" for EAGLE-3 heads, MTP modules (speculators' MTP
  layout) and DFlash drafters, "specforge" for EAGLE-3 heads, "eagle1" for EAGLE-1 heads,
  "medusa" for Medusa heads. verifier: the target's name or path recorded in the config.
  Returns the absolute path written."""
  from jspec.drafters.dflash import DFlash
  from jspec.drafters.eagle import Eagle
  from jspec.drafters.medusa import Medusa

  if fmt not in FORMATS:
    raise ValueError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
  dt = np.dtype(jnp.dtype("float32" if dtype is None else dtype))  # bf16: ml_dtypes' type
  if isinstance(drafter, DFlash):
    if fmt != eagle3.SPECULATORS:
      raise ValueError(f"DFlash drafters are written in the speculators layout "
                       f"(--format speculators), not {fmt!r}")
    return dflash.export(drafter, out, dtype=dt, verifier=verifier)
  if fmt == medusa.LAYOUT:
    if not isinstance(drafter, Medusa):
      raise ValueError(f"--format medusa writes Medusa heads, got {type(drafter).__name__}")
    return medusa.export(drafter, out, dtype=dt, base_model=verifier)
  if not isinstance(drafter, Eagle):
    raise ValueError(f"--format {fmt} writes EAGLE heads, got {type(drafter).__name__}")
  if drafter.config.input_form == "mtp":
    if fmt != eagle3.SPECULATORS:
      raise ValueError(f"this is an MTP module: --format speculators writes it (speculators' "
                       f"MTP layout), not --format {fmt}")
    return mtp.export(drafter, out, dtype=dt, verifier=verifier)
  if fmt == eagle1.LAYOUT:
    return eagle1.export(drafter, out, dtype=dt)
  if not drafter.config.fused:
    raise ValueError(f"--format {fmt} writes EAGLE-3 heads; this is an EAGLE-1 head "
                     f"(--format eagle1)")
  return eagle3.export(drafter, out, fmt, dtype=dt, verifier=verifier)
