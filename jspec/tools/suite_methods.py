"""The methods `jspec bench --suite` runs: a small registry, one entry per method.

Each entry names the Spec-Bench leaderboard row it stands beside and builds its drafter
for a target, or says why it cannot (`Unavailable`: no corpus given, no head that fits
the target, a drafter this version of jspec does not have). A method that is unavailable
is reported with its reason and skipped; it never stops the run.

    ngram      n-gram lookup in the context (PLD: prompt lookup decoding)
    suffix     suffix drafting, its memory carried across questions (SuffixDecoding)
    lookahead  Jacobi lookahead with the target itself (Lookahead decoding)
    recycling  Token Recycling (`jspec.TokenRecycling`, where this version has it) with the
               paper's static tree (81 nodes, depth 6), its matrix carried across questions
    datastore  n-gram lookup in the context and a corpus given with --corpus (REST)
    draft      a draft model (SpS): checkpoints/smollm2-draft, or --draft DIR
    eagle3     an EAGLE head: checkpoints/smollm2-eagle3, or --eagle DIR
    eagle3-tree  the same head growing a dynamic tree (EAGLE-2) of --eagle-tree N,D,k
    dflash     a DFlash block drafter given with --dflash DIR (none is shipped)
    medusa     Medusa heads: checkpoints/code-medusa where it fits, or --medusa DIR
    auto       num_draft_tokens="auto" over the drafter of --auto-over (default ngram)

Adding a method is one `METHODS` entry: a builder taking a `Setup` and returning a `Built`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable


class Unavailable(Exception):
  """A method that cannot run with this target and these options; the message says why."""


@dataclasses.dataclass(frozen=True)
class Setup:
  """What builders read: the target, the fixed K, the corpus's documents, drafter folders."""

  target: Any
  k: int = 4
  corpus: tuple[list[int], ...] | None = None  # token ids per document (--corpus)
  folders: dict = dataclasses.field(default_factory=dict)  # method -> folder given by the user
  checkpoints: str | None = None  # the shipped checkpoints folder
  auto_over: str = "ngram"
  eagle_tree: Any = None  # jspec.DynamicTree for eagle3-tree (None: DEFAULT_EAGLE_TREE)


# EAGLE-2's dynamic tree within the 32-node budget a verify of about one step affords on an
# accelerator at batch 1 (nodes, depth, children per candidate): the best of the shapes
# measured for SmolLM2's head (docs/training.md, "Chains and dynamic trees").
DEFAULT_EAGLE_TREE = (32, 4, 8)


@dataclasses.dataclass(frozen=True)
class Built:
  """A method ready to run: its drafter, K (an int or "auto"; a tree's depth), a
  description, whether the runner hands it the suffix memory of the questions before
  (`with_memory`), and the static tree it drafts, if any (then `k` is the tree's depth)."""

  drafter: Any
  k: Any
  description: str
  with_memory: bool = False
  tree: Any = None  # jspec.Tree or None (a chain of k)


@dataclasses.dataclass(frozen=True)
class Method:
  """A registry entry: the Spec-Bench row it compares with, and how to build it."""

  family: str  # the Spec-Bench leaderboard row it stands beside
  build: Callable[[Setup], Built]


def _vocab(setup: Setup) -> int:
  return setup.target.vocab_size


def _ngram(setup: Setup) -> Built:
  import jspec

  return Built(jspec.NGram(_vocab(setup)), setup.k, f"n-gram lookup, max n-gram 3, K = {setup.k}")


def _suffix(setup: Setup) -> Built:
  import jspec

  return Built(jspec.Suffix(_vocab(setup)), setup.k,
               f"suffix drafting, memory of earlier answers carried across questions, "
               f"K = {setup.k}", with_memory=True)


def _lookahead(setup: Setup) -> Built:
  import jspec

  d = jspec.Lookahead(_vocab(setup))
  return Built(d, setup.k, f"lookahead, window {d.window}, {d.ngram}-grams, {d.guesses} "
               f"guesses, depth {min(setup.k, d.ngram - 1)}")


def _recycling(setup: Setup) -> Built:
  import jspec

  try:
    cls = getattr(jspec, "TokenRecycling")
  except AttributeError:
    raise Unavailable("jspec.TokenRecycling is not in this version of jspec") from None
  # The configuration the leaderboard's row measures: the reference code's tree and top-8.
  tree = cls.paper_tree()
  return Built(cls(_vocab(setup)), tree.max_depth,
               f"Token Recycling, the paper's static tree ({tree.num_nodes} nodes, depth "
               f"{tree.max_depth}), matrix carried across questions", tree=tree)


def _datastore(setup: Setup) -> Built:
  import jspec

  if not setup.corpus:
    raise Unavailable("no corpus: give --corpus FILE (REST's datastore: documents to look "
                      "drafts up in)")
  store = jspec.Datastore.from_sequences(list(setup.corpus), _vocab(setup))
  return Built(store, setup.k, f"datastore of {int(store.tokens.shape[0]):,} corpus tokens "
               f"and the context, K = {setup.k}")


