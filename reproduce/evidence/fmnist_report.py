"""reproduce/RESULTS.md's Fashion-MNIST section from ``fmnist.json`` (`reproduce.evidence.fmnist`):
the tables, the verdicts stated in words (Welch's t-tests, alone and Holm-corrected together, the bar
of the baseline, flatness and price) and the curves of one run per estimator; the figure it shows is
`reproduce.evidence.fmnist_figure`'s. Every number the section states is rendered here from the JSON;
tests/checkout/test_docs.py holds the section to it."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

NAMES = {
    "sgd": "SGD",
    "sam": "SAM",
    "gam": "GAM (exact)",
    "gam_fd": "GAM (fd)",
    "sam+gam": "SAM+GAM",
}
BAR = 94.0  # the clean SGD baseline's required mean test accuracy (%)
LEVEL = 0.05  # significance level of the two-sided tests


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Welch's t-test of mean(a) − mean(b): (difference, t, two-sided p), with the
    Welch–Satterthwaite degrees of freedom; NaN where a sample has fewer than 2 values or no spread."""
    if len(a) < 2 or len(b) < 2:
        return (
            (statistics.mean(a) - statistics.mean(b) if a and b else math.nan),
            math.nan,
            math.nan,
        )
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    d = statistics.mean(a) - statistics.mean(b)
    if va + vb == 0:
        return d, math.nan, math.nan
    t = d / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    from scipy import stats

    return d, t, float(2 * stats.t.sf(abs(t), df))


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of a family of p-values (Holm 1979): the k-th smallest of m is
    multiplied by m − k + 1, the running maximum kept and capped at 1; an adjusted p under the level
    holds the family-wise error rate at that level."""
    adjusted, running = {}, 0.0
    ordered = sorted(pvalues, key=pvalues.get)
    for k, name in enumerate(ordered):
        running = max(running, min(1.0, (len(ordered) - k) * pvalues[name]))
        adjusted[name] = running
    return adjusted


def _pm(values: list[float], spec: str = ".2f") -> str:
    """Mean ± sample std of ``values`` (one alone; none: a dash), a negative mean with U+2212."""
    if not values:
        return "—"
    mean = format(statistics.mean(values), spec).replace("-", "−")
    if len(values) == 1:
        return mean
    return f"{mean} ± {format(statistics.stdev(values), spec)}"


def _test(a: list[float], b: list[float]) -> str:
    d, _, p = welch(a, b)
    if math.isnan(d):
        return "—"
    sign = "+" if d >= 0 else "−"
    verdict = "" if math.isnan(p) else (f", p = {p:.3f}" if p >= 0.001 else ", p < 0.001")
    return f"{sign}{abs(d):.2f}{verdict}"


def recipe_table(record: dict) -> str:
    """Stage 0: SGD's validation accuracy per recipe and seed, the chosen one marked."""
    rec = record["recipe"]
    rows = ["| recipe | arguments | seeds | val acc % | test acc % (not used) | note |"]
    rows.append("|---|---|---|---|---|---|")
    for name, args in rec["recipes"].items():
        cells = [c for c in rec["cells"] if c["recipe"] == name and c["run"]]
        rows.append(
            f"| `{name}` | `{' '.join(args)}` | {len(cells)} | "
            f"{_pm([c['val_acc'] for c in cells])} | {_pm([c['test_acc'] for c in cells])} | "
            f"{'selected' if name == rec['selected'] else ''} |"
        )
    return "\n".join(rows)


def sweep_table(record: dict) -> str:
    """Stage 1: the validation accuracy of each cell of the sweep."""
    lines = ["| cell | val acc % | test acc % (not used) |", "|---|---|---|"]
    for c in record["sweep"]["cells"]:
        label = NAMES[c["estimator"]] + "".join(
            f", {k.replace('sam_rho', 'ρ').replace('rho', 'ρ').replace('alpha', 'α')} {c[k]:g}"
            for k in ("sam_rho", "rho", "alpha")
            if k in c
        )
        val = f"{c['val_acc']:.2f}" if c.get("val_acc") is not None else "not run"
        test = f"{c['test_acc']:.2f}" if c.get("test_acc") is not None else "—"
        lines.append(f"| {label} | {val} | {test} |")
    return "\n".join(lines)


