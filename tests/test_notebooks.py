"""The Colab notebooks: committed without outputs, equal to what their generator writes, and
runnable top to bottom on a CPU in their fallback mode (the shipped code models)."""

import importlib.util
import json
import os
import pathlib
import sys
import time

import pytest

from conftest import require

pytestmark = pytest.mark.slow  # each notebook runs top to bottom in a kernel

COLAB = pathlib.Path(__file__).resolve().parents[1] / "colab"
NAMES = ["quickstart.ipynb", "train_drafter.ipynb", "measure.ipynb"]
CELL_TIMEOUT = 300  # seconds per cell; a whole notebook takes well under a minute on 2 cores


def _read(name):
  with open(COLAB / name, encoding="utf-8") as f:
    return json.load(f)


def _generator():
  spec = importlib.util.spec_from_file_location("make_notebooks", COLAB / "make_notebooks.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_committed_notebooks_have_no_outputs():
  assert sorted(p.name for p in COLAB.glob("*.ipynb")) == sorted(NAMES)
  for name in NAMES:
    nb = _read(name)
    assert nb["nbformat"] == 4, name
    for i, cell in enumerate(nb["cells"]):
      if cell["cell_type"] == "code":
        assert cell["outputs"] == [], f"{name} cell {i} has outputs"
        assert cell["execution_count"] is None, f"{name} cell {i} has an execution count"


def test_notebooks_match_their_generator():
  make = _generator()
  for name in NAMES:
    built, committed = make.build(name), _read(name)
    assert committed == built, (f"colab/{name} differs from what colab/make_notebooks.py writes: "
                                f"edit the script and rerun it")


@pytest.fixture(scope="module")
def python3_kernel(tmp_path_factory):
  """A `python3` kernelspec that starts this interpreter, found before any other one."""
  root = tmp_path_factory.mktemp("jupyter")
  spec = root / "kernels" / "python3"
  spec.mkdir(parents=True)
  (spec / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "Python 3 (tests)", "language": "python"}))
  return str(root)


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_fallback_mode(name, python3_kernel, tmp_path, monkeypatch):
  nbformat = require("nbformat")
  nbclient = require("nbclient")
  require("ipykernel")
  # The kernel inherits this environment: JUPYTER_PATH comes first in the kernelspec search,
  # and the fallback flag keeps the notebooks off the network and on the shipped models.
  monkeypatch.setenv("JUPYTER_PATH", python3_kernel)
  monkeypatch.setenv("JSPEC_NOTEBOOK_FALLBACK", "1")
  monkeypatch.delenv("JSPEC_REPO", raising=False)
  nb = nbformat.read(str(COLAB / name), as_version=4)
  client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                   resources={"metadata": {"path": str(tmp_path)}})
  start = time.perf_counter()
  client.execute()  # raises CellExecutionError, with the cell's traceback, on any error
  seconds = time.perf_counter() - start
  text = "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                 for out in cell.outputs)
  assert "fallback to the shipped models: JSPEC_NOTEBOOK_FALLBACK is set" in text
  assert not any(out.output_type == "error" for cell in nb.cells if cell.cell_type == "code"
                 for out in cell.outputs)
  print(f"{name}: {seconds:.0f} s")
  if name == "measure.ipynb":
    for path in ("prompts.jsonl", "measure.json", "measure.png", "acceptance_by_position.png"):
      assert (tmp_path / path).stat().st_size > 0, path
  if name == "train_drafter.ipynb":
    assert (tmp_path / "distilled-draft" / "jspec_config.json").is_file()
    assert os.listdir(tmp_path / "distill-checkpoints")
