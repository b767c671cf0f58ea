"""Writes the three Colab notebooks in this folder from the cell sources below.

    python colab/make_notebooks.py

The notebooks share their first cells (installation, and the choice between Hub
models and the shipped CPU models); keeping every cell here keeps the copies
equal. The files are written without outputs or execution counts, and
`tests/test_notebooks.py` checks that they match what this script writes.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# ----------------------------------------------------------------------------- shared cells

INSTALL = '''\
# Install jspec unless this runtime already has it (a clone installed with
# `pip install -e .` has it, and so does the test suite). Install from a clone of
# the repository: the CPU fallback models live in its checkpoints/ folder.
import importlib
import importlib.util
import os
import subprocess
import sys

JSPEC_REPO = os.environ.get("JSPEC_REPO", "https://github.com/YOUR-ACCOUNT/jspec.git")  # set me
JSPEC_SRC = (os.path.abspath(JSPEC_REPO) if os.path.isdir(JSPEC_REPO)
             else os.path.abspath("jspec-src"))  # a URL is cloned here

if importlib.util.find_spec("jspec") is None:
  if "YOUR-ACCOUNT" in JSPEC_REPO:
    raise RuntimeError("set JSPEC_REPO above to the jspec repository (a git URL or a local path)")
  if not os.path.isdir(JSPEC_SRC):
    subprocess.run(["git", "clone", "--depth", "1", JSPEC_REPO, JSPEC_SRC], check=True)
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"{JSPEC_SRC}[hub,plot]"],
                 check=True)
  importlib.invalidate_caches()
# A regular (non-editable) install leaves checkpoints/ behind in the clone: point jspec at it.
if "JSPEC_CHECKPOINTS" not in os.environ and os.path.isdir(os.path.join(JSPEC_SRC, "checkpoints")):
  os.environ["JSPEC_CHECKPOINTS"] = os.path.join(JSPEC_SRC, "checkpoints")

import jspec

print(f"jspec {jspec.__version__} from {os.path.dirname(jspec.__file__)}")'''

MODE_MD = '''\
## Hub models or shipped models

The next cell decides which models this notebook runs, and says why:

* **Hub mode**: an accelerator (TPU or GPU) is present, `huggingface_hub` is installed and the
  Hugging Face Hub answers. A Qwen2.5 instruct target and the 0.5B model of the same family as
  draft, in bf16 for decoding, placed over all devices. The target is the largest of the list
  that fits the devices' memory.
* **Fallback**: otherwise (and whenever `JSPEC_NOTEBOOK_FALLBACK=1` is set, as in the test
  suite), the small code models that ship in the repository, in float32 (the fast choice on a
  CPU), with small workloads that finish in about a minute on two CPU cores.

To force the fallback on an accelerator, set `os.environ["JSPEC_NOTEBOOK_FALLBACK"] = "1"` before
running the cell.'''

MODE = '''\
import jax


def accelerator_gib() -> float:
  """Memory of all local devices together, in GiB (0 when the backend does not say)."""
  stats = [d.memory_stats() or {} for d in jax.local_devices()]
  return sum(s.get("bytes_limit", 0) for s in stats) / 2**30


def hub_reachable(repo_id: str, timeout: float = 5.0) -> bool:
  """True when huggingface_hub is installed and the Hub answers for `repo_id` in time."""
  try:
    import huggingface_hub
  except ImportError:
    return False
  try:
    huggingface_hub.model_info(repo_id, timeout=timeout)
  except Exception:  # offline, blocked, rate limited: each means "use the shipped models"
    return False
  return True


def choose_target(gib: float):
  """The first Hub target whose memory need `gib` covers (the smallest one when unknown)."""
  if gib == 0:
    return HUB_TARGETS[-1][1]
  return next((repo for need, repo in HUB_TARGETS if gib >= need), None)


HUB_TARGET = None
if os.environ.get("JSPEC_NOTEBOOK_FALLBACK", "0") not in ("", "0"):
  why = "JSPEC_NOTEBOOK_FALLBACK is set"
elif jax.default_backend() not in ("tpu", "gpu"):
  why = f"no accelerator (JAX backend: {jax.default_backend()})"
elif choose_target(accelerator_gib()) is None:
  why = f"{accelerator_gib():.0f} GiB of accelerator memory is less than the smallest pair needs"
elif not hub_reachable(HUB_DRAFT):
  why = "the Hugging Face Hub is not reachable (or huggingface_hub is not installed)"
else:
  HUB_TARGET = choose_target(accelerator_gib())
USE_HUB = HUB_TARGET is not None

devices = jax.devices()
print(f"{len(devices)} x {devices[0].device_kind} ({jax.default_backend()})")
print(f"hub mode: target {HUB_TARGET}, draft {HUB_DRAFT}" if USE_HUB
      else f"fallback to the shipped models: {why}")'''

HELPERS = '''\
import dataclasses

import jax.numpy as jnp
from jspec.core import sharding
from jspec.io import shipped

# Every device on the mesh's `model` axis: the target is split tensor-parallel over them
# (one device: a 1 x 1 mesh, nothing to split), the draft is replicated on each.
MESH = sharding.make_mesh(data=1)


def load(name: str, dtype: str, rules: sharding.Rules) -> jspec.Model:
  """A Hub id in hub mode, a shipped model's name otherwise, placed on MESH by `rules`."""
  path = name if USE_HUB else os.path.join(shipped.checkpoints_dir(), name)
  return jspec.load(path, dtype=dtype, mesh=MESH, rules=rules)


