"""Measure before trusting: acceptance and speedup on your own prompts.

    report = jspec.tools.measure.measure(target, drafter, prompts, ks=(1, 2, 4, 8))
    print(jspec.tools.measure.format_table(report))
    jspec.tools.measure.plot(report, "measure.png")         # needs matplotlib

For each K in the sweep, in one process, after compilation, with baseline and
speculative runs interleaved:

  * acceptance per draft position i = 1..K: of the rounds whose drafts 1..i-1
    were all accepted, the fraction that also accepted draft i; and overall
    (alpha = accepted / judged, see `jspec.core.stats.acceptance_rates`);
  * tau = tokens emitted / target calls;
  * per-call costs: a target step (1 token), a target verify (K+1 tokens) and
    one drafter round (K drafts), each jitted alone at the same batch size;
  * predicted speedup tau * T_step / (T_verify + T_round), and the measured one
    (baseline wall time / speculative wall time, medians of `repeats`).
"""

from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jspec.tools import costs

from jspec.core.stats import acceptance_rates, ideal_speedup
from jspec.tools import latency as lat
from jspec.planner.api import generate, speculative_generate
from jspec.planner.inputs import cache_bucket
from jspec.drafters.draft_model import DraftModel
from jspec.core.decode import DecodeConfig
from jspec.core.dynamic_tree import DynamicTree
from jspec.core.drafter import BranchDrafter, DraftContext, target_for, uses_features
from jspec.core.drafter import prepared as prepared_drafter
from jspec.core.model import Model


def position_acceptance(accept_hist) -> list[float]:
  """Acceptance of draft i given drafts 1..i-1 were accepted, for i = 1..K.

  accept_hist [K+1]: rounds by accepted count n. Draft i was judged in rounds
  with n >= i-1 and accepted in rounds with n >= i.
  """
  hist = np.asarray(accept_hist, np.int64)
  at_least = np.cumsum(hist[::-1])[::-1]  # at_least[j] = rounds with n >= j
  K = hist.shape[0] - 1
  return [float(at_least[i] / at_least[i - 1]) if at_least[i - 1] else float("nan")
          for i in range(1, K + 1)]


def per_prompt(outs) -> list[dict]:
  """Per prompt, in prompt order, from one K's outputs (one per batch): tau, the
  accepted-length histogram and the acceptance of each draft position given the ones
  before it were accepted (`DecodeStats.position_acceptance`; NaN: never judged)."""
  rows = []
  for o in outs:
    hist = np.asarray(o.stats.row_hist, np.int64)
    accept = np.asarray(o.stats.position_acceptance(), np.float64)
    calls = np.asarray(o.stats.target_calls, np.int64)
    lengths = np.asarray(o.lengths, np.int64)
    for b in range(hist.shape[0]):
      rows.append({"tau": float(lengths[b] / max(calls[b], 1)), "accept_hist": hist[b].tolist(),
                   "position_acceptance": [float(a) for a in accept[b]]})
  return rows


