"""The harness of "flatness at SGD's price" without training: its processes and the estimators and
``--when`` of each, the recipe and sweep values reaching every process, × SGD from the same seed's
SGD, the deadline seed by seed, the goal's verdict both ways and when GAM's gain is not significant,
the section with and without its JSON, and the refusals of its command line."""

from __future__ import annotations

import json

import pytest

from reproduce.evidence import cheap as C
from reproduce.evidence import cheap_report as R

FMNIST = {  # what the committed fmnist.json holds: no recipe stage, the sweep's recipe
    "sweep": {"recipe": "w64-10", "selected": {"sam_rho": 0.1, "rho": 0.05, "alpha": 0.3}},
}
SECONDS = {"sgd": 10.0, "sam": 18.0, "gam": 89.0, "gam_fd": 35.0, "look_gam": 27.0}


class FakeRunner:
    """Stands for `reproduce.evidence.cheap.Runner`: records each process and answers with
    summaries; SGD of the ``every`` group takes ``10 + seed`` seconds, the adaptive group's 25."""

    def __init__(self, acc=lambda group, estimator, seed: 90.0, room=float("inf")):
        self.acc, self.room, self.calls = acc, room, []

    def predict_seed(self):
        return 100.0

    def left(self):
        return self.room - 100.0 * len({c[0].rsplit("/", 1)[0] for c in self.calls})

    def __call__(self, name, preset, estimators, args, group="every"):
        self.calls.append((name, preset, estimators, list(args), group))
        seed = int(next(a for a in args if a.startswith("--seed="))[7:])
        cfg = dict.fromkeys(("rho", "alpha", "sam_rho", "fd_radius", "model", "batch_size", "lr"))
        cfg |= {"seed": seed, "epochs": 10, "when": "", "mode": "auto"}
        for a in args:
            k, _, v = a[2:].partition("=")
            cfg[k] = v
        summaries = []
        for i, e in enumerate(estimators):
            t = SECONDS.get(e, 12.0)
            if e == "sgd":
                t = 25.0 if group == "adaptive" else 10.0 + seed
            final = {"test_acc": self.acc(group, e, seed), "train_eval_acc": 95.0}
            final |= {"lambda_max": 50.0, "r1": 0.5}
            summaries.append(
                # t s of steps at 120 / t images/s; a process's first estimator also carries its
                # warm-up (3 s) in train_seconds, which × SGD must leave out
                {"estimator": e, "status": "finished", "final": final,
                 "train_seconds": t + (3.0 if i == 0 else 0.0), "images_per_s": 120.0 / t,
                 "peak_memory_gib": 0.1, "config": cfg, "history": []}
            )  # fmt: skip
        return {"exit": 0, "wall_seconds": 1.0, "summaries": summaries}


def test_three_processes_a_seed_each_with_its_when_and_the_fmnist_values():
    v = C.values(FMNIST, FMNIST)
    assert v["recipe"] == "w64-10" and v["args"] == ["--model=resnet9", "--epochs=10"]
    run = FakeRunner()
    C.table(run, v, ("clean",), (0, 1, 2))
    assert [(c[4], c[2]) for c in run.calls[:3]] == [
        ("every", ("sgd", "look_gam", "msam", "rwp")),
        ("late", ("gam_fd", "sam")),
        ("adaptive", ("sgd", "gam_fd")),
    ]
    assert len(run.calls) == 9
    for i, (name, preset, _, args, group) in enumerate(run.calls):
        seed = i // 3
        assert preset == "fmnist.clean" and name == f"cheap/fmnist.clean/seed={seed}/{group}"
        assert {"--model=resnet9", "--epochs=10", f"--seed={seed}"} <= set(args)
        assert {"--sam_rho=0.1", "--rho=0.05", "--alpha=0.3"} <= set(args)
        when = {"every": [], "late": ["--when=late:0.75"], "adaptive": ["--when=adaptive"]}[group]
        assert [a for a in args if a.startswith("--when")] == when
        assert not any(a.startswith("--mode=") for a in args)  # every process as the table's


