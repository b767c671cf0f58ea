"""`jspec bench` on the shipped code pair: K and batch sweeps, latency, tasks, the floor, and
transformers on the same weights, as a declaration over the harness.

    head, recs = pair.run(target, {"draft": draft, "ngram": ngram}, shipped.heldout(), Settings())
    print(pair.summary(head, recs))

Every section runs through the runner (`runner.run`: compiled outside timing, plain
decoding and every variant interleaved with the order alternating, each greedy answer
compared with plain decoding's), or, for what `run` does not time (two lengths of one run,
another library's batch), through `runner.interleave`. Each writes records whose axis
`section` names it; every figure printed, tabled or plotted is a function of the records and
the header (`metrics`, `report`). Prompts are the shipped
checkpoints' held-out token windows (`task_prompts`: nothing is downloaded); rows run
max_new_tokens (EOS ignored) unless said. Variants are named `DRAFTER@k=K` (axes
drafter, k); a speedup is over plain decoding on the same prompts, paired by repeat.

  k_sweep      batch 1, six code prompts: each drafter at every K of the sweep and "auto".
               The header keeps each drafter's per-K costs (`costs_ms`): its round's calls
               back to back in one loop (`calls`), each call in a loop of its own
               (`apart`), and whole rounds (`rounds`), timed by `jspec.tools.profile`; the
               ideal speedup is tau * cost(0) / cost(K) (`metrics.predicted_speedup`);
  steady       (with k_sweep) the same variants past a long run's first quarter
               (`costs.steady`: a steady_tokens- and a quarter-length run of one prompt on
               one cache): time per round, tau and speedup without the call's fixed part;
  batch_sweep  code prompts, one call of each batch size (axis batch): each drafter at K = k
               and "auto";
  latency      the same, streamed (`runner.Settings(stream=True)`): inter-token latency
               percentiles from each round's arrival (`metrics.inter_token`);
  tasks        batch 1 (axis task): `restate` (a window, a separator, its first half again,
               greedy) and `sampled` (code at T = 0.8, top-p 0.95);
  floor        weight bytes over the bandwidth of a large copy (`costs.memory_bandwidth`),
               against plain decoding's steady-state step (its `steady` records);
  transformers PyTorch's greedy `generate` and assisted generation at K = k with the same
               draft, on the same weights (`save_hf`) and prompts, batch 1 through the
               runner (`jspec.bench.transformers_backend`; answers end at EOS), and greedy
               batch-8 calls of both libraries in turn (needs torch and transformers);
  heads        (asked for) each drafter as a chain of K = k and as a `NODES`-node tree
               `Tree.best_first` picks from the chain's acceptance by position.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jspec.bench import costs, report, runner, workloads
from jspec.bench import metrics as M
from jspec.bench import records as R
from jspec.bench.methods import Built

STUDY = "pair"
FILE = "bench.jsonl"
SECTIONS = ("k_sweep", "batch_sweep", "latency", "tasks", "floor", "transformers")
KNOWN = SECTIONS + ("heads",)
WRITES = {"k_sweep": ("k_sweep", "steady")}  # the record sections a section writes
PROMPTS = 6  # batch-1 prompts, run one after another
SAMPLED = (0.8, {"top_p": 0.95})  # the sampled task's temperature and filter
NODES, TREE_DEPTH = 16, 5  # the heads' trees
SECOND, HALVING, MAX_RANKS = 0.4, 0.5, 4  # the rank accuracies a tree is picked under


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `run` sweeps: batch sizes, the K sweep, the fixed K, lengths, repeats."""

  batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
  ks: tuple[int, ...] = (1, 2, 3, 4, 6)
  k: int = 4  # the fixed K of the batch sweep, latency, tasks, transformers, heads' chains
  max_new_tokens: int = 64
  repeats: int = 3
  transformers: bool = True
  steady_tokens: int = 256  # the steady part's long run (0: no steady part)


def task_prompts(target, heldout: dict, count: int) -> dict[str, list[list[int]]]:
  """code and restate prompts, `count` rows each (held-out rows repeat when short)."""
  code, windows = heldout["accept_prompts"], heldout["windows"]
  sep = [] if target.tokenizer is None else target.tokenizer.encode(
      "\n\n# The same code once more:\n", add_special_tokens=False)[0]
  rows = lambda a: [a[i % len(a)].tolist() for i in range(count)]
  return {"code": rows(code), "restate": [w[:96] + sep + w[:48] for w in rows(windows)]}