def setting_table(by: dict[str, list]) -> str:
    """Stage 2, one setting: per estimator, mean ± std over seeds and the tests against SGD, SAM."""
    rows = [
        "| estimator | seeds | test acc % | gap (train − test) | λ_max | R1 | train s | × SGD | "
        "vs SGD (Welch) | vs SAM (Welch) |",
        "|" + "---|" * 10,
    ]
    acc = {e: [r["test_acc"] for r in rs] for e, rs in by.items()}
    for e, rs in by.items():
        if not rs:
            rows.append(f"| {NAMES[e]} | 0 | not run | | | | | | | |")
            continue
        rows.append(
            f"| {NAMES[e]} | {len(rs)} | {_pm(acc[e])} | {_pm([r['gap'] for r in rs])} | "
            f"{_pm([r['lambda_max'] for r in rs])} | {_pm([r['r1'] for r in rs], '.3f')} | "
            f"{_pm([r['train_seconds'] for r in rs], '.1f')} | {_pm([r['x_sgd'] for r in rs])} | "
            f"{'—' if e == 'sgd' else _test(acc[e], acc['sgd'])} | "
            f"{'—' if e in ('sgd', 'sam') else _test(acc[e], acc['sam'])} |"
        )
    return "\n".join(rows)


def fmnist_table(record: dict) -> str:
    """reproduce/RESULTS.md's tables of ``fmnist.json``: the recipe (where run), the sweep, one table
    per setting, the curves."""
    out = [recipe_table(record)] if record.get("recipe") else []
    out.append(sweep_table(record))
    out += [f"{setting}:\n\n" + setting_table(by) for setting, by in record["runs"].items()]
    out.append(curves_table(record))
    return "\n\n".join(out)


def curves_table(record: dict, setting: str = "clean", seed: int = 0) -> str:
    """The TensorBoard curves of one run per estimator (``test/acc`` every epoch, ``flatness/
    lambda_max`` every two epochs and at the end), from the same records: epoch by epoch, "test %
    / λ_max" per estimator."""
    by = {
        e: next((r for r in rs if r["seed"] == seed), None)
        for e, rs in record["runs"][setting].items()
    }
    by = {e: r for e, r in by.items() if r is not None}
    epochs = max((len(r["history"]) for r in by.values()), default=0)
    rows = ["| epoch | " + " | ".join(NAMES[e] for e in by) + " |", "|---|" + "---|" * len(by)]
    for i in range(epochs):
        cells = []
        for r in by.values():
            h = r["history"][i]
            lam = r["lambda_max"] if i == epochs - 1 else h["lambda_max"]
            cells.append(f"{h['test_acc']:.2f}" + ("" if lam is None else f" / {lam:.1f}"))
        rows.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return f"{setting}, seed {seed}, test % / λ_max:\n\n" + "\n".join(rows)


def plural(n: int, noun: str) -> str:
    """``noun`` for one, ``noun``-s for any other count: "seed", "seeds"."""
    return noun if n == 1 else f"{noun}s"


def _count(n: int, noun: str) -> str:
    return f"{n} {plural(n, noun)}"


def _signed(d: float, spec: str = ".2f") -> str:
    return f"{'+' if d >= 0 else '−'}{format(abs(d), spec)}"


def _p(p: float) -> str:
    return f"p = {p:.3f}" if p >= 0.001 else "p < 0.001"