def test_every_form_is_timed_against_the_sgd_of_its_own_seed():
    run = FakeRunner()
    runs, processes = C.table(run, C.values(FMNIST, FMNIST), ("noise40",), (0, 2))
    assert not any(runs["clean"].values()) and len(processes) == 6
    by = runs["noise40"]
    table = {*C.BORROWED, R.TABLE_SGD}  # without the table's record, no rows of its runs
    assert {f for f, rs in by.items() if rs} == set(R.FORMS) - table
    assert all(len(rs) == 2 for f, rs in by.items() if f not in table)
    for f, rs in by.items():
        for r in rs:
            sgd = 120.0 / (10.0 + r["seed"])  # the every group's SGD, not the adaptive group's
            assert r["x_sgd"] == pytest.approx(sgd / r["images_per_s"]), f
    assert [r["x_sgd"] for r in by["sgd"]] == [1.0, 1.0]
    assert by["sgd@adaptive"][0]["x_sgd"] == 2.5
    assert by["gam_fd@late"][1]["x_sgd"] == pytest.approx(35 / 12)
    assert by["gam_fd@late"][0]["config"]["when"] == "late:0.75"
    assert by["gam_fd@adaptive"][0]["config"]["when"] == "adaptive"


def test_the_deadline_runs_whole_seeds_clean_first_and_records_what_it_skipped():
    run = FakeRunner(room=250.0)  # room for two seeds of 100 s
    runs, processes = C.table(run, C.values(FMNIST, FMNIST), ("clean", "noise40"), (0, 1, 2))
    assert [r["seed"] for r in runs["clean"]["look_gam"]] == [0, 1]
    assert not any(runs["noise40"].values())
    skipped = [(p["setting"], p["seed"]) for p in processes if not p["run"]]
    assert skipped == [(s, n) for s, n in [("clean", 2)] + [("noise40", k) for k in (0, 1, 2)]
                       for _ in C.GROUPS]  # fmt: skip


def test_a_seed_without_its_sgd_runs_no_other_process():
    class NoSgd(FakeRunner):
        def __call__(self, name, preset, estimators, args, group="every"):
            got = super().__call__(name, preset, estimators, args, group)
            got["summaries"] = [s for s in got["summaries"] if s["estimator"] != "sgd"]
            return got

    run = NoSgd()
    runs, _ = C.table(run, C.values(FMNIST, FMNIST), ("clean",), (0,))
    assert [c[4] for c in run.calls] == ["every"] and not any(runs["clean"].values())


def test_the_runner_predicts_a_seed_from_guesses_then_from_measured_times(tmp_path):
    run = C.Runner("data", tmp_path, 0.0, [])
    guess = sum(15.0 * m + 8.0 for m in C.GUESS.values())
    assert run.predict_seed() == pytest.approx(guess) and run.left() == float("inf")
    run.times = {("every", "sgd"): 10.0, ("late", "sam"): 11.0}
    assert run.predict(("sam",), "late") == 19.0 and run.predict(("msam",), "every") == 20.0


def test_the_full_price_forms_are_the_fmnist_tables_rows_of_the_same_seed():
    keys = {"gap": 1.0, "lambda_max": 50.0, "r1": 0.5, "train_seconds": 70.0, "x_sgd": 7.0}
    rows = {e: [{"seed": s, "estimator": e, "test_acc": 94.0 + s, **keys} for s in (0, 1, 2)]
            for e in ("sgd", *C.BORROWED)}  # fmt: skip
    full = {"platform": {"device": "H"}, "runs": {"clean": rows, "noise40": {}}}
    run = FakeRunner()
    runs, _ = C.table(run, C.values(FMNIST, FMNIST), ("clean", "noise40"), (0, 2), full=full)
    by = runs["clean"]
    for e in C.BORROWED:
        assert [(r["seed"], r["test_acc"], r["x_sgd"]) for r in by[e]] == [
            (0, 94.0, 7.0),
            (2, 96.0, 7.0),
        ]
        assert {r["group"] for r in by[e]} == {"table"} and {r["device"] for r in by[e]} == {"H"}
    assert [r["seed"] for r in by["sgd"]] == [0, 2]  # SGD is this run's own
    table_sgd = by[R.TABLE_SGD]  # and the table's SGD of the same seeds beside it
    assert [(r["seed"], r["estimator"], r["group"]) for r in table_sgd] == [
        (0, "sgd", "table"),
        (2, "sgd", "table"),
    ]
    assert all(c[2] == C.GROUPS[c[4]][1] for c in run.calls)  # no process trains a borrowed form
    assert not any(runs["noise40"][e] for e in C.BORROWED)  # the table has no noise40 runs yet
    section = R.cheap_section({"settings": {"argv": []}, "platform": {"device": "H", "torch": "2",
                               "date": "d"}, "values": {"recipe": "w32-15"}, "runs": runs,
                               "seconds": 1.0})  # fmt: skip
    assert "are the runs of the Fashion-MNIST table above for the same seeds (H)" in section


