"""reproduce/sweep.py --vmap: a grid × seeds trained as one vmapped step (reproduce/sweeps/vmap_grid.py and
reproduce/sweeps/vmapped.py): the sweep's table, each member equal to its own run on the same batches, a
selection blind to the test labels, reuse and resumption, one-line refusals naming the field."""

import json
from pathlib import Path

import pytest
import torch
from train_cli import poison_digits_test_labels

from gamfunc.training.ensemble import unstack
from gamfunc.training.state import StepState
from reproduce import sweep, train
from reproduce.build import setup
from reproduce.config import resolve
from reproduce.data import sets as data_mod
from reproduce.run import checkpoint as ckpt
from reproduce.sweeps import vmapped
from reproduce.sweeps.plan import plan

TRAIN_ARGS = [
    "--preset=digits",
    "--estimator=gam",
    "--epochs=1",
    "--val_fraction=0.2",
    "--progress=false",
]
GRID = ["--grid=rho=0.05,0.1", "--grid=alpha=0.1,1", "--seeds=0,1"]
CELLS = ["rho=0.05,alpha=0.1", "rho=0.05,alpha=1", "rho=0.1,alpha=0.1", "rho=0.1,alpha=1"]
NAME = "sweep.digits.vmap"


def run_sweep(logdir: Path, *args: str, train_args=TRAIN_ARGS) -> int:
    return sweep.main(["--vmap", *GRID, *args, "--", f"--logdir={logdir}", *train_args])


def tables(logdir: Path) -> tuple[dict, str]:
    root = logdir / NAME
    return json.loads((root / "sweep.json").read_text()), (root / "sweep.md").read_text()


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as the digits preset runs (--threads=1): these models are too small for two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The 2 × 2 × 2-seed sweep of the digits preset, one epoch, as 8 members of one step."""
    logdir = tmp_path_factory.mktemp("vmap")
    assert run_sweep(logdir) == 0
    return logdir


def test_the_vmapped_sweep_writes_the_sweep_table_of_every_cell(clean):
    table, md = tables(clean)
    assert [c["cell"] for c in table["cells"]] == CELLS
    assert table["runs"] == {"total": 8, "reused": 0, "trained": 8}
    assert table["vmap"]["members"] == 8 and table["vmap"]["data_seed"] == 0
    members = json.loads((clean / NAME / "members.json").read_text())
    assert [m["status"] for m in members] == ["finished"] * 8
    assert [(m["config"]["seed"], m["config"]["rho"]) for m in members[::2]] == [
        (0, 0.05), (0, 0.1), (1, 0.05), (1, 0.1)
    ]  # fmt: skip
    for cell in table["cells"]:
        assert cell["n"] == 2 and cell["status"] == "complete"
        assert cell["val_std"] is not None and cell["test_std"] is not None
    best = max(table["cells"], key=lambda c: c["val_mean"])
    assert table["selected"]["cell"] == best["cell"]
    lines = md.splitlines()
    assert "one vmapped step on the batches of seed 0" in lines[0]
    header = lines.index("| rho | alpha | seeds | val_acc (%) | test_acc (%) | note |")
    assert len(lines[header + 2 :]) == 4


def test_each_member_equals_its_own_run_on_the_same_batches(clean):
    """The reference: train.py's step (reproduce.build.setup) for one configuration alone, fed the
    batches of the data seed; every member's parameters equal it to float rounding."""
    members = unstack(ckpt.load(clean / NAME / "vmap.pt")["params"])
    grid = [("rho", ["0.05", "0.1"]), ("alpha", ["0.1", "1"])]
    cfgs = [r.config for r in plan(TRAIN_ARGS, grid, [0, 1], "x")[2]]  # the sweep's order
    data = data_mod.load(cfgs[0])  # seed 0: the data seed
    for got, cfg in zip(members, cfgs, strict=True):
        t = setup(cfg, "gam", data, torch.device("cpu"))
        params, state = t.params, t.state
        order = data_mod.epoch_order(len(data.train), 0, 0)
        for batch in data_mod.train_batches(data.train, order, 0, cfg.batch_size, seed=0, epoch=0):
            params, state, _ = t.step(params, state, batch)
        for k, v in params.items():
            torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6)
    assert not torch.equal(members[0]["net.0.weight"], members[4]["net.0.weight"])  # seeds differ


def test_the_members_of_the_data_seed_are_train_py_runs(clean, tmp_path):
    assert train.main([*TRAIN_ARGS, f"--logdir={tmp_path}", "--rho=0.1", "--alpha=1"]) == 0
    alone = json.loads((tmp_path / "digits" / "gam" / "summary.json").read_text())["final"]
    members = json.loads((clean / NAME / "members.json").read_text())
    member = members[CELLS.index("rho=0.1,alpha=1")]["final"]  # seed 0
    # accuracies in %: one example of 287 validation or 360 test ones is 0.35 or 0.28 points
    assert member["val_acc"] == pytest.approx(alone["val_acc"], abs=0.4)
    assert member["test_acc"] == pytest.approx(alone["test_acc"], abs=0.3)
    assert member["val_loss"] == pytest.approx(alone["val_loss"], rel=1e-5)
    assert member["train_loss"] == pytest.approx(alone["train_loss"], rel=1e-5)


