"""The documents say what the registry and the committed result files say.

docs/guides/reproduce.md's preset table is regenerated from ``reproduce.config.PRESETS``;
reproduce/README.md names the source of every preset family; the evidence tables of reproduce/RESULTS.md are recomputed from their JSON under
``reproduce/results/``; numbers in prose are checked against the JSON they come from.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
from pathlib import Path

import pytest

from reproduce.config import PRESETS
from reproduce.preset_table import SOURCES, families, markdown

ROOT = Path(__file__).resolve().parents[2]
REPRODUCE_GUIDE = (ROOT / "docs" / "guides" / "reproduce.md").read_text()
GUIDES = "".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")))
README = (ROOT / "README.md").read_text()
REPRODUCE_README = (ROOT / "reproduce" / "README.md").read_text()
RESULTS = (ROOT / "reproduce" / "RESULTS.md").read_text()
EVIDENCE = ROOT / "reproduce" / "results"


def between(text: str, start: str, end: str) -> str:
    """The text after the line holding ``start`` and before the line holding ``end``."""
    head = text.index(start)
    body = text.index("\n", head) + 1
    return text[body : text.index(end, body)]


def expand(pattern: str) -> list[str]:
    """``a.{b,c}.d`` -> ``["a.b.d", "a.c.d"]``."""
    parts = [p.split(",") for p in re.split(r"[{}]", pattern)]
    # split on braces alternates literal text and alternatives: literals are one-element lists
    return ["".join(t) for t in itertools.product(*parts)]


def test_preset_table_is_generated_from_the_registry():
    table = between(REPRODUCE_GUIDE, "<!-- preset table:", "<!-- end of preset table -->")
    assert table == markdown(), (
        "run: python -m reproduce.preset_table, paste into docs/guides/reproduce.md"
    )


def test_every_preset_family_names_its_source():
    assert set(families()) <= set(SOURCES)
    names = [n for group in families().values() for n in group]
    assert sorted(names) == sorted(PRESETS)


def test_reproduce_readme_gives_the_provenance_of_every_preset():
    section = REPRODUCE_README.split("## Where each preset's values come from", 1)[1]
    rows = [r for r in section.splitlines() if r.startswith("| `")]
    named = [n for r in rows for n in expand(r.split("`")[1])]
    assert sorted(named) == sorted(PRESETS), "one row per family, every preset once"
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 4 and any(c != "–" for c in cells[1:]), row


# ---------------------------------------------------------------- results from committed JSON


def tables(md: str) -> list[str]:
    """Every markdown table of ``md``, as text."""
    return [
        "\n".join(r for r in block.splitlines() if r.startswith("|")) + "\n"
        for block in re.split(r"\n\s*\n", md)
        if block.lstrip().startswith("| ")
    ]


def data_of_tables(md: str) -> list[tuple[str | None, str]]:
    """``(the "Data:" statement before it, the table)`` for every table after the first heading;
    the statement is the last one since the previous table or heading (None if there is none)."""
    body = md[md.index("\n## ") :]
    out, data = [], None
    for block in re.split(r"\n\s*\n", body):
        if block.lstrip().startswith("#"):
            data = None
        found = re.findall(r"Data:\s+(not kept|\[[^\]]+\])", block)
        if found and not block.lstrip().startswith("| "):
            data = found[-1]
        if block.lstrip().startswith("| "):
            out.append((data, tables(block)[0]))
            data = None
    return out


def test_every_results_table_says_where_its_data_are():
    rows = data_of_tables(RESULTS)
    assert len(rows) >= 15
    for data, table in rows:
        assert data is not None, f"no 'Data:' line before this table of RESULTS.md:\n{table}"
        if data != "not kept":
            assert (ROOT / data.strip("[]")).is_file(), data


def test_results_tables_equal_their_committed_json():
    evidence = pytest.importorskip("reproduce.evidence")
    checked = 0
    for data, table in data_of_tables(RESULTS):
        if data is None or not data.startswith("[reproduce/results/"):
            continue
        record = json.loads((ROOT / data.strip("[]")).read_text())
        render = evidence.TABLES[record["settings"]["command"]]
        # a renderer may give several tables (fd: training, then H·v error per model)
        assert table in tables(render(record)), data
        checked += 1
    assert checked >= 6  # minima, landscape, the GNP and SAM+GAM sweeps, the ablation, GAM variants


def _json_links(text: str, folder: Path) -> set[str]:
    """The JSON files that the Markdown links of ``text`` (a file in ``folder``) point to, as paths
    relative to the checkout."""
    found = re.findall(r"\]\(([^)#\s]+\.json)\)", text)
    return {os.path.relpath((folder / t).resolve(), ROOT) for t in found}


def test_every_committed_evidence_json_has_its_table():
    cited = {d.strip("[]") for d, _ in data_of_tables(RESULTS) if d and d != "not kept"}
    cited |= _json_links(RESULTS, ROOT / "reproduce") | _json_links(README, ROOT)
    for page in (ROOT / "docs").rglob("*.md"):
        cited |= _json_links(page.read_text(), page.parent)
    committed = {str(p.relative_to(ROOT)) for p in EVIDENCE.rglob("*.json")}
    assert committed <= cited, (
        f"JSON under reproduce/results/ that no document cites: {committed - cited}"
    )


def test_seed_accuracies_are_the_minima_runs():
    """The seed 0-2 test accuracies in docs/guides/reproduce.md are those of reproduce.evidence minima."""
    runs = json.loads((EVIDENCE / "minima.json").read_text())["runs"]
    accs = {m: " / ".join(f"{r['test_acc']:.1f}" for r in runs[m]) for m in ("SGD", "SGD+GAM")}
    assert f"SGD {accs['SGD']} and GAM {accs['SGD+GAM']}" in REPRODUCE_GUIDE.replace("\n", " ")


def test_results_prose_numbers_equal_their_json():
    sam = json.loads((EVIDENCE / "sam_val" / "ablation.json").read_text())["grid"]["0.2,0.0"]
    text = RESULTS.replace("\n", " ")
    val = sam["val"]
    mean, std = statistics.mean(val), statistics.stdev(val)
    assert f"ablation.json)): {mean:.1f} ± {std:.1f}" in text
    assert f"above SAM ({val[0]:.2f} and {val[1]:.2f}%)" in text
    grid = json.loads((EVIDENCE / "sam_gam_sweep" / "ablation.json").read_text())["grid"]
    best = max(grid.values(), key=lambda c: statistics.mean(c["val"]))
    b = best["val"]
    assert (
        f"the best cell, ρ = {best['rho']:g}, α = {best['alpha']:g} ({b[0]:.2f} and {b[1]:.2f}%), "
        f"is {b[0] - val[0]:.1f} and {b[1] - val[1]:.1f} points above SAM"
    ) in text
    full = json.loads((EVIDENCE / "ablation_full" / "ablation.json").read_text())["grid"]
    first, second = sorted(full.values(), key=lambda c: -statistics.mean(c["val"]))[:2]

    def pm(v):
        return f"{statistics.mean(v):.1f} ± {statistics.stdev(v):.1f}"

    assert (
        f"Best on validation: ρ = {first['rho']:g}, α = {first['alpha']:g} "
        f"(test {pm(first['test'])}%); the preset's ρ = {second['rho']:g}, α = {second['alpha']:g} "
        f"is second ({pm(second['val'])}%, test {pm(second['test'])}%)"
    ) in text
    variants = json.loads((EVIDENCE / "variants" / "variants.json").read_text())["runs"]
    fast = [statistics.mean(r[k] for r in variants[f"accelerated, {c}"]) for c in ("paper", "official")
            for k in ("test_acc", "lambda_max")]  # fmt: skip
    test, lam = sorted(fast[0::2]), sorted(fast[1::2])
    assert f"(test {int(test[0])}–{int(test[1])}%, λ_max {lam[0]:.1f}–{lam[1]:.1f})" in text
    assert max(r["train_acc"] for r in variants["finite difference"]) < 11  # "collapsed to chance"
    minima = json.loads((EVIDENCE / "minima.json").read_text())["runs"]
    for method, name in (("SGD", "SGD"), ("SAM", "SAM"), ("SGD+GAM", "SGD+GAM")):
        shares = [sum(x > 0 for x in r["minima"]) for r in minima[method]]
        assert f"{name} {min(shares)}–{max(shares)}%" in text
    assert all(max(r["minima"]) <= 1 for rs in minima.values() for r in rs)  # "more than one": none


def signed(x: float, digits: int = 1) -> str:
    """``x`` with its sign, a minus sign (U+2212) for negatives, as the prose writes it."""
    return f"{x:+.{digits}f}".replace("-", "\u2212")


def test_results_spectra_prose_equals_its_json():
    text = RESULTS.replace("\n", " ")
    runs = json.loads((EVIDENCE / "spectra5" / "spectra.json").read_text())["runs"]
    tuned = json.loads((EVIDENCE / "sam_gam_tuned" / "spectra.json").read_text())["runs"]["SAM+GAM"]

    def mean(rs, key, phase=None):
        return statistics.mean(r[phase][key] if phase else r[key] for r in rs)

    def lam(rs):
        return statistics.mean(r["end"]["eigenvalues"][0] for r in rs)

    gam, sgd, sam = runs["SGD+GAM"], runs["SGD"], runs["SAM"]
    assert (
        f"(λ_max {lam(gam):.2f} vs {lam(sgd):.2f} for SGD, {lam(sam):.2f} for SAM at the end; "
        f"trace {mean(gam, 'trace', 'end'):.1f} vs {mean(sgd, 'trace', 'end'):.1f} and "
        f"{mean(sam, 'trace', 'end'):.1f})"
    ) in text
    assert (
        f"ends exactly where SAM does (λ_max {lam(tuned):.2f} vs {lam(sam):.2f}, "
        f"trace {mean(tuned, 'trace', 'end'):.1f} vs {mean(sam, 'trace', 'end'):.1f})"
    ) in text
    test = {m: mean(rs, "test_acc") for m, rs in runs.items()}
    assert (
        f"SGD+GAM improves test accuracy by {test['SGD+GAM'] - test['SGD']:.0f} points over SGD "
        f"and {test['SGD+GAM'] - test['SAM']:.0f} over SAM"
    ) in text
    assert f"underfits ({mean(runs['SAM+GAM'], 'train_acc'):.0f}% train)" in text
    acc = [r["test_acc"] for r in tuned]
    paired = ", ".join(
        signed(t["test_acc"] - s["test_acc"]) for t, s in zip(tuned, sam, strict=True)
    )
    assert (
        f"it reaches {statistics.mean(acc):.2f} ± {statistics.stdev(acc):.2f}%, "
        f"{statistics.mean(acc) - test['SAM']:.2f} points above SAM; paired by seed the differences "
        f"are {paired} points"
    ) in text
    assert f"SGD+GAM alone ({test['SGD+GAM']:.2f}%)" in text


def test_vmap_sweep_example_is_that_of_results():
    """docs/guides/reproduce.md's looped-against-vmapped example and RESULTS.md's prose under the
    vmapped table are the full ablation both ways (reproduce/results/ablation_full, ablation_vmap)."""

    def ranked(name: str) -> list[dict]:
        grid = json.loads((EVIDENCE / name / "ablation.json").read_text())["grid"]
        return sorted(grid.values(), key=lambda c: -statistics.mean(c["val"]))

    def pm(v) -> str:
        return f"{statistics.mean(v):.1f} ± {statistics.stdev(v):.1f}"

    def cell(c) -> str:
        return f"ρ = {c['rho']:g}, α = {c['alpha']:g}"

    vmapped, looped = ranked("ablation_vmap"), ranked("ablation_full")
    guide = REPRODUCE_GUIDE.replace("\n", " ")
    assert (
        f"chose {cell(vmapped[0])} vmapped, at {pm(vmapped[0]['val'])}% validation accuracy, and "
        f"{cell(looped[0])} looped, at {pm(looped[0]['val'])}%, with {cell(looped[1])} second at "
        f"{pm(looped[1]['val'])}%"
    ) in guide
    ablation = RESULTS.split("## Ablation over ρ and α", 1)[1].split("\n## ", 1)[0]
    text = ablation.split("--vmap", 1)[1].replace("\n", " ")
    assert (
        f"Best on validation: {cell(vmapped[0])} (test {pm(vmapped[0]['test'])}%). The looped run "
        f"above, of the same day, chose {cell(looped[0])} and had {cell(looped[1])} second "
        f"({pm(looped[1]['val'])}%)"
    ) in text


def test_results_fd_prose_equals_its_json():
    text = " ".join(RESULTS.split())  # the list items are indented
    record = json.loads((EVIDENCE / "fd" / "fd.json").read_text())
    runs = record["runs"]

    def mean(label, key):
        return statistics.mean(r[key] for r in runs[label])

    exact, fd = "mlp_gelu, exact", "mlp_gelu, fd r = 0.001"
    assert f"({mean(exact, 'test_acc'):.1f} vs {mean(fd, 'test_acc'):.1f}%)" in text
    assert f"({mean(fd, 'step_ms'):.1f} vs {mean(exact, 'step_ms'):.1f} ms in this run" in text
    dead = runs["mlp, fd r = 0.001"][0]["dead"]
    epochs = (1, 3, 5, 7, 9, 11)
    assert (
        f"(r = 1e-3, seed 0: {', '.join(f'{dead[e - 1][1]:.0f}' for e in epochs)}% dead after "
        f"epochs {', '.join(map(str, epochs))};"
    ) in text
    small = [r for label in ("mlp, fd r = 0.001", "mlp, fd r = 0.0001") for r in runs[label]]
    large = [r for label in ("mlp, fd r = 0.1", "mlp, fd r = 0.01") for r in runs[label]]
    end = [r["dead"][-1][1] for r in small]
    assert f"{min(end):.0f}–{max(end):.0f}% at the end, {len(small)} runs)" in text
    assert all(r["dead"][-1][0] == 0 for rs in runs.values() for r in rs)  # "the first layer never"
    worst = max(d[1] for r in large for d in r["dead"])
    end = [r["dead"][-1][1] for r in large]
    assert (
        f"with r ≥ 1e-2 at most {worst:.0f}% die at any epoch and {min(end):.0f}–{max(end):.0f}% "
        "at the end"
    ) in text
    train = [r["train_acc"] for r in small]
    assert f"(train accuracy {min(train):.0f}–{max(train):.0f}%;" in text
    lam = sorted(r["lambda_max"] for r in small)
    assert f"in 4 of the 6 runs its λ_max is {statistics.mean(lam[:4]):.2f}" in text
    assert max(lam[:4]) - min(lam[:4]) < 0.005
    assert f"(the other two end at {lam[4]:.2f} and {lam[5]:.2f})" in text
    radii = [float(x) for x in record["settings"]["radii"].split(",")]
    points = [b for bs in record["hvp_error"]["mlp"].values() for b in bs]
    push = {r: statistics.mean(b[str(r)]["push"] for b in points) for r in radii}
    assert f"(push {push[1e-3]:+.2f} to {push[0.1]:+.2f} for r ≥ 1e-3)" in text
    assert push[1e-3] <= push[1e-2] <= push[0.1]


def test_results_noise_prose_equals_its_json():
    text = " ".join(RESULTS.split())
    runs = json.loads((EVIDENCE / "noise_full" / "noise.json").read_text())["runs"]
    clean = json.loads((EVIDENCE / "spectra5" / "spectra.json").read_text())["runs"]
    levels = list(runs)

    def spread(method, level, digits=0):
        train = [r["train_acc"] for r in runs[level][method]]
        return f"{min(train):.{digits}f}–{max(train):.{digits}f}%"

    def test(method, level):
        return statistics.mean(r["test_acc"] for r in runs[level][method])

    sgd = [r["train_acc"] for level in levels for r in runs[level]["SGD"]]
    assert f"SGD {min(sgd):.1f}–{max(sgd):.0f}% at every level" in text
    gam = ", ".join(f"{spread('SGD+GAM', lvl)} at {lvl}" for lvl in levels)
    assert f"SGD+GAM {gam}; SAM {spread('SAM', levels[0], 1)}, " in text
    assert ", ".join(spread("SAM", lvl) for lvl in levels[1:]) + "." in text
    loss = [
        statistics.mean(r["test_acc"] for r in clean["SGD"]) - test("SGD", lvl) for lvl in levels
    ]
    assert f"loses {min(loss):.0f}–{max(loss):.0f} points of test accuracy" in text
    assert f"(it fits {spread('SGD+GAM', '20%')} of the 20%-noise training labels" in text
    over = [test("SGD+GAM", lvl) - test(m, lvl) for m in ("SGD", "SAM") for lvl in levels[:2]]
    assert (
        f"(+{over[0]:.0f} and +{over[1]:.0f} points over SGD, +{over[2]:.0f} and +{over[3]:.0f} "
        "over SAM)"
    ) in text
    late = [r["train_acc"] for lvl in levels[2:] for r in runs[lvl]["SGD+GAM"]]
    assert f"(train accuracy {min(late):.0f}–{max(late):.0f}%, test at or below SGD)" in text
    assert all(test("SGD+GAM", lvl) <= test("SGD", lvl) for lvl in levels[2:])
    margin = [test("SAM+GAM", lvl) - test("SAM", lvl) for lvl in levels]
    assert f"SAM+GAM, tuned, is {min(margin):.1f}–{max(margin):.1f} points above SAM" in text


def test_results_cnn_validation_prose_equals_its_json():
    text = " ".join(RESULTS.split())

    def grid(name: str) -> dict:
        return json.loads((EVIDENCE / name / "ablation.json").read_text())["grid"]

    def pm(v) -> str:
        return f"{statistics.mean(v):.1f} ± {statistics.stdev(v):.1f}"

    (sgd,), (sam,) = grid("cnn1d_sgd").values(), grid("cnn1d_sam").values()
    assert f"SGD: {pm(sgd['val'])}; SAM ρ = 0.2: {pm(sam['val'])}." in text
    cells = [*grid("cnn1d_gam_small").values(), *grid("cnn1d_gam_large").values()]
    best = max(cells, key=lambda c: statistics.mean(c["val"]))
    weakest = min(cells, key=lambda c: c["rho"] * c["alpha"])
    assert best is weakest
    assert f"the best cell, ρ = {best['rho']:g}, α = {best['alpha']:g}, is the weakest term" in text
    # "every GAM term costs validation accuracy": every cell is below SGD
    assert all(statistics.mean(c["val"]) < statistics.mean(sgd["val"]) for c in cells)


def test_results_cnn_spectra_prose_equals_its_json():
    text = " ".join(RESULTS.split())
    runs = json.loads((EVIDENCE / "spectra_cnn1d" / "spectra.json").read_text())["runs"]
    tuned = json.loads((EVIDENCE / "spectra_cnn1d_gam_tuned" / "spectra.json").read_text())
    tuned = tuned["runs"]["SGD+GAM"]
    mlp = json.loads((EVIDENCE / "spectra5" / "spectra.json").read_text())["runs"]

    def mean(rs, key):
        return statistics.mean(r[key] for r in rs)

    def lam(rs):
        return statistics.mean(r["end"]["eigenvalues"][0] for r in rs)

    def trace(rs):
        return statistics.mean(r["end"]["trace"] for r in rs)

    def pm(rs, key):
        v = [r[key] for r in rs]
        return f"{statistics.mean(v):.2f} ± {statistics.stdev(v):.2f}"

    sgd, sam, gnp = runs["SGD"], runs["SAM"], runs["GNP"]
    assert (
        f"(SGD {mean(sgd, 'test_acc'):.0f}% vs the MLP's {mean(mlp['SGD'], 'test_acc'):.0f}%)"
    ) in text
    low, high = sorted((trace(sam), trace(gnp)))
    gain = sorted(mean(rs, "test_acc") - mean(sgd, "test_acc") for rs in (sam, gnp))
    assert (
        f"lower λ_max from {lam(sgd):.2f} to {lam(sam):.2f} and {lam(gnp):.2f} and the trace from "
        f"{trace(sgd):.0f} to {low:.0f}–{high:.0f} and add {gain[0]:.1f}–{gain[1]:.1f} points"
    ) in text
    gam = [runs[m] for m in ("SGD+GAM", "SAM+GAM")]
    means = [mean(rs, k) for rs in gam for k in ("train_acc", "test_acc")]
    each = [r[k] for rs in gam for r in rs for k in ("train_acc", "test_acc")]
    assert (
        f"does not train: {min(means):.0f}–{max(means):.0f}% accuracy (the rows' means; "
        f"{min(each):.0f}–{max(each):.0f}% per run)"
    ) in text
    tops = sorted(
        r[p]["eigenvalues"][0]
        for m in ("SGD+GAM", "SAM+GAM")
        for r in runs[m]
        for p in ("mid", "end")
    )
    assert f"λ_max {tops[0]:.2f}–{tops[-2]:.2f} ({tops[-1]:.2f} for one" in text
    near = [  # eigenvalues within 0.01 of 1/10, per spectrum whose top is near 1/10 too
        sum(abs(v - 0.1) <= 0.01 for v in r[p]["eigenvalues"])
        for rs in gam
        for r in rs
        for p in ("mid", "end")
        if r[p]["eigenvalues"][0] < 0.2
    ]
    assert set(near) == {9} and f"(9 per seed in the other {len(near)} spectra:" in text
    paired = [t["test_acc"] - s["test_acc"] for t, s in zip(tuned, sgd, strict=True)]
    assert (
        f"(test {pm(tuned, 'test_acc')} vs {pm(sgd, 'test_acc')}%; paired by seed "
        f"{signed(min(paired))} to {signed(max(paired))} points)"
    ) in text
    assert all(
        t["end"]["eigenvalues"][0] < s["end"]["eigenvalues"][0]
        for t, s in zip(tuned, sgd, strict=True)
    )  # "lower on every seed"
    assert (
        f"(λ_max {lam(tuned):.2f} vs {lam(sgd):.2f} at the end, lower on every seed; "
        f"trace {trace(tuned):.0f} vs {trace(sgd):.0f})"
    ) in text
    assert (
        f"(λ_max {lam(sam):.2f} and {lam(gnp):.2f}, trace {trace(sam):.0f} and {trace(gnp):.0f})"
    ) in text
    ahead = sorted(mean(rs, "test_acc") - mean(tuned, "test_acc") for rs in (sam, gnp))
    assert f"which are also {ahead[0]:.1f}–{ahead[1]:.1f} points more accurate" in text


def test_results_lookgam_prose_equals_its_json():
    """The LookGAM paragraph's numbers are those of reproduce/results/reuse/reuse.json."""
    text = " ".join(RESULTS.split())
    record = json.loads((EVIDENCE / "reuse" / "reuse.json").read_text())
    runs = dict(zip(("look", "every", "equal", "gam", "sgd"), record["runs"].values(), strict=True))

    def pm(rs, key):
        values = [r[key] for r in rs]
        return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"

    assert f"λ_max {pm(runs['look'], 'lambda_max')} against {pm(runs['gam'], 'lambda_max')}" in text
    train = ", ".join(f"{r['train_acc']:.1f}%" for r in runs["look"][:-1])
    assert f"train accuracy {train} and {runs['look'][-1]['train_acc']:.1f}%" in text
    gam_train = sorted(r["train_acc"] for r in runs["gam"])
    assert f"(GAM over 100 epochs: {gam_train[0]:.1f}–{gam_train[-1]:.1f}%)" in text
    assert f"test accuracy {pm(runs['look'], 'test_acc')}, below GAM over 40 epochs" in text
    assert f"at the same passes ({pm(runs['equal'], 'test_acc')})" in text
    assert f"every 5th step ({pm(runs['every'], 'test_acc')})" in text
    assert f"Seed 0 stayed at {runs['look'][0]['test_acc']:.1f}% test" in text
    assert f"(gap {pm(runs['every'], 'gap')}, λ_max {pm(runs['every'], 'lambda_max')}" in text
    sgd_lam = statistics.mean(r["lambda_max"] for r in runs["sgd"])
    assert f"against SGD's {sgd_lam:.2f}" in text
    best = max(
        ("look", "every", "equal"), key=lambda k: statistics.mean(r["test_acc"] for r in runs[k])
    )
    assert best == "every"  # "the best test accuracy of the three equal-cost runs"


