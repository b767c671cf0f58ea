"""The method registry: one name for each way of decoding, from `jspec generate --draft` to
`jspec bench --suite` and the benchmark scripts.

A method is a spec string:

    NAME[:ARGS][@KEY=VALUE]...   a method of the registry, its arguments and options
    PATH[@KEY=VALUE]...          a drafter folder, its kind read from the folder
    auto                         ngram@k=auto

    plain             no drafter: plain decoding
    none              plain
    ngram[:N]         n-gram lookup in the context, N the longest n-gram matched (default 3)
    suffix            suffix drafting; the suite carries its memory across questions
    lookahead[:W,N,G] Jacobi lookahead with the target itself, `jspec.Lookahead(window=W,
                      ngram=N, guesses=G)` (default 4,3,3): a W-column lookahead window, n-grams
                      of N tokens (N >= 3), G candidates verified a round; its depth is
                      min(K, N - 1)
    recycling         Token Recycling with the paper's static tree (81 nodes, depth 6)
    datastore         n-gram lookup in the context and in a corpus of documents (REST)
    draft             a draft model: @dir, else the shipped one that fits the target
    eagle3            an EAGLE head: @dir, else the shipped smollm2-eagle3 where it fits
    eagle3-tree       eagle3@tree=32,4,8 (the suite's --eagle-tree changes the tree)
    medusa            Medusa heads: @dir, else the shipped code-medusa where it fits
    dflash            a DFlash block drafter: @dir (none is shipped)
    self-int8         the target's own int8 copy as a draft model: no training, no folder
    self-int4         the same with int4 weights (affine, groups of 32)
    self-fp8          the same with fp8 (e4m3) weights

Options:

    @k=N              K, the draft tokens a round (default: the caller's, e.g. --fixed-k)
    @k=auto           num_draft_tokens="auto" over that drafter: a chain method only (not
                      lookahead, which verifies its own tree, nor a tree)
    @dir=PATH         the folder of draft, eagle3, medusa or dflash
    @tree=N,D,K       EAGLE-2's dynamic tree, `jspec.DynamicTree(nodes=N, depth=D, top_k=K)`:
                      N nodes with the root, depth D, K children per candidate; for eagle3
                      and folders holding an EAGLE head. A tree's depth is its K.

A list of specs (`parse`, `--methods`) is separated by commas, semicolons or whitespace; a
comma followed by a digit continues the spec it is in, so "ngram:3,lookahead:5,4,3,
eagle3@tree=32,4,8" is three specs. A bad spec raises ValueError naming the known methods
(`parse_spec`), before any model loads. `build` makes a spec's drafter for a target:
`Built`, or `Unavailable` (no corpus, no folder that fits the target) with the reason;
a suite reports such a method and skips it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable


class Unavailable(Exception):
  """A method that cannot run with this target and these inputs; the message says why."""


# EAGLE-2's dynamic tree within the 32-node budget a verify of about one step affords on an
# accelerator at batch 1 (nodes, depth, children per candidate): the best of the shapes
# measured for SmolLM2's head (docs/training.md, "Chains and dynamic trees").
DEFAULT_EAGLE_TREE = (32, 4, 8)
FOLDER = "folder"  # the name of a spec that is a drafter folder
AUTO_FAMILY = "(jspec's K per round; not on the leaderboard)"


@dataclasses.dataclass(frozen=True)
class Spec:
  """A parsed spec: the method's name (`FOLDER` for a drafter folder), its arguments, and
  the options given (None: not given)."""

  text: str  # as written
  name: str
  args: tuple[int, ...] = ()
  k: int | str | None = None  # an int, "auto", or None: the caller's K
  tree: tuple[int, int, int] | None = None  # nodes, depth, top-k of a dynamic tree
  dir: str | None = None


@dataclasses.dataclass(frozen=True)
class Built:
  """A method ready to run: its drafter (None: plain decoding), K (an int or "auto"; a
  tree's depth), a description, whether the runner hands it the suffix memory of the
  questions before (`with_memory`), the tree it drafts, if any (static or dynamic; then `k`
  is the tree's depth), and the Spec-Bench leaderboard row it stands beside."""

  drafter: Any
  k: Any
  description: str
  with_memory: bool = False
  tree: Any = None  # jspec.Tree, jspec.DynamicTree or None (a chain of k)
  family: str = ""


@dataclasses.dataclass(frozen=True)
class Method:
  """A registry entry: the Spec-Bench row it stands beside, what it takes, how to build it."""

  family: str
  build: Callable[[Spec, "Context"], Built]
  summary: str
  args: str = ""  # the arguments after ':' ("N", "W,N,G"), "" for none
  options: frozenset = frozenset({"k"})  # the @KEY= it takes
  auto: bool = True  # whether @k=auto applies (a chain whose K can be chosen per round)
  fixed: str = ""  # why @k=auto (or @k) does not apply, where it does not
  flag: str | None = None  # the suite's flag giving its folder (--draft, --eagle, ...)


@dataclasses.dataclass(frozen=True)
class Context:
  """What builders read besides the spec: the target, the default K, the corpus's documents,
  folders given for methods ({name: folder}), the shipped checkpoints folder."""

  target: Any
  k: Any = 4
  corpus: tuple[list[int], ...] | None = None
  folders: dict = dataclasses.field(default_factory=dict)
  checkpoints: str | None = None


# ----------------------------------------------------------------------------- builders


def _vocab(ctx: Context) -> int:
  return ctx.target.vocab_size


def _k(spec: Spec, ctx: Context):
  return ctx.k if spec.k is None else spec.k


def _plain(spec: Spec, ctx: Context) -> Built:
  return Built(None, 0, "plain decoding", family="(baseline)")


def _ngram(spec: Spec, ctx: Context) -> Built:
  import jspec

  n = spec.args[0] if spec.args else 3
  k = _k(spec, ctx)
  return Built(jspec.NGram(_vocab(ctx), max_ngram=n), k,
               f"n-gram lookup, max n-gram {n}, K = {k}", family="PLD")


def _suffix(spec: Spec, ctx: Context) -> Built:
  import jspec

  k = _k(spec, ctx)
  return Built(jspec.Suffix(_vocab(ctx)), k, f"suffix drafting, memory of earlier answers "
               f"carried across questions, K = {k}", with_memory=True,
               family="(SuffixDecoding; not on the leaderboard)")


def _lookahead(spec: Spec, ctx: Context) -> Built:
  import jspec

  options = dict(zip(("window", "ngram", "guesses"), spec.args))
  d = jspec.Lookahead(_vocab(ctx), **options)
  k = _k(spec, ctx)
  if k == "auto":
    raise Unavailable("lookahead verifies its own tree: \"auto\" does not set its K; give "
                      "an integer K")
  depth = min(int(k), d.ngram - 1)
  return Built(d, depth, f"lookahead, window {d.window}, {d.ngram}-grams, {d.guesses} "
               f"guesses, depth {depth}", family="Lookahead")


def _recycling(spec: Spec, ctx: Context) -> Built:
  import jspec

  try:
    cls = getattr(jspec, "TokenRecycling")
  except AttributeError:
    raise Unavailable("jspec.TokenRecycling is not in this version of jspec") from None
  # The configuration the leaderboard's row measures: the reference code's tree and top-8.
  tree = cls.paper_tree()
  return Built(cls(_vocab(ctx)), tree.max_depth,
               f"Token Recycling, the paper's static tree ({tree.num_nodes} nodes, depth "
               f"{tree.max_depth}), matrix carried across questions", tree=tree,
               family="Recycling")


def _datastore(spec: Spec, ctx: Context) -> Built:
  import jspec

  if not ctx.corpus:
    raise Unavailable("no corpus: give --corpus FILE (REST's datastore: documents to look "
                      "drafts up in)")
  store = jspec.Datastore.from_sequences(list(ctx.corpus), _vocab(ctx))
  k = _k(spec, ctx)
  return Built(store, k, f"datastore of {int(store.tokens.shape[0]):,} corpus tokens and the "
               f"context, K = {k}", family="REST")


def from_folder(path: str, target):
  """The drafter saved in `path`: an EAGLE head or Medusa heads (attached to `target`), a
  draft model that borrows the target's embedding (`jspec.io.draft_checkpoint`), a drafter
  published in another project's layout (`jspec.io.drafter_layouts`: EAGLE-3 from SpecForge
  or speculators, EAGLE-1/2, Medusa, MTP, DFlash from speculators or z-lab), or a draft
  model in any checkpoint `jspec.load` reads (a `jspec.Model`)."""
  from jspec.drafters import eagle, medusa
  from jspec.io import checkpoint, draft_checkpoint
  from jspec.io import drafter_layouts as published

  if os.path.isfile(os.path.join(path, eagle.CONFIG_FILE)):
    return eagle.load_eagle(path, target)
  if os.path.isfile(os.path.join(path, medusa.CONFIG_FILE)):
    return medusa.load_medusa(path, target)
  if draft_checkpoint.is_draft_dir(path):
    return draft_checkpoint.load_draft(path, target)
  if os.path.isdir(path) and published.is_published(path):
    return published.load_drafter(path, target, dtype="float32")
  return checkpoint.load(path, dtype="float32")


def fitting(path: str, target):
  """The drafter in `path` (`from_folder`), a `jspec.Model` wrapped as a `jspec.DraftModel`,
  checked to draft in `target`'s vocabulary; `Unavailable` saying why not, before anything
  compiles."""
  import jspec

  try:
    drafter = from_folder(path, target)
  except (ValueError, FileNotFoundError, NotADirectoryError, OSError) as e:
    raise Unavailable(f"{path}: {e}") from None  # heads check their fit as they load
  if isinstance(drafter, jspec.Model):
    drafter = jspec.DraftModel(drafter)
  if drafter.vocab_size != target.vocab_size:
    raise Unavailable(
        f"{path} has a {drafter.vocab_size}-token vocabulary but the target has "
        f"{target.vocab_size} tokens: drafts must be ids of the target's vocabulary. Give a "
        f"drafter made for this target, or ngram (n-gram lookup drafts from the target's own "
        f"vocabulary).")
  return drafter


def _shipped(ctx: Context, names: tuple[str, ...]) -> list[str]:
  from jspec.io import shipped

  try:
    root = shipped.checkpoints_dir(ctx.checkpoints)
  except FileNotFoundError:
    return []
  return [os.path.join(root, n) for n in names if os.path.isdir(os.path.join(root, n))]


def _first_fitting(spec: Spec, ctx: Context, shipped_names: tuple[str, ...], what: str,
                   kind=None):
  """The drafter of the folder given (@dir, else the context's folder for this method),
  else the first shipped folder that fits the target and is of `kind`: (drafter, folder)."""
  given = spec.dir or ctx.folders.get(spec.name)
  candidates = [given] if given is not None else _shipped(ctx, shipped_names)
  reasons = []
  for path in candidates:
    try:
      drafter = fitting(path, ctx.target)
    except Unavailable as e:
      reasons.append(str(e))
      continue
    if kind is not None and not isinstance(drafter, kind):
      reasons.append(f"{path} holds a {type(drafter).__name__}, not {what}")
      continue
    return drafter, path
  tried = "; ".join(reasons) if reasons else (
      f"none shipped ({', '.join(shipped_names)})" if shipped_names else "none shipped")
  flag = METHODS[spec.name].flag
  raise Unavailable(f"no {what} fits this target ({tried}); give one with "
                    f"{spec.name}@dir=DIR" + (f" or {flag} DIR" if flag else ""))


def _base(path: str) -> str:
  return os.path.basename(os.path.normpath(path))


def _chain_or_tree(spec: Spec, ctx: Context, drafter, what: str, family: str) -> Built:
  """A drafter as a chain of K (bounded by what it drafts a round), or with @tree as a
  dynamic tree."""
  import jspec
  from jspec.core.drafter import BoundedDrafter, DynamicTreeDrafter

  if spec.tree is not None:
    if not isinstance(drafter, DynamicTreeDrafter):
      raise Unavailable(f"{what} ({type(drafter).__name__}) cannot grow dynamic trees: "
                        f"@tree is for EAGLE heads")
    tree = jspec.DynamicTree(*spec.tree)
    return Built(drafter, tree.max_depth, f"{what}, dynamic tree (EAGLE-2) of "
                 f"{tree.num_nodes} nodes, depth {tree.max_depth}, top-{tree.top_k}",
                 tree=tree, family="EAGLE-2")
  k = _k(spec, ctx)
  if k != "auto" and isinstance(drafter, BoundedDrafter):
    k = min(int(k), int(drafter.max_draft_tokens))
  return Built(drafter, k, f"{what}, chain of K = {k}", family=family)


def _draft(spec: Spec, ctx: Context) -> Built:
  from jspec.io import shipped

  drafter, path = _first_fitting(spec, ctx, (shipped.SMOLLM2_DRAFT, shipped.DRAFT),
                                 "draft model")
  return _chain_or_tree(spec, ctx, drafter, f"draft model {_base(path)}", "SpS")


def _eagle3(spec: Spec, ctx: Context) -> Built:
  import jspec
  from jspec.io import shipped

  drafter, path = _first_fitting(spec, ctx, (shipped.SMOLLM2_EAGLE3,), "EAGLE head",
                                 kind=jspec.Eagle)
  return _chain_or_tree(spec, ctx, drafter, f"EAGLE head {_base(path)}", "EAGLE")


def _dflash(spec: Spec, ctx: Context) -> Built:
  import jspec

  if spec.dir is None and ctx.folders.get("dflash") is None:
    raise Unavailable("no DFlash drafter is shipped: give one with dflash@dir=DIR or --dflash "
                      "DIR (python -m jspec.recipes.smollm2_dflash, or a published one)")
  drafter, path = _first_fitting(spec, ctx, (), "DFlash drafter", kind=jspec.DFlash)
  return _chain_or_tree(spec, ctx, drafter, f"DFlash block drafter {_base(path)}, block "
                        f"{drafter.draft_block}", "(DFlash; not on the leaderboard)")


def _medusa(spec: Spec, ctx: Context) -> Built:
  import jspec
  from jspec.io import shipped

  drafter, path = _first_fitting(spec, ctx, (shipped.MEDUSA,), "Medusa heads",
                                 kind=jspec.Medusa)
  return _chain_or_tree(spec, ctx, drafter, f"Medusa heads {_base(path)}", "Medusa")


# `jspec.core.quant.MODES`, written out so that reading the registry imports no jax
# (tests/test_quant.py checks they agree).
SELF_MODES = ("int8", "int4", "fp8")


def _self_quantized(mode: str):
  """The builder of "self-<mode>": the target's own copy in `mode`
  (`jspec.models.quantize_model`) drafting as a `jspec.DraftModel`, a drafter that needs no
  training and fits any target of jspec.models.

  A DraftModel over the quantized copy rather than a new drafter kind: the copy is a
  `jspec.Model` like any draft model, so the draft-model machinery (its own cache, the
  catch-up after rounds without drafting, trees, "auto"'s pricing, placement) runs it
  unchanged. The copy is a new Model whose matrices are new arrays; it shares nothing
  mutable with the target (jax arrays are never written in place). The target verifies
  in its own weights, so the output is the target's, exactly."""

  def build(spec: Spec, ctx: Context) -> Built:
    import jspec
    from jspec import models

    try:
      copy = models.quantize_model(ctx.target, mode)
    except ValueError as e:
      raise Unavailable(f"self-{mode} quantizes the target itself: {e}") from None
    k = _k(spec, ctx)
    return Built(jspec.DraftModel(copy), k, f"the target's own {mode} copy as a draft "
                 f"model, K = {k}", family=f"(self-speculation, {mode} copy; not on the "
                 f"leaderboard)")

  return build


def _folder(spec: Spec, ctx: Context) -> Built:
  import jspec

  drafter = fitting(spec.dir, ctx.target)
  family = {jspec.Eagle: "EAGLE", jspec.Medusa: "Medusa", jspec.DraftModel: "SpS"}.get(
      type(drafter), "")
  return _chain_or_tree(spec, ctx, drafter, f"{type(drafter).__name__} from {_base(spec.dir)}",
                        family)


METHODS: dict[str, Method] = {
    "ngram": Method("PLD", _ngram, "n-gram lookup in the context (prompt lookup decoding)",
                    args="N"),
    "suffix": Method("(SuffixDecoding; not on the leaderboard)", _suffix,
                     "suffix drafting, its memory carried across questions"),
    "lookahead": Method("Lookahead", _lookahead, "Jacobi lookahead with the target itself",
                        args="W,N,G", auto=False, fixed="lookahead verifies its own tree of "
                        "guesses, at an integer K"),
    "recycling": Method("Recycling", _recycling, "Token Recycling with the paper's static "
                        "tree (81 nodes, depth 6)", options=frozenset(), auto=False,
                        fixed="recycling drafts the paper's static tree, whose depth is its K"),
    "datastore": Method("REST", _datastore, "n-gram lookup in the context and a corpus"),
    "draft": Method("SpS", _draft, "a draft model", options=frozenset({"k", "dir"}),
                    flag="--draft"),
    "eagle3": Method("EAGLE", _eagle3, "an EAGLE head (@tree: EAGLE-2's dynamic tree)",
                     options=frozenset({"k", "dir", "tree"}), flag="--eagle"),
    "dflash": Method("(DFlash; not on the leaderboard)", _dflash, "a DFlash block drafter",
                     options=frozenset({"k", "dir"}), flag="--dflash"),
    "medusa": Method("Medusa", _medusa, "Medusa heads", options=frozenset({"k", "dir"}),
                     flag="--medusa"),
    **{f"self-{m}": Method(f"(self-speculation, {m} copy; not on the leaderboard)",
                           _self_quantized(m), f"the target's own {m} copy as a draft model")
       for m in SELF_MODES},
    "plain": Method("(baseline)", _plain, "no drafter: plain decoding", options=frozenset(),
                    auto=False, fixed="plain decoding drafts nothing"),
    FOLDER: Method("", _folder, "a drafter folder", options=frozenset({"k", "tree"})),
}
# Names that stand for a spec.
ALIASES = {"auto": "ngram@k=auto", "none": "plain",
           "eagle3-tree": "eagle3@tree=" + ",".join(map(str, DEFAULT_EAGLE_TREE))}
# What `jspec bench --suite` runs by default ("all"): plain decoding is its baseline.
SUITE = ("ngram", "suffix", "lookahead", "recycling", "datastore", "draft", "eagle3",
         "eagle3-tree", "dflash", "medusa", "auto")


def names() -> list[str]:
  """Every name a spec may start with, the suite's order first."""
  return list(dict.fromkeys(SUITE + tuple(n for n in METHODS if n != FOLDER) + tuple(ALIASES)))


# ----------------------------------------------------------------------------- parsing


def _ints(text: str, count: int, what: str) -> tuple[int, ...]:
  parts = [p.strip() for p in text.split(",")]
  if len(parts) != count or not all(re.fullmatch(r"\d+", p) for p in parts):
    raise ValueError(f"expected {what}")
  return tuple(int(p) for p in parts)


def _unknown(name: str) -> ValueError:
  return ValueError(f"unknown method {name!r}; known: {', '.join(names())}, or a drafter "
                    f"folder ({name!r} is not a drafter name, and no such file or folder)")


def parse_spec(text: str) -> Spec:
  """One spec string (module docstring) -> `Spec`; ValueError saying what is wrong and
  naming the known methods. Nothing is loaded (a folder's path is checked to exist)."""
  if not isinstance(text, str) or not text.strip():
    raise ValueError(f"empty method spec {text!r}; known: {', '.join(names())}")
  text = text.strip()
  if text in ALIASES:
    return dataclasses.replace(parse_spec(ALIASES[text]), text=text)
  if os.path.exists(text) and text not in METHODS:
    return Spec(text=text, name=FOLDER, dir=text)
  head, *options = text.split("@")
  name, _, args = head.partition(":")
  name = name.strip()
  if name not in METHODS or name == FOLDER:
    if os.path.exists(head) and head not in METHODS:  # a folder with options
      name, args, head = FOLDER, "", head
    elif name in ALIASES:
      raise ValueError(f"{text!r}: {name!r} stands for {ALIASES[name]!r} and takes no "
                       f"arguments or options; write that spec instead")
    else:
      raise _unknown(head)
  method = METHODS[name]
  spec = Spec(text=text, name=name, dir=head if name == FOLDER else None)
  if args or head.endswith(":"):
    spec = dataclasses.replace(spec, args=_args(name, args.strip(), text))
  for option in options:
    key, eq, value = option.partition("=")
    key, value = key.strip(), value.strip()
    if not eq or not value:
      raise ValueError(f"{text!r}: expected @KEY=VALUE, got @{option}")
    if key not in ("k", "dir", "tree"):
      raise ValueError(f"{text!r}: unknown option @{key}; options: @k=N|auto, @dir=PATH, "
                       f"@tree=N,D,K")
    if key not in method.options:
      takes = ", ".join(f"@{o}" for o in sorted(method.options)) or "none"
      why = f"; {method.fixed}" if key == "k" and method.fixed else ""
      raise ValueError(f"{text!r}: {name} takes no @{key} (its options: {takes}){why}")
    if key == "k":
      spec = dataclasses.replace(spec, k=_k_option(value, text))
    elif key == "dir":
      if not os.path.isdir(value):
        raise ValueError(f"{text!r}: @dir={value}: no such folder")
      spec = dataclasses.replace(spec, dir=value)
    else:
      spec = dataclasses.replace(spec, tree=_tree_option(value, text))
  if spec.k is not None and spec.tree is not None:
    raise ValueError(f"{text!r}: a tree's K is its depth; give @tree=N,D,K without @k")
  if spec.k == "auto" and not method.auto:
    raise ValueError(f"{text!r}: @k=auto chooses the K of a chain per round; {method.fixed}")
  return spec


def _args(name: str, args: str, text: str) -> tuple[int, ...]:
  method = METHODS[name]
  if not method.args:
    raise ValueError(f"{text!r}: {name} takes no arguments (write {name!r})")
  if name == "ngram":
    if not re.fullmatch(r"\d+", args) or int(args) < 1:
      raise ValueError(f"{text!r}: expected ngram:N with N a positive integer (the longest "
                       f"n-gram the lookup matches)")
    return (int(args),)
  try:
    window, ngram, guesses = _ints(args, 3, "")
  except ValueError:
    raise ValueError(f"{text!r}: expected lookahead:W,N,G, three integers: the window's "
                     f"columns W, the n-gram length N (>= 3), the guesses verified G") from None
  from jspec.drafters.lookahead import Lookahead

  try:  # the drafter's own checks, on a placeholder vocabulary
    Lookahead(1, window=window, ngram=ngram, guesses=guesses)
  except ValueError as e:
    raise ValueError(f"{text!r}: {e} (lookahead:W,N,G)") from None
  return (window, ngram, guesses)


def _k_option(value: str, text: str):
  if value == "auto":
    return "auto"
  if not re.fullmatch(r"\d+", value) or int(value) < 1:
    raise ValueError(f"{text!r}: @k takes a positive integer or auto, got {value!r}")
  return int(value)


def _tree_option(value: str, text: str) -> tuple[int, int, int]:
  from jspec.core.dynamic_tree import DynamicTree

  try:
    nodes, depth, top_k = _ints(value, 3, "")
    DynamicTree(nodes=nodes, depth=depth, top_k=top_k)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{text!r}: @tree takes NODES,DEPTH,TOP_K of a dynamic tree"
                     + (f" ({e})" if str(e) else "")) from None
  return (nodes, depth, top_k)


# A comma ends a spec unless a digit follows it (lookahead:5,4,3, @tree=32,4,8).
_SEPARATOR = re.compile(r"[;\s]+|,(?!\d)")


def split(text: str) -> list[str]:
  """A list of specs -> the specs (module docstring: commas not followed by a digit,
  semicolons, whitespace; "lookahead:5, 4, 3" is one spec, "lookahead:5,4,3")."""
  text = re.sub(r",\s+(?=\d)", ",", text)
  return [t for t in (p.strip() for p in _SEPARATOR.split(text)) if t]


def parse(text: str | None) -> list[str]:
  """The specs of a list (`split`; None or "all": `SUITE`), each checked (`parse_spec`),
  without repeats."""
  if text is None or text.strip() == "all":
    return list(SUITE)
  specs = split(text)
  if not specs:
    raise ValueError(f"no method in {text!r}; known: {', '.join(names())} (or all)")
  for s in specs:
    parse_spec(s)
  return list(dict.fromkeys(specs))


# ----------------------------------------------------------------------------- building


def build(spec: str | Spec, target, *, k=4, corpus=None, folders=None,
          checkpoints: str | None = None) -> Built:
  """The method `spec` names, built for `target`: `Built`; `Unavailable` when it cannot run
  with this target (the reason in the message); ValueError for a bad spec (before loading).

  k: the K of a spec without @k (an int or "auto"); corpus: token ids per document
  (datastore); folders: {method name: folder} for specs without @dir (the suite's --draft,
  --eagle, --medusa, --dflash); checkpoints: the shipped checkpoints folder."""
  parsed = parse_spec(spec) if isinstance(spec, str) else spec
  ctx = Context(target=target, k=k, corpus=corpus, folders=dict(folders or {}),
                checkpoints=checkpoints)
  built = METHODS[parsed.name].build(parsed, ctx)
  if built.k == "auto":
    over = "ngram" if parsed.text == "auto" else parsed.text.replace("@k=auto", "")
    built = dataclasses.replace(built, description=f"num_draft_tokens=\"auto\" over {over}",
                                family=AUTO_FAMILY)
  return built


def build_all(specs, target, **options) -> tuple[dict[str, Built], dict[str, str]]:
  """({spec: Built} of the methods that can run, {spec: why not} of the others); options as
  `build`'s."""
  ready, skipped = {}, {}
  for spec in specs:
    try:
      ready[spec] = build(spec, target, **options)
    except Unavailable as e:
      skipped[spec] = str(e)
  return ready, skipped
