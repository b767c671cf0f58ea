"""Decoding from a Flax NNX module inside your own jitted code.

An NNX module splits into a static graph definition and a state pytree of
arrays (`graphdef, state = nnx.split(module)`). The state can go straight into
a `jax.jit`-compiled function as an ordinary traced argument; inside, the
module is rebuilt around the traced arrays and turned into a `jspec.Model`:

    @jax.jit
    def eval_step(state, target, tokens, prompt_lengths):
      draft = jspec.io.nnx.model_from_state(graphdef, state)   # graphdef closed over
      ...decode.init_state(target, jspec.DraftModel(draft), ...)...

Nothing crosses to the host: `nnx.state(module)` hands back the very device
arrays the optimizer updates, and the merge happens at trace time only. A
training loop can therefore measure speculative acceptance between steps at
the cost of the decoding itself (see `examples/distill_while_measuring.py` and
`docs/flax.md`).
"""

from __future__ import annotations

from typing import Any

from flax import nnx

from jspec.core.model import Model


def model_from_state(graphdef: nnx.GraphDef, state: Any) -> Model:
  """The `jspec.Model` of an NNX module given as `nnx.split` parts.

  The module must expose `to_model()` (as `jspec.models.Transformer` does).
  Callable inside `jax.jit` with `state` traced: the returned Model's params are
  the traced arrays, so no copy and no host transfer is made.
  """
  module = nnx.merge(graphdef, state)
  to_model = getattr(module, "to_model", None)
  if to_model is None:
    raise TypeError(f"{type(module).__name__} has no to_model(): give it one that returns a "
                    f"jspec.Model over its params (see docs/model_contract.md)")
  model = to_model()
  if not isinstance(model, Model):
    raise TypeError(f"{type(module).__name__}.to_model() returned {type(model).__name__}, "
                    f"not a jspec.Model")
  return model