def test_results_family_prose_equals_its_json():
    """The all-estimators paragraph's numbers are those of reproduce/results/family/family.json."""
    text = " ".join(RESULTS.split())
    record = json.loads((EVIDENCE / "family" / "family.json").read_text())
    runs, cost = record["runs"], record["cost"]

    def mean(label, key):
        return statistics.mean(r[key] for r in runs[label])

    gam = runs["GAM"]
    acc = f"{mean('GAM', 'test_acc'):.2f} ± {statistics.stdev(r['test_acc'] for r in gam):.2f}"
    assert f"({acc}, λ_max {mean('GAM', 'lambda_max'):.2f}) at the highest cost" in text
    assert max(runs, key=lambda m: mean(m, "test_acc")) == "GAM"
    singles = [m for m in cost if m not in ("SAM+GAM", "GSAM+GAM")]
    assert max(singles, key=lambda m: cost[m]["x_gradient"]) == "GAM"
    assert f"({cost['GAM']['x_gradient']:.1f} SGD steps:" in text
    fd = "GAM, finite difference"
    drop = mean("GAM", "test_acc") - mean(fd, "test_acc")
    assert f"is {drop:.0f} points below with a lower λ_max ({mean(fd, 'lambda_max'):.2f})" in text
    assert f"at {cost[fd]['x_gradient']:.1f} SGD steps" in text
    sam_like = (
        "SAM",
        "GSAM",
        "GSAM, adaptive",
        "WSAM, decoupled",
        "LookSAM",
        "Friendly-SAM",
        "ASAM",
    )
    accs = sorted(mean(m, "test_acc") for m in sam_like)
    lams = sorted(mean(m, "lambda_max") for m in sam_like)
    assert (
        f"between {accs[0]:.2f} and {accs[-1]:.2f}% test, SGD at {mean('SGD', 'test_acc'):.2f}"
        in text
    )
    assert (
        f"λ_max {lams[0]:.2f}–{lams[-1]:.2f} against SGD's {mean('SGD', 'lambda_max'):.2f}" in text
    )
    assert f"at {cost['LookSAM']['x_gradient']:.1f} SGD steps" in text
    assert f"like SGD here (λ_max {mean('GAM, accelerated', 'lambda_max'):.2f})" in text
    assert all(r["test_acc"] < 11 for r in runs["WSAM"])  # "at chance on both seeds"
    dec = runs["WSAM, decoupled"]
    acc = f"{mean('WSAM, decoupled', 'test_acc'):.2f} ± {statistics.stdev(r['test_acc'] for r in dec):.2f}"
    assert f"trains ({acc}, λ_max {mean('WSAM, decoupled', 'lambda_max'):.2f})" in text
    under = ("LookGAM", "SAM+GAM", "GSAM+GAM")
    gaps = sorted(mean(m, "gap") for m in under)
    tests = sorted(mean(m, "test_acc") for m in under)
    assert (
        f"(gap {gaps[0]:.2f}–{gaps[-1]:.2f} points, test {tests[0]:.2f}–{tests[-1]:.2f}%)" in text
    )