def test_poisoned_test_labels_do_not_change_the_selected_cell(clean, tmp_path, monkeypatch):
    clean_table, _ = tables(clean)
    poison_digits_test_labels(monkeypatch)
    assert run_sweep(tmp_path) == 0
    table, _ = tables(tmp_path)
    assert table["selected"]["cell"] == clean_table["selected"]["cell"]
    for a, b in zip(table["cells"], clean_table["cells"], strict=True):
        assert a["val_mean"] == b["val_mean"] and a["val_std"] == b["val_std"]
        assert a["test_mean"] < 15.0 < b["test_mean"]  # the poison reached the test set


def test_a_rerun_trains_nothing_and_other_settings_are_refused(clean, monkeypatch, capsys):
    _, md_before = tables(clean)
    monkeypatch.setattr(vmapped, "train", lambda *a, **k: pytest.fail("trained again"))
    assert run_sweep(clean) == 0
    table, md = tables(clean)
    assert md == md_before and table["runs"] == {"total": 8, "reused": 8, "trained": 0}
    assert "finished (reused), nothing to train" in capsys.readouterr().out
    assert run_sweep(clean, "--data_seed=1") == 2
    assert "data_seed: 0 there, 1 here" in capsys.readouterr().err
    other = [a if a != "--epochs=1" else "--epochs=2" for a in TRAIN_ARGS]
    assert run_sweep(clean, train_args=other) == 2
    assert "epochs: 1 there, 2 here" in capsys.readouterr().err


def test_a_stopped_training_continues_bit_for_bit():
    cfgs = [resolve([*TRAIN_ARGS, f"--seed={s}", f"--lr={lr}"]) for s, lr in ((0, 0.05), (1, 0.1))]
    data = data_mod.load(cfgs[0])
    whole = vmapped.train(cfgs, "gam", data, "cpu", data_seed=0, say=lambda s: None)
    saves, steps = [], iter(range(100))
    part = vmapped.train(
        cfgs,
        "gam",
        data,
        "cpu",
        data_seed=0,
        save=saves.append,
        stop=lambda: next(steps) >= 4,  # after the 5th step
        say=lambda s: None,
    )
    assert not part["finished"] and part["pos"]["batch"] == 5 == saves[-1]["pos"]["batch"]
    saved = torch.load(_roundtrip(part), weights_only=True)  # as a checkpoint reads it back
    done = vmapped.train(cfgs, "gam", data, "cpu", data_seed=0, saved=saved, say=lambda s: None)
    for k, v in whole["params"].items():
        assert torch.equal(done["params"][k], v)
    for a, b in zip(done["summaries"], whole["summaries"], strict=True):
        assert a["history"] == b["history"] and a["best_val"] == b["best_val"]


def _roundtrip(body):
    import io

    buf = io.BytesIO()
    torch.save(body, buf)
    buf.seek(0)
    return buf


@pytest.mark.parametrize(
    ("grid", "field"),
    [
        ("--grid=batch_size=50,100", "batch_size"),
        ("--grid=model=mlp,mlp_gelu", "model"),
        ("--grid=estimator=sam,gam", "estimator"),
        ("--grid=epochs=1,2", "epochs"),
        ("--grid=momentum=0.8,0.9", "momentum"),
    ],
)
def test_a_field_one_step_shares_is_refused_in_one_line(grid, field, tmp_path, capsys):
    rest = [a for a in TRAIN_ARGS if not a.startswith(f"--{field}=")]
    argv = ["--vmap", grid, "--", f"--logdir={tmp_path}", *rest]
    assert sweep.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --vmap cannot vary {field} per member") and "\n" not in err
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_what_vmap_does_not_implement_is_refused_in_one_line(tmp_path, capsys):
    cases = [
        (["--grid=lr=0.1,0.2"], ["--rho_schedule=proportional"], "rho_schedule=proportional"),
        (["--grid=rho=0.1,0.2"], ["--compile"], "compile"),
        (["--grid=rho=0.1,0.2", "--jobs=2"], [], "--jobs"),
        (["--seeds=0,1"], ["--preset=noise.cifar10.resnet32.p0", "--synthetic"], "BatchNorm"),
    ]
    for own, extra, word in cases:
        args = ["--vmap", *own, "--", f"--logdir={tmp_path}", *TRAIN_ARGS, *extra]
        assert sweep.main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and word in err and "\n" not in err, err