def variants(drafters: dict, ks, temperature: float = 0.0, options=None) -> list:
  """Plain decoding and each drafter at each K ("draft@k=2", axes drafter and k)."""
  options = dict(options or {})
  return [dataclasses.replace(runner.plain(temperature), options=options)] + [
      runner.Variant(f"{name}@k={k}", Built(d, k, f"{name}, K = {k}"), temperature,
                     {"drafter": name, "k": k}, options=options)
      for name, d in drafters.items() for k in ks]


def _run(target, section: str, vs, name: str, prompts, s: Settings, batch: int = 1,
         stream: bool = False, **axes):
  res = runner.run(target, vs, workloads.from_ids(name, prompts), runner.Settings(
      max_new_tokens=s.max_new_tokens, repeats=s.repeats, batch=batch, eos=False,
      stream=stream, progress=False), STUDY)
  return _tag(res.records, section=section, **axes)


def _tag(recs, **axes) -> list:
  return [dataclasses.replace(r, axes={**r.axes, **axes}) for r in recs]


# ----------------------------------------------------------------------------- sections


def k_sweep(target, drafters: dict, prompts, s: Settings, profile=None) -> tuple[list, dict]:
  """Batch 1 over the K sweep and "auto", and the steady part; (records, header part).
  profile: what times a round's calls in loop (`jspec.tools.profile`, handed in by the
  command: the harness sits below the tools); None: no costs, no ideal."""
  recs = _run(target, "k_sweep", variants(drafters, [*s.ks, "auto"]), "code", prompts, s)
  _, S = runner.shapes(max(map(len, prompts)), s.max_new_tokens)
  ks = (0, *s.ks)
  ms = lambda xs: {str(k): x * 1e3 for k, x in zip(ks, xs)}
  head = {"cache_length": S, "costs_ms": {} if profile is None else {
      name: {"calls": ms(profile.call_costs(target, d, 1, S, ks)),
             "apart": ms(profile.call_costs(target, d, 1, S, ks, apart=True)),
             "rounds": ms(profile.round_costs(target, d, 1, S, ks))}
      for name, d in drafters.items()}}
  if s.steady_tokens:
    built = {v.name: v.built for v in variants(drafters, s.ks)}
    recs += [_tag([r], section="steady", drafter=r.method.partition("@")[0])[0] for r in
             costs.steady(target, built, prompts[:1], s.steady_tokens, s.repeats, STUDY)]
  return recs, head


def batch_sweep(target, drafters: dict, prompts, s: Settings, log=print) -> list:
  """Each batch size, one call of that many code prompts: each drafter at K = k and "auto"."""
  recs = []
  for B in s.batches:
    mine = _run(target, "batch_sweep", variants(drafters, [s.k, "auto"]), "code", prompts[:B],
                s, batch=B)
    base = M.select(mine, method=runner.PLAIN)
    log(f"  batch {B}: " + ", ".join(f"{r.method} {M.speedup(base, [r]):.2f}x"
                                      for r in mine if r.method != runner.PLAIN))
    recs += mine
  return recs


def latency_sweep(target, drafters: dict, prompts, s: Settings, log=print) -> list:
  """The batch sweep's calls streamed (`runner.Settings(stream=True)`): each record keeps
  every round's arrival, whence request, first-token and inter-token latency."""
  recs = []
  for B in s.batches:
    mine = _run(target, "latency", variants(drafters, [s.k, "auto"]), "code", prompts[:B], s,
                batch=B, stream=True)
    log(f"  batch {B}: inter-token p99 ms " + ", ".join(
        f"{r.method} {_ms(M.inter_token([r]))['p99']:.1f}" for r in mine))
    recs += mine
  return recs


def _ms(seconds) -> dict:
  return {p: v * 1e3 for p, v in M.percentiles(seconds).items()}