def test_fmnist_prose_numbers_equal_their_json():
    """reproduce/RESULTS.md's Fashion-MNIST section is the generator's, from its JSON, and the
    verdicts it states agree with the tests they name."""
    from reproduce.evidence.fmnist import fmnist_section, welch

    record = json.loads((EVIDENCE / "fmnist" / "fmnist.json").read_text())
    section = "## Fashion-MNIST on one GPU" + RESULTS.split("## Fashion-MNIST on one GPU", 1)[1]
    section = section.split("\n## ", 1)[0]
    text = " ".join(section.split())
    assert section.strip() == fmnist_section(record).strip(), (
        "python -m reproduce.evidence.fmnist --docs"
    )
    clean = record["runs"]["clean"]
    acc = {e: [r["test_acc"] for r in rs] for e, rs in clean.items()}
    seeds = min(len(v) for v in acc.values())
    assert seeds >= 2
    # a table short of its three seeds says so, with the command that completes it
    assert (f"{3 - seeds} more by `python -m reproduce.evidence.fmnist" in text) == (seeds < 3)
    assert ("meets the bar" in text) == (statistics.mean(acc["sgd"]) >= 94.0)
    differs = [  # per setting: does some estimator differ from SGD at 5% (Welch)?
        any(welch(a, accs["sgd"])[2] < 0.05 for e, a in accs.items() if e != "sgd")
        for accs in (
            {e: [r["test_acc"] for r in rs] for e, rs in by.items()}
            for by in record["runs"].values()
        )
    ]
    assert text.count("Against SGD, significant") == sum(differs)


