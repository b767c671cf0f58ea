"""`jspec.tools.bench_flags`: XLA CPU option sets, each in a process of its own, in turns; and
jspec's own program options timed by the harness's runner; both as records."""

import pytest

from jspec.bench import metrics as M
from jspec.tools import bench_flags

from test_bench_real import write_tiny_llama


@pytest.mark.slow
def test_option_sets_run_in_their_own_processes_in_turns(tmp_path):
  path = write_tiny_llama(tmp_path / "tiny.gguf")
  lines = []
  recs, errors = bench_flags.run(path, [1, 3], calls=2, repeats=2,
                                 sets=["default", "vector width 512"], rounds=2,
                                 log=lines.append)
  assert errors == {}
  # The sets in turns, the order reversed in the second round.
  assert [ln.split("  ")[0].strip() for ln in lines] == ["default", "vector width 512",
                                                         "vector width 512", "default"]
  by = M.group(recs, "flags", "block", "round")
  assert set(by) == {(s, b, r) for s in ("default", "vector width 512") for b in (1, 3)
                     for r in (0, 1)}
  assert all(len(r.seconds) == 2 and min(r.seconds) > 0 for r in recs)
  assert all(r.extra["max_logit_diff"] == 0.0 for r in M.select(recs, flags="default"))
  assert by[("vector width 512", 1, 0)][0].extra["xla_flags"] == bench_flags.OPTION_SETS[
      "vector width 512"]
  table = bench_flags.table(recs, [1, 3])
  assert table.splitlines()[0].startswith("default") and "T=3:" in table


@pytest.mark.slow
def test_program_options_with_and_without_give_the_same_answers(tmp_path, monkeypatch):
  monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path / "cache"))
  path = write_tiny_llama(tmp_path / "tiny.gguf")
  lines = []
  recs, mismatches = bench_flags.program_options(path, repeats=2, max_new_tokens=8,
                                                 log=lines.append)
  assert mismatches == []
  by = M.group(recs, "method")
  assert list(by) == ["without-cpu-options", "with-cpu-options"]
  assert all(r.equal is True for r in by["with-cpu-options"])
  assert len(by["with-cpu-options"]) == 3  # one held-out chat prompt of each kind
  without, with_ = (sum(r.tokens for r in v) for v in by.values())
  assert without == with_ > 0
  assert "answers identical: True" in lines[-1]