def widen_vocab(model: jspec.Model, vocab_size: int) -> jspec.Model:
  """`model` scoring `vocab_size` ids: the ids past its own vocabulary get a logit of -1e30,
  so it never proposes them.

  Qwen2.5's 0.5B to 3B checkpoints have 151,936 rows of embeddings and the 7B one 152,064;
  the tokenizer uses fewer ids than either, so the extra rows are padding. A draft must score
  the target's vocabulary; speculative decoding stays exact whatever the draft proposes.
  """
  extra = vocab_size - model.vocab_size
  if extra <= 0:
    return model
  # The wrapped functions run with the model's own config; the new one only says the width.
  inner, base_apply, base_init_cache = model.config, model.apply_fn, model.init_cache_fn

  def apply_fn(config, params, tokens, cache, start, block_mask=None, depth=None):
    logits, hidden, cache = base_apply(inner, params, tokens, cache, start,
                                       block_mask=block_mask, depth=depth)
    pad = jnp.full(logits.shape[:-1] + (extra,), -1e30, logits.dtype)
    return jnp.concatenate([logits, pad], axis=-1), hidden, cache

  def init_cache_fn(config, batch, length, dtype):
    return base_init_cache(inner, batch, length, dtype)

  return dataclasses.replace(model, config=dataclasses.replace(inner, vocab_size=vocab_size),
                             apply_fn=apply_fn, init_cache_fn=init_cache_fn)'''


CHAT = '''\
# jspec.Tokenizer has no chat templates: Qwen2.5's format, written out.
SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def chat(question: str) -> str:
  """One user turn in Qwen's chat format, ending where the assistant's answer begins."""
  return (f"<|im_start|>system\\n{SYSTEM}<|im_end|>\\n<|im_start|>user\\n{question}<|im_end|>\\n"
          "<|im_start|>assistant\\n")'''

CHAT_PROMPTS = '''\
CHAT_PROMPTS = [
    "Explain in three sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Give me a packing list for a two-day hiking trip, as a bulleted list.",
    "What is the difference between a list and a tuple in Python?",
]'''

# Decoding pair: the 7B target fits about 20 GiB in bf16 next to its draft.
DECODE_PAIR = '''\
import os

HUB_DRAFT = "Qwen/Qwen2.5-0.5B-Instruct"
HUB_TARGETS = [  # (GiB of accelerator memory needed, target), largest first; bf16 weights
    (20, "Qwen/Qwen2.5-7B-Instruct"),
    (9, "Qwen/Qwen2.5-3B-Instruct"),
    (5, "Qwen/Qwen2.5-1.5B-Instruct"),
]'''

LOAD = '''\
import time

DTYPE = "bfloat16" if USE_HUB else "float32"
t0 = time.perf_counter()
target = load(HUB_TARGET if USE_HUB else shipped.TARGET, DTYPE, sharding.TENSOR_PARALLEL)
draft = load(HUB_DRAFT if USE_HUB else shipped.DRAFT, DTYPE, sharding.Rules())  # replicated
draft = widen_vocab(draft, target.vocab_size)
tokenizer = target.tokenizer
per_device = sharding.per_device_bytes(target.params)
print(f"loaded in {time.perf_counter() - t0:.1f} s: target {target.num_params() / 1e6:,.1f}M "
      f"params, draft {draft.num_params() / 1e6:,.1f}M params, {DTYPE}; the target holds "
      f"{max(per_device.values()) / 2**30:.2f} GiB on each of {len(per_device)} device(s)")'''


def md(text: str) -> dict:
  return {"cell_type": "markdown", "source": text}


def code(text: str) -> dict:
  return {"cell_type": "code", "source": text}


# ----------------------------------------------------------------------------- quickstart

QUICKSTART = [
    md('''\
# jspec quickstart: speculative decoding, exact and timed

A small draft model proposes K tokens, the target checks all of them in one forward pass, and an
exact acceptance rule keeps what the target itself would have produced. With greedy decoding the
output equals the target's own greedy output token for token; at a temperature it follows the
target's distribution exactly.

This notebook loads a target and a smaller draft of the same family, decodes a few prompts at
batch 1 with plain decoding and with speculative decoding, checks that the greedy outputs are
equal, and prints the acceptance and the speedup, timed after compilation.