def test_the_estimate_is_the_tables_sgd_seconds_times_the_guesses():
    fm = {"runs": {"clean": {"sgd": [{"train_seconds": 10.0}, {"train_seconds": 20.0}]}}}
    a_seed = sum(15.0 * m + C.fmnist.OVERHEAD for m in C.GUESS.values())
    assert C.estimate(fm) == pytest.approx(a_seed * 6 / 60)


def record_of(acc: dict[str, list[float]], x: dict[str, float], setting="clean") -> dict:
    """A cheap.json whose form ``f`` has the test accuracies ``acc[f]`` (seeds 0, 1, ...) at
    ``x[f]`` × SGD (10 s)."""
    by = {f: [] for f in R.FORMS}
    for f, values in acc.items():
        by[f] = [{"seed": i, "test_acc": a, "x_sgd": x[f], "train_seconds": 10 * x[f],
                  "gap": 1.0, "lambda_max": 50.0, "r1": 0.5} for i, a in enumerate(values)]  # fmt: skip
    runs = {"clean": {f: [] for f in R.FORMS}, "noise40": {f: [] for f in R.FORMS}, setting: by}
    platform = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "date": "2027-01-01"}
    return {"settings": {"command": "cheap", "argv": ["--data=DIR"]}, "platform": platform,
            "values": {"recipe": "w32-10"}, "runs": runs, "seconds": 900.0}  # fmt: skip


SGD, GAM = [93.0, 93.1, 93.2], [94.0, 94.1, 94.2]  # a gain of 1.00 point, p < 0.001
X = {"sgd": 1.0, "sgd@table": 1.0, "gam": 8.9, "msam": 1.1, "rwp": 1.1, "gam_fd@late": 1.6}
X |= {"sgd@adaptive": 2.5}


def test_the_goal_is_met_by_a_form_that_keeps_enough_gain_at_the_price():
    acc = {"sgd": SGD, "sgd@table": SGD, "gam": GAM, "msam": [93.9, 94.0, 94.1]}
    acc |= {"rwp": [93.5, 93.6, 93.7], "gam_fd@late": [94.1, 94.2, 94.3]}
    acc |= {"sgd@adaptive": [94.5, 94.6, 94.7]}
    by = record_of(acc, X)["runs"]["clean"]
    g = R.goal(by)
    assert g["significant"] and g["gain"] == pytest.approx(1.0)
    assert g["met"] == ["msam"]  # rwp keeps 50%; late GAM keeps 110% at 1.6 ×; references aside
    assert g["forms"]["rwp"]["keeps"] == pytest.approx(0.5) and "sgd@adaptive" not in g["forms"]
    words = R.goal_words(by)
    assert "GAM (exact) gains +1.00 points over the SGD of its own process (p < 0.001)" in words
    assert (
        "is met by 1 of 3: MSAM keeps 90% at 1.10 ×" in words and "RWP keeps 50% at 1.10 ×" in words
    )
    # the adaptive policy's SGD, the most accurate at 2.5 ×, is a reference: never on the front
    assert [R.FORMS[f] for f in R.pareto(by)] == ["SGD", "MSAM", "GAM (fd), last 25%"]


