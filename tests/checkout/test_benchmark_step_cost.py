"""``python -m benchmarks.step_cost``: its ``--quick`` CPU mode runs
every estimator and writes a complete table and JSON; the authors' GAM optimiser of the
``authors_gam`` row computes gamfunc's accelerated GAM in the official convention. No timing is
asserted (CPU timings on a shared machine say nothing)."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import gamfunc
from benchmarks import report
from benchmarks.step_cost import cli, facade, group, methods, models, pool, runners
from benchmarks.step_cost.authors_gam import AuthorsGAM
from benchmarks.step_cost.methods import METHODS

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path, *args):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.step_cost", "--quick", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def finite_positive(v):
    return isinstance(v, float) and math.isfinite(v) and v > 0


def test_tiny_runs_every_estimator_and_reports_every_column(tmp_path):
    result, stdout = run(tmp_path)
    rows = {r["method"]: r for r in result["rows"]}
    assert sorted(rows) == sorted(["torch_sgd", *METHODS])
    for name, r in rows.items():
        assert r["error"] is None, (name, r["error"])
        assert (r["model"], r["dtype"], r["mode"], r["batch"]) == ("tiny", "fp32", "eager", 4)
        for key in ("ms", "img_s", "x_sgd", "first_call_s"):
            assert finite_positive(r[key]), (name, key, r[key])
        assert len(r["ms_samples"]) == 2  # --quick: two interleaved rounds
        assert r["img_s"] == r["batch"] / r["ms"] * 1e3
        assert finite_positive(r["x_authors"]), name
        assert r["x_authors"] == r["ms"] / rows["authors_gam"]["ms"]
        if name != "torch_sgd":
            assert finite_positive(r["x_grad"]), name
            assert r["x_grad"] == r["ms"] / rows["gradient"]["ms"]  # the same mode: eager
    assert rows["torch_sgd"]["x_sgd"] == 1.0
    assert rows["gradient"]["x_grad"] == 1.0
    assert rows["authors_gam"]["x_authors"] == 1.0
    # × floor exists exactly for the estimators built from gradients only.
    floors = {m for m, r in rows.items() if r.get("x_floor") is not None}
    assert floors == {
        "grad_eval",
        "grad_eval_func",
        "gradient",
        "sam",
        "gnp",
        "gam_fd",
        "gam_accelerated",
        "authors_gam",
        "sam_gam",
        "gam_every10",
        "gam_every20",
        "gsam",
        "wsam",
        "looksam",
        "friendly_sam",
        "look_gam",
        "sam_2_steps",
        "msam",
        "rwp",
    }
    # GAM on one step in k: its floor is ((k − 1)·gradient step + GAM step)/k, measured here.
    for name, k in (("gam_every10", 10), ("gam_every20", 20)):
        r = rows[name]
        assert r["floor"] == [k, "gradient", "gam_fd"]
        floor = ((k - 1) * rows["gradient"]["ms"] + rows["gam_fd"]["ms"]) / k
        assert r["floor_ms"] == pytest.approx(floor)
        assert r["x_floor"] == pytest.approx(r["ms"] / floor)
    # × grad evals: the same, over one plain gradient evaluation (the grad_eval row, eager
    # torch.autograd.grad) instead of a step; grad_eval_func (torch.func.grad) is measured against it.
    assert rows["grad_eval"]["grad_impl"] == "torch.autograd.grad"
    assert rows["grad_eval_func"]["grad_impl"] == "torch.func.grad"
    evals = {m for m, r in rows.items() if r.get("x_evals") is not None}
    assert evals == floors - {"grad_eval", "look_gam"}  # LookGAM's full steps take exact H·v
    for m in evals:
        r = rows[m]
        assert r["x_evals"] == pytest.approx(r["ms"] / (r["grads"] * rows["grad_eval"]["ms"]))
    assert rows["grad_eval_func"]["x_evals"] == pytest.approx(
        rows["grad_eval_func"]["ms"] / rows["grad_eval"]["ms"]
    )
    meta = result["meta"]
    assert meta["torch"] == torch.__version__
    assert meta["device"] == "cpu"
    assert meta["no_loop_reorder"] is False
    assert meta["model_source"] == {"tiny": "benchmarks.step_cost.models.TinyNet"}
    assert meta["accelerated"]["convention"] == "official"
    assert meta["inductor_options"] == {}
    assert all("profile" not in r for r in rows.values())  # only with --profile
    assert "| model | dtype | mode | method | ms/step |" in stdout
    for name in rows:
        assert f"| {name} |" in stdout


def test_only_dtype_loop_reorder_and_every_k_flags(tmp_path):
    methods = ("sam", "authors_gam", "gam_exact", "gam_every2", "sam_gam_every3")
    result, stdout = run(
        tmp_path,
        *("--only", ",".join(methods), "--dtype", "fp32,bf16-cl", "--no-loop-reorder"),
    )
    got = sorted((r["method"], r["dtype"], r["channels_last"]) for r in result["rows"])
    want = [(m, "fp32", False) for m in (*methods, "torch_sgd")]
    want += [(m, "bf16", True) for m in (*methods, "torch_sgd")]
    assert got == sorted(want)
    for r in result["rows"]:  # exact GAM too: forward-over-reverse runs in bf16
        assert r["error"] is None, r["error"]
        assert finite_positive(r["img_s"])
        if r["dtype"] == "bf16":  # over the same row in fp32
            assert finite_positive(r["x_fp32"])
    assert "| tiny | bf16 cl | eager | authors_gam |" in stdout


def test_unknown_estimator_and_precision_are_rejected(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse(["--quick", "--only", "sam,adam"])
    assert exit_info.value.code == 2
    assert "--only: unknown ['adam']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse(["--quick", "--dtype", "fp32,fp16-cl"])
    assert "--dtype: unknown ['fp16-cl']" in capsys.readouterr().err


def test_precisions_and_channels_last_for_convolutional_models_only():
    assert models.split_precision("bf16-cl") == ("bf16", True)
    assert models.split_precision("fp32") == ("fp32", False)
    with pytest.raises(ValueError):
        models.split_precision("cl")
    assert {m for m, spec in models.MODELS.items() if spec.convolutional} == {
        "resnet18",
        "resnet50",
        "tiny",
    }


def test_every_k_methods_mix_estimators_as_stated():
    """``gam_every<k>``: GAM on one step in k, gradient steps between; ``sam_gam_every<k>``: SAM+GAM
    on one step in k, SAM steps between (the overhead table of paper Table app:tab:time)."""
    a = cli.parse(["--quick", "--only", "sam_gam_every7,gam_every2,gradient,gam_every20"])
    assert methods.method_names(a.only) == [
        "gradient",
        "gam_every20",
        "gam_every2",
        "sam_gam_every7",
    ]
    table = methods.build_methods(a, a.only)
    m = table["gam_every2"]
    assert (m.every, m.base, m.grads) == (2, None, (4 + 1) / 2)  # one 4-gradient step, one plain
    assert m.floor == (2, "gradient", "gam_fd")
    m = table["sam_gam_every7"]
    assert m.every == 7 and m.grads == (5 + 6 * 2) / 7  # one SAM+GAM step, 6 SAM steps
    assert m.floor == (7, "sam", "sam_gam")
    assert m.base is table["sam"].estimator
    assert m.estimator.name != m.base.name
    exact = methods.build_methods(cli.parse(["--quick", "--composite-hvp", "exact"]))
    assert exact["gam_every20"].floor == (20, "gradient", "gam_exact")
    assert exact["gam_every20"].grads is None


def test_the_rows_beside_gam_are_the_registry_estimators_and_cycle_by_themselves():
    """GSAM, WSAM, LookSAM, Friendly-SAM, LookGAM and two-step SAM, each built by
    ``reproduce.methods`` with ρ's cosine schedule; LookSAM and LookGAM run their own cycle of k
    steps (the step's ``every``), whose floor is ((k − 1)·gradient + full step)/k."""
    from reproduce.methods import Hyper

    a = cli.parse(["--quick"])
    table = methods.build_methods(a)
    k = Hyper().look_k
    names = {n: table[n].estimator.name for n in methods.FAMILY}
    assert names == {
        "gsam": "gsam",
        "wsam": "wsam",
        "looksam": "looksam",
        "friendly_sam": "friendly_sam",
        "look_gam": "look_gam",
        "sam_2_steps": "sam",
        "msam": "msam",
        "rwp": "rwp",
    }
    assert table["sam_2_steps"].estimator.hparams["ascent_steps"] == 2
    assert table["sam_2_steps"].grads == 3.0
    assert [table[n].grads for n in ("gsam", "wsam", "friendly_sam")] == [2.0] * 3
    for name, full in (("looksam", "sam"), ("look_gam", "gam_exact")):
        m = table[name]
        assert m.every == 1 and m.estimator.every == k  # the estimator brings its cycle
        assert m.floor == (k, "gradient", full)
    assert table["looksam"].grads == (k + 1) / k and table["look_gam"].grads is None
    rho = table["sam"].estimator.hparams["rho"]
    assert table["msam"].grads == table["rwp"].grads == 1.0
    for name in set(methods.FAMILY) - {"rwp"}:  # ρ follows the cosine of every other row
        assert table[name].estimator.hparams["rho"] is rho
    g = models.prepare("tiny", "fp32", a, torch.device("cpu"))
    runner = runners.runner_factory("looksam", "eager", g, table, a, torch.device("cpu"))()
    assert runner.every == k  # timed over whole cycles


@pytest.mark.parametrize("bad", ["gam_every1", "gam_every0", "sam_every4", "gam_everyx"])
def test_bad_every_k_names_are_rejected(capsys, bad):
    with pytest.raises(SystemExit):
        cli.parse(["--quick", "--only", bad])
    assert f"--only: unknown ['{bad}']" in capsys.readouterr().err


def tiny_model():
    torch.manual_seed(0)
    loss_fn, params, buffers = models.functional_loss(models.TinyNet(), "fp32")
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen))
    return loss_fn, params, buffers, batch