**In Colab**: *Runtime > Change runtime type* and pick a GPU or TPU, set `JSPEC_REPO` in the first
cell, then *Run all*. Without an accelerator or without network access the notebook uses the small
code models that ship with jspec instead.'''),
    code(INSTALL),
    md(MODE_MD),
    code(DECODE_PAIR + "\n\n" + MODE),
    md('''\
## Load the target and the draft

`jspec.load` takes a Hub id (or a local directory) and places each parameter on the mesh as it is
read: the target split by `TENSOR_PARALLEL` rules (heads, MLP and vocabulary over the devices),
the draft replicated (`sharding.Rules()` maps nothing), since a small model gains little from being
split and would pay for the communication. In hub mode the first run downloads the checkpoints
(about 15 GB for the 7B target), which takes a few minutes.'''),
    code(HELPERS + "\n\n\n" + CHAT),
    code(LOAD),
    md('''\
## Prompts

Hub mode: a few chat questions in Qwen's chat format. Fallback: held-out Python code (files the
shipped models never trained on) that the code models complete.'''),
    code(CHAT_PROMPTS + '''

if USE_HUB:
  shown = CHAT_PROMPTS
  texts = [chat(q) for q in CHAT_PROMPTS]
else:
  # Two held-out prompts of similar length: they share one compiled program.
  texts = [shipped.demo_prompts()[i] for i in (0, 2)]
  shown = ["".join(t.splitlines(keepends=True)[-3:]) for t in texts]
prompts = tokenizer.encode(texts)
print([len(p) for p in prompts], "prompt tokens")'''),
    md('''\
## Baseline against speculative decoding

Each prompt runs alone (batch 1, where speculation pays most). The first call of each compiles a
program; the timed runs come after, interleaved so that any drift in the machine's speed hits both
alike.'''),
    code('''\
import statistics

import numpy as np

K = 4  # draft tokens per round
MAX_NEW = 128 if USE_HUB else 32
REPEATS = 3 if USE_HUB else 2


def timed(fn):
  """(output, seconds) of fn(), waiting for the device to finish."""
  t0 = time.perf_counter()
  out = fn()
  jax.block_until_ready(out.tokens)
  return out, time.perf_counter() - t0


runs = {
    "baseline": lambda p: jspec.generate(target, [p], max_new_tokens=MAX_NEW, mesh=MESH),
    "speculative": lambda p: jspec.speculative_generate(
        target, draft, [p], num_draft_tokens=K, max_new_tokens=MAX_NEW, mesh=MESH),
}
t0 = time.perf_counter()
outputs = {name: [timed(lambda: run(p))[0] for p in prompts] for name, run in runs.items()}
print(f"compiled and ran once in {time.perf_counter() - t0:.1f} s")
seconds = {name: [] for name in runs}
for _ in range(REPEATS):
  for name, run in runs.items():
    seconds[name].append(sum(timed(lambda: run(p))[1] for p in prompts))'''),
    md('''\
## Exactness: the greedy outputs are equal

A (K+1)-token verify and a 1-token step sum in different orders, so their logits can differ in the
last bits (more in bf16). Where the target's two best tokens are that close, the argmax may flip
and the outputs part from there on. The check below accepts a difference only at such a near tie:
below 1e-4 in float32, as in jspec's test suite, and 0.25 in bf16, whose logits carry about three
significant digits.'''),
    code('''\
TIE = 0.25 if DTYPE == "bfloat16" else 1e-4


def first_difference(prompt, a, b):
  """None when rows a and b are equal; else (position, the target's top-2 logit gap there)."""
  a, b = np.asarray(a), np.asarray(b)
  diff = np.flatnonzero(a != b)
  if diff.size == 0:
    return None
  i = int(diff[0])
  context = np.asarray([list(prompt) + a[:i].tolist()], np.int32)
  top2 = np.sort(np.asarray(target.logits(context))[0, -1])[-2:]
  return i, float(top2[1] - top2[0])


for i, prompt in enumerate(prompts):
  base, spec = outputs["baseline"][i], outputs["speculative"][i]
  n = int(base.lengths[0])
  found = first_difference(prompt, base.tokens[0], spec.tokens[0])
  verdict = ("speculative output identical" if found is None else
             f"outputs differ from token {found[0]}, top-2 logit gap {found[1]:.2g}")
  print(f"--- prompt {i + 1} " + "-" * 50)
  print(shown[i].rstrip())
  print(f"--- completion ({n} tokens; {verdict}) " + "-" * 20)
  print(tokenizer.decode(base.tokens[0]).rstrip())
  assert found is None or found[1] < TIE, f"prompt {i + 1}: greedy outputs differ ({found})"'''),
    md('''\
## Acceptance and speedup

*tau* is the number of tokens a target call yields (1 for plain decoding); *alpha* is the share of
drafts the target accepted among those it judged. The speedup is the baseline's wall time over the
speculative one's, medians of the repeats.

