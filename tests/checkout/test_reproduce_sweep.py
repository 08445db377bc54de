"""reproduce/sweep.py: a grid × seeds of train.py runs, one table of mean ± std, reuse of finished runs,
and a selection that reads the validation split only."""

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest

# reproduce/ lives at the repository root
from train_cli import poison_digits_test_labels

from reproduce import sweep, train
from reproduce.sweeps import grid
from reproduce.sweeps.plan import Cell, Run
from reproduce.sweeps.table import aggregate, markdown, select

TRAIN_ARGS = [
    "--preset=digits",
    "--estimator=gam",
    "--epochs=1",
    "--val_fraction=0.2",
    "--eig_iters=0",
    "--trace_samples=0",
    "--r1_steps=0",
    "--landscape=false",
    "--progress=false",
]
GRID = ["--grid=rho=0.05,0.1", "--grid=alpha=0.1,1", "--seeds=0,1"]
CELLS = ["rho=0.05,alpha=0.1", "rho=0.05,alpha=1", "rho=0.1,alpha=0.1", "rho=0.1,alpha=1"]


def run_sweep(logdir: Path, *args: str, train_args=TRAIN_ARGS) -> int:
    return sweep.main([*GRID, *args, "--", f"--logdir={logdir}", *train_args])


def tables(logdir: Path, name: str = "sweep.digits") -> tuple[dict, str]:
    root = logdir / name
    return json.loads((root / "sweep.json").read_text()), (root / "sweep.md").read_text()


def summaries(logdir: Path, name: str = "sweep.digits") -> list[Path]:
    return sorted((logdir / name).glob("*/seed=*/gam/summary.json"))