def test_grad_eval_rows_compute_the_gradient_with_the_stated_functions(monkeypatch):
    """Eager ``grad_eval`` is ``torch.autograd.grad`` (by ``gamfunc.loss.gradient_pass``) and
    ``grad_eval_func`` ``torch.func.grad``; both give the gradient (and BatchNorm buffers) of
    ``torch.func.grad``, the reference."""
    loss_fn, params, buffers, batch = tiny_model()
    want, want_buffers = torch.func.grad(loss_fn, has_aux=True)(params, batch, buffers)
    calls = []  # torch.func.grad's eager transform also ends in torch.autograd.grad: count both
    autograd_grad, func_grad = torch.autograd.grad, torch.func.grad
    monkeypatch.setattr(
        torch.autograd, "grad", lambda *a, **k: calls.append("autograd") or autograd_grad(*a, **k)
    )
    monkeypatch.setattr(
        torch.func, "grad", lambda *a, **k: calls.append("func") or func_grad(*a, **k)
    )
    for impl, want_calls in (("autograd", ["autograd"]), ("func", ["func", "autograd"])):
        calls.clear()
        runner = runners.GradEval(loss_fn, params, buffers, batch, "eager", impl)
        runner()
        assert calls == want_calls, impl
        assert runner.impl == {"autograd": "torch.autograd.grad", "func": "torch.func.grad"}[impl]
        got, got_buffers = runner.fn(runner.params, batch, runner.buffers)
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-7)
        for k in want_buffers:
            torch.testing.assert_close(got_buffers[k], want_buffers[k])
    # Compiled, both rows are torch.func.grad under torch.compile (not called: no compile here).
    for impl in ("autograd", "func"):
        runner = runners.GradEval(loss_fn, params, buffers, batch, "compile", impl)
        assert runner.impl == "torch.func.grad" and runner.compiled
    with pytest.raises(ValueError, match="impl"):
        runners.GradEval(loss_fn, params, buffers, batch, "eager", "vjp")


