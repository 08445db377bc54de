"""The Fashion-MNIST evidence harness's stages without training: the recipe chosen on validation
accuracy alone, its arguments reaching the sweep and every run of the table, the sweep's choice, a
stored stage reused, and the refusals of its command line."""

from __future__ import annotations

import json

import pytest

from reproduce.evidence import fmnist as H
from reproduce.evidence import fmnist_report as R


class FakeRunner:
    """Stands for `reproduce.evidence.fmnist.Runner`: records each command and answers with
    summaries whose validation accuracy is ``val(name, args)``."""

    def __init__(self, val):
        self.val, self.calls, self.start = val, [], 0.0

    def __call__(self, name, preset, estimators, args):
        self.calls.append((name, preset, estimators, list(args)))
        cfg = {
            k: None for k in ("rho", "alpha", "sam_rho", "fd_radius", "model", "batch_size", "lr")
        }
        cfg |= {"seed": 0, "epochs": 10}
        for a in args:
            k, _, v = a[2:].partition("=")
            if k in cfg:
                cfg[k] = v
        summaries = [
            {
                "estimator": e,
                "status": "finished",
                "final": {
                    "val_acc": self.val(name, args),
                    "test_acc": 90.0,
                    "train_eval_acc": 91.0,
                    "lambda_max": 10.0 if e == "sgd" else 5.0,
                    "r1": 0.1,
                },
                "train_seconds": 2.0 if e == "sgd" else 5.0,
                "images_per_s": 60.0 if e == "sgd" else 20.0,
                "peak_memory_gib": 0.1,
                "config": cfg,
                "history": [],
            }
            for e in estimators
        ]
        return {"exit": 0, "wall_seconds": 1.0, "summaries": summaries}


def test_the_recipe_is_the_best_mean_validation_accuracy_and_ties_take_the_cheaper():
    scores = {"w32-10": (94.0, 94.4), "w32-15": (94.3, 94.1), "w64-10": (94.5, 93.8)}
    run = FakeRunner(lambda name, args: scores[name.split("/")[1]][int(name[-1])])
    got = H.recipe(run)
    assert got["selected"] == "w32-10" and {"device", "torch", "date"} <= set(
        got["platform"]
    )  # 94.2 ties w32-15's 94.2 and beats w64-10's 94.15
    assert [c["recipe"] for c in got["cells"]] == [n for n in H.RECIPES for _ in H.RECIPE_SEEDS]
    for name, _, estimators, args in run.calls:
        assert estimators == ("sgd",) and "--val_fraction=0.1" in args
        assert all(a in args for a in H.RECIPES[name.split("/")[1]])
    scores["w64-10"] = (94.5, 94.0)
    assert (
        H.recipe(FakeRunner(lambda n, a: scores[n.split("/")[1]][int(n[-1])]))["selected"]
        == "w64-10"
    )


def test_a_recipe_with_a_run_missing_is_never_selected():
    def val(name, args):
        return 99.0 if name.startswith("recipe/w64-10") else 90.0

    class Skips(FakeRunner):
        def __call__(self, name, preset, estimators, args):
            return (
                None
                if name == "recipe/w64-10/seed=1"
                else super().__call__(name, preset, estimators, args)
            )

    got = H.recipe(Skips(val))
    assert got["selected"] == "w32-10"
    assert [c["run"] for c in got["cells"] if c["recipe"] == "w64-10"] == [True, False]


def test_the_recipe_reaches_the_sweep_and_every_run_of_the_table():
    run = FakeRunner(
        lambda name, args: 95.0 if "--sam_rho=0.1" in args or "--alpha=0.3" in args else 94.0
    )
    args = H.RECIPES["w64-10"]
    swept = H.sweep(run, args)
    assert swept["selected"] == {"sam_rho": 0.1, "rho": 0.05, "alpha": 0.3}
    runs = H.table(run, swept["selected"], settings=("clean",), args_=args)
    table_calls = [c for c in run.calls if c[0].startswith("table/")]
    assert len(table_calls) == len(H.SEEDS)
    for *_, a in run.calls:
        assert all(x in a for x in args)
    for _, preset, estimators, a in table_calls:
        assert preset == "fmnist.clean" and estimators == H.ESTIMATORS
        assert {"--sam_rho=0.1", "--rho=0.05", "--alpha=0.3"} <= set(a)
    rows = runs["clean"]["gam"]
    assert [r["seed"] for r in rows] == list(H.SEEDS)
    # × SGD: SGD's steady-state images/s over GAM's (60 / 20), not the ratio of train_seconds (2.5)
    assert rows[0]["x_sgd"] == 3.0 and rows[0]["config"]["model"] == "resnet9"
    assert not any(runs["noise40"].values())