def count_trainings(monkeypatch) -> list[list[str]]:
    """Every train.main call the sweep makes from now on."""
    calls: list[list[str]] = []
    real = train.main

    def counted(argv):
        calls.append(list(argv))
        return real(argv)

    monkeypatch.setattr(train, "main", counted)
    return calls


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The 2 × 2 × 2-seed sweep of the digits preset, one epoch per run, trained once for the module."""
    logdir = tmp_path_factory.mktemp("clean")
    assert run_sweep(logdir) == 0
    return logdir


def test_the_table_holds_every_cell_with_mean_and_std_over_seeds(clean):
    table, _ = tables(clean)
    assert [c["cell"] for c in table["cells"]] == CELLS
    assert table["runs"] == {"total": 8, "reused": 0, "trained": 8}
    for cell in table["cells"]:
        assert cell["n"] == 2 and cell["status"] == "complete"
        folder = clean / "sweep.digits" / cell["cell"]
        finals = [
            json.loads((folder / f"seed={s}" / "gam" / "summary.json").read_text())["final"]
            for s in (0, 1)
        ]
        vals, tests = [f["val_acc"] for f in finals], [f["test_acc"] for f in finals]
        assert cell["val_mean"] == pytest.approx(statistics.mean(vals))
        assert cell["val_std"] == pytest.approx(statistics.stdev(vals))
        assert cell["test_mean"] == pytest.approx(statistics.mean(tests))
        assert cell["test_std"] == pytest.approx(statistics.stdev(tests))
        saved = json.loads((folder / "seed=1" / "gam" / "config.json").read_text())
        assert (saved["seed"], saved["rho"], saved["alpha"]) == (
            1,
            float(cell["values"]["rho"]),
            float(cell["values"]["alpha"]),
        )
    best = max(table["cells"], key=lambda c: c["val_mean"])  # max keeps the first of equals
    assert table["selected"]["cell"] == best["cell"]


def test_the_markdown_table_has_the_header_and_one_row_per_cell(clean):
    table, md = tables(clean)
    lines = md.splitlines()
    header = lines.index("| rho | alpha | seeds | val_acc (%) | test_acc (%) | note |")
    assert lines[header + 1] == "|---:|---:|---:|---:|---:|:--|"
    rows = lines[header + 2 :]
    assert len(rows) == 4
    for row, cell in zip(rows, table["cells"], strict=True):
        parts = [p.strip() for p in row.strip("|").split("|")]
        assert parts[:3] == [cell["values"]["rho"], cell["values"]["alpha"], "2"]
        assert parts[3] == f"{cell['val_mean']:.2f} ± {cell['val_std']:.2f}"
        assert parts[4] == f"{cell['test_mean']:.2f} ± {cell['test_std']:.2f}"
        assert parts[5] == ("selected" if cell["cell"] == table["selected"]["cell"] else "")


def test_a_rerun_reuses_every_finished_run_and_continues_the_others(clean, monkeypatch, capsys):
    before = {p: p.stat().st_mtime_ns for p in summaries(clean)}
    assert len(before) == 8
    table_before, md_before = tables(clean)
    calls = count_trainings(monkeypatch)
    assert run_sweep(clean) == 0
    assert calls == []
    assert {p: p.stat().st_mtime_ns for p in summaries(clean)} == before
    table, md = tables(clean)
    assert table["runs"] == {"total": 8, "reused": 8, "trained": 0}
    assert md == md_before and table["cells"][0]["val_mean"] == table_before["cells"][0]["val_mean"]
    assert "8 finished (reused), 0 to train" in capsys.readouterr().out

    # a run without its summary (cut short) is trained again, from its checkpoint, and alone
    (clean / "sweep.digits" / CELLS[2] / "seed=1" / "gam" / "summary.json").unlink()
    assert run_sweep(clean) == 0
    assert len(calls) == 1 and "--resume" in calls[0]
    assert f"--name=sweep.digits/{CELLS[2]}/seed=1" in calls[0]
    assert tables(clean)[0]["runs"] == {"total": 8, "reused": 7, "trained": 1}
    assert tables(clean)[1] == md_before


def test_poisoned_test_labels_do_not_change_the_selected_cell(clean, tmp_path, monkeypatch):
    clean_table, _ = tables(clean)
    poison_digits_test_labels(monkeypatch)
    assert run_sweep(tmp_path) == 0
    table, _ = tables(tmp_path)
    assert table["selected"]["cell"] == clean_table["selected"]["cell"]
    for a, b in zip(table["cells"], clean_table["cells"], strict=True):
        assert a["val_mean"] == b["val_mean"] and a["val_std"] == b["val_std"]
        assert a["test_mean"] < 15.0 < b["test_mean"]  # the poison reached the test set


def _outcome(val, test, status="finished"):
    return {"status": status, "val": val, "test": test}


def test_selection_reads_the_validation_metric_only():
    cells = [Cell((("rho", r),)) for r in ("0.05", "0.1", "0.2")]
    runs = [
        Run(c, s, (), None, Path(f"{c.label}/{s}")) for s in (0, 1) for c in cells
    ]  # seed-major, as plan() orders them
    outcomes = {
        0: _outcome(80.0, 99.0),  # best on test, worst on validation
        1: _outcome(90.0, 50.0),  # best on validation
        2: _outcome(95.0, 99.0),
        3: _outcome(82.0, 99.0),
        4: _outcome(91.0, 50.0),
        5: {"status": "diverged"},  # 0.2 has the best single validation value but diverged once
    }
    rows = aggregate(runs, outcomes, [0, 1])
    assert [r["status"] for r in rows] == ["complete", "complete", "diverged"]
    assert rows[1]["val_mean"] == 90.5 and rows[1]["val_std"] == pytest.approx(0.5**0.5)
    assert rows[2]["n"] == 1 and rows[2]["val_std"] is None
    assert select(rows) is rows[1]
    # the test values may be anything at all: the same row is chosen
    poisoned = {i: o | {"test": -o.get("test", 0)} for i, o in outcomes.items()}
    assert select(aggregate(runs, poisoned, [0, 1]))["cell"] == "rho=0.1"
    md = markdown(rows, ["rho"], "val_acc", rows[1], "caption")
    assert "| 0.2 | 1 | 95.00 ± – | 99.00 ± – | diverged |" in md


def test_best_val_acc_reads_the_best_epoch_and_its_test_accuracy(clean, tmp_path):
    assert run_sweep(clean, "--metric=best_val_acc", f"--out={tmp_path}") == 0
    table = json.loads((tmp_path / "sweep.json").read_text())
    assert table["runs"]["reused"] == 8
    for cell in table["cells"]:
        for seed, o in cell["seeds"].items():
            path = clean / "sweep.digits" / cell["cell"] / f"seed={seed}" / "gam" / "summary.json"
            best = json.loads(path.read_text())["best_val"]
            assert (o["val"], o["test"], o["epoch"]) == (
                best["val_acc"],
                best["test_acc"],
                best["epoch"],
            )
    assert (
        "| rho | alpha | seeds | best_val_acc (%) | test_acc at best val (%) | note |"
        in (tmp_path / "sweep.md").read_text()
    )


@pytest.mark.parametrize(
    "args, train_args, message",
    [
        ([], [a for a in TRAIN_ARGS if "val_fraction" not in a], "validation split"),
        ([], [*TRAIN_ARGS, "--estimator=sgd,gam"], "one estimator per cell"),
        ([], [*TRAIN_ARGS, "--rho=0.2"], "--rho after -- is in --grid"),
        ([], [*TRAIN_ARGS, "--seed=3"], "--seed after -- is set by the sweep"),
        (["--grid=lr"], TRAIN_ARGS, "--grid takes KEY=V1,V2"),
        (["--grid=rho=0.3"], TRAIN_ARGS, "--grid names rho twice"),
        (["--grid=beta=x"], TRAIN_ARGS, "takes a float"),
        (["--gpus=0,1", "--jobs=3"], TRAIN_ARGS, "--jobs=3 but --gpus lists 2"),
    ],
)
def test_bad_sweeps_exit_2_in_one_line_before_training(
    tmp_path, capsys, monkeypatch, args, train_args, message
):
    calls = count_trainings(monkeypatch)
    assert run_sweep(tmp_path, *args, train_args=train_args) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ") and err.count("\n") == 1
    assert calls == []


@pytest.mark.parametrize("vmap", [False, True])
@pytest.mark.parametrize(
    "where", ["out_proc", "out_file", "out_read_only", "logdir_file", "logdir_read_only"]
)
def test_an_out_or_logdir_that_cannot_be_written_exits_2_before_training(
    tmp_path, capsys, monkeypatch, where, vmap
):
    """Not every cell trained and then a traceback from write_tables, or "failed (exit 2): " with
    an empty reason: one line naming the flag, exit 2, nothing trained."""
    import errno
    import tempfile

    from reproduce.sweeps import vmapped

    calls = count_trainings(monkeypatch)
    monkeypatch.setattr(vmapped, "train", lambda *a, **k: calls.append(["vmap"]))
    logdir, out = tmp_path / "runs", tmp_path / "tables"
    if where == "out_proc":
        out = Path("/proc/gamfunc-no-such-folder")
    elif where in ("out_file", "logdir_file"):
        (tmp_path / "a_file").write_text("")
        out, logdir = (
            (tmp_path / "a_file", logdir) if where == "out_file" else (out, tmp_path / "a_file")
        )
    else:
        read_only = out if where == "out_read_only" else logdir
        real = tempfile.TemporaryFile

        def refused(*a, dir=None, **k):
            if dir is not None and Path(dir).is_relative_to(read_only):
                raise OSError(errno.EROFS, "Read-only file system", str(dir))
            return real(*a, dir=dir, **k)

        monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    args = [f"--out={out}", *(["--vmap"] if vmap else [])]
    assert run_sweep(logdir, *args) == 2
    err = capsys.readouterr().err
    flag = "--out" if where.startswith("out") else "--logdir"
    assert err.startswith(f"error: {flag}") and err.count("\n") == 1, err
    assert "cannot write" in err and calls == []


def test_malformed_sweep_options_exit_2_and_help_exits_0(tmp_path, capsys):
    assert run_sweep(tmp_path, "--seeds=0,0") == 2
    assert "--seeds: expected distinct integers >= 0" in capsys.readouterr().err
    assert sweep.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "python reproduce/sweep.py --grid=rho=0.05,0.1" in out and "--gpus" in out


def test_a_finished_run_of_other_settings_is_never_reused(clean, capsys, monkeypatch):
    calls = count_trainings(monkeypatch)
    assert run_sweep(clean, train_args=[*TRAIN_ARGS, "--lr=0.1"]) == 2
    assert "holds a finished run of other settings (lr: 0.05 there, 0.1 here)" in (
        capsys.readouterr().err
    )
    assert calls == []


class FakeProcess:
    """A train.py subprocess that ends at once with exit status 0 (and writes no summary)."""

    running: ClassVar[dict[str, int]] = {}
    seen: ClassVar[list[tuple[str, list[str]]]] = []
    most: ClassVar[dict[str, int]] = {}

    def __init__(self, cmd, env, **kw):
        self.gpu = env["CUDA_VISIBLE_DEVICES"]
        FakeProcess.seen.append((self.gpu, cmd))
        FakeProcess.running[self.gpu] = FakeProcess.running.get(self.gpu, 0) + 1
        FakeProcess.most[self.gpu] = max(FakeProcess.most.get(self.gpu, 0), self.running[self.gpu])

    def wait(self):
        time.sleep(0.05)
        FakeProcess.running[self.gpu] -= 1
        return 0

    def send_signal(self, signum):
        pass


def test_gpus_run_one_subprocess_per_listed_gpu(tmp_path, monkeypatch):
    FakeProcess.running, FakeProcess.seen, FakeProcess.most = {}, [], {}
    monkeypatch.setattr(grid.subprocess, "Popen", FakeProcess)
    assert run_sweep(tmp_path, "--gpus=0,1") == 0
    assert len(FakeProcess.seen) == 8
    assert FakeProcess.most == {"0": 1, "1": 1}
    for _, cmd in FakeProcess.seen:
        assert cmd[:2] == [sys.executable, str(grid.TRAIN)] and cmd[-1] == "--device=cuda"
    table, _ = tables(tmp_path)
    assert {c["status"] for c in table["cells"]} == {"incomplete"}  # no summary was written
    assert table["selected"] is None


@pytest.mark.slow
def test_parallel_subprocesses_give_the_in_process_results(clean, tmp_path):
    """--jobs=2 trains train.py subprocesses: the same numbers as the runs trained in process."""
    args = ["--grid=rho=0.05,0.1", "--seeds=0", "--jobs=2"]
    rc = sweep.main([*args, "--", f"--logdir={tmp_path}", *TRAIN_ARGS, "--alpha=0.1"])
    assert rc == 0
    table, _ = tables(tmp_path)
    assert table["runs"]["trained"] == 2
    for cell in table["cells"]:
        there = clean / "sweep.digits" / f"{cell['cell']},alpha=0.1" / "seed=0" / "gam"
        final = json.loads((there / "summary.json").read_text())["final"]
        assert (cell["seeds"]["0"]["val"], cell["seeds"]["0"]["test"]) == (
            final["val_acc"],
            final["test_acc"],
        )
        assert (tmp_path / "sweep.digits" / cell["cell"] / "seed=0" / "train.log").exists()


def test_a_run_started_afresh_is_not_told_to_resume(tmp_path, monkeypatch, capsys):
    """--resume goes only to a run with a checkpoint (one that was stopped): a fresh run prints no
    line about resuming; the same run cut short is resumed."""
    calls = count_trainings(monkeypatch)
    args = ["--grid=rho=0.05", "--seeds=0", "--", f"--logdir={tmp_path}", *TRAIN_ARGS]
    assert sweep.main(args) == 0
    out = capsys.readouterr().out
    assert "--resume" not in calls[0] and "--resume" not in out and "resum" not in out
    (tmp_path / "sweep.digits" / "rho=0.05" / "seed=0" / "gam" / "summary.json").unlink()
    assert sweep.main(args) == 0
    assert "--resume" in calls[1] and "resumed from" in capsys.readouterr().out


def test_a_signal_stops_a_sweep_and_keeps_the_checkpoint(tmp_path):
    """SIGTERM while a run of an in-process sweep trains: that run writes its checkpoint, no other
    run starts, the tables are written and the sweep exits 143. (The waits only keep a broken sweep
    from hanging the suite; no assertion reads a clock.)"""
    import signal
    import subprocess

    from reproduce.run import checkpoint as ckpt

    train_args = [*TRAIN_ARGS, "--epochs=200", "--checkpoint_every=5"]
    cmd = [sys.executable, str(Path(sweep.__file__)), "--grid=rho=0.05,0.1", "--seeds=0"]
    cmd += ["--", f"--logdir={tmp_path}", *train_args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    path = tmp_path / "sweep.digits" / "rho=0.05" / "seed=0" / "gam" / "checkpoint.pt"
    deadline = time.monotonic() + 300
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.exists(), proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert "rerun the same command to continue" in err.splitlines()[-1]
    assert ckpt.load(path)["status"] == "interrupted"
    assert not (tmp_path / "sweep.digits" / "rho=0.1").exists()  # never started
    assert (tmp_path / "sweep.digits" / "sweep.md").exists()


def test_a_run_that_diverged_marks_its_cell_and_is_never_selected(tmp_path, capsys):
    """lr=1e30 diverges (train.py exit 3): its cell is marked, lr=0.1 is selected, exit 0."""
    args = ["--grid=lr=1e30,0.1", "--seeds=0", "--", f"--logdir={tmp_path}", *TRAIN_ARGS]
    assert sweep.main(args) == 0
    out = capsys.readouterr().out
    assert "[sweep 1/2] lr=1e30 seed=0: diverged" in out and "selected lr=0.1:" in out
    table, md = tables(tmp_path)
    assert [c["status"] for c in table["cells"]] == ["diverged", "complete"]
    diverged = table["cells"][0]["seeds"]["0"]
    assert (diverged["status"], diverged["exit"], diverged["reused"]) == ("diverged", 3, False)
    assert "steps were skipped as non-finite" in diverged["why"]  # train.py's reason
    assert table["selected"]["cell"] == "lr=0.1"
    assert "| 1e30 | 0 | – | – | diverged |" in md


def test_a_sweep_whose_every_cell_exited_3_exits_3(tmp_path, capsys, monkeypatch):
    """Any run that exits 3 (it did not train: a divergence, or an estimator one of whose branches
    never took a step) is a diverged cell, never an ordinary row; when every cell is one, nothing is
    selected and the sweep exits 3, as train.py does."""
    calls = []
    monkeypatch.setattr(train, "main", lambda argv: calls.append(argv) or 3)
    assert run_sweep(tmp_path) == 3
    assert len(calls) == 8
    out = capsys.readouterr().out
    assert (
        "every cell has a run that diverged: nothing selected" in out and "selected rho" not in out
    )
    table, md = tables(tmp_path)
    assert table["selected"] is None
    assert {c["status"] for c in table["cells"]} == {"diverged"}
    assert all(o["status"] == "diverged" for c in table["cells"] for o in c["seeds"].values())
    assert md.count("| diverged |") == 4