On an accelerator a large target is memory-bound at batch 1: verifying K+1 tokens costs about one
step, so the speedup approaches tau less the draft's cost. The shipped CPU models are too small for
that (a 5-token verify costs about twice a step on a CPU), so expect a speedup near 1x there:
the fallback shows exactness and acceptance, not speed.'''),
    code('''\
from jspec.core.stats import acceptance_rates

spec = outputs["speculative"]
emitted = sum(int(o.lengths[0]) for o in spec)
calls = sum(int(o.stats.target_calls[0]) for o in spec)
rates = acceptance_rates(sum(np.asarray(o.stats.accept_hist) for o in spec), emitted, calls)
base_tokens = sum(int(o.lengths[0]) for o in outputs["baseline"])
t_base, t_spec = (statistics.median(seconds[name]) for name in ("baseline", "speculative"))
print(f"K = {K}: tau {rates['tau']:.2f} tokens per target call, acceptance alpha "
      f"{rates['alpha']:.2f} ({rates['draft_accept']:.2f} of all drafts proposed)")
print(f"{'run':12s} {'tokens':>7s} {'seconds':>8s} {'tok/s':>8s} {'speedup':>8s}")
print(f"{'baseline':12s} {base_tokens:7d} {t_base:8.3f} {base_tokens / t_base:8.1f} {1:8.2f}")
print(f"{'speculative':12s} {emitted:7d} {t_spec:8.3f} {emitted / t_spec:8.1f} "
      f"{t_base / t_spec:8.2f}")'''),
    md('''\
## A sampled run

At a temperature above 0 each token is drawn at random, so speculative and plain decoding give
different draws; what is exact is the distribution they are drawn from (top-p and top-k included).
The acceptance rule now accepts a draft with probability min(1, p/q) and otherwise resamples from
the residual of the two distributions.'''),
    code('''\
sampled = jspec.speculative_generate(target, draft, [prompts[0]], num_draft_tokens=K,
                                     max_new_tokens=MAX_NEW, temperature=0.7, top_p=0.9, seed=0,
                                     mesh=MESH)
rates = acceptance_rates(sampled.stats.accept_hist, int(sampled.lengths[0]),
                               int(sampled.stats.target_calls[0]))
print(f"temperature 0.7, top-p 0.9, seed 0: tau {rates['tau']:.2f}, alpha {rates['alpha']:.2f}")
print(tokenizer.decode(sampled.tokens[0]).rstrip())'''),
    md('''\
Next: `measure.ipynb` sweeps K on your own prompts and plots acceptance and speedup, and
`train_drafter.ipynb` distils a draft for a target and measures what it gains.'''),
]

# ----------------------------------------------------------------------------- train_drafter

TRAIN_PAIR = '''\
import os

HUB_DRAFT = "Qwen/Qwen2.5-0.5B-Instruct"
HUB_TARGETS = [  # (GiB needed, target): a bf16 teacher beside a float32 draft under AdamW
    (24, "Qwen/Qwen2.5-3B-Instruct"),
    (14, "Qwen/Qwen2.5-1.5B-Instruct"),
]'''

TRAIN_DRAFTER = [
    md('''\
# Distil a draft for a target

A draft is worth what it agrees with its target: acceptance, not its own text quality, decides the
speedup. DistillSpec (Zhou et al. 2023) trains the draft on the target's own outputs to match the
target's full next-token distributions, and finds this raises acceptance well beyond training on
text.

This notebook does that with jspec's optax training loop (`jspec.training.train`):

1. load a target and a starting draft, and measure greedy acceptance on evaluation prompts;
2. let the target continue a set of training prompts (on-policy data);
3. train the draft on the forward KL from the target's distributions on that data
   (`distill_loss`), with an orbax checkpoint (a rerun resumes from it);
4. save the draft in jspec's native format, load it back, and measure acceptance again.

**In Colab**: pick a GPU or TPU runtime with at least 16 GB of memory, set `JSPEC_REPO` in the
first cell, *Run all*. Hub mode distils Qwen2.5-0.5B-Instruct toward a larger Qwen2.5 instruct
model (both with 151,936 vocabulary rows). The fallback makes a draft from the shipped code target
itself and trains it for a few dozen steps on a CPU.'''),
    code(INSTALL),
    md(MODE_MD),
    code(TRAIN_PAIR + "\n\n" + MODE),
    md('''\
## The target and the starting draft

The target is the teacher: bf16 in hub mode, float32 in the fallback. The draft trains in
float32. Hub mode starts from the pretrained Qwen2.5-0.5B-Instruct. The fallback has no second
model to fetch, so it builds one from the target: its embeddings, its first layer of four and its
final norm (a "self-draft"), which starts out agreeing with the target on some tokens.'''),
    code('''\
import dataclasses
import time

import numpy as np
from jspec.core import sharding
from jspec.core.stats import acceptance_rates
from jspec.io import shipped
from jspec.training import corpus
from jspec.training import train as T

MESH = sharding.make_mesh(data=1)  # the target split over all devices, the draft replicated
REPLICATED = sharding.Layout(MESH, sharding.Rules())