def _versus(acc: dict[str, list[float]], ref: str, others: list[str]) -> str:
    """One sentence: which of ``others`` differ from ``ref`` in mean test accuracy at `LEVEL`."""
    tests = {e: welch(acc[e], acc[ref]) for e in others if len(acc[e]) > 1 and len(acc[ref]) > 1}
    tests = {e: t for e, t in tests.items() if not math.isnan(t[2])}
    if not tests:
        return f"Against {NAMES[ref]}: too few seeds for a test."
    sig = [e for e, t in tests.items() if t[2] < LEVEL]
    said = "; ".join(f"{NAMES[e]} {_signed(tests[e][0])} points ({_p(tests[e][2])})" for e in sig)
    if not sig:
        e = min(tests, key=lambda k: tests[k][2])
        return (
            f"Against {NAMES[ref]}: no difference is significant at the {LEVEL:.0%} level (the "
            f"smallest p is {NAMES[e]}'s, {_signed(tests[e][0])} points, {_p(tests[e][2])})."
        )
    rest = [NAMES[e] for e in tests if e not in sig]
    tail = f"; {', '.join(rest)}: not significant" if rest else ""
    return f"Against {NAMES[ref]}, significant at the {LEVEL:.0%} level: {said}{tail}."


DATA = "Data: [reproduce/results/fmnist/fmnist.json](results/fmnist/fmnist.json)."
SEEDS = (0, 1, 2)  # the seeds of every cell of the table
# the command that trains what the committed table lacks, and adds it
CONTINUE = (
    "python -m reproduce.evidence.fmnist --data=DIR --stages=table "
    "--into=reproduce/results/fmnist/fmnist.json"
)
HEADING = "## Fashion-MNIST on one GPU: real images, seeds, significance"
SETTING_NAMES = {"clean": "Clean", "noise40": "40% label noise (`noise40`)"}
INTRO = """The one section on real images, and on a GPU: Fashion-MNIST (Xiao et al. 2017; 60,000 training
and 10,000 test images, 28×28 grey, 10 classes; `bash reproduce/data/fashion_mnist.sh DIR` fetches the
four IDX files offline) and the presets `fmnist.clean` and `fmnist.noise40` (reproduce/README.md: the
fast ResNet-9, SGD with Nesterov momentum, cosine schedule, crop and flip on the GPU, every step
replayed as a CUDA graph). `python -m reproduce.evidence.fmnist` runs three stages, each run a
`reproduce/train.py` process alone on the GPU: the baseline's recipe (width and epochs), chosen by
SGD's accuracy on 10% of the training set held out; the validation sweep of SAM's ρ and GAM's (ρ, α),
likewise; the table, every estimator on the whole training set per setting and seed. "train s" is the
training steps' wall time as the host saw it (evaluation and metrics left out) and "× SGD" the cost
of a step as a multiple of SGD's: SGD's steady-state images per second in the same process over the
estimator's, timed between synchronisations of the device with the first interval (compilation,
warm-up) left out. λ_max (Lanczos) and R1 are measured at the end on 1,000 training examples in eval mode; the
gap is train accuracy over the training set in eval mode minus test accuracy (under label noise, train
accuracy against the noisy labels the run trained on, 40% of them replaced by another class: a net
that predicted every true label would score 60% there, so a negative gap says the noise was not
memorised); "vs SGD" and "vs SAM" are the difference of mean test accuracy with Welch's two-sided
t-test, and the tests of a setting are also taken together with Holm's correction."""


def _made(argv: list[str], where: dict, seconds: float, beside: str | None = None) -> str:
    """ "`the command` on one DEVICE, torch X, DATE (N s)": where and how a part of a record was
    made."""
    cmd = " ".join(["python -m reproduce.evidence.fmnist", *argv])
    also = f", beside `{beside}`" if beside else ""
    return (
        f"`{cmd}` on one {where['device']}, torch {where['torch'].split('+')[0]}, "
        f"{where['date']} ({seconds:.0f} s{also})"
    )


def _run_line(record: dict) -> str:
    plat = record["platform"]
    argv = record["settings"].get("argv", [])
    line = f"The table's command: {_made(argv, plat, record['seconds'])}."
    for c in record.get("continued", []):
        if c["ran"]:
            made = _made(c["argv"], c["platform"], c["seconds"])
            line += f" Continued with {made}: {_seeds_of(c['ran'])}."
    devices = {
        plat["device"],
        *(c["platform"]["device"] for c in record.get("continued", []) if c["ran"]),
    }
    if len(devices) > 1:
        line += " The seconds of different devices are not comparable: × SGD is each process's own."
    if record.get("added"):
        line += (
            " Added afterwards with `--add` (the table's own command for that setting and seed): "
        )
        line += ", ".join(f"{a['setting']} seed {a['seed']}" for a in record["added"]) + "."
    return line