def test_the_goal_met_by_no_form_says_so():
    acc = {"sgd": SGD, "sgd@table": SGD, "gam": GAM, "msam": [93.5, 93.6, 93.7]}
    acc["gam_fd@late"] = [94.0, 94.1, 94.2]
    by = record_of(acc, X)["runs"]["clean"]
    assert R.goal(by)["met"] == []
    words = R.goal_words(by)
    assert (
        "is met by no form: MSAM keeps 50% at 1.10 ×; GAM (fd), last 25% keeps 100% at 1.60 ×"
        in words
    )


def test_a_gain_of_gam_that_is_not_significant_is_said_and_judges_nothing():
    acc = {"sgd": SGD, "sgd@table": SGD, "gam": [93.0, 93.3, 93.2], "msam": [94.9, 95.0, 95.1]}
    by = record_of(acc, X)["runs"]["clean"]
    g = R.goal(by)
    assert not g["significant"] and g["met"] == [] and g["forms"]["msam"]["keeps"] is None
    words = R.goal_words(by)
    assert words.startswith(
        "GAM (exact)'s gain over the SGD of its own process is not significant (+0.07 points, p = "
    )
    assert "the curve is reported as it is" in words and "MSAM (1.10 ×, +1.90 points" in words
    one = {"sgd": SGD, "sgd@table": SGD, "gam": [94.0]}
    assert "not judged" in R.goal_words(record_of(one, X)["runs"]["clean"])
    no_table = {"sgd": SGD, "gam": GAM}  # full GAM's gain is over the table's SGD: none, no goal
    assert not R.goal(record_of(no_table, X)["runs"]["clean"])["judged"]


