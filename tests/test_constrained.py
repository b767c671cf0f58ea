"""Constrained decoding (`constraint=`): outputs stay in the language, greedy speculative
equals greedy baseline, and sampled sequences follow the target's constrained
distribution exactly (whole-sequence enumeration on a tiny vocabulary)."""

import itertools
import json
import re

import numpy as np
import pytest

import jspec
from conftest import ragged_prompts, tiny_config
from jspec.planner import engine as engine_lib
from reference import assert_counts_match, chi_square_ok, processed_probs

EOS = 63
# 64 ids: single characters, a few longer pieces (so drafts and constraints cross token
# boundaries), and EOS last.
_CHARS = list('abcdefghijklmnopqrstuvwxyz0123456789{}":, -')
_PIECES = ["ab", "ba", "12", "true", "false", '"ok"', '"c"', '{"', '"}', '":', "a-", "-1",
           "ok", "tr", "ue", "fa", "lse", '": ', ', "', "c1", "99"]
VOCAB = (_CHARS + _PIECES + ["xyz"] * 64)[:EOS] + ["<eos>"]
PATTERN = r"[a-c]{1,3}-[0-9]{2}"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                          "c": {"enum": ["ab", "ba"]}},
          "required": ["ok", "c"]}
BINARY = jspec.Tree.from_paths([(0, 0), (0, 1), (1, 0), (1, 1)])


def text_of(row):
  return "".join(VOCAB[t] for t in row if 0 <= t != EOS)


@pytest.fixture(scope="module")
def regex():
  return jspec.Constraint.from_regex(PATTERN, VOCAB, eos_ids=[EOS])


@pytest.fixture(scope="module")
def schema():
  return jspec.Constraint.from_json_schema(SCHEMA, VOCAB, eos_ids=[EOS], whitespace_pattern=" ?")


def _drafter(method, target, close_draft):
  return {"draft_model": dict(draft=close_draft, num_draft_tokens=3),
          "ngram": dict(draft=jspec.NGram(target.vocab_size, max_ngram=2), num_draft_tokens=4),
          "tree": dict(draft=close_draft, tree=BINARY),
          "auto": dict(draft=close_draft,
                       num_draft_tokens=jspec.AutoK(choices=(0, 2, 4), costs=(1.0, 1.1, 1.2)))
          }[method]


@pytest.mark.parametrize("method", ["draft_model"] + [pytest.param(m, marks=pytest.mark.slow)
                                                  for m in ("ngram", "tree", "auto")])
def test_greedy_constrained_speculative_equals_baseline(target, close_draft, regex, method):
  prompts = ragged_prompts(3, target.vocab_size, seed=6, min_len=2, max_len=9)
  per_row = [regex, None, regex]  # one row free: it must decode as without a constraint
  kw = dict(max_new_tokens=10, eos_id=[EOS], constraint=per_row)
  base = jspec.generate(target, prompts, **kw)
  spec = jspec.speculative_generate(target, prompts=prompts, **_drafter(method, target,
                                                                         close_draft), **kw)
  np.testing.assert_array_equal(base.tokens, spec.tokens)
  free = jspec.generate(target, prompts, max_new_tokens=10, eos_id=[EOS])
  np.testing.assert_array_equal(base.tokens[1], free.tokens[1])
  for b in (0, 2):
    row = np.asarray(base.tokens[b])
    assert row[int(base.lengths[b]) - 1] == EOS, "a bounded pattern ends in EOS"
    assert re.fullmatch(PATTERN, text_of(row)), text_of(row)
  # A random model left alone writes outside the language.
  assert not re.fullmatch(PATTERN, text_of(np.asarray(free.tokens[0])))