t0 = time.perf_counter()
if USE_HUB:
  target = jspec.load(HUB_TARGET, dtype="bfloat16", mesh=MESH, rules=sharding.TENSOR_PARALLEL)
  draft0 = jspec.load(HUB_DRAFT, dtype="float32", mesh=MESH, rules=sharding.Rules())
else:
  path = os.path.join(shipped.checkpoints_dir(), shipped.TARGET)
  target = jspec.load(path, dtype="float32", mesh=MESH, rules=sharding.TENSOR_PARALLEL)
  config = dataclasses.replace(target.config, num_hidden_layers=1)
  params = dict(target.params, layers=jax.tree.map(lambda x: x[:1], target.params["layers"]))
  draft0 = jspec.models.make_model(config, params, tokenizer=target.tokenizer,
                                   eos_ids=target.eos_ids)
  draft0 = sharding.shard_model(draft0, REPLICATED, replicate=True)
tokenizer = target.tokenizer
assert draft0.vocab_size == target.vocab_size, "the draft must score the target's vocabulary"
print(f"loaded in {time.perf_counter() - t0:.1f} s: target {target.num_params() / 1e6:,.1f}M "
      f"params, starting draft {draft0.num_params() / 1e6:,.1f}M params")'''),
    md('''\
## Acceptance before training

Greedy speculative decoding of evaluation prompts the draft never trains on (fallback: held-out
code windows; hub mode: chat questions apart from the training ones). `acceptance` also compares
the output with the target's own greedy output. They are equal in float32; in bf16 a row can part
where the target's two best tokens are nearly tied, since a verify and a step round differently
(`quickstart.ipynb` shows the check).'''),
    code(CHAT),
    code('''\
K = 4
EVAL_QUESTIONS = [
    "Summarise the causes of the French Revolution in four sentences.",
    "Write a haiku about autumn rain.",
    "How do I reverse a linked list in Python? Show code.",
    "What are three tips for a good night's sleep?",
    "Explain what a hash table is to a beginner.",
    "Write a short, polite email declining a meeting invitation.",
    "Convert 72 degrees Fahrenheit to Celsius and show the formula.",
    "Name four planets of the solar system and one fact about each.",
]
if USE_HUB:
  eval_prompts = tokenizer.encode([chat(q) for q in EVAL_QUESTIONS])
  EVAL_NEW = 128
else:
  eval_prompts = shipped.heldout()["accept_prompts"][:, :48].tolist()  # 32 prompts
  EVAL_NEW = 32
reference = jspec.generate(target, eval_prompts, max_new_tokens=EVAL_NEW, mesh=MESH)


def acceptance(draft) -> dict:
  """Greedy tau and alpha of `draft` on the evaluation prompts, at K draft tokens per round."""
  out = jspec.speculative_generate(target, draft, eval_prompts, num_draft_tokens=K,
                                   max_new_tokens=EVAL_NEW, mesh=MESH)
  rows = np.any(np.asarray(out.tokens) != np.asarray(reference.tokens), axis=1)
  print("  speculative output identical to the target's own greedy output" if not rows.any()
        else f"  rows {np.flatnonzero(rows).tolist()} differ from the target's greedy output")
  return acceptance_rates(out.stats.accept_hist, int(np.sum(np.asarray(out.lengths))),
                                int(np.sum(np.asarray(out.stats.target_calls))))


before = acceptance(draft0)
print(f"before: alpha {before['alpha']:.3f}, tau {before['tau']:.2f} (K = {K}, "
      f"{len(eval_prompts)} prompts x {EVAL_NEW} new tokens)")'''),
    md('''\
## Training data: the target's own continuations

The target continues the training prompts, greedily and (in hub mode) also sampled, without
stopping at EOS. Distilling on what the target writes teaches the draft the contexts it will meet
while drafting. Hub mode uses chat questions (put your own domain's prompts here for the largest
gain on it); the fallback uses 48-token windows of the Python standard library's training split
(files the held-out evaluation windows do not come from).'''),
    code('''\
TRAIN_QUESTIONS = [
    "Explain how photosynthesis works.", "Write a Python function that merges two sorted lists.",
    "What causes the seasons on Earth?", "Give three arguments for and against remote work.",
    "Describe the water cycle for a ten-year-old.", "How does a binary search work?",
    "Write a limerick about a cat who loves coffee.", "What is the capital of Australia?",
    "Explain recursion with an example in JavaScript.", "List five healthy breakfast ideas.",
    "What is the Pythagorean theorem?", "Translate 'Where is the train station?' into German.",
    "How do vaccines train the immune system?", "Write a SQL query counting orders per customer.",
    "Give tips for learning a new language as an adult.", "What is inflation, in simple terms?",
    "Describe the plot of Romeo and Juliet briefly.", "How do I make a simple tomato sauce?",
    "Explain the difference between TCP and UDP.", "Write a motivational quote and explain it.",
    "What are prime numbers? Give the first ten.", "How does a refrigerator keep food cold?",
    "Write a Python class for a bank account with deposit and withdraw.",
    "Suggest a weekend itinerary for Rome.", "Why do leaves change colour in autumn?",
    "Explain what an API is.", "Write a short story opening set on a space station.",
    "What should I consider when buying a used car?", "How does compound interest work?",
    "Explain Big-O notation with two examples.", "Give advice for a first job interview.",
    "What is the difference between weather and climate?",
]
if USE_HUB:
  seeds = tokenizer.encode([chat(q) for q in TRAIN_QUESTIONS])
  TEMPERATURES, NEW, BATCH = (0.0, 0.7, 1.0), 256, 16