def task_runs(target, drafters: dict, tasks: dict, s: Settings) -> list:
  """Batch 1: restating (greedy) and sampled (T = 0.8, top-p 0.95), each drafter at K = k
  and "auto"."""
  temperature, options = SAMPLED
  return (_run(target, "tasks", variants(drafters, [s.k, "auto"]), "restate",
               tasks["restate"][:1], s, task="restate")
          + _run(target, "tasks", variants(drafters, [s.k, "auto"], temperature, options),
                 "code", tasks["code"][:1], s, task="sampled"))


def floor(target, prompt, s: Settings) -> tuple[list, dict]:
  """Plain decoding's steady-state step and the weight-streaming floor: a step reads every
  weight once, so it cannot beat weight bytes / bandwidth (weights in cache aside)."""
  recs = costs.steady(target, {runner.PLAIN: None}, [prompt], max(4 * s.max_new_tokens, 64),
                      max(s.repeats, 7), STUDY)
  return _tag(recs, section="floor"), {"weight_bytes": costs.weight_bytes(target),
                                       "bandwidth_gb_s": costs.memory_bandwidth() / 1e9}


def transformers_side(target, draft, prompts, s: Settings, batch: int = 8) -> tuple[list, dict]:
  """transformers' greedy and assisted generation (the draft model at K = k, a constant
  schedule) against jspec's plain decoding, batch 1 through the runner (answers end at EOS);
  then greedy calls of `batch` rows of both libraries in turn, max_new_tokens each."""
  import torch
  import transformers

  from jspec.bench import transformers_backend as T

  hf, N = T.from_jspec(target), s.max_new_tokens
  res = runner.run(target, [runner.plain(), T.greedy(hf), T.assisted(hf, T.from_jspec(draft), s.k)],
                   workloads.from_ids("code", prompts), runner.Settings(
                       max_new_tokens=N, repeats=s.repeats, progress=False), STUDY, call=T.call)
  rows = [prompts[i % len(prompts)] for i in range(batch)]
  ids = torch.tensor(rows)  # equal-length prompts: no padding
  config = transformers.GenerationConfig(max_new_tokens=N, min_new_tokens=N, do_sample=False,
                                         pad_token_id=0, eos_token_id=None)

  def hf_batch():
    with torch.no_grad():
      seq = hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    none = np.zeros((batch, 0), np.int32)
    return T.Output(seq[:, ids.shape[1]:].numpy(), np.full(batch, N), T.Stats(
        np.zeros(batch, np.int64), none, none))

  jspec_batch = runner.jspec_call(target, None, rows, N, 0.0, 0, False)
  calls = {runner.PLAIN: lambda: jspec_batch(N), T.NAME: hf_batch}
  for fn in calls.values():
    fn()  # compiled, warmed
  outs, times = runner.interleave(calls, s.repeats)
  recs = res.records + [R.from_output(outs[n], study=STUDY, method=n, workload="code",
                                      prompt=",".join(str(i % len(prompts)) for i in range(batch)),
                                      axes={"batch": batch}, seconds=tuple(times[n]))
                        for n in calls]
  return _tag(recs, section="transformers"), T.versions()


def accuracy_table(acceptance, depth: int) -> np.ndarray:
  """[depth, MAX_RANKS] rank accuracies from a chain's acceptance by draft position (of the
  rounds that reached depth d, the share that accepted its draft; depths beyond the chain
  reuse its last): rank 0 right with that probability, rank r > 0 with (1 - a_d) * SECOND *
  HALVING^(r-1), a second choice's share of a rejected argmax's mass, halving after."""
  a = np.nan_to_num(np.asarray(acceptance, np.float64), nan=0.0)
  a = np.concatenate([a, np.full(max(depth - a.size, 0), a[-1] if a.size else 0.0)])[:depth]
  rest = (1 - a)[:, None] * SECOND * HALVING ** np.arange(MAX_RANKS - 1)[None, :]
  return np.clip(np.concatenate([a[:, None], rest], axis=1), 0.0, 1.0)


