"""The compiled programs a decoding call runs: prefill, then the loop of rounds.

Two programs, one per kind of loop: `fixed` (K static: `decode.decode_loop`) and
`auto` (K chosen per round among `AutoK.choices`: `dynamic.decode_loop`). Each takes
placed arrays and static settings and returns plain arrays; everything on the host
(checks, buckets, placement, round costs, listeners) is `jspec.planner`'s. They are
usable directly from jitted code's neighbourhood: `jspec.planner` is one caller.

Returns (both): out [B, S] int32 new tokens left-aligned (-1 past each row's end),
lengths [B] int32, stats (`DecodeStats`), records (`logprobs.output`, or None), memory
(a `RememberingDrafter`'s `remembered` state after the loop, or None); `fixed` adds
recorded [B, S, F] (`DecodeConfig.record`: the recorded layers at every slot of each
row's prompt and output, filled for slots 0..L-2; None when off), `auto` adds rounds
[len(choices)] int32, the rounds run at each K. Both take `cache`, the target cache to
decode in (donated; None: the program allocates one) and return it last (None when
none was given), so a caller can hand one call's memory to the next
(`jspec.planner.workspace`).
"""

from __future__ import annotations

from jspec.core import compilation, decode, dynamic, logprobs
from jspec.core import slots as slots_lib
from jspec.core.drafter import remembered


def _records(state: decode.DecodeState):
  if state.logprobs is None:
    return None
  return logprobs.output(state.logprobs, state.prompt_lengths, state.lengths)


@compilation.program(static_argnames=("config",), donate_argnames=("cache",))
def fixed(target, drafter, tokens, prompt_lengths, max_new, params, eos_ids, seeds, constraint,
          channel, cache, config: decode.DecodeConfig):
  """tokens [B, P] int32 right-padded prompts; prompt_lengths, max_new, seeds [B] int32;
  params: `SamplingParams` or None (all greedy); eos_ids [E]; constraint:
  `ConstraintRows` or None; channel [] int32 for `config.stream`."""
  state = decode.init_state(target, drafter, tokens, prompt_lengths, max_new, params, eos_ids,
                            seeds, config, constraint, cache=cache)
  state = decode.decode_loop(target, drafter, state, config, channel)
  out, new_lengths = decode.output_tokens(state)
  return (out, new_lengths, state.stats, _records(state),
          remembered(drafter, state.drafter_state), state.recorded,
          None if cache is None else state.target_cache)


@compilation.program(static_argnames=("config", "auto"), donate_argnames=("cache",))
def auto(target, drafter, tokens, prompt_lengths, max_new, params, eos_ids, seeds, constraint,
         channel, cache, costs, catch_up, config: decode.DecodeConfig, auto):
  """As `fixed`, with costs [len(auto.choices)] f32 the round costs at each K and
  catch_up [] f32 what one catch-up call of the drafter costs, in the same unit."""
  state = dynamic.init_state(target, drafter, tokens, prompt_lengths, max_new, params, eos_ids,
                             seeds, costs, config, auto, constraint, catch_up, cache=cache)
  state = dynamic.decode_loop(target, drafter, state, config, auto, channel)
  out, new_lengths = decode.output_tokens(state.decode)
  return (out, new_lengths, state.decode.stats, _records(state.decode),
          remembered(drafter, state.decode.drafter_state), state.schedule.rounds,
          None if cache is None else state.decode.target_cache)


@compilation.program(static_argnames=("config", "slots", "width"))
def many(target, drafter, queue, count, eos_ids, config: decode.DecodeConfig, slots: int,
         width: int):
  """The first `count` requests of `queue` (`slots_lib.Queue`, N rows, a bucket) through
  `slots` rows in one loop (`slots_lib.decode_queue`). Returns tokens [N, width],
  lengths [N], stats [N], records ([N, width], or None) and memory, per request in
  queue order."""
  results, state = slots_lib.decode_queue(target, drafter, queue, count, eos_ids, config,
                                          slots, width)
  return (results.tokens, results.lengths, results.stats, results.logprobs,
          remembered(drafter, state.drafter_state))
