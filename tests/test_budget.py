"""jspec.recipes.budget: a training budget from learning curves, on made-up curves whose
lines and rates are known exactly."""

import json
import math
import os
import re

import pytest

from jspec.recipes import answers as A
from jspec.recipes import budget as BU


def curve(path, head, points, epochs=2.0, machine=None):
  data = {"head": head, "epochs": epochs, "points": points}
  if machine:
    data["machine"] = machine
  with open(path, "w") as f:
    json.dump(data, f)
  return str(path)


def point(tokens, tau, mt=None, **seconds):
  p = {"answer_tokens": tokens, "tau": tau, **seconds}
  if mt is not None:
    p["conversations"] = {"tau": mt}
  return p


def store(path, shards):
  os.makedirs(path)
  with open(os.path.join(path, A.MANIFEST), "w") as f:
    json.dump({"shards": shards, "totals": {"answer_tokens": sum(s["answer_tokens"]
                                                                 for s in shards)}}, f)
  return str(path)


def shard(tokens, rate, device, cpus):
  backend = "cpu" if device == "cpu" else "gpu"
  return {"answer_tokens": tokens, "tokens_per_second": rate,
          "machine": {"device": device, "backend": backend, "cpus": cpus}}


def test_budget_inverts_the_pooled_fit_and_prices_it_at_measured_rates(tmp_path, capsys):
  # chat tau = 0.5 + 0.25 log10(t), MT-Bench tau = 0.8 + 0.1 log10(t), exactly, over two curves.
  line = lambda t: 0.5 + 0.25 * math.log10(t)  # noqa: E731
  mt = lambda t: 0.8 + 0.1 * math.log10(t)  # noqa: E731
  cpu = curve(tmp_path / "cpu.json", "eagle3",
              [point(t, line(t), mt(t), cpu_seconds=t / 50, wall_seconds=t)
               for t in (10_000, 100_000)])
  gpu = curve(tmp_path / "gpu.json", "eagle3",
              [point(1_000_000, line(1e6), mt(1e6), cpu_seconds=999.0,
                     recipe_seconds={"data": 5.0, "train": 40.0, "measure": 60.0})],
              machine={"device": "Accel 1"})
  answers = store(tmp_path / "store", [shard(2_000, 10.0, "cpu", 2), shard(2_000, 30.0, "cpu", 2),
                                       shard(2_000, 20.0, "cpu", 2),
                                       shard(500_000, 5_000.0, "Accel 1", 16)])
  assert BU.main([cpu, gpu, "--answers", answers, "--taus", "1.5,2.0", "--json",
                  str(tmp_path / "plan.json")]) == 0
  with open(tmp_path / "plan.json") as f:
    plan = json.load(f)
  fits = plan["fits"]
  assert fits["points"] == 3 and fits["tokens"] == [10_000, 1_000_000]
  assert fits["chat"]["b_per_decade"] == pytest.approx(0.25)
  assert fits["chat"]["a"] == pytest.approx(0.5) and fits["chat"]["r2"] == pytest.approx(1.0)
  assert fits["mt_bench"]["b_per_decade"] == pytest.approx(0.1)
  assert plan["generation"]["2-core CPU"] == {"median": 20.0, "fastest": 30.0, "shards": 3,
                                              "answer_tokens": 6_000}
  assert plan["generation"]["Accel 1"]["fastest"] == 5_000.0
  rates = {t["machine"]: t for t in plan["training"]}
  # The CPU curve has no recipe seconds: its CPU seconds (features and measurement too),
  # flagged as an upper bound; the accelerator's training seconds alone.
  assert rates["CPU"]["tokens_epochs_per_second"] == pytest.approx(2 * 100_000 / 2_000)
  assert rates["CPU"]["upper_bound"] and not rates["Accel 1"]["upper_bound"]
  assert rates["Accel 1"]["tokens_epochs_per_second"] == pytest.approx(2 * 1e6 / 40.0)
  low, high = plan["rows"]
  assert low["answer_tokens"]["chat"] == pytest.approx(1e4)  # tau 1.5 at 10^4: inside the data
  assert low["past_largest_point"] == pytest.approx(0.01)
  assert high["answer_tokens"]["chat"] == pytest.approx(1e6)
  assert high["answer_tokens"]["mt_bench"] == pytest.approx(1e12)
  assert high["times_the_store"] == pytest.approx(1e6 / 506_000)
  assert high["generate_seconds"]["Accel 1"] == pytest.approx(1e6 / 5_000)
  assert high["train_seconds"][f"Accel 1 ({gpu})"] == pytest.approx(2 * 1e6 / 5e4)
  table = capsys.readouterr().out
  assert "| 2.00 | 1e+06 | 1e+12 | inside the data |" in table
  # Priced by the MT-Bench line instead: its 1e12 tokens, 1e6 times past the data.
  by_mt = BU.plan(BU.load_curves([cpu, gpu]), answers, [2.0], 2.0, by="mt_bench")["rows"][0]
  assert by_mt["past_largest_point"] == pytest.approx(1e6)
  assert by_mt["generate_seconds"]["Accel 1"] == pytest.approx(1e12 / 5_000)


