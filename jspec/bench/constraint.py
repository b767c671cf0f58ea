"""What a constraint costs speculative decoding: tokens/s with and without one.

    python -m jspec.bench.constraint [--target smollm2|FILE.gguf] [--batches 1,8]
        [--max-new-tokens 48] [--repeats 5] [--json out.jsonl]

Per batch size, through the harness's runner (compiled first, the variants interleaved and
timed `repeats` times), greedy speculative decoding with the n-gram drafter beside plain
decoding:

  free         no constraint (its answers equal plain decoding's);
  lookup only  a one-state automaton per row that allows every id: the same tokens as
               "free" (compared with plain decoding's too), so the difference is the
               table lookups and masking alone;
  json         a JSON schema (an object with a string and an integer), a different
               output with its own acceptance: what a user of structured output sees
               (compared, not held to plain decoding's: `exact=False`).

Prompts ask for the JSON object, so "free" and "json" write similar text, but not
equally long: the JSON answers stop at the closing brace. So every variant also runs with
max_new_tokens=1 (prefill and one round), and the decoding rate is the tokens per second
of the rounds past that call (`metrics.steady_seconds`), comparable between outputs of
different lengths; "ms/round" the seconds per round past it. The JSON rows that parse
(with an integer age) are counted from the answers the records keep.
"""

from __future__ import annotations

import argparse
import json

from jspec.bench import metrics as M
from jspec.bench import methods as registry
from jspec.bench import report, runner
from jspec.bench import workloads as W

STUDY = "constraint"
PROMPTS = (
    "Describe a person called Ann, aged 31, as a JSON object with the fields name and age.",
    "Give me a JSON object for a cat named Tom who is 4 years old (fields name, age).",
    "Return a JSON object with a name and an age for the user Bob, 52.",
    "Write the JSON object {name, age} for a character named Lia, who is 19.",
    "As JSON with keys name and age: the engineer Ravi is 40.",
    "Output only JSON with name and age: Mia, twenty-five.",
    "Encode this as a JSON object with name and age: Olu, 63 years old.",
    "Make a JSON record (name, age) for Sam, who just turned 8.",
)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}
VARIANTS = ("free", "lookup only", "json")


def workload(batch: int, prompts=None) -> W.Workload:
  """`batch` rows, the prompts (token-id lists; default PROMPTS as chat turns) cycled."""
  if prompts is None:
    return W.Workload("json", tuple(W.Prompt(str(i), "json", W.user(PROMPTS[i % len(PROMPTS)]))
                                    for i in range(batch)))
  return W.from_ids("json", [prompts[i % len(prompts)] for i in range(batch)])


def run(target, constraint, batches=(1, 8), max_new_tokens: int = 48, k: int = 4,
        repeats: int = 5, prompts=None, progress: bool = True) -> runner.Result:
  """Every variant at every batch size, at max_new_tokens and at 1 (module docstring);
  records' axes `new_tokens`, the answers kept (`extra["answers"]`)."""
  ngram = registry.build("ngram", target, k=k)
  recs, mismatches = [], []
  for B in batches:
    options = {"free": {}, "lookup only": {"constraint": [None] * B},
               "json": {"constraint": constraint}}
    for new in (max_new_tokens, 1):
      variants = [runner.Variant(runner.PLAIN, axes={"new_tokens": new})] + [
          runner.Variant(v, ngram, axes={"new_tokens": new, "k": k}, options=options[v],
                         exact=v != "json") for v in VARIANTS]
      ran = runner.run(target, variants, workload(B, prompts), runner.Settings(
          max_new_tokens=new, repeats=repeats, batch=B, answers=True, progress=progress),
          STUDY)
      recs += ran.records
      mismatches += ran.mismatches
  return runner.Result(recs, mismatches)


def valid_json(text: str) -> bool:
  """An object whose "age" is an integer."""
  try:
    value = json.loads(text)
  except ValueError:
    return False
  return isinstance(value, dict) and isinstance(value.get("age"), int)


def table(recs, max_new_tokens: int) -> str:
  """Per batch and variant: tokens, tokens/s of the call, decoding rate and ms per round
  past the one-token call, tau, and the decoding rate over free's."""
  out = [["batch", "variant", "tokens", "tokens/s (call)", "decoding tok/s", "ms per round",
          "tau", "decoding rate vs free"]]
  for B, mine in M.group(recs, "batch").items():
    at = lambda v, n: M.select(mine, method=v, new_tokens=n)
    rate = {v: 1 / M.steady_seconds(at(v, 1), at(v, max_new_tokens)) for v in VARIANTS}
    for v in VARIANTS:
      full = at(v, max_new_tokens)
      out.append([str(B), v, str(sum(r.tokens for r in full)), f"{M.tokens_per_s(full):.1f}",
                  f"{rate[v]:.1f}",
                  f"{1e3 * M.steady_seconds(at(v, 1), full, per='rounds'):.1f}",
                  f"{M.tau(full):.2f}", "" if v == "free" else f"{rate[v] / rate['free']:.2f}x"])
  return report.markdown(out)


def valid_rows(recs, tokenizer) -> dict:
  """{batch: (JSON rows that parse, rows)} of the json variant's full-length answers."""
  out = {}
  for r in M.select(recs, method="json"):
    if r.axes["new_tokens"] > 1:
      ok = sum(valid_json(tokenizer.decode(a)) for a in r.extra["answers"])
      out[r.axes["batch"]] = (ok, len(r.extra["answers"]))
  return out


def main(argv=None) -> int:
  """The command line (module docstring)."""
  import jspec
  from jspec.bench import targets

  p = argparse.ArgumentParser(prog="python -m jspec.bench.constraint",
                              description=__doc__.splitlines()[0])
  p.add_argument("--target", default="smollm2", help="'smollm2' or a GGUF / jspec path")
  p.add_argument("--batches", default="1,8")
  p.add_argument("--max-new-tokens", type=int, default=48)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--k", type=int, default=4)
  p.add_argument("--json", help="write the records here (JSON lines)")
  args = p.parse_args(argv)
  target = targets.load(args.target)
  outs, seconds = runner.interleave(
      {"schema": lambda: jspec.Constraint.from_json_schema(SCHEMA, target.tokenizer)}, 1,
      wait=lambda c: c.next_state.block_until_ready())
  schema = outs["schema"]
  info = {"states": schema.num_states, "table_mib": schema.next_state.size * 4 / 2 ** 20,
          "build_s": seconds["schema"][0]}
  print(f"JSON schema: {info['states']} states, {info['table_mib']:.1f} MiB, built in "
        f"{info['build_s']:.2f} s")
  batches = [int(b) for b in args.batches.split(",")]
  ran = run(target, schema, batches, args.max_new_tokens, args.k, args.repeats)
  valid = valid_rows(ran.records, target.tokenizer)
  lines = "\n".join(f"B={B}: JSON rows valid {ok}/{n} (rows cut by max_new_tokens are not)"
                    for B, (ok, n) in valid.items())
  settings = {"batches": batches, "max_new_tokens": args.max_new_tokens, "k": args.k,
              "repeats": args.repeats}
  return report.finish(ran, STUDY, settings, {
      "tokens/s with and without a constraint, n-gram drafting": table(
          ran.records, args.max_new_tokens), "valid JSON": lines}, args.json,
      target=args.target, schema=SCHEMA, automaton=info)


if __name__ == "__main__":
  raise SystemExit(main())