def heads(target, drafters: dict, prompts, s: Settings) -> tuple[list, dict]:
  """Each drafter as a chain of K = k (at most its heads) and as a NODES-node tree picked
  for it the same way: its chain's acceptance by position on the first prompt (an untimed
  run) gives the rank accuracies (`accuracy_table`) `Tree.best_first` maximises."""
  from jspec.core.tree import Tree

  chains = []
  for name, d in drafters.items():
    k = min(s.k, getattr(d, "num_heads", s.k))  # Medusa drafts at most its heads
    chains.append(runner.Variant(f"{name}@k={k}", Built(d, k, f"{name} chain"),
                                 axes={"drafter": name, "shape": "chain", "k": k}))
  probe = runner.run(target, chains, workloads.from_ids("code", prompts[:1]), runner.Settings(
      max_new_tokens=s.max_new_tokens, repeats=1, eos=False, progress=False), STUDY).records
  trees, head = [], {"nodes": NODES, "trees": {}}
  for v in chains:
    d, name = v.built.drafter, v.axes["drafter"]
    depth = min(TREE_DEPTH, getattr(d, "num_heads", TREE_DEPTH))
    table = accuracy_table(M.acceptance(M.select(probe, method=v.name)), depth)
    tree = Tree.best_first(table, NODES)
    trees.append(runner.Variant(f"{name}@best-first={NODES}",
                                Built(d, tree.max_depth, f"{name} tree", tree=tree),
                                axes={"drafter": name, "shape": "tree", "k": tree.max_depth}))
    head["trees"][name] = {"nodes": tree.num_nodes, "depth": tree.max_depth,
                           "parents": list(tree.parents), "ranks": list(tree.ranks),
                           "accuracy_table": np.round(table, 3).tolist()}
  return _run(target, "heads", [runner.plain(), *chains, *trees], "code", prompts, s), head


# ----------------------------------------------------------------------------- the run


def run(target, drafters: dict, heldout: dict, s: Settings, sections=SECTIONS,
        heads_drafters: dict | None = None, profile=None, keep=None,
        log=print) -> tuple[dict, list]:
  """Every section asked for, in one process: (header, records). drafters: {name: drafter}
  of the sweeps ("draft" a `DraftModel`, whose model transformers also runs);
  heads_drafters: the heads section's; profile: as for `k_sweep`; keep: (header, records)
  of an earlier run, whose other sections are kept (one section can be redone alone)."""
  unknown = set(sections) - set(KNOWN)
  if unknown:
    raise ValueError(f"unknown sections {sorted(unknown)}; known: {', '.join(KNOWN)}")
  tasks = task_prompts(target, heldout, max(max(s.batches), 8))
  code1 = tasks["code"][:PROMPTS]
  recs, parts = [], {}
  if "floor" in sections:  # first: at the end of a full run one read 1.12 ms a step where a
    log("weight-streaming floor")  # fresh process read 0.63-0.68
    mine, parts["floor"] = floor(target, code1[0], s)
    recs += mine
  if "k_sweep" in sections:
    log("K sweep, batch 1")
    mine, parts["k_sweep"] = k_sweep(target, drafters, code1, s, profile)
    recs += mine
  if "batch_sweep" in sections:
    log("batch sweep")
    recs += batch_sweep(target, drafters, tasks["code"], s, log)
    parts["batch_sweep"] = {}
  if "latency" in sections:
    log("latency percentiles by batch size")
    recs += latency_sweep(target, drafters, tasks["code"], s, log)
    parts["latency"] = {}
  if "tasks" in sections:
    log("restating and sampled tasks, batch 1")
    recs += task_runs(target, drafters, tasks, s)
    parts["tasks"] = {}
  if "heads" in sections:
    log("self-drafting heads against the draft model, chains and trees, batch 1")
    mine, parts["heads"] = heads(target, heads_drafters or {"draft": drafters["draft"]}, code1, s)
    recs += mine
  if "transformers" in sections and s.transformers:
    try:
      import torch  # noqa: F401
      import transformers  # noqa: F401
    except ImportError:
      parts["transformers"] = {"skipped": "not installed (pip install 'jspec[bench]')"}
    else:
      log("transformers, same weights and prompts")
      mine, parts["transformers"] = transformers_side(target, drafters["draft"].model, code1, s)
      recs += mine
  for part in parts.values():
    part["settings"] = dataclasses.asdict(s)
  if keep is not None:  # the sections not run now, from the earlier run
    old_head, old = keep
    redone = {x for sec in parts for x in WRITES.get(sec, (sec,))}
    recs = [r for r in old if r.axes.get("section") not in redone] + recs
    parts = {**{k: v for k, v in old_head.get("sections", {}).items() if k not in parts}, **parts}
  head = R.header(STUDY, dataclasses.asdict(s), target_params=target.num_params(),
                  drafters={n: type(d).__name__ for n, d in drafters.items()}, sections=parts)
  return head, recs