def fitting(setup: Setup, method: str, shipped_names: tuple[str, ...], what: str):
  """The drafter in the folder given for `method`, else the first shipped folder that fits
  the target; `Unavailable` (saying why) when none does."""
  from jspec.io import shipped
  from jspec.tools.chat import drafter_from_dir

  given = setup.folders.get(method)
  if given is not None:
    candidates = [given]
  else:
    try:
      root = shipped.checkpoints_dir(setup.checkpoints)
    except FileNotFoundError:
      root = None
    candidates = [os.path.join(root, n) for n in shipped_names
                  if root and os.path.isdir(os.path.join(root, n))]
  reasons = []
  for path in candidates:
    try:
      drafter = drafter_from_dir(path, setup.target)
    except (ValueError, FileNotFoundError, OSError) as e:
      reasons.append(f"{path}: {e}")
      continue
    if drafter.vocab_size != _vocab(setup):
      reasons.append(f"{path}: a {drafter.vocab_size}-token vocabulary, the target has "
                     f"{_vocab(setup)}")
      continue
    return drafter, path
  flag = {"draft": "--draft", "eagle3": "--eagle", "medusa": "--medusa",
          "dflash": "--dflash"}[method]
  tried = "; ".join(reasons) if reasons else f"none shipped ({', '.join(shipped_names)})"
  raise Unavailable(f"no {what} fits this target ({tried}); give one with {flag} DIR")


def _draft(setup: Setup) -> Built:
  import jspec
  from jspec.io import shipped

  drafter, path = fitting(setup, "draft", (shipped.SMOLLM2_DRAFT, shipped.DRAFT), "draft model")
  if isinstance(drafter, jspec.Model):
    drafter = jspec.DraftModel(drafter)
  return Built(drafter, setup.k, f"draft model {os.path.basename(os.path.normpath(path))}, "
               f"K = {setup.k}")


def _eagle3(setup: Setup) -> Built:
  import jspec
  from jspec.io import shipped

  drafter, path = fitting(setup, "eagle3", (shipped.SMOLLM2_EAGLE3,), "EAGLE head")
  if not isinstance(drafter, jspec.Eagle):
    raise Unavailable(f"{path} holds no EAGLE head")
  return Built(drafter, setup.k, f"EAGLE head {os.path.basename(os.path.normpath(path))}, "
               f"chain of K = {setup.k}")


def _eagle3_tree(setup: Setup) -> Built:
  import jspec

  tree = setup.eagle_tree or jspec.DynamicTree(*DEFAULT_EAGLE_TREE)
  head = _eagle3(setup)
  return Built(head.drafter, tree.max_depth, head.description.split(",")[0]
               + f", dynamic tree (EAGLE-2) of {tree.num_nodes} nodes, depth {tree.max_depth}, "
               f"top-{tree.top_k}", tree=tree)


def _dflash(setup: Setup) -> Built:
  import jspec

  if setup.folders.get("dflash") is None:
    raise Unavailable("no DFlash drafter is shipped: give one with --dflash DIR "
                      "(python -m jspec.recipes.smollm2_dflash, or a published one)")
  drafter, path = fitting(setup, "dflash", (), "DFlash drafter")
  if not isinstance(drafter, jspec.DFlash):
    raise Unavailable(f"{path} holds no DFlash drafter")
  k = min(setup.k, drafter.max_draft_tokens)
  return Built(drafter, k, f"DFlash block drafter {os.path.basename(os.path.normpath(path))}, "
               f"block {drafter.draft_block}, chain of K = {k}")


def _medusa(setup: Setup) -> Built:
  import jspec
  from jspec.io import shipped

  drafter, path = fitting(setup, "medusa", (shipped.MEDUSA,), "Medusa head")
  if not isinstance(drafter, jspec.Medusa):
    raise Unavailable(f"{path} holds no Medusa heads")
  k = min(setup.k, drafter.num_heads)
  return Built(drafter, k, f"Medusa heads {os.path.basename(os.path.normpath(path))}, "
               f"chain of K = {k}")


def _auto(setup: Setup) -> Built:
  if setup.auto_over in ("auto", "lookahead"):
    raise Unavailable(f"--auto-over {setup.auto_over}: \"auto\" drafts with a drafter whose "
                      f"K it can choose (not lookahead, which verifies its own tree)")
  inner = METHODS[setup.auto_over].build(setup)
  if inner.tree is not None:
    raise Unavailable(f"--auto-over {setup.auto_over}: it verifies a tree; \"auto\" chooses "
                      f"the K of a chain")
  return Built(inner.drafter, "auto", f"num_draft_tokens=\"auto\" over {setup.auto_over}",
               with_memory=inner.with_memory)


METHODS: dict[str, Method] = {
    "ngram": Method("PLD", _ngram),
    "suffix": Method("(SuffixDecoding; not on the leaderboard)", _suffix),
    "lookahead": Method("Lookahead", _lookahead),
    "recycling": Method("Recycling", _recycling),
    "datastore": Method("REST", _datastore),
    "draft": Method("SpS", _draft),
    "eagle3": Method("EAGLE", _eagle3),
    "eagle3-tree": Method("EAGLE-2", _eagle3_tree),
    "dflash": Method("(DFlash; not on the leaderboard)", _dflash),
    "medusa": Method("Medusa", _medusa),
    "auto": Method("(jspec's K per round; not on the leaderboard)", _auto),
}


def parse(text: str | None) -> list[str]:
  """Method names from --methods (comma-separated; None or "all": every one), checked."""
  if text is None or text.strip() == "all":
    return list(METHODS)
  names = [n.strip() for n in text.split(",") if n.strip()]
  unknown = [n for n in names if n not in METHODS]
  if unknown or not names:
    raise ValueError(f"unknown method{'s' if len(unknown) > 1 else ''} "
                     f"{', '.join(map(repr, unknown)) or repr(text)}; known: "
                     f"{', '.join(METHODS)} (or all)")
  return list(dict.fromkeys(names))


def build(names: list[str], setup: Setup) -> tuple[dict[str, Built], dict[str, str]]:
  """({name: Built} of the methods that can run, {name: why not} of the others)."""
  ready, skipped = {}, {}
  for name in names:
    try:
      ready[name] = METHODS[name].build(setup)
    except Unavailable as e:
      skipped[name] = str(e)
  return ready, skipped