def test_inductor_options_are_parsed_as_literals_and_merged_over_the_mode():
    a = cli.parse(
        [
            "--quick",
            "--inductor",
            "combo_kernels=True",
            "--inductor",
            "max_autotune_gemm_backends=ATEN,TRITON",
            "--inductor",
            "cpp.simdlen=8",
            "--inductor",
            "combo_kernels=False",  # the later one wins
        ]
    )
    assert a.inductor_options == {
        "combo_kernels": False,
        "max_autotune_gemm_backends": "ATEN,TRITON",
        "cpp.simdlen": 8,
    }
    assert cli.parse(["--quick"]).inductor_options == {}
    assert runners.compile_options("compile", {"combo_kernels": True}) == {"combo_kernels": True}
    assert runners.compile_options("reduce-overhead", {"combo_kernels": True}) == {
        "triton.cudagraphs": True,
        "combo_kernels": True,
    }
    assert runners.compile_options("reduce-overhead", {"triton.cudagraphs": False}) == {
        "triton.cudagraphs": False
    }


def test_step_cost_pass_modes_compile_each_pass_with_the_named_mode():
    assert runners.split_mode("pass") == ("pass", "compile")
    assert runners.split_mode("pass-reduce-overhead") == ("pass", "reduce-overhead")
    assert runners.split_mode("reduce-overhead") == ("step", "reduce-overhead")
    assert runners.compile_options("pass-reduce-overhead") == runners.compile_options(
        "reduce-overhead"
    )
    assert runners.compile_options("pass") == {}


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("combo_kernels", "expected KEY=VALUE"),
        ("=True", "expected KEY=VALUE"),
        ("no_such_option=1", "unknown inductor option 'no_such_option'"),
        ("combo_kernels=1", "combo_kernels must be bool"),
    ],
)
def test_bad_inductor_options_are_rejected(capsys, item, message):
    with pytest.raises(SystemExit):
        cli.parse(["--quick", "--inductor", item])
    err = capsys.readouterr().err
    assert "--inductor" in err and message in err
    with pytest.raises(ValueError, match="--inductor"):
        cli.inductor_options([item])