def _seeds_of(ran: list) -> str:
    """``[["clean", 2], ["noise40", 0]]`` → ``"clean seed 2, noise40 seed 0"``."""
    by: dict[str, list[int]] = {}
    for setting, seed in ran:
        by.setdefault(setting, []).append(seed)
    return ", ".join(
        f"{setting} {plural(len(seeds), 'seed')} {', '.join(map(str, seeds))}"
        for setting, seeds in by.items()
    )


def _recipe_line(record: dict) -> str:
    rec = record["recipe"]
    means: dict[str, list[float]] = {}
    for c in rec["cells"]:
        if c["run"]:
            means.setdefault(c["recipe"], []).append(c["val_acc"])
    best = rec["selected"]
    seeds = ", ".join(str(s) for s in sorted({c["seed"] for c in rec["cells"]}))
    where = rec.get("platform", record["platform"])
    line = (
        f"**Recipe.** SGD on the clean preset, seeds {seeds}, 10% of the training set held out, on "
        f"one {where['device']} ({where['date']}); the best mean validation accuracy chose `{best}` "
        f"(`{' '.join(rec['recipes'][best])}`, {statistics.mean(means[best]):.2f}%). The test "
        "accuracy beside it was not used."
    )
    made = record.get("table_recipe")
    if made and made != best:
        line += (
            f" The sweep and tables below were made with `{made}` before this stage existed; "
            "`python -m reproduce.evidence.fmnist --data=DIR --recipe=reproduce/results/fmnist/fmnist.json "
            "--stages=sweep,table` remakes them with the chosen recipe."
        )
    return f"{line} {DATA}"


def _sweep_line(record: dict) -> str:
    sweep, sel = record["sweep"], record["sweep"]["selected"]
    where = f"recipe `{sweep.get('recipe')}`" if sweep.get("recipe") else "the preset"
    made = record.get("table_recipe")
    reused = (
        f" (on {where}; reused for `{made}`)"
        if made and sweep.get("recipe") and made != sweep["recipe"]
        else f" (on {where})"
    )
    made = ""
    if sweep.get("made"):
        m = sweep["made"]
        made = f" Its command: {_made(m['argv'], m['platform'], m['seconds'], m.get('beside'))}."
    return (
        f"**Validation sweep.** Seed 0, 10% of the training set held out, the clean preset{reused}: the "
        f"final validation accuracy chose SAM's ρ = {sel['sam_rho']:g} and GAM's ρ = {sel['rho']:g}, "
        f"α = {sel['alpha']:g} (SAM+GAM takes both, fd GAM GAM's). The test accuracy beside it was not "
        f"used.{made} {DATA}"
    )


def adjusted_tests(
    acc: dict[str, list[float]], others: list[str]
) -> dict[tuple[str, str], tuple[float, float]]:
    """A setting's tests against SGD and SAM taken together: (estimator, reference) → (difference of
    mean test accuracy, Holm-adjusted Welch p, `holm`); empty where fewer than two can be made."""
    pairs = [(e, "sgd") for e in others] + [
        (e, "sam") for e in others if e != "sam" and "sam" in acc
    ]
    tests = {pair: welch(acc[pair[0]], acc[pair[1]]) for pair in pairs}
    tests = {pair: t for pair, t in tests.items() if not math.isnan(t[2])}
    if len(tests) < 2:
        return {}
    adjusted = holm({pair: t[2] for pair, t in tests.items()})
    return {pair: (tests[pair][0], adjusted[pair]) for pair in tests}