def test_the_guides_fashion_mnist_summary_is_its_generators():
    """docs/guides/reproduce.md's "In short" paragraph says what the committed table says."""
    from reproduce.evidence.fmnist_report import in_short

    record = json.loads((EVIDENCE / "fmnist" / "fmnist.json").read_text())
    guide = " ".join((ROOT / "docs" / "guides" / "reproduce.md").read_text().split())
    assert in_short(record) in guide, "python -m reproduce.evidence.fmnist --docs"


def test_the_guides_paragraph_on_which_form_to_start_with_is_its_generators():
    """docs/guides/concepts.md's "Which form to start with" says what the committed cheap.json says,
    and no numbers before it is committed."""
    from reproduce.evidence.cheap_report import start_with

    path = EVIDENCE / "fmnist" / "cheap.json"
    record = json.loads(path.read_text()) if path.is_file() else None
    guide = " ".join((ROOT / "docs" / "guides" / "concepts.md").read_text().split())
    assert start_with(record) in guide, "python -m reproduce.evidence.cheap --docs"


def test_cheap_section_is_its_generators():
    """reproduce/RESULTS.md's section "Flatness at SGD's price" is the generator's: from
    reproduce/results/fmnist/cheap.json once committed, and "Not run yet" with its command before."""
    from reproduce.evidence.cheap import estimate
    from reproduce.evidence.cheap_report import HEADING, cheap_section, goal

    path = EVIDENCE / "fmnist" / "cheap.json"
    record = json.loads(path.read_text()) if path.is_file() else None
    minutes = estimate(json.loads((EVIDENCE / "fmnist" / "fmnist.json").read_text()))
    section = HEADING + RESULTS.split(HEADING, 1)[1].split("\n## ", 1)[0]
    assert section.strip() == cheap_section(record, minutes).strip(), (
        "python -m reproduce.evidence.cheap --docs"
    )
    assert RESULTS.index("## Fashion-MNIST on one GPU") < RESULTS.index(HEADING)
    if record is None:
        assert "Not run yet" in section and "Data:" not in section
        return
    text = " ".join(section.split())
    for by in record["runs"].values():
        g = goal(by)
        if g["judged"] and not g["significant"]:
            assert "gain over the SGD of its own process is not significant" in text