def test_weight_decay_and_accelerated_gams_alpha_beta_gamma_vary_per_member():
    """Fields whose consumer takes a schedule (gamfunc.sgd's weight decay, gam_accelerated's α, β,
    γ) differ per member: each member equals its own run of train.py's step on the same batches."""
    rest = [a for a in TRAIN_ARGS if not a.startswith("--estimator=")]
    values = [  # one member's each
        {"weight_decay": 0.0, "alpha": 0.5, "beta": 0.5, "gamma": 0.1},
        {"weight_decay": 1e-2, "alpha": 0.8, "beta": 0.3, "gamma": 0.5},
    ]
    cfgs = [
        resolve([*rest, "--estimator=gam_accelerated", *(f"--{k}={v}" for k, v in m.items())])
        for m in values
    ]
    assert vmapped.check(cfgs, "gam_accelerated") == ["alpha", "beta", "gamma", "weight_decay"]
    data = data_mod.load(cfgs[0])
    body = vmapped.train(cfgs, "gam_accelerated", data, "cpu", data_seed=0, say=lambda line: None)
    members = unstack(body["params"])
    for got, cfg in zip(members, cfgs, strict=True):
        t = setup(cfg, "gam_accelerated", data, torch.device("cpu"))
        params, state = t.params, t.state
        order = data_mod.epoch_order(len(data.train), 0, 0)
        for batch in data_mod.train_batches(data.train, order, 0, cfg.batch_size, seed=0, epoch=0):
            params, state, _ = t.step(params, state, batch)
        for k, v in params.items():
            torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6)
    assert not torch.equal(members[0]["net.0.weight"], members[1]["net.0.weight"])


@pytest.mark.parametrize("when", ["late:0.75", "adaptive", "every:2"])
def test_a_when_policy_is_refused_naming_when(when):
    """The vmapped step is built without when=: a policy would be dropped, every step flat."""
    cfgs = [resolve([f"--seed={s}", f"--when={when}"]) for s in (0, 1)]
    with pytest.raises(vmapped.VmapError, match="does not implement when"):
        vmapped.check(cfgs, "gam")


def test_check_names_the_fields_that_vary():
    cfgs = [
        resolve([f"--lr={lr}", "--rho=0.5", f"--seed={s}"]) for lr in (0.1, 0.2) for s in (0, 1)
    ]
    assert vmapped.check(cfgs, "gam") == ["lr"]
    assert vmapped.check([resolve([f"--seed={s}"]) for s in (0, 1)], "gam") == []


# A member that did not train is judged as train.py judges a run: diverged, never selected.
DIVERGE = [
    "--preset=digits",
    "--estimator=sam",
    "--epochs=1",
    "--val_fraction=0.2",
    "--progress=false",
]


def test_a_member_that_diverged_is_marked_and_never_selected(tmp_path, capsys):
    """lr=1e30 skips 10 of its 11 steps (more than --max_skipped_fraction), never 50 in a row: it
    diverged as train.py says of the same run, while lr=0.1 in the same step trained."""
    argv = ["--vmap", "--grid=lr=1e30,0.1", "--seeds=0", "--", f"--logdir={tmp_path}", *DIVERGE]
    assert sweep.main(argv) == 0
    out = capsys.readouterr().out
    assert "[sweep] lr=1e30 seed=0: diverged: 10 of its 11 steps were skipped" in out
    table = json.loads((tmp_path / "sweep.digits.vmap" / "sweep.json").read_text())
    assert [c["status"] for c in table["cells"]] == ["diverged", "complete"]
    assert table["cells"][0]["seeds"]["0"]["status"] == "diverged"
    assert table["selected"]["cell"] == "lr=0.1"
    members = json.loads((tmp_path / "sweep.digits.vmap" / "members.json").read_text())
    assert [m["status"] for m in members] == ["diverged", "finished"]
    assert "--max_skipped_fraction=0.5" in members[0]["reason"] and members[1]["reason"] is None


def test_a_sweep_whose_every_member_diverged_exits_3(tmp_path, capsys):
    argv = ["--vmap", "--grid=lr=1e30,1e31", "--seeds=0", "--", f"--logdir={tmp_path}", *DIVERGE]
    assert sweep.main(argv) == 3
    out = capsys.readouterr().out
    assert "every cell has a run that diverged: nothing selected" in out
    assert "selected lr=" not in out
    table = json.loads((tmp_path / "sweep.digits.vmap" / "sweep.json").read_text())
    assert table["selected"] is None
    assert [c["status"] for c in table["cells"]] == ["diverged", "diverged"]
    assert sweep.main(argv) == 3  # a rerun reads the same verdicts from the checkpoint


def test_members_are_judged_by_train_pys_rules():
    """Each rule of reproduce.run.summary.diverged, on one member's own parameters and loss."""
    cfgs = [resolve([*DIVERGE, f"--lr={lr}"]) for lr in (0.1, 0.2, 0.3, 0.4)]
    params = {"w": torch.zeros(4, 3)}
    params["w"][1, 0] = float("nan")  # member 1: non-finite parameters
    params["w"][2] = 1e4  # member 2: a root mean square above --max_param_rms
    zeros = torch.zeros(4, dtype=torch.int64)
    state = StepState(step=zeros, opt=(), skipped=zeros)
    pos = {"diverged": [False, False, False, True], "step": 10}
    loss = torch.tensor([0.5, 0.5, 0.5, 0.5])
    why = vmapped._judge(cfgs, params, state, pos, loss)
    assert why[0] is None
    assert "not finite" in why[1] and "root mean square" in why[2]
    assert "--max_skipped=50 steps in a row" in why[3]
    loss[0] = float("inf")
    assert "loss at the last step is inf" in vmapped._judge(cfgs, params, state, pos, loss)[0]