else:
  root = corpus.stdlib_root()
  train_files = [f for f in corpus.list_files(root) if not corpus.is_heldout(f)][::40]
  docs = []
  for rel in train_files:
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
      docs.append(f.read())
  stream = np.concatenate([np.asarray(ids, np.int32) for ids in tokenizer.encode(docs)])
  seeds = corpus.windows(stream, 48, 128, seed=(0, 0)).tolist()
  # Greedy only, at the evaluation's batch and lengths: one compiled program serves both.
  TEMPERATURES, NEW, BATCH = (0.0,), EVAL_NEW, len(eval_prompts)

t0 = time.perf_counter()
sequences = []
for temperature in TEMPERATURES:
  for i in range(0, len(seeds), BATCH):
    rows = seeds[i:i + BATCH]
    out = jspec.generate(target, rows, max_new_tokens=NEW, temperature=temperature, seed=i,
                         eos_id=(), mesh=MESH)
    sequences += [row + np.asarray(new).tolist() for row, new in zip(rows, out.tokens)]
# One token stream, sequences separated by the end-of-text id; training windows are cut from it.
sep = list(target.eos_ids[:1])
train_stream = np.asarray([t for s in sequences for t in s + sep], np.int32)
print(f"{len(sequences)} continuations, {train_stream.size:,} tokens, in "
      f"{time.perf_counter() - t0:.1f} s")'''),
    md('''\
## Distil

`T.train` builds the NNX `Transformer`, starts it from the draft's params and runs AdamW under a
warmup and cosine schedule on `distill_loss`: the mean forward KL(target || draft) per position,
with the target's logits computed inside the jitted step. Model and optimizer state go to an orbax
checkpoint in `CHECKPOINTS` every `checkpoint_every` steps. With `RESUME = True` a run picks up
from the latest one there, and since `batch_fn(step)` is a pure function of the step it sees the
batches an uninterrupted run would have; put `CHECKPOINTS` on a mounted drive to survive a
disconnected runtime. `RESUME = False` (the default) starts afresh, so that a changed setting never
meets a stale checkpoint.'''),
    code('''\
import shutil

if USE_HUB:
  cfg = T.TrainConfig(steps=100, batch_size=8, seq_len=128, learning_rate=2e-5, warmup_steps=10,
                      end_learning_rate=2e-6, checkpoint_every=50, eval_every=10**9)
else:
  cfg = T.TrainConfig(steps=30, batch_size=8, seq_len=64, learning_rate=3e-3, warmup_steps=3,
                      end_learning_rate=3e-4, checkpoint_every=30, eval_every=10**9)
CHECKPOINTS = os.path.abspath("distill-checkpoints")
RESUME = False
if not RESUME:
  shutil.rmtree(CHECKPOINTS, ignore_errors=True)


def batch_fn(step: int) -> dict:
  """Windows of seq_len + 1 tokens at random offsets of the stream, seeded by the step."""
  return {"tokens": corpus.windows(train_stream, cfg.seq_len + 1, cfg.batch_size,
                                   seed=(cfg.seed, step))}


result = T.train(draft0.config, cfg, batch_fn, T.distill_loss, teacher=target,
                 init_params=draft0.params, checkpoint_dir=CHECKPOINTS, desc="distil")
print(f"{result.steps} steps, {result.tokens_seen:,} tokens in {result.seconds:.0f} s; KL to the "
      "target (nats per token) by step: "
      + ", ".join(f"{h['step']}: {h['loss']:.3f}" for h in result.history))'''),
    md('''\
## Save, load back, measure again

`jspec.save` writes jspec's native format (params through orbax, the config, the tokenizer);
`jspec.load` reads it back onto the mesh. The saved folder works anywhere a draft does, for
instance `jspec measure --drafter distilled-draft`.'''),
    code('''\
OUT = "distilled-draft"
trained = dataclasses.replace(result.module.to_model(), tokenizer=tokenizer,
                              eos_ids=target.eos_ids)
shutil.rmtree(OUT, ignore_errors=True)  # save writes into a new, empty folder
jspec.save(trained, OUT)
draft1 = jspec.load(OUT, mesh=MESH, rules=sharding.Rules())

after = acceptance(draft1)
print(f"{'':8s} {'alpha':>6s} {'tau':>5s}")
for name, r in (("before", before), ("after", after)):
  print(f"{name:8s} {r['alpha']:6.3f} {r['tau']:5.2f}")