def test_the_guides_cheap_forms_paragraph_states_the_harness_goal_and_values():
    """docs/guides/concepts.md's paragraph above "Which form to start with" (written by hand) and the
    section's introduction state the goal of `cheap_report` and the σ and k the harness trains."""
    from reproduce.config import resolve
    from reproduce.evidence import cheap, cheap_report

    guide = " ".join((ROOT / "docs" / "guides" / "concepts.md").read_text().split())
    said = guide[: guide.index(cheap_report.GUIDE_HEAD)].rsplit("It trains ", 1)[1]
    keep, price = f"{cheap_report.KEEP:.0%}", f"{cheap_report.PRICE:g} ×"
    assert f"keeps at least {keep} of the accuracy gain of full GAM (exact H·v) over SGD" in said
    assert f"at no more than {price} SGD's wall-clock" in said
    assert set(cheap.GROUPS["late"][1]) == {"gam_fd", "sam"} and cheap.GROUPS["late"][0].endswith(
        ":0.75"
    )
    assert "fd GAM and SAM in the last quarter" in said
    # what the harness configures: the preset, the recipe and the every group's own arguments
    record = json.loads((EVIDENCE / "fmnist" / "fmnist.json").read_text())
    v = cheap.values(record, record)
    for preset in cheap.fmnist.SETTINGS.values():
        cfg = resolve([f"--preset={preset}", *v["args"], *cheap.GROUPS["every"][2]])
        intro = " ".join(cheap_report.INTRO.split())
        for text in (said, intro):
            assert re.findall(r"σ = ([0-9.e-]+)", text) == [f"{cfg.rwp_sigma:g}"], text
            assert re.findall(r"\bk = (\d+)", text) == [str(cfg.look_k)], text
        assert cheap_report.FORMS["look_gam"] == f"LookGAM (k = {cfg.look_k})"