def round_time(drafter, batch: int, k: int, cache_length: int, prefix: int = 64,
               repeats: int = 20, target: Model | None = None, tree=None) -> float:
  """Median wall time of one `drafter.propose` of k drafts (with `tree`, a static
  `jspec.Tree`: one `propose_tree`; a `jspec.DynamicTree`: one `propose_dynamic`), jitted alone (greedy), on the
  drafter in decoding form (`decode.prepared`, inside the program, as the decode loop
  runs it: per-layer weights, a reduced vocabulary's rows gathered once).
  A drafter that reads the target's features needs `target` (for their width; the
  features themselves are zeros: the cost does not depend on them)."""
  if isinstance(drafter, Model):
    drafter = DraftModel(drafter)
  tokens = jnp.ones((batch, prefix + 1), jnp.int32)
  lengths = jnp.full((batch,), prefix + 1, jnp.int32)
  buffer = jnp.zeros((batch, cache_length), jnp.int32).at[:, :prefix + 1].set(tokens)
  if uses_features(drafter):
    if target is None:
      raise ValueError(f"{type(drafter).__name__} reads the target's features: pass target=")
    seen = target_for(target, drafter)
    width = jax.eval_shape(lambda: seen.apply(tokens[:, :1], seen.init_cache(batch, 8),
                                              jnp.zeros((batch,), jnp.int32)))[1].shape[-1]
    feats = jnp.zeros((batch, prefix, width), jnp.float32)
    state = jax.jit(lambda d, t, n, f: d.init(t, n, cache_length, f))(drafter, tokens, lengths,
                                                                       feats)
    context = DraftContext(tokens=buffer, lengths=lengths,
                           features=jnp.zeros((batch, k + 1, width), jnp.float32),
                           feature_start=lengths - 2 - k)
  else:
    state = jax.jit(lambda d, t, n: d.init(t, n, cache_length))(drafter, tokens, lengths)
    context = DraftContext(tokens=buffer, lengths=lengths)
  keys = jax.vmap(jax.random.key)(jnp.arange(batch, dtype=jnp.int32))
  # Prepared once outside the timed calls: the decode loop prepares once per program,
  # before its rounds.
  drafter = jax.jit(prepared_drafter)(drafter)
  if tree is None:
    propose = jax.jit(lambda d, s, c, kk: d.propose(s, c, k, None, kk)[0])
  elif isinstance(tree, DynamicTree):  # grown from the drafter's confidences (EAGLE-2)
    propose = jax.jit(lambda d, s, c, kk: d.propose_dynamic(s, c, tree, None, kk)[0])
  else:
    propose = jax.jit(lambda d, s, c, kk: d.propose_tree(s, c, tree, None, kk)[0])
  jax.block_until_ready(propose(drafter, state, context, keys))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(propose(drafter, state, context, keys))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def verify_width(drafter, k: int) -> int:
  """Tokens in one verify call at K = k: k + 1, or a branch drafter's tree and side branch."""
  if isinstance(drafter, BranchDrafter):
    return DecodeConfig(num_draft_tokens=drafter.verify_tree(k).max_depth, cache_length=0,
                        tree=drafter.verify_tree(k), side=drafter.side_tree()).block_width
  return k + 1


def _batches(prompts, batch_size):
  return [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]


def _timed(fn):
  t0 = time.perf_counter()
  out = fn()
  jax.block_until_ready(out.tokens)
  return out, time.perf_counter() - t0


def measure(target: Model, drafter, prompts, *, ks=(1, 2, 4, 8), max_new_tokens: int = 64,
            batch_size: int = 1, temperature: float = 0.0, repeats: int = 3,
            seed: int = 0, latency: bool = False) -> dict:
  """Acceptance, tau, per-call costs and predicted / measured speedup per K.

  prompts: token-id lists. latency: also run every batch once more per repeat with
  per-round timestamps (`jspec.tools.latency`) and report request, first-token and
  inter-token latency percentiles for the baseline and each K. Returns a JSON-ready
  dict (see module docstring).
  """
  ks = sorted({int(k) for k in ks})
  if not ks or ks[0] < 1:
    raise ValueError(f"ks must be integers >= 1, got {ks!r}")
  if not prompts:
    raise ValueError("prompts is empty")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  groups = _batches(list(prompts), batch_size)
  kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, eos_id=())
  base = lambda g, stream=None: generate(target, g, stream=stream, **kw)
  spec = {k: (lambda g, stream=None, k=k: speculative_generate(
      target, drafter, g, num_draft_tokens=k, stream=stream, **kw)) for k in ks}
  outs = {"base": [base(g) for g in groups]}  # compile everything first
  for k in ks:
    outs[k] = [spec[k](g) for g in groups]
  jax.block_until_ready([o.tokens for v in outs.values() for o in v])

  spent = {name: [] for name in outs}
  for _ in range(repeats):  # interleaved: drift hits every variant alike
    totals = dict.fromkeys(outs, 0.0)
    for i, g in enumerate(groups):
      outs["base"][i], t = _timed(lambda: base(g))
      totals["base"] += t
      for k in ks:
        outs[k][i], t = _timed(lambda: spec[k](g))
        totals[k] += t
    for name, t in totals.items():
      spent[name].append(t)

  latencies = {}
  if latency:  # streamed programs are their own: compiled here, then timed interleaved
    fns = {"base": base, **spec}
    for name, fn in fns.items():
      lat.timed_call(lambda stream, g=groups[0], fn=fn: fn(g, stream=stream))
    samples = {name: [] for name in fns}
    for _ in range(repeats):
      for g in groups:
        for name, fn in fns.items():
          samples[name].append(lat.timed_call(lambda stream, g=g, fn=fn: fn(g, stream=stream))[1])
    latencies = {name: lat.percentiles(lat.merge(v)) for name, v in samples.items()}

  longest = max(len(p) for p in prompts)
  widest = max(verify_width(drafter, k) for k in ks)
  S = cache_bucket(longest + max_new_tokens + widest)
  prefix = min(longest, S - widest - 1)
  t_step = costs.call_time(target, len(groups[0]), 1, S, prefix=prefix)
  base_time = statistics.median(spent["base"])
  base_tokens = sum(int(np.sum(np.asarray(o.lengths))) for o in outs["base"])
  rows = []
  for k in ks:
    hist = sum(np.asarray(o.stats.accept_hist, np.int64) for o in outs[k])
    emitted = sum(int(np.sum(np.asarray(o.lengths))) for o in outs[k])
    calls = sum(int(np.sum(np.asarray(o.stats.target_calls))) for o in outs[k])
    rates = acceptance_rates(hist, emitted, calls)
    t_verify = costs.call_time(target, len(groups[0]), verify_width(drafter, k), S,
                               prefix=prefix)
    # A branch drafter (lookahead) drafts by lookups; its work is the verify's extra rows.
    t_round = (0.0 if isinstance(drafter, BranchDrafter)
               else round_time(drafter, len(groups[0]), k, S, prefix=prefix, target=target))
    spec_time = statistics.median(spent[k])
    same = all(np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
               for a, b in zip(outs["base"], outs[k]))
    rows.append({
        "k": k, "tau": rates["tau"], "alpha": rates["alpha"],
        "draft_accept": rates["draft_accept"], "position_acceptance": position_acceptance(hist),
        "accept_hist": hist.tolist(), "t_verify_ms": t_verify * 1e3,
        "t_draft_round_ms": t_round * 1e3,
        "predicted_speedup": ideal_speedup(rates["tau"], 1, t_step, t_verify, t_round),
        "measured_speedup": base_time / spec_time, "tokens_per_s": emitted / spec_time,
        "equal_to_baseline": same if temperature == 0 else None,
        "per_prompt": per_prompt(outs[k]),
        **({"latency": latencies[k]} if latency else {}),
    })
  return {
      "prompts": len(prompts), "batch_size": batch_size, "max_new_tokens": max_new_tokens,
      "temperature": temperature, "repeats": repeats, "backend": jax.default_backend(),
      "t_step_ms": t_step * 1e3, "baseline_tokens_per_s": base_tokens / base_time,
      "rows": rows,
      **({"baseline_latency": latencies["base"]} if latency else {}),
  }