print(f"acceptance gain: {after['alpha'] - before['alpha']:+.3f} alpha, "
      f"{after['tau'] - before['tau']:+.2f} tokens per target call")
if not USE_HUB:
  shipped_acc = shipped.manifest(shipped.DRAFT)["acceptance_vs_code_target"]
  print(f"for scale: the shipped code-draft (2 layers of width 128, distilled for 400 steps of "
        f"8 x 256 tokens) has alpha {shipped_acc['alpha']:.3f} on {shipped_acc['prompts']} "
        f"prompts x {shipped_acc['new_tokens']} tokens")
  # The fallback's gain is large against the evaluation's noise on every run seen so far.
  assert after["alpha"] > before["alpha"], (before, after)'''),
    md('''\
A draft pays when its acceptance outweighs its cost: the fallback's self-draft costs a sizeable
share of a target step, so it shows the gain in acceptance, not a speedup. `measure.ipynb` measures
both for any pair. For a larger gain, train longer, on more prompts from the domain you will
decode, and evaluate on prompts kept apart from training.'''),
]

# ----------------------------------------------------------------------------- measure

MEASURE = [
    md('''\
# Measure acceptance and speedup on your own prompts

Speculative decoding is exact, but whether it is faster depends on the model pair, the prompts,
the batch size and the hardware. `jspec.tools.measure.measure` runs your prompts for each K in a sweep,
in one process, after compilation, and reports:

* acceptance per draft position and overall (alpha), and tau, the tokens per target call;
* the cost of a target step, a (K+1)-token verify and a drafter round, each timed alone;
* the speedup those predict, `tau * T_step / (T_verify + T_round)`, beside the measured one.

The same report comes from the command line: `jspec measure --prompts prompts.jsonl --k 1,2,4,8`.

**In Colab**: pick a GPU or TPU runtime, set `JSPEC_REPO` in the first cell, put your prompts in
`MY_PROMPTS` below, *Run all*. Without an accelerator or network the shipped code models run on
held-out code prompts.'''),
    code(INSTALL),
    md(MODE_MD),
    code(DECODE_PAIR + "\n\n" + MODE),
    md("## Load the target and the draft"),
    code(HELPERS + "\n\n\n" + CHAT),
    code(LOAD),
    md('''\
## Your prompts

Put your own prompts in `MY_PROMPTS` (plain text; in hub mode each is wrapped as a user turn of the
chat format). With the list empty, the defaults are used: chat questions in hub mode, held-out
code in the fallback. They are written to `prompts.jsonl`, one JSON object per line, the file
format `jspec measure --prompts` reads, and read back from it.'''),
    code('''\
import json

from jspec.tools import measure

MY_PROMPTS = []  # e.g. ["Summarise this paragraph: ...", "Write a unit test for ..."]

# The defaults when MY_PROMPTS is empty, in hub mode:
''' + CHAT_PROMPTS + '''

if MY_PROMPTS:
  texts = [chat(p) for p in MY_PROMPTS] if USE_HUB else list(MY_PROMPTS)
elif USE_HUB:
  texts = [chat(q) for q in CHAT_PROMPTS]
else:
  texts = [shipped.demo_prompts()[i] for i in (0, 2)]  # similar lengths: one program per K
with open("prompts.jsonl", "w", encoding="utf-8") as f:
  for text in texts:
    f.write(json.dumps({"prompt": text}) + "\\n")
prompts = tokenizer.encode(measure.read_prompts("prompts.jsonl"))
print(f"{len(prompts)} prompts, {[len(p) for p in prompts]} tokens")'''),
    md('''\
## The sweep