def test_tiny_profile_writes_the_profile_fields(tmp_path):
    """``--profile 2`` on CPU: per method the profiled steps, host time and the top aten ops by self
    CPU time, per step. The tiny net has two convolutions, so one gradient evaluation calls
    ``aten::convolution_backward`` twice; ``gam_every2`` (fd) averages 4 and 1 evaluations."""
    result, stdout = run(
        tmp_path,
        "--only",
        "grad_eval,grad_eval_func,gam_every2",
        "--profile",
        "2",
        "--inductor",
        "combo_kernels=True",
    )
    meta = result["meta"]
    assert meta["inductor_options"] == {"combo_kernels": True}
    assert meta["args"]["profile"] == 2
    assert "inductor combo_kernels=True" in stdout
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {"torch_sgd", "grad_eval", "grad_eval_func", "gam_every2"}
    conv_backward = {"torch_sgd": 2.0, "grad_eval": 2.0, "grad_eval_func": 2.0, "gam_every2": 5.0}
    for name, r in rows.items():
        assert r["error"] is None, (name, r["error"])
        p = r["profile"]
        assert p["steps"] == 2, name
        for key in ("host_ms", "host_ms_unprofiled", "aten_ops"):
            assert finite_positive(float(p[key])), (name, key, p[key])
        assert "top_kernels" not in p and "device_ms" not in p  # CPU: no device
        top = p["top_ops"]
        assert 0 < len(top) <= 15
        times = [op["self_us_per_step"] for op in top]
        assert times == sorted(times, reverse=True)
        for op in top:
            assert op["name"].startswith("aten::") and len(op["name"]) <= 80
            assert op["calls_per_step"] > 0
        calls = {op["name"]: op["calls_per_step"] for op in top}
        assert calls["aten::convolution_backward"] == conv_backward[name], name


def test_authors_gam_moves_along_accelerated_gam_in_the_official_convention():
    """The ``authors_gam`` baseline computes what ``gamfunc.gam_accelerated(...,
    convention="official")`` computes: the same direction (left in ``p.grad``) from the same params
    and batch, in float64, through BatchNorm in train mode; its base SGD steps along it, and the
    running statistics come from the clean pass at θ alone."""
    torch.manual_seed(0)
    net = models.TinyNet().double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 3, 8, 8, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (6,), generator=gen)
    loss_fn, params, buffers = gamfunc.nn.functionalize(net)
    hp = {"rho": 0.2, "rho_prime": 0.05, "alpha": 0.6, "beta": 0.3, "gamma": 0.5}

    def loss(p, batch):
        return loss_fn(p, batch, buffers)

    official = gamfunc.gam_accelerated(**hp, convention="official")
    want, _ = official(params, (x, y), loss)
    paper, _ = gamfunc.gam_accelerated(**hp, convention="paper")(params, (x, y), loss)

    model = copy.deepcopy(net)
    lr = 0.1
    opt = AuthorsGAM(model, torch.optim.SGD(model.parameters(), lr=lr), **hp)

    def closure():
        opt.zero_grad()
        with torch.enable_grad():
            out = F.cross_entropy(model(x), y)
        out.backward()
        return out.detach()

    opt.step(closure)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[name], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(p.detach(), params[name] - lr * want[name])
    assert any(not torch.allclose(want[k], paper[k]) for k in want)  # the convention matters
    _, clean_buffers = loss(params, (x, y))
    for name, b in model.named_buffers():
        if name.endswith(("running_mean", "running_var")):
            torch.testing.assert_close(b, clean_buffers[name], rtol=1e-12, atol=1e-14)
    assert all(m.momentum == 0.1 for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))


