"""Drafter capabilities are declared protocols: a drafter written outside jspec that has the
members gets what jspec's own get (placement, decoding form, pricing, catch-up, features),
and one without them gets none of it. Nothing is probed by attribute name."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core import dynamic, sharding
from jspec.core.drafter import (CatchUpDrafter, Drafter, FeatureDrafter, ModelDrafter,
                                PricedCatchUpDrafter, uses_features)
from jspec.planner import cost_model, placement, plan
from jspec.planner.inputs import request


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Wrapped:
  """A user's drafter: a draft model behind its own class, by delegation (no subclassing)."""

  inner: jspec.DraftModel
  sync_block: int = dataclasses.field(default=16, metadata=dict(static=True))

  @property
  def vocab_size(self):
    return self.inner.vocab_size

  def init(self, tokens, prompt_lengths, cache_length):
    return self.inner.init(tokens, prompt_lengths, cache_length)

  def propose(self, state, context, num_drafts, params, keys):
    return self.inner.propose(state, context, num_drafts, params, keys)

  def sync(self, state, context, synced):
    return self.inner.sync(state, context, synced, chunk=self.sync_block)

  def sync_calls(self, context, synced):
    return self.inner.sync_calls(context, synced)

  def models(self):
    return self.inner.models()

  def with_models(self, models):
    return Wrapped(self.inner.with_models(models), self.sync_block)

  def prepared(self):
    return Wrapped(self.inner.prepared(), self.sync_block)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Unpriced:
  """Catches up (`sync`) but says nothing of what it costs: caught up, not priced."""

  inner: jspec.DraftModel

  @property
  def vocab_size(self):
    return self.inner.vocab_size

  def init(self, tokens, prompt_lengths, cache_length):
    return self.inner.init(tokens, prompt_lengths, cache_length)

  def propose(self, state, context, num_drafts, params, keys):
    return self.inner.propose(state, context, num_drafts, params, keys)

  def sync(self, state, context, synced):
    return self.inner.sync(state, context, synced)


def test_the_protocols_recognise_members_not_classes(close_draft):
  mine, builtin = Wrapped(jspec.DraftModel(close_draft)), jspec.DraftModel(close_draft)
  for d in (mine, builtin):
    assert isinstance(d, Drafter) and isinstance(d, ModelDrafter)
    assert isinstance(d, CatchUpDrafter) and isinstance(d, PricedCatchUpDrafter)
    assert not isinstance(d, FeatureDrafter) and not uses_features(d)
  unpriced = Unpriced(builtin)
  assert isinstance(unpriced, CatchUpDrafter) and not isinstance(unpriced, PricedCatchUpDrafter)
  assert not isinstance(unpriced, ModelDrafter)
  ngram = jspec.NGram(64)
  assert not isinstance(ngram, ModelDrafter) and not isinstance(ngram, CatchUpDrafter)


def test_a_users_model_drafter_is_priced_and_prepared_as_jspecs(target, close_draft):
  mine, builtin = Wrapped(jspec.DraftModel(close_draft)), jspec.DraftModel(close_draft)
  rates = cost_model.DeviceRates(bandwidth=1e10, rows=(1, 512), compute=(1e10, 1e12))
  costs = [cost_model.prior_costs(target, d, 1, 256, (0, 2, 4), rates) for d in (mine, builtin)]
  assert costs[0] == costs[1]
  assert costs[0][2] > costs[0][1] > costs[0][0] > 0  # the draft model's steps are priced
  assert cost_model.drafter_time(mine, 1, 4, 256, rates) > 0
  assert cost_model.drafter_time(jspec.NGram(64), 1, 4, 256, rates) == 0
  formed = plan.decoding_form(mine)
  assert isinstance(formed, Wrapped) and formed is plan.decoding_form(mine)  # kept per object
  assert all(m.prepare_fn is None for m in formed.models())  # the decoding form


def test_a_users_model_drafter_is_placed_on_the_mesh(target, close_draft):
  layout = sharding.as_layout(sharding.make_mesh(data=1, model=1), None)
  req = request(target, [[1, 2, 3]], None, 4, 0.0, 0, 1.0, None, 0, None, block=5)
  _, placed, rows = placement.place(target, Wrapped(jspec.DraftModel(close_draft)), req, None,
                                    layout)
  assert isinstance(placed, Wrapped)
  for leaf in jax.tree_util.tree_leaves(placed.models()[0].params):
    assert isinstance(leaf.sharding, jax.sharding.NamedSharding)
    assert leaf.sharding.is_fully_replicated
  assert rows.params is None and rows.tokens.shape == (1, 16)


@pytest.mark.slow  # three "auto" programs compiled
def test_a_users_drafter_decodes_and_catches_up_as_jspecs(target, close_draft):
  """Greedy "auto" with costs that make drafting pay after plain rounds: the user's class
  and DraftModel give the same tokens, the same rounds at each K, and the target's own."""
  prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8]]
  auto = jspec.AutoK(choices=(0, 3), costs=(1.0, 1.3), variants=2)
  plain = jspec.generate(target, prompts, max_new_tokens=12)
  outs = [jspec.speculative_generate(target, d, prompts, num_draft_tokens=auto, max_new_tokens=12)
          for d in (Wrapped(jspec.DraftModel(close_draft)), jspec.DraftModel(close_draft),
                    Unpriced(jspec.DraftModel(close_draft)))]
  for out in outs:
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(plain.tokens))
  assert outs[0].rounds_by_k == outs[1].rounds_by_k
  assert outs[0].rounds_by_k[3] > 0


def test_only_priced_catch_up_has_a_fee(target, close_draft):
  """`dynamic.catch_up_fee` prices a PricedCatchUpDrafter and not one with `sync` alone."""
  state = dynamic.AutoState(decode=None, schedule=None)
  assert dynamic.catch_up_fee(Unpriced(jspec.DraftModel(close_draft)), state) is None
  assert dynamic.catch_up_fee(jspec.NGram(64), state) is None
  with pytest.raises(AttributeError):  # priced: it reads the state (None here)
    dynamic.catch_up_fee(Wrapped(jspec.DraftModel(close_draft)), state)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LastFeature:
  """A feature drafter of the user's: drafts token 0 and records the newest feature's norm."""

  vocab_size: int = dataclasses.field(default=64, metadata=dict(static=True))
  feature_layers = ()  # a FeatureDrafter over the final hidden state (not a field)

  def init(self, tokens, prompt_lengths, cache_length, features):
    return jnp.zeros((tokens.shape[0],), jnp.float32)

  def propose(self, state, context, num_drafts, params, keys):
    B = context.lengths.shape[0]
    newest = context.features[:, -1]  # [B, D]
    return (jnp.zeros((B, num_drafts), jnp.int32), None,
            jnp.maximum(state, jnp.linalg.norm(newest, axis=-1)))


def test_a_users_feature_drafter_gets_the_features(target):
  """Its `init` takes the prefill's features and `propose` reads `context.features`: a loop
  that did not treat it as a FeatureDrafter would call `init` with three arguments and give
  `propose` no features, and the call would fail."""
  drafter = LastFeature()
  assert isinstance(drafter, FeatureDrafter) and uses_features(drafter)
  out = jspec.speculative_generate(target, drafter, [[1, 2, 3]], num_draft_tokens=2,
                                   max_new_tokens=6)
  plain = jspec.generate(target, [[1, 2, 3]], max_new_tokens=6)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(plain.tokens))
