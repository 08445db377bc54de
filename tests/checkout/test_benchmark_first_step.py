"""``python -m benchmarks.first_step``: its cells, its ``--quick`` CPU run (first steps cold and warm in
fresh processes, the steady state, strict JSON) and its table in RESULTS.md. No timing is asserted
(CPU timings on a shared machine say nothing); that a warm start used the cache is, through inductor's
cache counters."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import _common, report
from benchmarks.first_step import cells, cli

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path, *args):
    out = tmp_path / "first_step.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.first_step", "--quick", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    return json.loads(text), proc.stdout


def seconds(v):
    return isinstance(v, float) and math.isfinite(v) and v >= 0


def test_cells_are_estimators_by_modes_less_those_skipped():
    plan = cells.plan(["tiny"], ["fp32"], ["gradient", "gam_fd"], cells.MODES, ["gam_fd:step"])
    assert len(plan) == 9 and cells.Cell("tiny", "fp32", "gam_fd", "step") not in plan
    cell = cells.Cell("resnet50", "bf16-cl", "gam_exact", "pass-graph")
    assert (
        cells.Cell.parse(cell.key) == cell and cell.key == "resnet50:bf16-cl:gam_exact:pass-graph"
    )
    with pytest.raises(ValueError, match="MODEL:PRECISION:ESTIMATOR:MODE"):
        cells.Cell.parse("resnet50:bf16:gam:eager")


def test_graph_modes_need_cuda_and_are_ready_after_their_capture():
    for mode in cells.MODES:
        cell = cells.Cell("tiny", "fp32", "gradient", mode)
        graph = mode in ("graph", "pass-graph")
        assert (cells.skip_reason(cell, "cpu") is not None) == graph
        assert cells.skip_reason(cell, "cuda") is None
        assert cells.ready_step(cell) == (cells.GRAPH_WARMUP + 1 if graph else 1)


def test_the_costliest_first_steps_start_first():
    plan = cells.plan(["tiny"], ["fp32"], list(cells.ESTIMATORS), cells.MODES)
    first = sorted(plan, key=cells.cost_order)
    assert first[0] == cells.Cell("tiny", "fp32", "gam_exact", "step")
    assert all(c.mode in ("eager", "graph") for c in first[-8:])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--skip", "gam:eager"], "--skip"),
        (["--phases", "warm"], "add cold"),
        (["--modes", "compile"], "--modes"),
        (["--jobs", "0"], "--jobs"),
        (["--dtype", "fp16"], "--dtype"),
    ],
)
def test_bad_flags_are_refused_naming_them(args, match, capsys):
    with pytest.raises(SystemExit):
        cli.parse(["--quick", *args])
    assert match in capsys.readouterr().err


def test_ratios_are_against_the_compiled_gradient_step_of_the_same_model():
    def row(estimator, mode, ms, model="m"):
        return {"model": model, "precision": "fp32", "estimator": estimator, "mode": mode, "ms": ms}

    rows = [
        row("gradient", "pass", 4.0),
        row("gradient", "pass-graph", 2.0),
        row("gam_fd", "graph", 5.0),
        row("gam_fd", "eager", 9.0, model="other"),
    ]
    cli.ratios(rows)
    assert rows[2]["x_grad"] == 2.5 and rows[2]["grad_reference"] == "gradient/pass-graph"
    assert rows[0]["x_grad"] == 2.0
    assert "x_grad" not in rows[3]  # no compiled gradient step of its model


def test_a_warm_start_that_missed_the_cache_says_so():
    row = {"mode": "pass", "cold": {"error": None}, "warm": {"error": None}}
    row["warm"]["cache"] = {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 2}
    assert cli.notes(row) == "warm: no inductor cache hit"
    row["warm"]["cache"] = {"fxgraph_cache_hit": 2, "fxgraph_cache_miss": 0}
    assert cli.notes(row) is None
    row["warm"]["cache"]["autograd_cache_bypass"] = 1
    assert cli.notes(row) == "warm: AOTAutograd's cache bypassed"
    row["cold"]["error"] = "RuntimeError: x"
    assert cli.notes(row) == "cold: RuntimeError: x"


def test_the_cold_first_steps_of_eager_cells_and_the_graph_cells_skipped_on_the_cpu(tmp_path):
    result, stdout = run(tmp_path, "--modes", "eager,graph", "--phases", "cold")
    assert result["benchmark"] == "first_step" and result["meta"]["device"] == "cpu"
    rows = {r["mode"]: r for r in result["rows"]}
    assert sorted(rows) == ["eager", "graph"]
    cold = rows["eager"]["cold"]
    assert cold["error"] is None and rows["eager"]["note"] is None
    assert seconds(cold["first_s"]) and cold["ready_s"] == cold["first_s"] == cold["steps_s"][0]
    assert seconds(cold["setup_s"])  # recorded; how long anything took is the benchmark's to say
    assert "warm" not in rows["eager"] and "ms" not in rows["eager"]
    assert rows["graph"]["note"] == "skipped: a CUDA graph needs a CUDA device"
    assert "cold" not in rows["graph"]
    assert "| tiny | fp32 | gradient | graph |" in stdout


@pytest.mark.slow
def test_quick_runs_cold_warm_and_steady_and_renders_in_results_md(tmp_path):
    # eager and by pass: the whole step's compile, the slowest on the CPU, is the same code path
    result, _ = run(tmp_path, "--jobs", "2", "--modes", "eager,pass")
    meta = result["meta"]
    assert meta["quick"] and meta["jobs"] == 2 and {"device_name", "date", "torch"} <= set(meta)
    rows = {r["mode"]: r for r in result["rows"]}
    assert sorted(rows) == ["eager", "pass"]
    for mode in ("eager", "pass"):
        r = rows[mode]
        assert r["note"] is None, (mode, r["note"])
        for phase in ("cold", "warm"):
            assert r[phase]["error"] is None and seconds(r[phase]["first_s"]), (mode, phase)
        assert seconds(r["ms"]) and len(r["ms_samples"]) == 2 and r.get("recompiles") in (0, None)
        assert r["x_grad"] == r["ms"] / rows["pass"]["ms"]  # the compiled gradient step by pass
        assert r["grad_reference"] == "gradient/pass"
    cold, warm = rows["pass"]["cold"]["cache"], rows["pass"]["warm"]["cache"]
    assert cold["fxgraph_cache_miss"] > 0 and cold["fxgraph_cache_hit"] == 0  # cold compiles
    assert warm["fxgraph_cache_hit"] > 0 and warm["fxgraph_cache_miss"] == 0  # warm loads it
    # RESULTS.md's table, from the file as the results folder would hold it
    folder = tmp_path / "results"
    folder.mkdir()
    _common.save(result, str(folder / _common.file_name(meta)))
    text = report.render(folder, None)
    assert "## The first step" in text and report.PENDING["first_step"] not in text
    assert "| tiny | fp32 | gradient | pass | 2 |" in text


def test_results_md_says_the_first_step_is_not_yet_measured_without_a_result(tmp_path):
    text = report.render(tmp_path, None)
    assert "## The first step" in text and report.PENDING["first_step"] in text


def test_append_keeps_the_rows_of_other_models_and_their_runs_metadata(tmp_path):
    out = tmp_path / "r.json"
    rows = [
        {"model": "resnet50", "precision": "bf16-cl"},
        {"model": "vit_s32", "precision": "bf16"},
    ]
    meta = {"benchmark": "first_step", "date": "before"}
    out.write_text(json.dumps({"benchmark": "first_step", "meta": meta, "rows": rows}))
    now = {"date": "now"}
    kept = cli.earlier(str(out), {("vit_s32", "bf16")}, now)
    assert kept == rows[:1] and now["earlier"] == [meta]
    assert cli.earlier(str(tmp_path / "none.json"), set(), {}) == []
    with pytest.raises(SystemExit):
        cli.parse(["--quick", "--append"])