def test_authors_rho_follows_the_functional_rows_schedule():
    schedule = methods.rho_schedule(0.05)
    for t in (0, 1, 1234, methods.RHO_STEPS, 2 * methods.RHO_STEPS):
        assert methods.rho_at(0.05, t) == pytest.approx(float(schedule(torch.tensor(t))), rel=1e-12)


def test_worker_caches_are_merged_without_touching_existing_files(tmp_path):
    src, dst = tmp_path / "worker", tmp_path / "main"
    (src / "ab").mkdir(parents=True)
    (src / "ab" / "kernel.so").write_text("worker")
    (src / "ab" / "new.py").write_text("new")
    (dst / "ab").mkdir(parents=True)
    (dst / "ab" / "kernel.so").write_text("loaded")
    pool.merge_cache(src, dst)
    assert (dst / "ab" / "kernel.so").read_text() == "loaded"
    assert (dst / "ab" / "new.py").read_text() == "new"
    assert sorted(p.name for p in (dst / "ab").iterdir()) == ["kernel.so", "new.py"]


def test_plan_lists_every_row_and_compile_jobs_the_compiled_ones():
    a = cli.parse(["--quick", "--modes", "eager,pass", "--only", "gradient,gam_exact,authors_gam"])
    assert group.plan(a) == [
        ("torch_sgd", "eager"),
        ("authors_gam", "eager"),
        *[(m, mode) for mode in ("eager", "pass") for m in ("gradient", "gam_exact")],
    ]
    assert group.compile_jobs("tiny", "bf16", a) == [
        ("tiny", "bf16", "pass", "gradient"),
        ("tiny", "bf16", "pass", "gam_exact"),
    ]


def test_compile_threads_and_unknown_jobs(monkeypatch):
    monkeypatch.setattr(pool.os, "cpu_count", lambda: 16)
    assert [pool.compile_threads(n) for n in (1, 7, 14, 40)] == [16, 9, 4, 2]
    a = cli.parse(["--quick", "--compile-jobs", "2"])
    with pytest.raises(ValueError, match="never submitted"):
        next(pool.Precompiler(a, []).completed([("tiny", "fp32", "pass", "gradient")]))


def test_compile_phases_rank_the_compilers_own_timings_since_a_point():
    from benchmarks.step_cost import timing

    before = {k: len(v) for k, v in timing._compile_timings().items()}
    torch.compile(lambda x: torch.sin(x) + 1, backend="aot_eager")(torch.ones(3))
    phases = timing.compile_phases(before)
    assert phases, "torch records its compile phases"
    seconds = [p["s"] for p in phases.values()]
    assert seconds == sorted(seconds, reverse=True)
    assert all(p["calls"] >= 1 for p in phases.values())
    assert timing.compile_phases({k: len(v) for k, v in timing._compile_timings().items()}) == {}