def test_the_committed_cheap_record_compares_with_the_tables_sgd_and_names_its_rwp_code():
    """cheap.json holds, per setting and seed it has, the table's SGD of that seed (from fmnist.json,
    marked as borrowed), no skipped process of a seed it has, and which RWP code each run timed."""
    from reproduce.evidence.cheap_report import TABLE_SGD

    record = json.loads((EVIDENCE / "fmnist" / "cheap.json").read_text())
    table = json.loads((EVIDENCE / "fmnist" / "fmnist.json").read_text())
    for setting, by in record["runs"].items():
        seeds = sorted(r["seed"] for r in by["sgd"])
        assert sorted(r["seed"] for r in by[TABLE_SGD]) == seeds
        for r in by[TABLE_SGD]:
            row = next(t for t in table["runs"][setting]["sgd"] if t["seed"] == r["seed"])
            assert r == {**row, "group": "table", "device": table["platform"]["device"]}
        have = {(setting, s) for s in seeds}
        assert not [
            p for p in record["processes"] if not p["run"] and (p["setting"], p["seed"]) in have
        ]
    assert record["platform"]["rwp_noise"] in ("one draw", "per tensor")
    merged = [a for a in record.get("added", []) if "date" in a]
    assert all(a["rwp_noise"] in ("one draw", "per tensor") for a in merged)


def test_the_fashion_mnist_sections_write_a_negative_number_with_the_minus_sign():
    from reproduce.evidence.cheap_report import HEADING

    for head in ("## Fashion-MNIST on one GPU", HEADING):
        section = RESULTS.split(head, 1)[1].split("\n## ", 1)[0]
        assert not re.findall(r"(?<![\w`=/.-])-\d", section), head