def test_budget_refuses_what_it_cannot_plan(tmp_path):
  a = curve(tmp_path / "a.json", "eagle3", [point(1e4, 1.2), point(1e5, 1.4)])
  b = curve(tmp_path / "b.json", "dflash", [point(1e4, 1.1)])
  with pytest.raises(SystemExit, match="several heads"):
    BU.main([a, b])
  # Curves of other epochs per token are other steps at each size: not one line.
  more = curve(tmp_path / "more.json", "eagle3", [point(1e4, 1.5)], epochs=8.0)
  with pytest.raises(SystemExit, match="several epochs"):
    BU.main([a, more])
  assert BU.plan(BU.load_curves([more]), None, [2.0])["epochs"] == 8.0
  with open(tmp_path / "bad.json", "w") as f:
    f.write("{")
  with pytest.raises(SystemExit, match="bad.json"):
    BU.main([str(tmp_path / "bad.json")])
  with pytest.raises(SystemExit):
    BU.main([a, "--taus", "0.5"])
  # A line that does not rise reaches no goal.
  flat = curve(tmp_path / "flat.json", "eagle3", [point(1e4, 1.3), point(1e5, 1.2)])
  plan = BU.plan(BU.load_curves([flat]), None, [2.0], 2.0)
  assert plan["rows"][0]["answer_tokens"]["chat"] is None


ROOT = os.path.join(os.path.dirname(__file__), "..")
SECONDS = {"s": 1, "min": 60, "h": 3600, "days": 86400, "years": 86400 * 365}


def _quoted(text: str) -> tuple[float, float]:
  """A figure as the docs quote it ("8.6e5", "7,300", "0.226", "1.2e6") -> (value, half a
  unit in its last significant digit: how far the quoted value may be from the exact one)."""
  mantissa, _, exponent = text.replace(",", "").partition("e")
  scale = 10.0 ** int(exponent or 0)
  if "." in mantissa:
    last = 10.0 ** -len(mantissa.split(".")[1])
  else:  # an integer's trailing zeros are rounding, not digits ("7,300", "340")
    last = 10.0 ** (len(mantissa) - len(mantissa.rstrip("0"))) if mantissa.strip("0") else 1.0
  return float(mantissa) * scale, 0.5 * last * scale


def _assert_quotes(text: str, value: float, what: str):
  quoted, half = _quoted(text)
  assert abs(quoted - value) <= half * (1 + 1e-9), (
      f"{what}: the docs say {text}, the code gives {value:.6g}")


def _assert_duration(text: str, seconds: float, what: str):
  number, unit = text.split()
  _assert_quotes(number, seconds / SECONDS[unit], what)