Greedy decoding at batch 1; every K compiles its own program first. The report is a plain dict,
saved as JSON beside the plots. With greedy decoding every speculative output is also compared with
the baseline's (`equal_to_baseline`).'''),
    code('''\
KS = (1, 2, 4, 8) if USE_HUB else (1, 2, 4)
MAX_NEW = 128 if USE_HUB else 32
REPEATS = 3 if USE_HUB else 1

t0 = time.perf_counter()
report = measure.measure(target, draft, prompts, ks=KS, max_new_tokens=MAX_NEW, batch_size=1,
                         repeats=REPEATS)
print(f"measured in {time.perf_counter() - t0:.0f} s\\n")
print(measure.format_table(report))
with open("measure.json", "w") as f:
  json.dump(report, f, indent=2)
print("\\nspeculative output equal to the baseline's:",
      {row["k"]: row["equal_to_baseline"] for row in report["rows"]})'''),
    md('''\
## Plots

Left: tau against K. Right: the predicted and the measured speedup; above the grey line
speculation is faster than plain decoding. Pick the K where the measured speedup peaks. On a CPU
with the small shipped models it stays near or below 1x (a verify of K+1 tokens costs well over a
step there); a large target on an accelerator is where it climbs.'''),
    code('''\
from IPython.display import Image, display

measure.plot(report, "measure.png")
display(Image("measure.png"))'''),
    md('''\
Acceptance by draft position: of the rounds whose first i-1 drafts were all accepted, the share
that also accepted draft i. A curve that falls with i means later drafts are wasted more often,
an argument for a smaller K.'''),
    code('''\
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(5, 3.5))
for row in report["rows"]:
  positions = range(1, row["k"] + 1)
  ax.plot(positions, row["position_acceptance"], "o-", label=f"K = {row['k']}")
ax.set_xlabel("draft position i")
ax.set_ylabel("acceptance of draft i")
ax.set_ylim(0, 1.05)
ax.legend()
fig.tight_layout()
fig.savefig("acceptance_by_position.png", dpi=120)
plt.close(fig)
display(Image("acceptance_by_position.png"))'''),
    md('''\
To compare drafters, pass another one to `measure.measure`: a draft checkpoint of your own (for
instance the one `train_drafter.ipynb` writes), or a prompt-lookup drafter that needs no model,
`jspec.NGram(target.vocab_size, max_ngram=3)`, which shines on prompts that restate their
context.'''),
    md('''\
## A published head for a Hub target

Drafters trained by other projects load into jspec with `jspec.load_drafter(hub_id, target)`:
EAGLE-3 heads in the SpecForge / SafeAILab layout (served by SGLang) and in vLLM speculators'
layout, EAGLE-1/2 heads, Medusa heads and speculators' MTP modules and DFlash drafters (see
`docs/published_drafters.md`). The cell below runs in hub mode only: it loads Qwen3 targets
and drafters published for them, an EAGLE-3 head (Tengyunw/qwen3_8b_eagle3, SpecForge's layout;
its authors report Qwen3-8B going from 187 to 365 tokens/s in SGLang on one H200) and a DFlash
block drafter (z-lab/Qwen3-4B-DFlash-b16), checks that the greedy output equals the target's
own, and measures tau. It needs about 20 GiB of accelerator
memory (bf16).'''),
    code('''\
import numpy as np

# (target, drafter published for it, K): an EAGLE-3 head in SpecForge's layout, and a DFlash
# block drafter in z-lab's (blocks of 16: up to 15 drafts a round)
PUBLISHED = [("Qwen/Qwen3-8B", "Tengyunw/qwen3_8b_eagle3", 4),
             ("Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16", 8)]

if USE_HUB and accelerator_gib() >= 20:
  for target_id, drafter_id, k in PUBLISHED:
    big = jspec.load(target_id, dtype="bfloat16", mesh=MESH, rules=sharding.TENSOR_PARALLEL)
    head = jspec.load_drafter(drafter_id, big, dtype="bfloat16")
    print(drafter_id, "->", type(head).__name__, "reading target layers", head.feature_layers)
    qwen3 = [big.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=True,
                                               add_generation_prompt=True, enable_thinking=False)
             for q in CHAT_PROMPTS[:2]]
    plain = jspec.generate(big, qwen3[:1], max_new_tokens=64, mesh=MESH)
    fast = jspec.speculative_generate(big, head, qwen3[:1], num_draft_tokens=k,
                                      max_new_tokens=64, mesh=MESH)
    print("greedy output equal to the target's:",
          bool(np.array_equal(np.asarray(plain.tokens), np.asarray(fast.tokens))))
    published = measure.measure(big, head, qwen3, ks=(k,), max_new_tokens=128, batch_size=1,
                                repeats=2)
    print(measure.format_table(published))
    del big, head
else:
  print("skipped: needs hub mode and about 20 GiB of accelerator memory")'''),
]

NOTEBOOKS = {
    "quickstart.ipynb": QUICKSTART,
    "train_drafter.ipynb": TRAIN_DRAFTER,
    "measure.ipynb": MEASURE,
}


def build(name: str) -> dict:
  """The notebook `name` as an nbformat-4 dict: no outputs, no execution counts, fixed ids."""
  stem = name.removesuffix(".ipynb")
  cells = []
  for i, cell in enumerate(NOTEBOOKS[name]):
    out = {"cell_type": cell["cell_type"], "id": f"{stem}-{i:02d}", "metadata": {},
           "source": cell["source"].splitlines(keepends=True)}
    if cell["cell_type"] == "code":
      out.update(execution_count=None, outputs=[])
    cells.append(out)
  return {
      "cells": cells,
      "metadata": {
          "accelerator": "GPU",  # Colab opens it on a GPU runtime
          "colab": {"provenance": [], "toc_visible": True},
          "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
          "language_info": {"name": "python"},
      },
      "nbformat": 4,
      "nbformat_minor": 5,
  }


def main(argv=None) -> int:
  import json

  for name in NOTEBOOKS:
    path = os.path.join(HERE, name)
    with open(path, "w", encoding="utf-8") as f:
      json.dump(build(name), f, indent=1, ensure_ascii=False)
      f.write("\n")
    print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
