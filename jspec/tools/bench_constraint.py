"""What a constraint costs speculative decoding: tokens/s with and without one.

    python -m jspec.tools.bench_constraint [--target smollm2|FILE.gguf] [--batches 1,8]

Per batch size, one process, after compilation, the variants interleaved and timed
`repeats` times (medians), all greedy speculative decoding with the n-gram drafter:

  free         no constraint;
  lookup only  a one-state automaton that allows every id: the same tokens as "free",
               so the difference is the table lookups and masking alone;
  json         a JSON schema (an object with a string and an integer), a different
               output with its own acceptance: what a user of structured output sees.

Prompts ask for the JSON object, so "free" and "json" write similar text, but not
equally long: the JSON answers stop at the closing brace. So each variant is also
timed with max_new_tokens=1 (prefill and one round), and the decoding rate is
(tokens - 1) / (t - t_1): tokens per second of the rounds alone, comparable
between outputs of different lengths. "ms/round" is (t - t_1) / (rounds - 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import numpy as np

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


def run(target, batches=(1, 8), max_new_tokens: int = 48, k: int = 4, repeats: int = 5,
        log=print) -> dict:
  """Tokens/s of each variant at each batch size (module docstring)."""
  import jspec
  from jspec.tools.bench_real import chat_ids

  tok = target.tokenizer
  t0 = time.perf_counter()
  schema = jspec.Constraint.from_json_schema(SCHEMA, tok)
  build_s = time.perf_counter() - t0
  ids = [row for _, row in chat_ids(tok, [{"kind": "json", "content": p} for p in PROMPTS])]
  drafter = jspec.NGram(target.vocab_size)
  report = {"schema": SCHEMA, "states": schema.num_states, "table_mib":
            schema.next_state.size * 4 / 2 ** 20, "build_s": build_s, "k": k,
            "max_new_tokens": max_new_tokens, "repeats": repeats, "batches": {}}
  log(f"JSON schema: {schema.num_states} states, {report['table_mib']:.1f} MiB, "
      f"built in {build_s:.2f} s")
  for B in batches:
    rows = [ids[i % len(ids)] for i in range(B)]
    variants = {"free": None, "lookup only": [None] * B, "json": schema}

    def call(constraint, new=max_new_tokens):
      return jspec.speculative_generate(target, drafter, rows, num_draft_tokens=k,
                                        max_new_tokens=new, constraint=constraint)

    outs = {name: call(c) for name, c in variants.items()}  # compile each
    for c in variants.values():
      call(c, 1)
    times = {name: [] for name in variants}
    firsts = {name: [] for name in variants}
    for _ in range(repeats):
      for name, c in variants.items():
        t = time.perf_counter()
        outs[name] = call(c)
        jax.block_until_ready(outs[name].tokens)
        times[name].append(time.perf_counter() - t)
        t = time.perf_counter()
        jax.block_until_ready(call(c, 1).tokens)
        firsts[name].append(time.perf_counter() - t)
    result = {}
    for name, out in outs.items():
      tokens = int(np.sum(np.asarray(out.lengths)))
      calls = int(np.sum(np.asarray(out.stats.target_calls)))
      rounds = int(np.max(np.asarray(out.stats.target_calls)))
      seconds, first = statistics.median(times[name]), statistics.median(firsts[name])
      result[name] = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                      "tau": tokens / max(calls, 1), "first_round_s": first,
                      "decode_tokens_per_s": (tokens - B) / (seconds - first),
                      "ms_per_round": 1e3 * (seconds - first) / max(rounds - 1, 1)}
    same = bool(np.array_equal(np.asarray(outs["free"].tokens),
                               np.asarray(outs["lookup only"].tokens)))
    valid = sum(_valid_json(tok.decode(np.asarray(row))) for row in np.asarray(outs["json"].tokens))
    for name in ("lookup only", "json"):
      result[name]["ratio_to_free"] = (result[name]["decode_tokens_per_s"]
                                       / result["free"]["decode_tokens_per_s"])
    result["lookup_only_equals_free"] = same
    result["json_rows_valid"] = f"{valid}/{B}"
    report["batches"][B] = result
    for name in variants:
      r = result[name]
      ratio = f"  {r['ratio_to_free']:.3f}x free" if "ratio_to_free" in r else ""
      log(f"B={B:<3} {name:<12} {r['tokens']:4d} tokens {r['tokens_per_s']:7.1f} tok/s, "
          f"decoding {r['decode_tokens_per_s']:7.1f} tok/s, {r['ms_per_round']:6.1f} ms/round, "
          f"tau {r['tau']:.2f}{ratio}")
    log(f"B={B:<3} lookup-only tokens equal free: {same}; JSON rows valid: {valid}/{B} "
        f"(rows cut by max_new_tokens are not)")
  return report


def _valid_json(text: str) -> bool:
  try:
    value = json.loads(text)
  except ValueError:
    return False
  return isinstance(value, dict) and isinstance(value.get("age"), int)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--target", default="smollm2", help="'smollm2' or a GGUF / jspec path")
  parser.add_argument("--batches", default="1,8")
  parser.add_argument("--max-new-tokens", type=int, default=48)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--json", help="write the report here")
  args = parser.parse_args(argv)
  from jspec.bench import targets
  from jspec.tools.bench_real import write_json

  report = run(targets.load(args.target), [int(b) for b in args.batches.split(",")], args.max_new_tokens,
               repeats=args.repeats)
  write_json(report, args.json)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
