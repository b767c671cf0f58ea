"""`out.stats` against an independent count on the host: an oracle drafter proposes the
target's greedy continuation, wrong at chosen slots, so which drafts each round accepts is
known, and every counter must count a draft as accepted only if it was emitted (rounds cut
by EOS or max_new_tokens included)."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec

RIGHT, SECOND, WRONG = 0, 1, 2  # what the oracle's rank-0 / rank-1 drafts at a slot are
DEEP = jspec.Tree.from_paths(list(itertools.product((0, 1), repeat=3)))  # binary, depth 3


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Oracle:
  """Drafts slot s of row b from `table[b, s, rank]`: a chain takes rank 0, a tree node of
  depth d (slot L - 1 + d) its own rank. Deterministic: q is one-hot."""

  table: jax.Array  # [B, T, 2] int32
  vocab_size: int = dataclasses.field(default=64, metadata=dict(static=True))

  def init(self, tokens, prompt_lengths, cache_length):
    return None

  def _at(self, slots, ranks):
    slots = jnp.minimum(slots, self.table.shape[1] - 1)
    rows = jnp.arange(slots.shape[0])[:, None]
    return self.table[rows, slots, ranks]

  def propose(self, state, context, num_drafts, params, keys):
    slots = context.lengths[:, None] + jnp.arange(num_drafts)[None, :]
    return self._at(slots, jnp.zeros_like(slots)), None, state

  def propose_tree(self, state, context, tree, params, keys):
    depth = jnp.asarray(tree.depths[1:], jnp.int32)[None, :]
    slots = context.lengths[:, None] - 1 + depth
    ranks = jnp.broadcast_to(jnp.asarray(tree.ranks[1:], jnp.int32)[None, :], slots.shape)
    return self._at(slots, ranks), state


def oracle_table(text, kinds, V):
  """[B, T, 2]: at a RIGHT slot rank 0 is the text's token; at SECOND rank 1 is (rank 0
  is wrong); at WRONG neither is."""
  r = np.arange(2)[None, None, :]
  shift = np.where(kinds == WRONG, -1, kinds)[:, :, None]  # WRONG: text + 1 + rank
  return ((text[:, :, None] + r - shift) % V).astype(np.int32)


def host_stats(emitted, prompt_len, table, ranks, K, width):
  """The counters of one row worked out from its emitted tokens alone. A round starting
  at new-token index i judges slot prompt_len + i + j for j < K; draft j is accepted while
  it is one of the proposals at that slot (greedy: the emitted token there is the
  target's argmax) and it was emitted. A round emits its accepted drafts and then the
  target's own token, unless the row's tokens end first (EOS, max_new_tokens)."""
  total = len(emitted)
  calls = accepted = 0
  hist = np.zeros(width + 1, np.int64)
  judged = np.zeros(width, np.int64)
  pos_acc = np.zeros(width, np.int64)
  i = 0
  while i < total:
    calls += 1
    m = 0
    while m < K and i + m < total and emitted[i + m] in table[prompt_len + i + m, ranks]:
      m += 1
    count = min(m + 1, total - i)  # m <= count: an accepted draft past the end was never seen
    hist[m] += 1
    accepted += m
    judged[:min(K, count)] += 1
    pos_acc[:m] += 1
    i += count
  return dict(target_calls=calls, accepted=accepted, row_hist=hist, position_judged=judged,
              position_accepted=pos_acc)


@pytest.mark.parametrize("kind", ["chain", "tree", "auto"])
def test_counters_count_emitted_drafts_only(target, kind):
  """Row 0: every draft right and an EOS inside an accepted run (the drafts after it are
  accepted by the target but never emitted); row 1: drafts wrong at chosen slots (partial
  acceptance, a sibling taking over in the tree); row 2: every draft right and
  max_new_tokens = K - 1, which cuts the first round short."""
  V = target.vocab_size
  prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8, 2, 8], [9, 9, 2]]
  P = max(len(p) for p in prompts)
  NEW = 20
  greedy = np.asarray(jspec.generate(target, prompts, max_new_tokens=NEW, eos_id=()).tokens)
  T = P + NEW + 8
  text = np.zeros((3, T), np.int64)
  for b, p in enumerate(prompts):
    text[b, :len(p) + NEW] = p + greedy[b].tolist()
  kinds = np.full((3, T), RIGHT)
  rng = np.random.default_rng(0)
  kinds[1, len(prompts[1]):] = rng.choice([RIGHT, RIGHT, SECOND, WRONG], size=T - len(prompts[1]))
  table = oracle_table(text, kinds, V)
  K = DEEP.max_depth if kind == "tree" else 4
  # EOS: a token of row 0's text that is new there and absent from the other rows', at a
  # draft position that is neither a round's last draft nor its own token (every round
  # of row 0 emits K + 1 tokens).
  e = next(e for e in range(K + 1, NEW) if e % (K + 1) < K - 1
           and greedy[0, e] not in greedy[0, :e] and greedy[0, e] not in greedy[1:])
  eos = int(greedy[0, e])
  kw = dict(max_new_tokens=[NEW, NEW, K - 1], eos_id=[eos])
  if kind == "chain":
    out = jspec.speculative_generate(target, Oracle(jnp.asarray(table), V), prompts,
                                     num_draft_tokens=K, **kw)
  elif kind == "tree":
    out = jspec.speculative_generate(target, Oracle(jnp.asarray(table), V), prompts, tree=DEEP,
                                     **kw)
  else:  # "auto" with one choice: every round at K = 4, through jspec.core.dynamic's loop
    out = jspec.speculative_generate(target, Oracle(jnp.asarray(table), V), prompts,
                                     num_draft_tokens=jspec.AutoK(choices=(K,), costs=(1.0,)),
                                     **kw)
    assert out.rounds_by_k == {K: int(np.max(np.asarray(out.stats.target_calls)))}
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  stats = {f: np.asarray(getattr(out.stats, f)) for f in
           ("target_calls", "accepted", "row_hist", "position_judged", "position_accepted")}
  assert lengths.tolist()[::2] == [e + 1, K - 1] and tokens[0, e] == eos
  ranks = [0, 1] if kind == "tree" else [0]
  for b, p in enumerate(prompts):
    want = host_stats(tokens[b, :lengths[b]].tolist(), len(p), table[b], ranks, K, K)
    for field, value in want.items():
      np.testing.assert_array_equal(stats[field][b], value, err_msg=f"row {b} {field}")
  # The scenarios happened: accepted drafts in every row, and row 1 also rejected some.
  assert np.all(stats["accepted"] > 0) and stats["row_hist"][1, :K].sum() > 0
  # One definition: the totals agree however they are read.
  np.testing.assert_array_equal(stats["accepted"], stats["position_accepted"].sum(axis=1))
  np.testing.assert_array_equal(stats["accepted"], stats["row_hist"] @ np.arange(K + 1))
  np.testing.assert_array_equal(stats["target_calls"], stats["row_hist"].sum(axis=1))