def test_the_section_without_and_with_its_json(tmp_path):
    text = R.cheap_section(None, 38.5)
    assert text.startswith(R.HEADING) and "**Not run yet.** `" + R.COMMAND + "`" in text
    assert "(an estimated 38 minutes of one GPU;" in text
    assert "Data:" not in text and "|" not in text
    acc = {"sgd": SGD, "sgd@table": SGD, "gam": GAM, "msam": [93.9, 94.0, 94.1]}
    record = record_of(acc, X)
    text = R.cheap_section(record)
    assert f"**Clean, 3 seeds.** {R.DATA}\n\n| form |" in text
    assert R.setting_table(record["runs"]["clean"]) in text and "is met by 1 of 1: MSAM" in text
    assert f"Not run yet; `{R.COMMAND} --settings=noise40`" in text
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "# R\n\n## Fashion-MNIST on one GPU: x\n\ntext\n\n## Not measured here\n\n- a\n"
    )
    R.write_section(None, results, minutes=38.5)
    once = results.read_text()
    assert once.index("## Fashion-MNIST") < once.index(R.HEADING) < once.index("## Not measured")
    R.write_section(record, results, tmp_path / "cheap.png")
    again = results.read_text()
    assert again.count(R.HEADING) == 1 and R.cheap_section(record) in again
    assert again.endswith("## Not measured here\n\n- a\n")
    assert (tmp_path / "cheap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_merge_adds_the_seeds_it_lacks_from_the_same_device():
    a = record_of({"sgd": SGD[:2], "gam": GAM[:2]}, X)
    b = record_of({"sgd": SGD, "gam": GAM}, X)
    b["processes"] = [
        {"setting": "clean", "seed": s, "group": "every", "run": True} for s in range(3)
    ]
    skipped = [{"setting": "clean", "seed": 2, "group": g, "run": False} for g in C.GROUPS]
    a["processes"] = [{"setting": "clean", "seed": 0, "group": "every", "run": True}, *skipped]
    b["platform"] |= {"torch": "2.11.0+cu128", "rwp_noise": "one draw"}  # the same torch
    assert C.merge(a, b) == [("clean", 2)]
    assert [r["seed"] for r in a["runs"]["clean"]["gam"]] == [0, 1, 2]
    # the skipped processes of the seed it adds are replaced by those that ran, not kept beside
    assert a["processes"] == [a["processes"][0], b["processes"][2]]
    assert a["added"][0]["rwp_noise"] == "one draw"  # which RWP code the merged run timed
    for key, value, says in (
        ("device", "NVIDIA H200", "one device"),
        ("torch", "2.12.0+cu130", "torch 2.12.0, not 2.11.0"),
    ):
        c = record_of({"sgd": SGD}, X)
        c["platform"][key] = value
        with pytest.raises(ValueError, match=says):
            C.merge(a, c)
    for key, value in (("recipe", "w64-10"), ("selected", {"sam_rho": 0.1})):
        c = record_of({"sgd": SGD}, X)
        c["values"] = {**c["values"], key: value}
        with pytest.raises(ValueError, match="values"):
            C.merge(a, c)


def test_a_merge_on_the_command_line_names_the_run_it_added(tmp_path):
    """--merge adds the other setting's seeds, and the section says which run measured them: its
    command, date and seconds."""
    (tmp_path / "cheap.json").write_text(json.dumps(record_of({"sgd": SGD, "gam": GAM}, X)))
    other = record_of({"sgd": SGD, "gam": GAM, "msam": [93.9, 94.0, 94.1]}, X, "noise40")
    other["settings"]["argv"] = ["--data=DIR", "--settings=noise40"]
    other["platform"]["date"], other["seconds"] = "2027-01-02", 843.4
    other["runs"]["clean"] = {f: [] for f in R.FORMS}
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert C.main([f"--out={tmp_path}", f"--merge={tmp_path / 'other.json'}"]) == 0
    merged = json.loads((tmp_path / "cheap.json").read_text())
    assert [r["seed"] for r in merged["runs"]["noise40"]["msam"]] == [0, 1, 2]
    assert len(merged["runs"]["clean"]["gam"]) == 3
    assert (
        "Added afterwards: noise40 seeds 0, 1, 2 (`python -m reproduce.evidence.cheap --data=DIR "
        "--settings=noise40`, 2027-01-02, 843 s)." in R.cheap_section(merged)
    )
    merged["added"].append({"setting": "clean", "seed": 3})  # --add: a folder, no run named
    assert "843 s); clean seed 3." in R.cheap_section(merged)


def test_rwp_rows_timed_with_its_per_tensor_noise_are_said_to_be(monkeypatch):
    """The record says which RWP code its run imported, and an added seed which code its own run
    did; RWP's × SGD from the per-tensor noise is that code's: the section says so for all of its
    rows, for some, or not at all, whatever the date."""
    import importlib

    module = importlib.import_module("gamfunc.estimators.rwp")
    assert C.rwp_noise() == "one draw" and C.run_platform()["rwp_noise"] == "one draw"
    monkeypatch.delattr(module, "normals")  # the earlier code: a draw per tensor
    assert C.rwp_noise() == "per tensor"
    record = record_of({"sgd": SGD, "rwp": [93.5, 93.6, 93.7]}, X)
    record["platform"] |= {"rwp_noise": "per tensor", "date": "2099-01-01"}
    assert R.rwp_timing(record).startswith(" RWP's rows were timed by runs whose RWP drew its ")
    assert R.rwp_timing(record) in R.cheap_section(record)
    record["added"] = [
        {"setting": "clean", "seed": 2, "date": "2000-01-01", "rwp_noise": "one draw"}
    ]
    assert R.rwp_timing(record).startswith(" 2 of RWP's 3 rows were timed")
    record["added"].append({"setting": "clean", "seed": 1})  # --add: the record's code
    assert R.rwp_timing(record).startswith(" 2 of RWP's 3 rows were timed")
    record["platform"]["rwp_noise"] = "one draw"
    assert R.rwp_timing(record) == ""
    assert R.rwp_timing(record_of({"sgd": SGD}, X)) == ""


def test_the_command_line_refuses(tmp_path, capsys):
    (tmp_path / "none.json").write_text(json.dumps({"sweep": {"selected": {}}}))
    base = [f"--data={tmp_path}", f"--out={tmp_path / 'out'}"]
    for bad, says in (
        (["--settings=noise99"], "--settings"),
        (["--seeds=0,x"], "--seeds"),
        (["--seeds=1,1"], "--seeds"),
        (["--deadline=-5"], "--deadline"),
        ([f"--recipe={tmp_path / 'none.json'}"], "--recipe: no recipe chosen"),
        ([f"--sweep={tmp_path / 'none.json'}"], "--sweep: that JSON's sweep selected no"),
        (["--add=clean:0:folder"], "--add/--merge: no"),
        (["--merge=other.json"], "--add/--merge: no"),
    ):
        with pytest.raises(SystemExit):
            C.main([*base, *bad])
        assert says in capsys.readouterr().err
    with pytest.raises(SystemExit):
        C.main(base[1:])
    assert "--data: the folder" in capsys.readouterr().err


def test_the_guides_paragraph_says_what_to_start_with_from_the_goal():
    assert R.start_with(None).startswith(R.GUIDE_HEAD + " is a matter of measurement")
    lam = {"sgd": 100.0, "sgd@table": 100.0, "gam": 60.0, "msam": 90.0, "rwp": 70.0}
    lam["gam_fd@late"] = 50.0
    acc = {"sgd": SGD, "sgd@table": SGD, "gam": GAM, "msam": [93.9, 94.0, 94.1]}
    acc["rwp"] = [93.5, 93.6, 93.7]
    acc["gam_fd@late"] = [94.1, 94.2, 94.3]  # the flattest, but at 1.6 × it is no cheap form
    record = record_of(acc, X)
    for f, rows in record["runs"]["clean"].items():
        for r in rows:
            r["lambda_max"] = lam[f]
    text = R.start_with(record)
    assert text.startswith(f"{R.GUIDE_HEAD}, as measured (`reproduce.evidence.cheap` on one NVIDIA")
    assert (
        "on clean Fashion-MNIST (3 seeds), GAM (exact) gained +1.00 points over the SGD of its own "
        "process (p < 0.001)" in text
    )
    assert "MSAM kept 90% of it at 1.10 × SGD" in text and text.endswith("start with MSAM.")
    assert "RWP lowered λ_max most (−30% against SGD's, at 1.10 ×)" in text
    assert "MSAM was the most accurate (94.00% at 1.10 ×, +0.90 points against SGD, p" in text
    clean = record["runs"]["clean"]
    for r in clean["gam"]:
        r["test_acc"] -= 0.95  # GAM's gain now +0.05 points: not significant
    text = R.start_with(record)
    assert text.endswith("start with MSAM, which beat SGD significantly.")  # +0.90, p < 0.001
    clean["msam"] = clean["msam"][:1]  # one seed: MSAM is no candidate
    text = R.start_with(record)  # RWP: the most accurate and the flattest, +0.50 points
    assert "RWP was the most accurate (93.60% at 1.10 ×, +0.50 points against SGD, p = " in text
    assert ") and lowered λ_max most (−30%" in text and text.endswith(
        "which beat SGD significantly."
    )
    for r, a in zip(clean["rwp"], (93.0, 93.3, 93.2), strict=True):
        r["test_acc"] = a  # +0.07 points: not significant
    text = R.start_with(record)
    assert "GAM (exact)'s gain over the SGD of its own process was not significant (+0.05 " in text
    assert text.endswith(
        "start with SGD where test accuracy is the aim, and with RWP where a flatter minimum is."
    )


def test_each_form_is_compared_with_the_sgd_of_its_own_process():
    """The borrowed forms are tested against the table's SGD of the same seeds, the cheap forms
    against this run's; full GAM's gain, the goal's, is over the table's SGD; the table shows both
    SGDs, the table's right after this run's, and each form has a marker of its own."""
    assert list(R.FORMS)[:2] == ["sgd", R.TABLE_SGD] and R.TABLE_SGD in R.REFERENCES
    assert len({R.MARKERS[i % len(R.MARKERS)] for i in range(len(R.FORMS))}) == len(R.FORMS)
    acc = {"sgd": SGD, "sgd@table": [92.0, 92.1, 92.2], "gam": SGD, "msam": [93.9, 94.0, 94.1]}
    acc |= {"sam": [92.5, 92.6, 92.7]}
    by = record_of(acc, X | {"sam": 1.9})["runs"]["clean"]
    g = R.goal(by)
    assert g["gain"] == pytest.approx(1.0) and g["significant"]  # over the table's SGD, not ours
    assert g["forms"]["msam"]["keeps"] == pytest.approx(0.9)  # (94.0 − 93.1) / 1.0
    assert R.TABLE_SGD not in g["forms"] and g["met"] == ["msam"]
    rows = {
        line.split(" | ")[0][2:]: line.split(" | ") for line in R.setting_table(by).splitlines()
    }
    assert rows["GAM (exact)"][8].startswith("+1.00, p < 0.001")  # against the table's SGD
    assert rows["SAM"][8].startswith("+0.50, p = 0.004")
    assert rows["MSAM"][8].startswith("+0.90, p < 0.001")  # against this run's SGD
    assert rows["SGD (the table's run)"][8].startswith("−1.00, p < 0.001")  # the two SGDs
    # GAM against this run's SGD would cross processes: the table's SGD row carries that test
    assert rows["SGD"][8:10] == ["—", "— |"] and rows["SGD (the table's run)"][9].startswith(
        "−1.00"
    )
    assert list(rows)[2:4] == ["SGD", "SGD (the table's run)"]
    intro = " ".join(R.INTRO.split())
    assert "each form is compared with the SGD of its own process" in intro
    assert "run-to-run variation" in intro and "the table shows both" in intro


def test_the_front_holds_no_sgd_but_the_runs_own_and_keeps_full_gam():
    acc = {"sgd": SGD, "sgd@table": [93.3, 93.4, 93.5], "gam": GAM}
    acc |= {"sgd@adaptive": [94.5, 94.6, 94.7], "msam": [93.0, 93.1, 93.2]}
    by = record_of(acc, X)["runs"]["clean"]
    assert R.pareto(by) == ["sgd", "gam"]  # the table's SGD beats ours at 1.00 ×: a reference


def test_the_intro_says_what_a_cell_and_a_multiple_of_sgd_are():
    intro = " ".join(R.INTRO.split())
    assert "mean ± sample std over seeds" in intro
    assert (
        "× SGD (the tables, the goal, the Pareto front and the figure) is the mean of the " in intro
    )
    assert "per-seed ratios" in intro


def test_the_section_says_once_when_a_setting_has_fewer_than_three_seeds_of_a_form():
    acc = {"sgd": SGD, "sgd@table": SGD, "gam": GAM, "msam": [93.9, 94.0, 94.1]}
    record = record_of(acc, X)
    assert "degrees of freedom" not in R.cheap_section(record)
    record["runs"]["noise40"] = record_of({k: v[:2] for k, v in acc.items()}, X)["runs"]["clean"]
    text = " ".join(R.cheap_section(record).split())
    said = (
        "40% label noise (`noise40`) has fewer than 3 seeds of a form: Welch's test on 2 seeds a "
        "side has at most 2 degrees of freedom, so its p-values there are rough (a form of 1 seed "
        "has none)."
    )
    assert text.count("degrees of freedom") == 1 and said in text
    assert text.index("What this shows, plainly") < text.index(said) < text.index("Clean: -")
    record["runs"]["clean"]["msam"].pop()
    assert "Clean and 40% label noise (`noise40`) have fewer than 3 seeds" in R.cheap_section(
        record
    )


def test_the_figure_and_the_guide_give_the_seeds_in_the_sections_words(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = {"sgd": SGD, "sgd@table": SGD, "gam": GAM, "msam": [93.9, 94.0, 94.1]}
    record = record_of(acc, X)
    record["runs"]["noise40"] = record_of(acc, X)["runs"]["clean"]
    record["runs"]["noise40"]["msam"].pop()
    shown = []
    monkeypatch.setattr(plt, "close", shown.append)
    R.figure(record, tmp_path / "cheap.png")
    assert [ax.get_title() for ax in shown[0].axes] == [
        "Fashion-MNIST, Clean, 3 seeds",
        "Fashion-MNIST, 40% label noise (noise40), 2–3 seeds",
    ]
    text = R.start_with(record)
    assert "on clean Fashion-MNIST (3 seeds)" in text and "on 40% label noise (2–3 seeds)" in text
    assert "**40% label noise (`noise40`), 2–3 seeds.**" in R.cheap_section(record)


def test_negative_values_carry_the_minus_sign_of_the_docs():
    assert R._pm([-1.0, -2.0]) == "−1.50 ± 0.71" and R._pm([-0.5], ".1f") == "−0.5"
    assert R._pm([1.0, 2.0]) == "1.50 ± 0.71"


def _folder(tmp_path, seed: int, groups=tuple(C.GROUPS)):
    """A train.py folder per group of `GROUPS` for ``seed``, as the harness's command writes it."""
    run = FakeRunner()
    folder = tmp_path / f"seed{seed}"
    for group in groups:
        got = run(f"cheap/x/{group}", "p", C.GROUPS[group][1], [f"--seed={seed}"], group)
        for s in got["summaries"]:
            path = folder / group / s["estimator"] / "summary.json"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps(s))
    return folder


def test_add_borrows_the_tables_rows_and_refuses_a_seed_it_has_or_a_folder_without_sgd(
    tmp_path, capsys
):
    (tmp_path / "cheap.json").write_text(json.dumps(record_of({"sgd": SGD, "gam": GAM}, X)))
    keys = {"gap": 1.0, "lambda_max": 50.0, "r1": 0.5, "train_seconds": 70.0, "x_sgd": 7.0}
    rows = {e: [{"seed": s, "estimator": e, "test_acc": 94.0 + s, **keys} for s in (0, 1, 2)]
            for e in ("sgd", *C.BORROWED)}  # fmt: skip
    table = {"platform": {"device": "H"}, "runs": {"clean": {}, "noise40": rows}}
    (tmp_path / "fmnist.json").write_text(json.dumps(table))
    base = [f"--out={tmp_path}", f"--sweep={tmp_path / 'fmnist.json'}"]
    assert C.main([*base, f"--add=noise40:2:{_folder(tmp_path, 2)}"]) == 0
    record = json.loads((tmp_path / "cheap.json").read_text())
    by = record["runs"]["noise40"]
    for f in (*C.BORROWED, R.TABLE_SGD):
        assert [(r["seed"], r["group"], r["device"]) for r in by[f]] == [(2, "table", "H")], f
    assert [r["seed"] for r in by["sgd"]] == [2] and record["added"][-1]["seed"] == 2
    for bad, says in (
        ([f"--add=noise40:2:{_folder(tmp_path / 'again', 2)}"], "noise40 seed 2 is in the record"),
        ([f"--add=clean:1:{tmp_path / 'seed2'}"], "clean seed 1 is in the record"),
        ([f"--add=noise40:1:{_folder(tmp_path, 1, ('late', 'adaptive'))}"], "no SGD in"),
    ):
        with pytest.raises(SystemExit):
            C.main([*base, *bad])
        assert says in capsys.readouterr().err
    assert json.loads((tmp_path / "cheap.json").read_text()) == record  # nothing written


def test_a_merge_of_other_values_or_torch_is_refused_on_the_command_line(tmp_path, capsys):
    (tmp_path / "cheap.json").write_text(json.dumps(record_of({"sgd": SGD}, X)))
    for key, value, says in (
        ("values", {"recipe": "w64-10"}, "--merge: its values"),
        ("platform", {"torch": "2.10.0+cu130"}, "--merge: measured with torch 2.10.0"),
    ):
        other = record_of({"sgd": SGD}, X, "noise40")
        other[key] = {**other[key], **value}
        (tmp_path / "other.json").write_text(json.dumps(other))
        with pytest.raises(SystemExit):
            C.main([f"--out={tmp_path}", f"--merge={tmp_path / 'other.json'}"])
        assert says in capsys.readouterr().err
