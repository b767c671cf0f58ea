"""vLLM's side of a side-by-side run: one engine kept loaded, timing a request list on demand.

Runs inside vLLM's own virtualenv (benchmarks/vllm_setup.sh), started by a jspec benchmark:

    VENV/bin/python benchmarks/vllm_worker.py --model HF_DIR --requests REQUESTS.json \
        [--max-num-seqs 32] [--ngram K]

REQUESTS.json: {"prompts": [[token ids], ...], "max_new": [n, ...]}. The worker loads the
model, runs the whole list once untimed (warm-up), prints "ready", then for each line "run"
on stdin runs the list again (greedy, EOS ignored, every prompt given as token ids) and
prints one JSON line: {"seconds": s, "tokens": [[ids], ...]}. "quit" ends it. Between runs
it waits on stdin, so the other engine's repeats run on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> int:
  p = argparse.ArgumentParser()
  p.add_argument("--model", required=True, help="a Hugging Face folder (jspec export-hf)")
  p.add_argument("--requests", required=True)
  p.add_argument("--max-num-seqs", type=int, default=32)
  p.add_argument("--max-model-len", type=int, default=1024)
  p.add_argument("--ngram", type=int, default=0, help="K of vLLM's n-gram speculation (0: none)")
  args = p.parse_args()
  from vllm import LLM, SamplingParams
  from vllm.inputs import TokensPrompt

  with open(args.requests) as f:
    spec = json.load(f)
  speculative = None
  if args.ngram:
    speculative = {"method": "ngram", "num_speculative_tokens": args.ngram,
                   "prompt_lookup_max": 3, "prompt_lookup_min": 1}
  llm = LLM(model=args.model, dtype="float32", max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len, speculative_config=speculative,
            enable_prefix_caching=False)
  prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in spec["prompts"]]
  params = [SamplingParams(temperature=0.0, max_tokens=int(n), ignore_eos=True)
            for n in spec["max_new"]]

  def run():
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t
    return seconds, [list(o.outputs[0].token_ids) for o in outs]

  run()
  print("ready", flush=True)
  for line in sys.stdin:
    command = line.strip()
    if command == "quit":
      break
    if command == "run":
      seconds, tokens = run()
      print(json.dumps({"seconds": seconds, "tokens": tokens}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
