"""The sampling flags the CLI commands share (`jspec generate`, `jspec chat`)."""


def add(p) -> None:
  """The sampling flags of `generate` and `chat`, named and defaulted as vLLM's
  `SamplingParams` (docs/decoding.md, "Sampling settings" and "Penalties")."""
  p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
  p.add_argument("--top-k", type=int, default=0, help="0 turns top-k off")
  p.add_argument("--top-p", type=float, default=1.0)
  p.add_argument("--min-p", type=float, default=0.0, help="0 turns min-p off")
  p.add_argument("--repetition-penalty", type=float, default=1.0,
                 help="> 1 discourages tokens seen in the prompt or output; 1 turns it off")
  p.add_argument("--presence-penalty", type=float, default=0.0,
                 help="subtracted once from every token already in the output")
  p.add_argument("--frequency-penalty", type=float, default=0.0,
                 help="subtracted per occurrence in the output")
  p.add_argument("--seed", type=int, default=0)


def kwargs(args) -> dict:
  """`jspec.generate`'s sampling keywords from `add`'s flags."""
  return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
              min_p=args.min_p, repetition_penalty=args.repetition_penalty,
              presence_penalty=args.presence_penalty,
              frequency_penalty=args.frequency_penalty, seed=args.seed)