# ----------------------------------------------------------------------------- figures


def _of(recs, section: str) -> list:
  return [r for r in recs if r.axes.get("section") == section]


def _others(recs) -> dict:
  return {n: mine for n, mine in M.group(recs, "method").items() if not n.startswith(runner.PLAIN)}


def k_rows(head: dict, recs) -> dict[str, dict]:
  """The K sweep per variant: tau, speedup, ideal (calls back to back, apart), measured /
  ideal, rounds by K ("auto"), whether every answer equals plain decoding's."""
  part = _of(recs, "k_sweep")
  base, out = M.select(part, method=runner.PLAIN), {}
  costs_ms = head["sections"]["k_sweep"]["costs_ms"]
  for name, mine in _others(part).items():
    k, c = mine[0].axes["k"], costs_ms.get(mine[0].axes["drafter"])
    row = out[name] = {"k": k, "tau": M.tau(mine), "speedup": M.speedup(base, mine),
                       "rounds_by_k": M.rounds_by_k(mine), "equal": M.all_equal(mine)}
    if c and k != "auto":
      ideal = lambda by: M.predicted_speedup(row["tau"], by["0"], by[str(k)], 0.0)
      row.update(ideal=ideal(c["calls"]), ideal_apart=ideal(c["apart"]))
      row["measured_over_ideal"] = row["speedup"] / row["ideal"]
  return out


def steady_rows(head: dict, recs) -> dict[str, dict]:
  """The steady part per variant (`metrics.steady_seconds`, the long run's extra over the
  short one's): ms per round, tau (seconds per round over seconds per token), speedup
  (plain's seconds per token over the variant's) and the ideal at that tau."""
  part = _of(recs, "steady")
  ends = lambda mine: (M.select(mine, length="short"), M.select(mine, length="long"))
  base = M.steady_seconds(*ends(M.select(part, method=runner.PLAIN)))
  costs_ms = head["sections"]["k_sweep"]["costs_ms"]
  out = {runner.PLAIN: {"ms_per_token": base * 1e3}}
  for name, mine in _others(part).items():
    per_round, per_token = (M.steady_seconds(*ends(mine), per=p) for p in ("rounds", "tokens"))
    row = out[name] = {"k": mine[0].axes["k"], "round_ms": per_round * 1e3,
                       "tau": per_round / per_token, "speedup": base / per_token}
    c = costs_ms.get(mine[0].axes["drafter"])
    if c:
      row["ideal"] = M.predicted_speedup(row["tau"], c["calls"]["0"], c["calls"][str(row["k"])],
                                         0.0)
      row["measured_over_ideal"] = row["speedup"] / row["ideal"]
  return out


def floor_row(head: dict, recs) -> dict:
  """Weight bytes, bandwidth, the floor and plain decoding's steady step, in ms per token."""
  f = head["sections"]["floor"]
  part = _of(recs, "floor")
  step = M.steady_seconds(M.select(part, length="short"), M.select(part, length="long"))
  floor_s = f["weight_bytes"] / (f["bandwidth_gb_s"] * 1e9)
  return {**f, "floor_ms": floor_s * 1e3, "plain_ms_per_token": step * 1e3,
          "plain_over_floor": step / floor_s}


def _x(x: float) -> str:
  return f"{x:.2f}x"


def _speedup_cell(recs, base) -> str:
  if recs[0].method.startswith(runner.PLAIN):
    return f"{M.tokens_per_s(recs):.0f} tok/s"
  by_k = M.rounds_by_k(recs)
  cell = _x(M.speedup(base, recs)) + (" (K = {} in {} rounds)".format(
      "/".join(map(str, by_k)), "/".join(map(str, by_k.values()))) if by_k else "")
  return cell + ("" if M.all_equal(recs) is not False else " (differs from plain)")