def test_stored_stages_are_reused_and_the_table_needs_a_sweep(tmp_path, monkeypatch, capsys):
    stored = {
        "recipe": {"selected": "w32-15", "cells": []},
        "sweep": {"selected": {"sam_rho": 0.05, "rho": 0.05, "alpha": 0.1}, "cells": []},
    }
    (tmp_path / "old.json").write_text(json.dumps(stored))
    made = []

    def runner(*a):
        made.append(FakeRunner(lambda name, args: 94.0))
        return made[-1]

    monkeypatch.setattr(H, "Runner", runner)
    old = str(tmp_path / "old.json")
    argv = [f"--data={tmp_path}", f"--out={tmp_path / 'out'}", "--settings=clean"]
    assert H.main([*argv, f"--recipe={old}", f"--sweep={old}", "--stages=table"]) == 0
    record = json.loads((tmp_path / "out" / "fmnist.json").read_text())
    assert record["recipe"] == stored["recipe"] and record["sweep"] == stored["sweep"]
    assert record["table_recipe"] == "w32-15"  # the recipe the table's runs were made with
    calls = made[0].calls
    assert calls and all(c[0].startswith("table/fmnist.clean/") for c in calls)
    assert all("--epochs=15" in c[3] and "--alpha=0.1" in c[3] for c in calls)
    for bad, says in (
        (["--stages=table"], "the table needs the sweep"),
        (["--stages=recipe,plot"], "--stages"),
        (["--settings=noise99"], "--settings"),
    ):
        with pytest.raises(SystemExit):
            H.main([*argv, *bad])
        assert says in capsys.readouterr().err


def test_into_trains_only_what_the_record_lacks_and_keeps_each_sitting(tmp_path, monkeypatch):
    first = FakeRunner(lambda name, args: 94.0)
    runs = H.table(first, {"sam_rho": 0.05, "rho": 0.05, "alpha": 0.3}, settings=("clean",))
    for rows in runs["clean"].values():
        del rows[2:]  # seeds 0 and 1 made; seed 2 skipped by a deadline
    record = {
        "settings": {"argv": ["--data=DIR"]},
        "seconds": 1.0,
        "platform": {"device": "X", "torch": "2.11", "date": "d"},
        "table_recipe": "w32-15",
        "sweep": {"selected": {"sam_rho": 0.05, "rho": 0.05, "alpha": 0.3}, "cells": []},
        "runs": runs,
    }
    (tmp_path / "r.json").write_text(json.dumps(record))
    made = []
    monkeypatch.setattr(
        H, "Runner", lambda *a: made.append(FakeRunner(lambda n, a: 93.0)) or made[-1]
    )
    argv = [f"--data={tmp_path}", f"--out={tmp_path / 'out'}", "--stages=table"]
    assert H.main([*argv, f"--into={tmp_path / 'r.json'}"]) == 0
    names = [c[0] for c in made[0].calls]
    assert names == ["table/fmnist.clean/seed=2"] + [
        f"table/fmnist.noise40/seed={s}" for s in H.SEEDS
    ]
    assert all("--epochs=15" in c[3] and "--alpha=0.3" in c[3] for c in made[0].calls)
    out = json.loads((tmp_path / "out" / "fmnist.json").read_text())
    assert [r["seed"] for r in out["runs"]["clean"]["gam"]] == [0, 1, 2]
    assert [r["seed"] for r in out["runs"]["noise40"]["sgd"]] == list(H.SEEDS)
    assert out["runs"]["clean"]["sgd"][:2] == record["runs"]["clean"]["sgd"]  # kept as they were
    (sitting,) = out["continued"]
    assert sitting["ran"] == [["clean", 2]] + [["noise40", s] for s in H.SEEDS]
    section = H.fmnist_section(out)
    assert "Continued with `python -m reproduce.evidence.fmnist" in section
    assert "clean seed 2, noise40 seeds 0, 1, 2" in section
    assert "are not comparable" in section  # device X, then this machine's


def test_into_takes_the_records_recipe_and_sweep_alone(tmp_path, capsys):
    argv = [f"--data={tmp_path}", f"--into={tmp_path / 'r.json'}"]
    for bad in ([], ["--stages=table", f"--sweep={tmp_path}"]):
        with pytest.raises(SystemExit):
            H.main([*argv, *bad])
        assert "--into" in capsys.readouterr().err


def test_in_short_names_what_beat_sgd_and_the_settings_not_run():
    row = {"lambda_max": 10.0}
    runs = {
        "clean": {
            "sgd": [{**row, "test_acc": a} for a in (93.0, 93.1, 93.2)],
            "sam": [{**row, "test_acc": a, "lambda_max": 5.0} for a in (94.0, 94.1, 94.2)],
            "gam": [{**row, "test_acc": a, "lambda_max": 8.0} for a in (93.0, 93.3, 92.9)],
        },
        "noise40": {"sgd": []},
    }
    assert H.in_short({"runs": runs}) == (
        "In short (Welch's tests, with Holm's correction over each setting's): on clean "
        "Fashion-MNIST (3 seeds) SAM beat SGD significantly, and λ_max fell most under SAM (−50% "
        "against SGD's); 40% label noise not run yet."
    )