def test_facade_rows_time_the_facade_make_step_and_davda54_sam(tmp_path):
    result, stdout = run(tmp_path, "--facade=only", "--batch-size", "2")
    assert result["benchmark"] == result["meta"]["benchmark"] == "step_cost_facade"
    assert result["meta"]["part"] == "tiny_b2"  # one model: step_cost_facade_tiny_b2_<device>.json
    rows = {(r["method"], r["estimator"], r["mode"]): r for r in result["rows"]}
    want = {
        (m, e, "eager") for e in ("gam_fd", "gam_exact", "sam") for m in ("facade", "make_step")
    }
    assert set(rows) == want | {("davda54", "sam", "eager"), ("facade_unguarded", "sam", "eager")}
    for key, r in rows.items():
        assert r["error"] is None, (key, r["error"])
        assert (r["model"], r["dtype"], r["batch"]) == ("tiny", "fp32", 2)
        assert finite_positive(r["img_s"]) and r["img_s"] == r["batch"] / r["ms"] * 1e3
        assert r["base"] == ("gamfunc.sgd" if key[0] == "make_step" else "torch.optim.SGD")
    for est in ("gam_fd", "gam_exact", "sam"):
        r = rows[("facade", est, "eager")]
        assert r["x_make_step"] == r["img_s"] / rows[("make_step", est, "eager")]["img_s"]
    sam = rows[("facade", "sam", "eager")]
    # on_nonfinite="ignore", as davda54 has no guard
    bare = rows[("facade_unguarded", "sam", "eager")]
    davda54 = rows[("davda54", "sam", "eager")]
    assert sam["x_davda54"] == sam["img_s"] / davda54["img_s"]
    assert bare["x_davda54"] == bare["img_s"] / davda54["img_s"]
    assert [r for r in result["rows"] if r.get("x_davda54") is not None] == [sam, bare]
    assert bare.get("x_make_step") is None and bare["base"] == "torch.optim.SGD"
    assert "github.com/davda54/sam" in result["meta"]["davda54"]
    assert "| facade ÷ make_step | per round | facade ÷ davda54 | per round |" in stdout
    median, quartiles = sam["x_davda54_rounds"].split(" ")
    q1, q3 = (float(v) for v in quartiles.strip("()").split("–"))
    assert q1 <= float(median) <= q3
    # benchmarks.report renders it as a table of its own
    (tmp_path / "result.json").rename(tmp_path / "step_cost_facade_tiny_cpu.json")
    text = report.render(tmp_path)
    assert "## The torch.optim facade's speed" in text
    assert "| tiny | fp32 | False | sam | — | eager | facade | torch.optim.SGD | 2 |" in text


def test_a_facade_run_names_its_batch_and_a_subset_of_estimators_in_its_file():
    def part(*args):
        return cli.facade_part(cli.parse(["--quick", "--facade=only", *args]))

    assert part() == "tiny"  # step_cost_facade_tiny_<device>.json
    assert part("--facade-estimators", "sam", "--batch-size", "2") == "tiny_b2_sam"
    every = ",".join(reversed(facade.ESTIMATORS))  # all of them, in any order: no suffix
    assert part("--facade-estimators", every, "--batch-size", "2") == "tiny_b2"
    both = ("--model", "resnet50,vit_s32")  # several models: no model in the name
    assert part(*both, "--facade-estimators", "sam") == "sam"
    assert part(*both) == ""


def test_facade_beside_the_step_cost_rows_in_one_json(tmp_path):
    result, stdout = run(tmp_path, "--facade", "--only", "gradient")
    assert result["benchmark"] == "step_cost"
    assert sorted(r["method"] for r in result["rows"]) == ["gradient", "torch_sgd"]
    assert {r["method"] for r in result["facade"]} == {
        "facade",
        "make_step",
        "davda54",
        facade.UNGUARDED,
    }
    assert "| model | dtype | mode | method | ms/step |" in stdout
    assert "| facade ÷ make_step |" in stdout
    (tmp_path / "result.json").rename(tmp_path / "step_cost_cpu.json")
    text = report.render(tmp_path)
    assert "The `torch.optim` facade (`--facade`):" in text


def test_davda54_sam_takes_the_step_of_the_facade_sam():
    torch.manual_seed(0)
    model = models.TinyNet().double().train()
    x, y = torch.randn(6, 3, 8, 8, dtype=torch.float64), torch.randint(0, 10, (6,))
    a = cli.parse(["--quick", "--rho", "0.3", "--lr", "0.2"])
    cpu = torch.device("cpu")
    ours = facade.Davda54SAM(model, (x, y), "SGD", a, cpu, "fp32")
    theirs = facade.FacadeStep(model, (x, y), "sam", None, "SGD", a, cpu, "fp32", "eager")
    for _ in range(3):
        ours()
        theirs()
    ours_state, theirs_state = ours.model.state_dict(), theirs.model.state_dict()
    assert list(ours_state) == list(theirs_state)
    for name, p in ours_state.items():
        if name.endswith("num_batches_tracked"):  # davda54's second pass counts a batch too
            continue
        torch.testing.assert_close(p, theirs_state[name], rtol=1e-10, atol=1e-12, msg=name)
        if name.endswith("weight") and "features.0" in name:  # the step moved the weights
            assert not torch.equal(p, model.state_dict()[name])