def format_table(report: dict) -> str:
  """The report of `measure` as a text table: one line per K."""
  lines = [f"{report['prompts']} prompts, batch {report['batch_size']}, "
           f"{report['max_new_tokens']} new tokens, temperature {report['temperature']}; "
           f"target step {report['t_step_ms']:.2f} ms; baseline "
           f"{report['baseline_tokens_per_s']:.1f} tok/s (medians of {report['repeats']})",
           f"{'K':>3} {'tau':>5} {'alpha':>6} {'verify ms':>9} {'draft ms':>8} "
           f"{'predicted':>9} {'measured':>8}  acceptance by position"]
  for r in report["rows"]:
    pos = " ".join(f"{a:.2f}" for a in r["position_acceptance"])
    lines.append(f"{r['k']:>3} {r['tau']:5.2f} {r['alpha']:6.2f} {r['t_verify_ms']:9.2f} "
                 f"{r['t_draft_round_ms']:8.2f} {r['predicted_speedup']:8.2f}x "
                 f"{r['measured_speedup']:7.2f}x  {pos}")
  if "baseline_latency" in report:
    lines.append("latency, milliseconds:")
    lines.append(lat.format_line("baseline", report["baseline_latency"]))
    for r in report["rows"]:
      lines.append(lat.format_line(f"K={r['k']}", r["latency"]))
  lines.append("per prompt: tau, then acceptance by position (- never judged)")
  for i in range(report["prompts"]):
    cells = []
    for r in report["rows"]:
      one = r["per_prompt"][i]
      pos = " ".join("-" if a != a else f"{a:.2f}" for a in one["position_acceptance"])
      cells.append(f"K={r['k']}: {one['tau']:.2f} [{pos}]")
    lines.append(f"{i:>4}  " + "  ".join(cells))
  return "\n".join(lines)