def test_the_documented_eagle3_plan_is_what_the_recorded_curves_give():
  """docs/training.md's budget for the EAGLE-3 head (the fit, the measured rates and every
  figure of its table) is what `budget.plan` makes of the curves in docs/bench and the store:
  each figure read from the doc and compared with the code's to the digits the doc quotes."""
  with open(os.path.join(ROOT, "docs", "training.md")) as f:
    doc = f.read()
  start = doc.index("### A training budget from the curve")
  section = doc[start:doc.index("The other two heads' curves", start)]
  prose = " ".join(section.split())
  curves = [os.path.join(ROOT, "docs", "bench", n) for n in
            ("curve_smollm2_eagle3.json", "curve_smollm2_eagle3_h200.json")]
  for name in ("curve_smollm2_eagle3.json", "curve_smollm2_eagle3_h200.json"):
    assert f"docs/bench/{name}" in section  # the command the section quotes reads these
  table = [line.strip("|").split("|") for line in section.splitlines()
           if re.match(r"\| [0-9.]+ \|", line)]
  goals = [float(row[0]) for row in table]
  assert goals == [1.6, 1.8, 2.0, 2.5, 3.0]
  plan = BU.plan(BU.load_curves(curves), os.path.join(ROOT, "data", "smollm2_answers"), goals,
                 2.0)
  assert plan["fits"]["points"] == 6 and "(the five CPU points and the H200 point)" in prose
  fit = re.search(r"Held-out chat tau = ([0-9.]+) \+ ([0-9.]+) log10\(tokens\) \(R\^2 ([0-9.]+)\), "
                  r"MT-Bench tau = ([0-9.]+) \+ ([0-9.]+) log10\(tokens\) \(R\^2 ([0-9.]+)\)",
                  prose)
  assert fit, "docs/training.md no longer quotes the fit in the form this test reads"
  for i, line in enumerate(("chat", "mt_bench")):
    for j, key in enumerate(("a", "b_per_decade", "r2")):
      _assert_quotes(fit.group(3 * i + j + 1), plan["fits"][line][key], f"{line} {key}")
  cpu, h200 = plan["generation"]["2-core CPU"], plan["generation"]["NVIDIA H200"]
  rates = re.search(r"median 75 and fastest ([0-9,]+) answer tokens/s on the 2-core CPU .*"
                    r"bring the median to ([0-9,]+);.* median ([0-9,]+) and fastest ([0-9,]+) on "
                    r"the H200", prose)
  assert rates, "docs/training.md no longer quotes the writing rates in the form this test reads"
  for text, value, what in zip(rates.groups(), (cpu["fastest"], cpu["median"], h200["median"],
                                                 h200["fastest"]),
                               ("CPU fastest", "CPU median", "H200 median", "H200 fastest")):
    _assert_quotes(text, value, f"writing, {what}")
  training = {t["machine"]: t["tokens_epochs_per_second"] for t in plan["training"]}
  quoted = re.search(r"Training: ([0-9,]+) answer tokens x epochs per CPU second .* ([0-9,]+) per "
                     r"second on the H200", prose)
  _assert_quotes(quoted.group(1), training["CPU"], "training on the CPU")
  _assert_quotes(quoted.group(2), training["NVIDIA H200"], "training on the H200")
  for row, got in zip(table, plan["rows"]):
    cells = [c.strip() for c in row]
    what = f"goal tau {cells[0]}"
    _assert_quotes(cells[1], got["answer_tokens"]["chat"], f"{what}, chat tokens")
    _assert_quotes(cells[2], got["answer_tokens"]["mt_bench"], f"{what}, MT-Bench tokens")
    if cells[3] == "inside the data":
      assert got["past_largest_point"] <= 1.0, what
    else:
      _assert_quotes(cells[3].rstrip("x"), got["past_largest_point"], f"{what}, past the data")
    write, train = got["generate_seconds"], list(got["train_seconds"].values())
    _assert_duration(cells[4], write["2-core CPU"], f"{what}, writing on the CPU")
    _assert_duration(cells[5], write["NVIDIA H200"], f"{what}, writing on the H200")
    _assert_duration(cells[6], train[0], f"{what}, training on the CPU")
    _assert_duration(cells[7], train[1], f"{what}, training on the H200")