def test_in_short_says_what_fell_below_sgd_after_the_correction():
    # Welch's p (scipy.stats.ttest_ind, equal_var=False): SAM−SGD 0.000385, GAM−SGD 0.0159,
    # GAM−SAM 0.0199; Holm: 3·0.000385 = 0.001, 2·0.0159 = 0.032, max(1·0.0199, 0.032) = 0.032
    accs = {"sgd": (92.3, 92.4, 92.35), "sam": (91.9, 91.85, 91.95), "gam": (92.1, 92.2, 92.05)}
    lam = {"sgd": 10.0, "sam": 4.0, "gam": 8.0}
    row = {"x_sgd": 1.0, "train_seconds": 1.0, "images_per_s": 1000.0}
    by = {e: [{**row, "lambda_max": lam[e], "test_acc": a} for a in v] for e, v in accs.items()}
    assert H.in_short({"runs": {"noise40": by}}) == (
        "In short (Welch's tests, with Holm's correction over each setting's): on 40% label noise "
        "(3 seeds) no estimator beat SGD, SAM and GAM (exact) fell significantly below it, and "
        "λ_max fell most under SAM (−60% against SGD's)."
    )
    lines = R.fmnist_prose({"runs": {"noise40": by}}).splitlines()
    family = [line for line in lines if line.startswith("- Taken together")]
    assert family == [
        "- Taken together (Holm's correction over these 3 tests), significant at the 5% level: "
        "SAM below SGD (−0.45 points, p = 0.001); GAM (exact) below SGD (−0.23 points, "
        "p = 0.032); GAM (exact) above SAM (+0.22 points, p = 0.032)."
    ]


def test_in_short_says_a_setting_of_one_seed_allows_no_test():
    row = {"lambda_max": 10.0}
    runs = {
        "noise40": {
            "sgd": [{**row, "test_acc": 90.0}],
            "sam": [{**row, "test_acc": 95.0, "lambda_max": 4.0}],
        }
    }
    assert H.in_short({"runs": runs}) == (
        "In short: on 40% label noise (1 seed) there were too few seeds for a test, and λ_max fell "
        "most under SAM (−60% against SGD's)."
    )


def test_holm_multiplies_the_kth_smallest_p_by_m_minus_k_plus_1_and_keeps_the_order():
    # by hand: sorted 0.005, 0.01, 0.03, 0.04 -> 4·0.005, 3·0.01, 2·0.03, max(1·0.04, 0.06)
    got = R.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005})
    assert got == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06, "d": 0.02})
    assert R.holm({"a": 0.6, "b": 0.5}) == {"a": 1.0, "b": 1.0}  # capped at 1


def test_the_tests_taken_together_can_undo_a_single_significant_one():
    # Welch's p (scipy.stats.ttest_ind, equal_var=False): SAM−SGD 0.2209, fd−SGD 0.3918,
    # fd−SAM 0.0385; Holm: 3·0.0385 = 0.115, then max(2·0.2209, 0.3918) = 0.442 twice
    row = {"lambda_max": 10.0, "x_sgd": 1.0, "train_seconds": 1.0, "images_per_s": 1000.0}
    accs = {
        "sgd": (94.20, 94.40, 94.30),
        "sam": (94.15, 94.25, 94.20),
        "gam_fd": (94.30, 94.45, 94.36),
    }
    by = {e: [{**row, "test_acc": a} for a in v] for e, v in accs.items()}
    lines = R.fmnist_prose({"runs": {"noise40": by}}).splitlines()
    assert "- Against SAM, significant at the 5% level: GAM (fd) +0.17 points (p = 0.038)." in lines
    assert (
        "- Taken together (Holm's correction over these 3 tests): none is significant at the 5% "
        "level (the smallest adjusted p, GAM (fd) against SAM: p = 0.115)."
    ) in lines


def test_predictions_take_the_records_times_and_the_curves_of_seed_0(tmp_path):
    run = H.Runner("data", tmp_path, 0.0, [])
    plain = sum(15.0 * H.GUESS[e] + H.OVERHEAD for e in H.ESTIMATORS)
    assert run.predict(H.ESTIMATORS) == pytest.approx(plain)
    assert run.predict_process(H.ESTIMATORS, ["--seed=1"]) == pytest.approx(plain)
    curves = run.predict_process(H.ESTIMATORS, ["--seed=0", "--flatness_every=2"])
    assert curves == pytest.approx(plain + H.CURVES * len(H.ESTIMATORS))
    rows = {e: [{"train_seconds": 10.0 * (i + 1)}, {"train_seconds": 12.0 * (i + 1)}]
            for i, e in enumerate(H.ESTIMATORS)}  # fmt: skip
    run.remember({"clean": rows, "noise40": {e: [] for e in H.ESTIMATORS}})
    assert run.seconds == {e: 11.0 * (i + 1) for i, e in enumerate(H.ESTIMATORS)}
    run.seconds["sgd"] = 9.0  # measured in this process: kept over the record's
    run.remember({"clean": rows})
    assert run.seconds["sgd"] == 9.0
