"""The plan of a decoding call: which drafter, which K, what a round costs.

`speculation` checks what `speculative_generate` was given and settles it once: the
drafter (a `jspec.Model` draft becomes a `DraftModel`), K as an int or an `AutoK`, the
tree, and a `BranchDrafter`'s side branch. `round_costs` gives `"auto"` its round
costs as plain values: a profile saved for these models and shapes (`jspec profile`),
else the prior of `jspec.planner.cost_model`, shaped by the target's own calls timed
once per machine, model and shape (`jspec.planner.call_times`). The engine gets the
costs as an array and never times anything.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from typing import Any

from jspec.core import schedule, sharding
from jspec.core.drafter import (BoundedDrafter, BranchDrafter, Drafter, DynamicTreeDrafter,
                                ModelDrafter, PricedCatchUpDrafter, TreeCheckingDrafter,
                                TreeDrafter)
from jspec.core.dynamic_tree import DynamicTree
from jspec.core.model import Model
from jspec.core.tree import Tree
from jspec.drafters.draft_model import DraftModel
from jspec.planner import call_times, cost_model


@dataclasses.dataclass(frozen=True)
class Speculation:
  """What a speculative call drafts with, settled on the host."""

  drafter: Any  # a `Drafter`
  k: int | schedule.AutoK  # K, or "auto"'s settings
  tree: Tree | DynamicTree | None = None  # the verify tree; None: a chain
  side: Tree | None = None  # a `BranchDrafter`'s side branch

  @property
  def max_k(self) -> int:
    """The largest K a round may draft (the tree's depth for a tree)."""
    return self.k.max_k if isinstance(self.k, schedule.AutoK) else self.k


def speculation(target: Model, draft, num_draft_tokens, tree) -> Speculation:
  """The checked drafter, K, tree and side branch; clear errors before any tracing."""
  if not isinstance(target, Model):
    raise TypeError(f"target must be a jspec.Model, got {type(target).__name__}")
  K = num_draft_tokens
  if tree is not None:
    if not isinstance(tree, (Tree, DynamicTree)):
      raise TypeError(f"tree must be a jspec.Tree or a jspec.DynamicTree, got "
                      f"{type(tree).__name__}")
    if K is not None and (isinstance(K, (str, schedule.AutoK)) or K != tree.max_depth):
      raise ValueError(f"num_draft_tokens={K!r} conflicts with the tree, whose depth is "
                       f"{tree.max_depth}: omit it when passing a tree")
    K = tree.max_depth
  elif K is None:
    K = 4
  if isinstance(K, str) and K == "auto":
    K = schedule.AutoK()
  if not isinstance(K, schedule.AutoK):
    if isinstance(K, bool) or not isinstance(K, numbers.Integral) or K < 1:
      raise ValueError(f"num_draft_tokens must be an integer >= 1, \"auto\" or a jspec.AutoK, "
                       f"got {K!r}")
    K = int(K)
  drafter = DraftModel(draft) if isinstance(draft, Model) else draft
  if drafter is None or not isinstance(drafter, Drafter):
    raise TypeError(f"draft must be a jspec.Model or a Drafter, got {type(draft).__name__}")
  if drafter.vocab_size != target.vocab_size:
    raise ValueError(f"draft vocab size {drafter.vocab_size} != target vocab size "
                     f"{target.vocab_size}: drafts must be scored in the target's vocabulary")
  side = None
  if isinstance(drafter, BranchDrafter):  # lookahead: the drafter shapes the whole block
    if tree is not None:
      raise ValueError(f"{type(drafter).__name__} verifies its own tree; give num_draft_tokens "
                       f"and not tree=")
    if isinstance(K, schedule.AutoK):
      raise ValueError(f"num_draft_tokens=\"auto\" does not serve {type(drafter).__name__}: "
                       f"give an integer K")
    tree, side = drafter.verify_tree(K), drafter.side_tree()
    K = tree.max_depth
  if isinstance(tree, DynamicTree) and not isinstance(drafter, DynamicTreeDrafter):
    raise TypeError(f"{type(drafter).__name__} cannot grow dynamic trees (it has no "
                    f"propose_dynamic); use a static jspec.Tree or an EAGLE head")
  if isinstance(tree, Tree) and not isinstance(drafter, TreeDrafter):
    raise TypeError(f"{type(drafter).__name__} cannot draft trees (it has no propose_tree); "
                    f"use a chain (num_draft_tokens) or a tree drafter")
  if isinstance(tree, Tree) and isinstance(drafter, TreeCheckingDrafter):
    drafter.check_tree(tree)
  if isinstance(drafter, BoundedDrafter):
    _check_bound(drafter, K, tree)
  if tree is not None and sharding.model_axes(target) is None:
    raise ValueError("tree decoding needs the target's cache axes (Model.axes_fn) to find "
                     "the slot axis of its K/V buffers")
  return Speculation(drafter=drafter, k=K, tree=tree, side=side)


def _check_bound(drafter, K, tree) -> None:
  """Refuse a K (a chain's, "auto"'s largest choice or a tree's depth) past what a
  `BoundedDrafter` drafts in a round."""
  bound = int(drafter.max_draft_tokens)
  deepest = K.max_k if isinstance(K, schedule.AutoK) else int(K)
  if deepest <= bound:
    return
  name = type(drafter).__name__
  if tree is not None:
    raise ValueError(f"the tree is {deepest} deep, but {name} drafts at most {bound} tokens "
                     f"a round")
  if isinstance(K, schedule.AutoK):
    raise ValueError(f"num_draft_tokens=\"auto\" may draft up to {deepest}, but {name} drafts "
                     f"at most {bound} tokens a round: give jspec.AutoK(choices=...) with "
                     f"choices <= {bound}")
  raise ValueError(f"num_draft_tokens={deepest}, but {name} drafts at most {bound} tokens a "
                   f"round")


_DECODING_DRAFTERS: dict = {}


def decoding_form(drafter):
  """The drafter over its models' decoding form (`Model.decoding_form`), built once per
  drafter object: costs and compiled programs are keyed on the object it returns."""
  if not isinstance(drafter, ModelDrafter):
    return drafter
  return cost_model.per_object(
      _DECODING_DRAFTERS, drafter,
      lambda d: d.with_models(tuple(m.decoding_form() for m in d.models())))


@dataclasses.dataclass(frozen=True)
class RoundCosts:
  """`"auto"`'s choices at this batch and cache, and what a round costs at each."""

  choices: tuple[int, ...]  # the K worth compiling (0: a plain round)
  costs: tuple[float, ...]  # seconds (or a profile's unit) of a round at each choice
  catch_up: float  # one catch-up call of the drafter, in the same unit (0: none)

  @property
  def plain(self) -> bool:
    """No K can beat plain decoding here: the call runs without its drafter."""
    return max(self.choices) == 0


def round_costs(target: Model, drafter, auto: schedule.AutoK, batch: int, cache_length: int,
                greedy: bool, filtered: bool) -> RoundCosts:
  """The choices and round costs `"auto"` runs with (module docstring); `auto.costs`,
  when given, are used as they are."""
  if auto.costs:
    costs, catch_up = auto.costs, 0.0
  else:
    costs, catch_up = _auto_costs(target, drafter, batch, cache_length, auto, greedy, filtered)
  choices, costs = schedule.select(auto, costs)
  return RoundCosts(choices=choices, costs=costs, catch_up=catch_up)


_AUTO_COSTS: dict = {}


def _auto_costs(target, drafter, B: int, S: int, auto, greedy: bool, filtered: bool):
  """(costs at each of auto.choices, catch_up): a saved profile, else the prior shaped by
  the target's timed growth and, for a drafter that runs models, its step beside the
  target's. catch_up prices one call of a `PricedCatchUpDrafter`'s `sync` (its
  `sync_block` tokens through its model, timed beside the target's one-token call)."""
  # Worked out once per process for the same models, shapes and saved files: the
  # lookups below cost about a millisecond, 2% of a 64-token call of a small model.
  files = [cost_model.cache_path(auto.cache_dir, name)
           for name in ("costs.json", "calls.json", "device.json")]
  key = (B, S, auto.choices, greedy, filtered, tuple(files), tuple(_stamp(f) for f in files))
  memo = cost_model.per_object(cost_model.per_object(_AUTO_COSTS, target, lambda _: {}),
                               drafter, lambda _: {})
  if key in memo:
    return memo[key]
  draft_model = drafter.models()[0] if isinstance(drafter, ModelDrafter) else None
  saved = cost_model.saved_round_costs(target, drafter, B, S, auto.choices, greedy=greedy,
                                       filtered=filtered, cache_dir=auto.cache_dir)
  if saved is None:
    growth = call_times.growth(target, B, [k + 1 for k in auto.choices], S, auto.cache_dir)
    ratio = None
    if draft_model is not None:
      ratio = call_times.step_ratio(draft_model, target, B, S, auto.cache_dir)
    saved = cost_model.prior_costs(target, drafter, B, S, auto.choices,
                                   cost_model.device_rates(auto.cache_dir), growth, ratio,
                                   cost_model.TokenChoice(greedy=greedy, filtered=filtered))
  catch_up = 0.0
  if (isinstance(drafter, PricedCatchUpDrafter) and draft_model is not None
      and 0 in auto.choices):
    block = min(drafter.sync_block, S)
    catch_up = saved[auto.choices.index(0)] * call_times.step_ratio(
        draft_model, target, B, S, auto.cache_dir, block=block)
  value = (saved, catch_up)
  # Keyed on the files as they are now that any measurement above has been written.
  memo[key[:-1] + (tuple(_stamp(f) for f in files),)] = value
  return value


def _stamp(path: str):
  try:
    st = os.stat(path)
  except OSError:
    return None
  return st.st_mtime_ns, st.st_size