def section_tables(head: dict, recs) -> dict[str, tuple[str, str]]:
  """{section: (title, markdown table)} of each section the records hold that has a table
  (`TABLE_SECTIONS`)."""
  out, have = {}, {r.axes.get("section") for r in recs}
  if "k_sweep" in have:
    plain = M.select(_of(recs, "k_sweep"), method=runner.PLAIN)
    rows = [["method", "tau", "speedup", "ideal", "measured / ideal", "ideal, calls apart"]]
    for name, r in k_rows(head, recs).items():
      cell = _speedup_cell(M.select(_of(recs, "k_sweep"), method=name), plain)
      rows.append([f"`{name}`", f"{r['tau']:.2f}", cell] + (
          [_x(r["ideal"]), f"{r['measured_over_ideal']:.2f}", _x(r["ideal_apart"])]
          if "ideal" in r else ["", "", ""]))
    out["k_sweep"] = (f"batch 1, held-out code ({len(plain)} prompts), greedy: plain "
                      f"{M.tokens_per_s(plain):.0f} tok/s", report.markdown(rows))
  if "steady" in have:
    st = steady_rows(head, recs)
    rows = [["method", "tau", "ms per round", "speedup", "ideal", "measured / ideal"]]
    rows += [[f"`{n}`", f"{r['tau']:.2f}", f"{r['round_ms']:.2f}", _x(r["speedup"])] + (
        [_x(r["ideal"]), f"{r['measured_over_ideal']:.2f}"] if "ideal" in r else ["", ""])
             for n, r in st.items() if n != runner.PLAIN]
    out["steady"] = (f"steady state (no prefill): plain {st[runner.PLAIN]['ms_per_token']:.2f} "
                     "ms/token", report.markdown(rows))
  if "batch_sweep" in have:
    part = _of(recs, "batch_sweep")
    out["batch_sweep"] = ("speedup over plain decoding by batch size (code, greedy)", report.pivot(
        part, "method", "batch", _speedup_cell, overall=False, skip_rows=(),
        corner="method \\ batch"))
  if "latency" in have:
    part = _of(recs, "latency")
    cell = lambda mine, _: "{p50:.1f} / {p99:.1f}".format(**_ms(M.inter_token(mine)))
    out["latency"] = ("inter-token latency p50 / p99, ms, by batch size (code, greedy)",
                      report.pivot(part, "method", "batch", cell, overall=False, skip_rows=(),
                                   corner="method \\ batch"))
  if "tasks" in have:
    out["tasks"] = ("batch 1 tasks: speedup over plain decoding (tau)", report.pivot(
        _of(recs, "tasks"), "method", "task", report.speedup_tau, overall=False,
        skip_rows=(runner.PLAIN, runner.plain(SAMPLED[0]).name)))
  if "heads" in have:
    part = _of(recs, "heads")
    trees = head["sections"]["heads"]["trees"]
    rows = [["method", "shape", "tau", "speedup"]]
    for name, mine in _others(part).items():
      a = mine[0].axes
      shape = (f"K = {a['k']}" if a["shape"] == "chain" else
               f"{trees[a['drafter']]['nodes']} nodes, depth {a['k']}")
      rows.append([f"`{name}`", shape, f"{M.tau(mine):.2f}",
                   _speedup_cell(mine, M.select(part, method=runner.PLAIN))])
    out["heads"] = ("self-drafting heads, batch 1, held-out code, greedy", report.markdown(rows))
  return out


TABLE_SECTIONS = ("k_sweep", "steady", "batch_sweep", "latency", "tasks", "heads")


def tables(head: dict, recs) -> dict[str, str]:
  """The report: {title: markdown table} of each section the records hold."""
  return dict(section_tables(head, recs).values())


def section_table(section: str):
  """The table of one section as a function of (header, records), the form the docs'
  quoted tables take (`jspec.bench.tables.TABLES["pair.SECTION"]`)."""
  if section not in TABLE_SECTIONS:
    raise ValueError(f"no table for section {section!r}; known: {', '.join(TABLE_SECTIONS)}")

  def table(head: dict, recs) -> str:
    got = section_tables(head, recs)
    if section not in got:
      raise ValueError(f"the records hold no {section!r} section")
    return got[section][1]

  table.__doc__ = f"`jspec bench`'s {section} table."
  return table


