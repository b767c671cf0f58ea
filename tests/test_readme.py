"""README's commands are the ones CI runs."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ci_runs_readme_test_command():
  blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)
  assert len(blocks) >= 2, "README must give a main-job command and a test command"
  main_job, tests = blocks[0].strip(), blocks[1].strip()
  assert main_job.endswith("jspec demo")
  assert "pytest" in tests
  ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
  assert tests in ci_lines, ".ci/run must run README's test command verbatim"