def test_facade_bases_are_the_torch_and_gamfunc_twins():
    params = [torch.nn.Parameter(torch.randn(3))]
    cpu = torch.device("cpu")
    sgd = facade.torch_base(facade.base_kind("resnet50"), params, 0.1, cpu)
    adamw = facade.torch_base(facade.base_kind("vit_s32"), params, 0.1, cpu)
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == 0.9
    assert isinstance(adamw, torch.optim.AdamW) and adamw.defaults["lr"] == facade.ADAMW_LR
    assert sgd.defaults["fused"] == adamw.defaults["fused"] == facade.fused_ok(cpu)
    assert facade.plan("compile")[-3:] == [
        ("davda54", "sam", "eager"),
        ("facade", "sam", "eager"),
        (facade.UNGUARDED, "sam", "eager"),
    ]
    assert len(facade.plan("eager")) == 8  # the eager facade SAM is listed once


def test_facade_estimators_choose_the_rows_and_davda54_comes_with_sam():
    a = cli.parse(["--quick", "--facade=only", "--facade-estimators", "gam_exact"])
    assert facade.plan("pass", a.facade_estimators) == [
        ("facade", "gam_exact", "pass"),
        ("make_step", "gam_exact", "pass"),
    ]
    assert facade.plan("pass-graph", ["sam"])[-3:] == [
        ("davda54", "sam", "eager"),
        ("facade", "sam", "eager"),
        (facade.UNGUARDED, "sam", "eager"),
    ]
    with pytest.raises(SystemExit):
        cli.parse(["--quick", "--facade=only", "--facade-estimators", "gnp"])


def test_a_ratio_per_round_pairs_the_samples_of_each_round():
    """images/s ratio of round i = reference ms ÷ row ms of round i (here 1, 0.5, 2, 0.8, 1.25):
    their median, first and third quartiles."""
    from benchmarks.step_cost.facade import per_round, ratios

    assert (
        per_round([10.0, 10.0, 20.0, 10.0, 10.0], [10.0, 20.0, 10.0, 12.5, 8.0])
        == "1.000 (0.800–1.250)"
    )
    assert per_round([10.0], [10.0]) is None and per_round(None, [1.0]) is None
    rows = [
        {
            "method": "make_step",
            "estimator": "sam",
            "mode": "pass",
            "img_s": 2.0,
            "ms_samples": [1.0, 2.0, 1.0],
        },
        {
            "method": "facade",
            "estimator": "sam",
            "mode": "pass",
            "img_s": 1.0,
            "ms_samples": [2.0, 2.0, 4.0],
        },
    ]
    ratios(rows)
    assert rows[1]["x_make_step"] == 0.5 and rows[1]["x_make_step_rounds"] == "0.500 (0.375–0.750)"


def test_the_unguarded_facade_row_is_the_facade_without_its_guard():
    a = cli.parse(["--quick", "--facade=only"])
    cpu = torch.device("cpu")
    g = models.prepare("tiny", "fp32", a, cpu)
    guarded = facade.factory("facade", "sam", "eager", g, "tiny", a, cpu)()
    bare = facade.factory(facade.UNGUARDED, "sam", "eager", g, "tiny", a, cpu)()
    assert guarded.opt._batch_step.on_nonfinite == a.on_nonfinite == "skip"
    assert bare.opt._batch_step.on_nonfinite == "ignore"


def test_every_method_of_reproduce_is_timed_by_one_row_or_named_untimed():
    """The rows take their estimator names from reproduce.methods.METHODS: each row of one method
    maps to it (by its own name or RENAMED), and a method without a row is named in UNTIMED."""
    from reproduce.methods import METHODS as NAMES

    timed = [methods.method_of(r) for r in methods.METHODS if methods.method_of(r) in NAMES]
    assert len(timed) == len(set(timed))
    assert sorted({*timed, *methods.UNTIMED}) == sorted(NAMES)
    assert set(methods.UNTIMED).isdisjoint(timed)
    table = methods.build_methods(cli.parse(["--quick"]))
    for row in methods.RENAMED:
        assert table[row].estimator.name == methods.estimator(methods.method_of(row)).name
