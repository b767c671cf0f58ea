"""MTP: a multi-token-prediction module of the target as a drafter.

DeepSeek-V3 (Liu et al. 2024) trains its model with extra modules that predict one token
further each; Qwen3-Next and Qwen3.5 publish one such module with their weights, and vLLM
speculators fine-tunes and exports them (layout "mtp"; FastMTP, Cai et al. 2025, reuses one
module for several steps). A module reads the pair (h_j, e(t_{j+1})), the target's final
hidden state at slot j and the embedding of the next token, and predicts t_{j+2}:

    x_j    = proj([norm_e(e(t_{j+1})); norm_h(h_j)])     proj: [2D, D], no bias
    y_j    = decoder_layer(x_j | pairs at slots <= j)    the target family's layer
    f^_j   = norm_out(y_j)                               ~ h_{j+1}
    logits = LM_head(f^_j)                                the target's head, full vocabulary

That is the shape of an EAGLE-1 head (`jspec.Eagle`, Li et al. 2024) with its inputs normed
apart and a final norm (`EagleConfig(input_form="mtp")`, `jspec.drafters.eagle_head`): the
pair at slot j, the one-layer K/V cache, the catch-up from the verify's features and the
chain of one-pair steps are the same. So a module drafts K tokens as the reference code
chains it, feeding its own normed output back as the next step's hidden state, and gets
EAGLE's static trees and dynamic trees (EAGLE-2) with it. Checkpoints with several modules
(DeepSeek-V3's `num_nextn_predict_layers` > 1) are not read: speculators' layout holds one.
"""

from __future__ import annotations

import dataclasses

import jax

from jspec.core.model import Model
from jspec.drafters.eagle import Eagle, EagleConfig


def mtp_config(target_config, **overrides) -> EagleConfig:
  """The config of an MTP module for a target: one of the target's layers (its config's
  fields, `EagleConfig.for_target`) taking pairs as MTP modules do, with no pair at slot 0
  (the published modules start at (h_0, e(t_1))). `overrides` first (e.g. qk_norm=True for a
  Qwen3 layer)."""
  fields = {"input_form": "mtp", "zero_pair": False, "fc_bias": False, **overrides}
  return EagleConfig.for_target(target_config, **fields)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MTP(Eagle):
  """An MTP module drafting for its target: an `Eagle` whose config has
  `input_form="mtp"`. Build one with `MTP.from_target(target, params)` (random params:
  `jspec.drafters.eagle.init_params(mtp_config(target.config), key)`) or load a published
  one with `jspec.load_drafter`."""

  @classmethod
  def from_target(cls, target: Model, head_params, config: EagleConfig | None = None) -> "MTP":
    """Attach module params to `target`'s embedding and LM head (shared, not copied).
    config: an `EagleConfig` with input_form "mtp"; None derives it (`mtp_config`)."""
    if not isinstance(target, Model):
      raise TypeError(f"target must be a jspec.Model, got {type(target).__name__}")
    if config is None:
      config = mtp_config(target.config)
    if config.input_form != "mtp":
      raise ValueError(f"jspec.MTP takes an EagleConfig with input_form='mtp', got "
                       f"{config.input_form!r} (an EAGLE head: use jspec.Eagle)")
    return super().from_target(target, head_params, config)