def _family(acc: dict[str, list[float]], others: list[str]) -> str | None:
    """One sentence: the tests against SGD and SAM taken together (`adjusted_tests`), each kept one
    with its direction; None where fewer than two tests can be made."""
    tests = adjusted_tests(acc, others)
    if not tests:
        return None
    kept = [pair for pair, (_, p) in tests.items() if p < LEVEL]
    head = f"Taken together (Holm's correction over these {len(tests)} tests)"
    if not kept:
        best = min(tests, key=lambda pair: tests[pair][1])
        return (
            f"{head}: none is significant at the {LEVEL:.0%} level (the smallest adjusted p, "
            f"{NAMES[best[0]]} against {NAMES[best[1]]}: {_p(tests[best][1])})."
        )
    said = "; ".join(
        f"{NAMES[a]} {'above' if tests[a, b][0] > 0 else 'below'} {NAMES[b]} "
        f"({_signed(tests[a, b][0])} points, {_p(tests[a, b][1])})"
        for a, b in kept
    )
    return f"{head}, significant at the {LEVEL:.0%} level: {said}."


def _bullets(setting: str, by: dict[str, list]) -> list[str]:
    acc = {e: [r["test_acc"] for r in rs] for e, rs in by.items() if rs}
    bullets = []
    if setting == "clean":
        m, sd = statistics.mean(acc["sgd"]), _pm(acc["sgd"]).partition(" ± ")[2]
        bullets.append(
            f"The baseline {'meets' if m >= BAR else 'misses'} the bar of {BAR:.1f}%: SGD reaches "
            f"{m:.2f}" + (f" ± {sd}" if sd else "") + f"% over {len(acc['sgd'])} seeds."
        )
    others = [e for e in acc if e != "sgd"]
    bullets.append(_versus(acc, "sgd", others))
    if "sam" in acc:
        bullets.append(_versus(acc, "sam", [e for e in others if e != "sam"]))
    if (family := _family(acc, others)) is not None:
        bullets.append(family)
    lam = {e: statistics.mean(r["lambda_max"] for r in by[e]) for e in acc}
    bullets.append(
        f"λ_max at the end, against SGD's {lam['sgd']:.0f}: "
        + ", ".join(
            f"{NAMES[e]} {lam[e]:.0f} ({_signed(100 * (lam[e] / lam['sgd'] - 1), '.0f')}%)"
            for e in others
        )
        + "."
    )
    x = {e: statistics.mean(r["x_sgd"] for r in by[e]) for e in others}
    bullets.append(
        "Cost as a multiple of SGD's in the same process (steady-state images per second): "
        + ", ".join(f"{NAMES[e]} {x[e]:.1f} ×" for e in others)
        + f" (SGD: {statistics.mean(r['images_per_s'] for r in by['sgd']):,.0f} images/s)."
    )
    return bullets


def fmnist_prose(record: dict) -> str:
    """What the section states in words, each number from ``record``: per setting with runs, the
    baseline against `BAR`, the tests against SGD and SAM at `LEVEL`, λ_max and the price."""
    out = []
    for setting, by in record["runs"].items():
        if by.get("sgd"):
            lines = "\n".join(f"- {b}" for b in _bullets(setting, by))
            out.append(f"{SETTING_NAMES.get(setting, setting)}:\n\n{lines}")
    return "\n\n".join(out)