def plot(report: dict, path: str) -> None:
  """tau and speedup (predicted, measured) against K, as a PNG."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError as e:
    raise ImportError("plotting needs matplotlib: pip install 'jspec[plot]'") from e
  ks = [r["k"] for r in report["rows"]]
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
  ax1.plot(ks, [r["tau"] for r in report["rows"]], "o-")
  ax1.set_xlabel("K (draft tokens per round)")
  ax1.set_ylabel("tau (tokens per target call)")
  ax2.plot(ks, [r["predicted_speedup"] for r in report["rows"]], "o--", label="predicted")
  ax2.plot(ks, [r["measured_speedup"] for r in report["rows"]], "o-", label="measured")
  ax2.axhline(1.0, color="gray", lw=0.8)
  ax2.set_xlabel("K")
  ax2.set_ylabel("speedup over baseline")
  ax2.legend()
  fig.suptitle(f"batch {report['batch_size']}, temperature {report['temperature']}")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def read_prompts(path: str) -> list[str]:
  """Text prompts from a file: JSONL (a string, or an object with "prompt" or
  "text", per line) when the name ends in .jsonl; otherwise prompts separated
  by lines holding only `---` (a file without one is a single prompt)."""
  if not path.endswith(".jsonl"):
    return _separated(path)
  prompts = []
  for where, item in _jsonl(path):
    if isinstance(item, dict):
      if "messages" in item and not ("prompt" in item or "text" in item):
        raise ValueError(f"{where}: a 'messages' row is a conversation: read it with "
                         f"read_chat_prompts (on the command line: --chat)")
      item = item.get("prompt", item.get("text"))
    if not isinstance(item, str) or not item:
      raise ValueError(f"{where}: expected a string or an object with a non-empty "
                       f"'prompt' or 'text' field")
    prompts.append(item)
  return _nonempty(prompts, path)


def read_chat_prompts(path: str) -> list[list[dict]]:
  """Conversations for a chat model, to be put through its chat template
  (`chat_prompt_ids`): from JSONL, per line an object with "messages" (a list of
  {"role", "content"} dicts) or "text" (or "prompt": one user message), or a string
  (one user message); from any other file, prompts separated by `---` lines, each one
  user message. Every row is checked here, before any model is loaded."""
  user = lambda text: [{"role": "user", "content": text}]
  if not path.endswith(".jsonl"):
    return [user(p) for p in _separated(path)]
  conversations = []
  for where, item in _jsonl(path):
    if isinstance(item, dict) and "messages" in item:
      messages = item["messages"]
      if not isinstance(messages, list) or not messages or not all(
          isinstance(m, dict) and isinstance(m.get("role"), str)
          and isinstance(m.get("content"), str) for m in messages):
        raise ValueError(f"{where}: 'messages' must be a non-empty list of "
                         f'{{"role": ..., "content": ...}} objects with string values')
      conversations.append([{"role": m["role"], "content": m["content"]} for m in messages])
      continue
    if isinstance(item, dict):
      item = item.get("text", item.get("prompt"))
    if not isinstance(item, str) or not item:
      raise ValueError(f"{where}: expected an object with 'text' (one user message) or "
                       f"'messages' (a list of role/content objects), or a string")
    conversations.append(user(item))
  return _nonempty(conversations, path)


def chat_prompt_ids(tokenizer, conversations, where: str = "the model") -> list[list[int]]:
  """Token ids of each conversation under the tokenizer's chat template, ending with the
  header of the assistant's turn (the prompt a chat model answers)."""
  if tokenizer is None or tokenizer.chat_template is None:
    raise ValueError(f"{where} has no chat template to apply; encode the prompts as plain "
                     f"text (on the command line: without --chat)")
  return [[int(i) for i in tokenizer.apply_chat_template(c, add_generation_prompt=True,
                                                          tokenize=True)]
          for c in conversations]


def _jsonl(path: str):
  """("path:line", parsed JSON) of each non-blank line."""
  with open(path, encoding="utf-8") as f:
    content = f.read()
  for n, line in enumerate(content.splitlines(), 1):
    if not line.strip():
      continue
    try:
      item = json.loads(line)
    except ValueError as e:
      raise ValueError(f"{path}:{n}: not JSON: {e}") from e
    yield f"{path}:{n}", item


def _separated(path: str) -> list[str]:
  """Prompts separated by lines holding only `---`."""
  with open(path, encoding="utf-8") as f:
    content = f.read()
  parts, current = [], []
  for line in content.splitlines(keepends=True):
    if line.strip() == "---":
      parts.append("".join(current))
      current = []
    else:
      current.append(line)
  parts.append("".join(current))
  return _nonempty([p for p in parts if p.strip()], path)


def _nonempty(prompts: list, path: str) -> list:
  if not prompts:
    raise ValueError(f"{path}: no prompts found")
  return prompts