def lines(head: dict, recs) -> list[str]:
  """The report's one-line figures: the floor, transformers against jspec."""
  out, have = [], {r.axes.get("section") for r in recs}
  if "floor" in have:
    f = floor_row(head, recs)
    out.append(f"floor: {f['weight_bytes'] / 1e6:.1f} MB of weights at {f['bandwidth_gb_s']:.1f} "
               f"GB/s = {f['floor_ms']:.2f} ms/token; jspec plain decoding "
               f"{f['plain_ms_per_token']:.2f} ms/token ({f['plain_over_floor']:.2f}x the floor)")
  hf = head["sections"].get("transformers", {})
  if "skipped" in hf:
    out.append(f"transformers: {hf['skipped']}")
  if "transformers" in have:
    part = _of(recs, "transformers")
    at = lambda B, method: M.select(part, batch=B, method=method)
    B = max(r.axes["batch"] for r in part)
    assisted = next(n for n in M.group(part, "method") if "assisted" in n)
    out.append(f"transformers {hf['transformers']} (torch, {hf['torch_threads']} threads): "
               f"greedy {M.tokens_per_s(at(1, 'transformers')):.0f} tok/s at batch 1, "
               f"{M.tokens_per_s(at(B, 'transformers')):.0f} at batch {B}; assisted "
               f"{_x(M.speedup(at(1, 'transformers'), at(1, assisted)))} (`{assisted}`)")
    out.append("  jspec plain / transformers greedy: " + ", ".join(
        f"batch {b} {_x(M.tokens_per_s(at(b, 'plain')) / M.tokens_per_s(at(b, 'transformers')))}"
        for b in (1, B)))
  differ = differing(recs)
  out.append("every greedy answer equals plain decoding's" if not differ else
             f"ERROR: greedy answers differ from plain decoding's: {', '.join(differ)}")
  return out


def differing(recs) -> list[str]:
  """The methods with a greedy answer unlike plain decoding's (another library's answers are
  compared, not held to it)."""
  return sorted({r.method for r in recs if r.equal is False and "library" not in r.axes})


def summary(head: dict, recs) -> str:
  """Every table and line of the report, as printed."""
  return "\n\n".join([f"{t}:\n{table}" for t, table in tables(head, recs).items()]
                     + ["\n".join(lines(head, recs))])


def plot(head: dict, recs, out_dir: str) -> list[str]:
  """speedup_vs_k.png, speedup_vs_batch.png, latency_vs_batch.png under out_dir (those whose
  section the records hold); the paths."""
  import os

  have, figures = {r.axes.get("section") for r in recs}, []
  if "k_sweep" in have:
    curves = {}
    for name, r in k_rows(head, recs).items():
      c = curves.setdefault(name.partition("@")[0], {"measured": ([], []), "ideal": ([], [])})
      if r["k"] == "auto":
        c["auto"] = (None, r["speedup"])
        continue
      for curve, y in (("measured", r["speedup"]), ("ideal", r.get("ideal"))):
        if y is not None:
          c[curve][0].append(r["k"])
          c[curve][1].append(y)
    figures.append(("speedup_vs_k.png", curves, "batch 1, held-out code, greedy",
                    "K (drafts per round)", "speedup over plain decoding", {}))
  if "batch_sweep" in have:
    part = _of(recs, "batch_sweep")
    Bs = list(M.group(part, "batch"))
    curves = {n: {"": (Bs, [M.speedup(M.select(part, batch=B, method=runner.PLAIN),
                                      M.select(mine, batch=B)) for B in Bs])}
              for n, mine in _others(part).items()}
    figures.append(("speedup_vs_batch.png", curves, "held-out code, greedy", "batch size",
                    "speedup over plain decoding", {"log2x": True}))
  if "latency" in have:
    part = _of(recs, "latency")
    Bs = list(M.group(part, "batch"))
    curves = {n: {p: (Bs, [_ms(M.inter_token(M.select(mine, batch=B)))[p] for B in Bs])
                  for p in ("p99", "p50")} for n, mine in M.group(part, "method").items()}
    figures.append(("latency_vs_batch.png", curves,
                    "held-out code, greedy: the wait between tokens", "batch size",
                    "inter-token latency, ms", {"log2x": True, "unity": False}))
  for name, curves, title, xlabel, ylabel, options in figures:
    report.lines(curves, os.path.join(out_dir, name), title, xlabel, ylabel, **options)
  return [os.path.join(out_dir, f[0]) for f in figures]