def _wrap(text: str, width: int = 104) -> str:
    """``text`` broken into lines of at most ``width`` characters, at spaces."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False))


def in_short(record: dict) -> str:
    """docs/guides/reproduce.md's one-paragraph summary of the table, from ``record``: per setting,
    which estimators beat SGD and which fell below it at `LEVEL` (Welch, with Holm's correction over
    the setting's tests: `adjusted_tests`) and where λ_max fell most; the settings not run."""
    said, missing, tested = [], [], False
    for setting, by in record["runs"].items():
        name = {"clean": "clean Fashion-MNIST", "noise40": "40% label noise"}.get(setting, setting)
        acc = {e: [r["test_acc"] for r in rs] for e, rs in by.items() if rs}
        if "sgd" not in acc:
            missing.append(name)
            continue
        seeds = min(len(a) for a in acc.values())
        tests = adjusted_tests(acc, [e for e in acc if e != "sgd"]) if seeds > 1 else {}
        tested = tested or bool(tests)
        kept = [(a, d) for (a, b), (d, p) in tests.items() if b == "sgd" and p < LEVEL]
        above = " and ".join(NAMES[a] for a, d in kept if d > 0)
        below = " and ".join(NAMES[a] for a, d in kept if d < 0)
        if seeds < 2:
            verdict = "there were too few seeds for a test"
        elif above:
            verdict = f"{above} beat SGD significantly" + (
                f" and {below} fell below it" if below else ""
            )
        elif below:
            verdict = f"no estimator beat SGD, {below} fell significantly below it"
        else:
            verdict = "no estimator differed significantly from SGD"
        lam = {e: statistics.mean(r["lambda_max"] for r in by[e]) for e in acc}
        low = min((e for e in lam if e != "sgd"), key=lam.get)
        said.append(
            f"on {name} ({_count(seeds, 'seed')}) {verdict}, and λ_max fell most under {NAMES[low]} "
            f"({_signed(100 * (lam[low] / lam['sgd'] - 1), '.0f')}% against SGD's)"
        )
    head = (
        "In short (Welch's tests, with Holm's correction over each setting's)"
        if tested
        else "In short"
    )
    text = f"{head}: " + "; ".join(said) if said else "In short: nothing has been run yet"
    if missing:
        text += "; " + " and ".join(missing) + " not run yet"
    return text + "."


def fmnist_section(record: dict) -> str:
    """reproduce/RESULTS.md's whole Fashion-MNIST section, from ``record`` alone."""
    parts = [HEADING, INTRO, _run_line(record)]
    if record.get("recipe"):
        parts += [_recipe_line(record), recipe_table(record)]
    parts += [_sweep_line(record), sweep_table(record)]
    for setting, by in record["runs"].items():
        n = [len(rs) for rs in by.values()]
        name = SETTING_NAMES.get(setting, setting)
        chosen = (record.get("recipe") or {}).get("selected")
        if max(n) == 0 and chosen and chosen != record.get("table_recipe"):
            parts.append(f"**{name}.** Not run yet: the recipe's command above runs it. {DATA}")
        elif max(n) == 0:
            parts.append(f"**{name}.** Not run yet; `{CONTINUE}` runs it. {DATA}")
        else:
            seeds = _count(min(n), "seed") if min(n) == max(n) else f"{min(n)}–{max(n)} seeds"
            made = f", recipe `{record['table_recipe']}`" if record.get("table_recipe") else ""
            lacks = f" {len(SEEDS) - min(n)} more by `{CONTINUE}`." if min(n) < len(SEEDS) else ""
            parts.append(f"**{name}, {seeds}{made}.**{lacks} {DATA}")
        parts.append(setting_table(by))
    parts.append(
        "What this shows, plainly (Welch's two-sided t-test at the 5% level; Holm's correction where "
        "the tests are taken together):"
    )
    parts.append(fmnist_prose(record))
    parts.append("Test accuracy against cost: ![Fashion-MNIST](results/fmnist/fmnist.png)")
    parts.append(
        "**The curves of one run per estimator** (the TensorBoard scalars `test/acc` every epoch and "
        f"`flatness/lambda_max` every two epochs, from the same records; seed 0, clean). {DATA}"
    )
    parts.append(curves_table(record))
    return "\n\n".join(parts) + "\n"


def write_section(record: dict, results: Path) -> None:
    """Replace the Fashion-MNIST section of ``results`` (a RESULTS.md) with `fmnist_section`'s, and
    the guide's "In short" paragraph with `in_short`'s."""
    text = results.read_text()
    head, _, rest = text.partition(HEADING)
    if not _:
        raise ValueError(f"{results}: no heading {HEADING!r}")
    tail = rest.split("\n## ", 1)
    after = "\n## " + tail[1] if len(tail) > 1 else ""
    results.write_text(head + fmnist_section(record) + after)
    guide = results.parent.parent / "docs" / "guides" / "reproduce.md"
    write_paragraph(guide, "In short", in_short(record))


def write_paragraph(guide: Path, head: str, text: str) -> None:
    """Replace the paragraph of ``guide`` that starts with ``head`` by ``text``, wrapped; nothing
    when there is no ``guide``."""
    if guide.is_file():
        old = guide.read_text()
        start = old.index(head)
        end = old.index("\n\n", start)
        guide.write_text(old[:start] + _wrap(text) + old[end:])