@pytest.mark.slow
def test_sampled_rows_stay_in_the_language(target, close_draft, regex, schema):
  """200 sampled rows under each constraint, all finished, all in the language."""
  rows = 400
  prompts = ragged_prompts(rows, target.vocab_size, seed=9, min_len=1, max_len=6)
  kw = dict(max_new_tokens=32, eos_id=[EOS], temperature=1.0, seed=17)
  out = jspec.speculative_generate(target, close_draft, prompts, num_draft_tokens=3,
                                   constraint=[regex, schema] * (rows // 2), **kw)
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  texts = set()
  for b in range(rows):
    assert tokens[b, lengths[b] - 1] == EOS, f"row {b} did not finish: {text_of(tokens[b])!r}"
    text = text_of(tokens[b])
    texts.add(text)
    if b % 2 == 0:
      assert re.fullmatch(PATTERN, text), text
    else:
      value = json.loads(text)
      assert set(value) == {"ok", "c"} and isinstance(value["ok"], bool)
      assert value["c"] in ("ab", "ba")
  assert len(texts) > 100  # sampled, not one answer repeated
  assert int(np.sum(out.stats.accepted)) > 0


@pytest.mark.slow
def test_whole_sequence_constrained_distribution():
  """Vocabulary 6, 3 new tokens, the language (ab|c)+ over tokens a, b, c, ab, ba: the
  counts of 20,000 sampled rows match P(x1 x2 x3) of the target with every step
  masked by the automaton, and the sequences it forbids never appear."""
  V, NEW, ROWS, prompt = 6, 3, 20_000, [1, 4]
  vocab = ["a", "b", "c", "ab", "ba", None]
  constraint = jspec.Constraint.from_regex(r"(ab|c)+", vocab, eos_ids=[])
  table = np.asarray(constraint.next_state)
  config = tiny_config(vocab_size=V, layers=1, hidden=16, heads=2, kv_heads=1, scale=0.6)
  target, draft = jspec.models.init(config, seed=31), jspec.models.init(config, seed=32)

  def exact(model):
    probs = np.zeros((V,) * NEW)
    for seq in itertools.product(range(V), repeat=NEW):
      logits = np.asarray(model.logits(np.asarray([prompt + list(seq)], np.int32)), np.float64)[0]
      state, p = 0, 1.0
      for j, x in enumerate(seq):
        row = np.where(table[state] >= 0, logits[len(prompt) - 1 + j], -np.inf)
        p *= processed_probs(row, 1.0)[x]
        state = table[state, x]
        if state < 0:
          break
      probs[seq] = p if state >= 0 else 0.0
    return probs.reshape(-1)

  expected = exact(target)
  assert np.isclose(expected.sum(), 1.0) and np.sum(expected == 0) > 100
  kw = dict(max_new_tokens=NEW, temperature=1.0, seed=2027, eos_id=(), constraint=constraint)
  spec = jspec.speculative_generate(target, draft, [prompt] * ROWS, num_draft_tokens=2, **kw)
  hist = np.asarray(spec.stats.accept_hist)
  assert hist[0] > 0 and hist[1] > 0 and hist[2] > 0, f"acceptance not exercised: {hist}"
  codes = np.asarray(spec.tokens) @ (V ** np.arange(NEW - 1, -1, -1))
  assert_counts_match(np.bincount(codes, minlength=V ** NEW), expected, "constrained speculative")
  # Power: the draft's own constrained distribution is told apart from the target's.
  other = jspec.generate(draft, [prompt] * ROWS, **kw)
  codes = np.asarray(other.tokens) @ (V ** np.arange(NEW - 1, -1, -1))
  assert not chi_square_ok(np.bincount(codes, minlength=V ** NEW), expected)


@pytest.mark.slow
def test_a_few_sampled_rows_stay_in_the_language(target, regex):
  """The fast sibling of the 400-row check: sampled plain and speculative rows."""
  prompts = ragged_prompts(8, target.vocab_size, seed=2, min_len=1, max_len=6)
  kw = dict(max_new_tokens=12, eos_id=[EOS], temperature=1.0, seed=3, constraint=regex)
  for out in (jspec.generate(target, prompts, **kw),
              jspec.speculative_generate(target, jspec.NGram(target.vocab_size), prompts,
                                         num_draft_tokens=3, **kw)):
    for row, n in zip(np.asarray(out.tokens), np.asarray(out.lengths)):
      assert row[n - 1] == EOS and re.fullmatch(PATTERN, text_of(row)), text_of(row)


def _log_softmax(row):
  row = np.asarray(row, np.float64)
  finite = row[np.isfinite(row)]
  return row - (np.log(np.sum(np.exp(finite - finite.max()))) + finite.max())


@pytest.mark.parametrize("raw", [True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=["raw", "processed"])
@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_logprobs_under_a_constraint(target, close_draft, regex, raw):
  """Logprobs(raw=True) is the model's own log_softmax, before the constraint's mask as
  before temperature (its top ids include forbidden ones); the processed default is the
  constrained distribution the tokens are drawn from. Plain, chain and tree alike."""
  prompts = [[5, 6, 7], [2, 9]]
  request = jspec.Logprobs(raw=raw, top=3)
  kw = dict(max_new_tokens=8, eos_id=[EOS], constraint=regex, return_logprobs=request,
            temperature=[1.0, 0.0], seed=4)
  runs = {"plain": jspec.generate(target, prompts, **kw),
          "chain": jspec.speculative_generate(target, close_draft, prompts, num_draft_tokens=3,
                                              **kw),
          "tree": jspec.speculative_generate(target, close_draft, prompts, tree=BINARY, **kw)}
  table = np.asarray(regex.next_state)
  forbidden_in_top = 0
  for name, out in runs.items():
    for b, prompt in enumerate(prompts):
      n = int(out.lengths[b])
      new = np.asarray(out.tokens[b, :n])
      assert re.fullmatch(PATTERN, text_of(new)), (name, text_of(new))
      logits = np.asarray(target.logits(np.asarray([prompt + new.tolist()], np.int32)),
                          np.float64)[0]
      state = 0
      for j, x in enumerate(new):
        row = logits[len(prompt) - 1 + j]
        allowed = table[state] >= 0
        if raw:
          want = _log_softmax(row)
        elif b == 0:  # sampled at temperature 1: the masked softmax
          want = _log_softmax(np.where(allowed, row, -np.inf))
        else:  # greedy: the argmax of the allowed ids, drawn with certainty
          want = np.where(np.arange(row.size) == np.argmax(np.where(allowed, row, -np.inf)),
                          0.0, -np.inf)
        where = f"{name} row {b} position {j}"
        assert abs(float(out.logprobs[b, j]) - want[x]) < 1e-4, where
        top, values = np.asarray(out.top_ids[b, j]), np.asarray(out.top_logprobs[b, j])
        # Ids of log p -inf (forbidden, or a greedy row's runners-up) tie: their order
        # is XLA's, and only their values are checked.
        ranked = np.argsort(-want, kind="stable")[:3]
        finite = np.isfinite(want[ranked])
        np.testing.assert_array_equal(top[finite], ranked[finite], err_msg=where)
        np.testing.assert_allclose(values, want[ranked], atol=1e-4, err_msg=where)
        forbidden_in_top += int(np.sum(~allowed[top] & np.isfinite(values)))
        state = table[state, x]
  # Power: the raw top lists give forbidden ids a probability; the processed never do.
  assert (forbidden_in_top > 0) == raw


def test_constraint_errors(target, close_draft):
  too_wide = jspec.Constraint.from_regex("ab", VOCAB + ["zz"], eos_ids=[EOS])
  with pytest.raises(ValueError, match="65 ids but the model has 64"):
    jspec.generate(target, [[1, 2]], max_new_tokens=3, constraint=too_wide)
  with pytest.raises(ValueError, match="one per row"):
    jspec.generate(target, [[1, 2], [3]], max_new_tokens=3,
                   constraint=[jspec.Constraint.from_regex("ab", VOCAB, eos_ids=[EOS])])
  with pytest.raises(TypeError, match="jspec.Constraint"):
    jspec.generate(target, [[1, 2]], max_new_tokens=3, constraint="ab")
  # Nothing this vocabulary spells can match: refused when compiled, before decoding.
  with pytest.raises(ValueError, match="regex"):
    jspec.Constraint.from_regex("Q+", VOCAB, eos_ids=[EOS])


@pytest.mark.slow
def test_a_narrower_tokenizer_pads_the_model_vocabulary(target):
  """A tokenizer with fewer ids than the model (padded embeddings): the extra ids are
  never emitted."""
  narrow = jspec.Constraint.from_regex("[a-c]+", VOCAB[:40], eos_ids=[])
  out = jspec.generate(target, [[1, 2]], max_new_tokens=6,
                       temperature=1.0, constraint=narrow, eos_id=())
  assert np.all(np.asarray(out.tokens) < 40)
  assert re.fullmatch("[a-c]+", text_of(np.asarray(out.tokens[0])))


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_constraints_per_request_through_slots(target, close_draft, regex):
  """generate_many with a constraint on some requests: each request's tokens equal the
  lone constrained (or free) run, and the constraint state of a slot's previous request
  does not carry over (requests alternate constrained and free through 2 slots)."""
  prompts = ragged_prompts(5, target.vocab_size, seed=8, min_len=2, max_len=9)
  per_row = [regex, None, regex, regex, None]
  out = jspec.generate_many(target, close_draft, prompts, slots=2, max_new_tokens=10,
                            num_draft_tokens=3, eos_id=[EOS], constraint=per_row)
  for i, (prompt, c) in enumerate(zip(prompts, per_row)):
    alone = jspec.generate(target, [prompt], max_new_tokens=10, eos_id=[EOS],
                           constraint=None if c is None else [c])
    n = int(alone.lengths[0])
    assert int(out.lengths[i]) == n
    np.testing.assert_array_equal(np.asarray(out.tokens[i, :n]), np.asarray(alone.tokens[0, :n]))
    if c is not None:
      assert re.fullmatch(PATTERN, text_of(np.asarray(out.tokens[i])))


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_constraints_per_request_through_the_engine(target, close_draft, regex, schema):
  """Engine requests with a regex, a JSON schema or none, decoding side by side through 2
  slots: each equals the lone run with its own constraint. The table holds the regex and
  the schema but not a third automaton beside both in use; a constraint no request uses
  gives its room up to a new one."""
  Q = 1 + regex.num_states + schema.num_states
  prompts = ragged_prompts(6, target.vocab_size, seed=9, min_len=2, max_len=9)
  per_row = [regex, schema, None, schema, regex, None]
  with jspec.Engine(target, close_draft, slots=2, num_draft_tokens=3, cache_length=64,
                    eos_id=[EOS], constraints=Q) as engine:
    handles = [engine.submit(p, max_new_tokens=12, constraint=c)
               for p, c in zip(prompts, per_row)]
    outs = [h.result(timeout=300) for h in handles]
    third = jspec.Constraint.from_regex("[0-9]+", VOCAB, eos_ids=[EOS])
    # Neither regex nor schema is in use now: the third takes the room of the older.
    late = engine.submit(prompts[2], max_new_tokens=8, constraint=third).result(timeout=300)
  # Requests that wait (an engine not started) hold their constraints' room.
  idle = jspec.Engine(target, close_draft, slots=2, num_draft_tokens=3, cache_length=64,
                      eos_id=[EOS], constraints=Q, start=False)
  waiting = [idle.submit(prompts[0], max_new_tokens=4, constraint=regex),
             idle.submit(prompts[1], max_new_tokens=4, constraint=schema),
             idle.submit(prompts[3], max_new_tokens=4, constraint=schema)]  # shares its room
  with pytest.raises(engine_lib.ConstraintsFull, match="does not fit"):
    idle.submit(prompts[2], max_new_tokens=4, constraint=third)
  assert waiting[0].cancel()  # the regex is in use no more: its room goes to the third
  idle.submit(prompts[2], max_new_tokens=4, constraint=third)
  with pytest.raises(ValueError, match="without constraints"):
    jspec.Engine(target, slots=1, cache_length=32, start=False).submit(
        prompts[0], max_new_tokens=2, constraint=regex)
  for prompt, c, out in zip(prompts, per_row, outs):
    alone = jspec.generate(target, [prompt], max_new_tokens=12, eos_id=[EOS],
                           constraint=None if c is None else [c])
    n = int(alone.lengths[0])
    assert out.tokens == [int(t) for t in np.asarray(alone.tokens[0, :n])]
  assert re.fullmatch("[0-9]+", text_of(late.tokens))
  alone = jspec.generate(target, [prompts[2]], max_new_tokens=8, eos_id=[EOS],
                         constraint=[third])
  assert late.tokens == [int(t) for t in np.asarray(alone.tokens[0, :int(alone.lengths[0])])]
