"""reproduce/RESULTS.md's section "Flatness at SGD's price on Fashion-MNIST" from ``cheap.json``
(`reproduce.evidence.cheap`): one table per setting (mean ± std over seeds, Welch's t-tests against
the SGD of each form's own process and against full GAM), the goal stated in words, the Pareto front
and the figure. Every number the section states is rendered here from the JSON; without it the
section says how to make it. tests/checkout/test_docs.py holds the section to this module in both
cases."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from reproduce.evidence.fmnist_report import LEVEL, _p, _pm, _signed, _test, welch, write_paragraph

# form -> its name; a form is an estimator of one group of `reproduce.evidence.cheap.GROUPS`, or a
# run of the Fashion-MNIST table (`BORROWED`, `TABLE_SGD`)
FORMS = {
    "sgd": "SGD",
    "sgd@table": "SGD (the table's run)",
    "sam": "SAM",
    "gam": "GAM (exact)",
    "gam_fd": "GAM (fd)",
    "look_gam": "LookGAM (k = 5)",
    "msam": "MSAM",
    "rwp": "RWP",
    "gam_fd@late": "GAM (fd), last 25%",
    "sam@late": "SAM, last 25%",
    "gam_fd@adaptive": "GAM (fd), adaptive",
    "sgd@adaptive": "SGD, adaptive policy",
}
FULL = "gam"  # full GAM, whose gain over SGD the goal asks to keep: the paper's estimator
# the full-price forms, the Fashion-MNIST table's runs of the same setting and seed ...
BORROWED = ("sam", "gam", "gam_fd")
# ... and the SGD of their process there, the one they are compared with: same-seed SGD differs
# between processes by run-to-run variation, so each form is set against the SGD of its own process
TABLE_SGD = "sgd@table"
BESIDE = (TABLE_SGD, "sgd@adaptive")  # SGD measured beside this run's: never on the Pareto front
REFERENCES = ("sgd", FULL, *BESIDE)  # measured beside, never candidates of the goal
KEEP = 0.8  # the share of full GAM's gain over SGD a form must keep ...
PRICE = 1.5  # ... at no more than this multiple of SGD's wall-clock
OWN = "the SGD of its own process"  # what full GAM's gain is over: the table's SGD (`TABLE_SGD`)
DATA = "Data: [reproduce/results/fmnist/cheap.json](results/fmnist/cheap.json)."
HEADING = "## Flatness at SGD's price on Fashion-MNIST"
FMNIST_HEADING = "## Fashion-MNIST on one GPU"  # the section this one follows
SETTING_NAMES = {"clean": "Clean", "noise40": "40% label noise (`noise40`)"}
# which RWP code timed a run (``platform["rwp_noise"]``, `reproduce.evidence.cheap.rwp_noise`): the
# earlier one drew its noise tensor by tensor, and its × SGD was that code's
PER_TENSOR = "per tensor"
COMMAND = (
    "python -m reproduce.evidence.cheap --data=DIR --recipe=reproduce/results/fmnist/fmnist.json "
    "--sweep=reproduce/results/fmnist/fmnist.json"
)


def form(group: str, estimator: str) -> str:
    """The form of ``estimator`` trained in ``group``: ``gam_fd@late``; the estimator's name in the
    ``every`` group."""
    return estimator if group == "every" else f"{estimator}@{group}"


def _acc(by: dict[str, list]) -> dict[str, list[float]]:
    return {f: [r["test_acc"] for r in by[f]] for f in FORMS if by.get(f)}


def sgd_of(f: str) -> str:
    """The SGD that form ``f`` is compared with: that of its own process, the table's for the forms
    borrowed from it, this run's for the others (and for the table's SGD: the two SGDs' difference)."""
    return TABLE_SGD if f in BORROWED else "sgd"


def seeds_words(by: dict[str, list]) -> str:
    """How many seeds the forms of one setting have: ``3 seeds``, or ``2–3 seeds`` when they differ."""
    n = [len(rs) for rs in by.values() if rs]
    if min(n) == max(n):
        return f"{n[0]} seed{'s' if n[0] != 1 else ''}"
    return f"{min(n)}–{max(n)} seeds"


def _x(rows: list[dict]) -> float:
    return statistics.mean(r["x_sgd"] for r in rows)


def setting_table(by: dict[str, list]) -> str:
    """One setting: per form that ran, mean ± std over seeds and the tests against the SGD of its own
    process (`sgd_of`) and against full GAM."""
    rows = [
        "| form | seeds | × SGD | test acc % | gap (train − test) | λ_max | R1 | train s | "
        f"vs SGD (Welch) | vs {FORMS[FULL]} (Welch) |",
        "|" + "---|" * 10,
    ]
    acc = _acc(by)
    for f in acc:
        rs, sgd = by[f], sgd_of(f)
        rows.append(
            f"| {FORMS[f]} | {len(rs)} | {_pm([r['x_sgd'] for r in rs])} | {_pm(acc[f])} | "
            f"{_pm([r['gap'] for r in rs])} | {_pm([r['lambda_max'] for r in rs])} | "
            f"{_pm([r['r1'] for r in rs], '.3f')} | {_pm([r['train_seconds'] for r in rs], '.1f')} | "
            f"{'—' if f == 'sgd' or sgd not in acc else _test(acc[f], acc[sgd])} | "
            f"{'—' if f in (FULL, 'sgd') or FULL not in acc else _test(acc[f], acc[FULL])} |"
        )
    return "\n".join(rows)


def cheap_table(record: dict) -> str:
    """The tables of ``cheap.json``: one per setting that has runs."""
    return "\n\n".join(
        f"{setting}:\n\n" + setting_table(by)
        for setting, by in record["runs"].items()
        if any(by.values())
    )


def goal(by: dict[str, list]) -> dict:
    """The goal on one setting: full GAM's gain over the SGD of its own process (`TABLE_SGD`,
    Welch), and for each other form with 2 seeds or more the share of that gain it keeps (its mean
    less the mean of this run's SGD, over the gain) and its mean × SGD; a form meets the goal when
    GAM's gain is positive and significant at `LEVEL`, it keeps at least `KEEP` of it and costs at
    most `PRICE` × SGD."""
    acc = _acc(by)
    if any(len(acc.get(f, ())) < 2 for f in ("sgd", TABLE_SGD, FULL)):
        return {"judged": False}
    gain, _, p = welch(acc[FULL], acc[TABLE_SGD])
    significant = gain > 0 and p < LEVEL  # NaN compares False
    base = statistics.mean(acc["sgd"])
    forms = {}
    for f, a in acc.items():
        if f in REFERENCES or len(a) < 2:
            continue
        keeps = (statistics.mean(a) - base) / gain if significant else None
        x = _x(by[f])
        meets = significant and keeps >= KEEP and x <= PRICE
        forms[f] = {"keeps": keeps, "x_sgd": x, "meets": meets}
    met = [f for f, g in forms.items() if g["meets"]]
    return dict(judged=True, gain=gain, p=p, significant=significant, forms=forms, met=met)


def _cheap_line(by: dict[str, list], forms: dict) -> str:
    acc = _acc(by)
    cheap = [f for f, g in forms.items() if g["x_sgd"] <= PRICE]
    if not cheap:
        return f"No form besides SGD costs at most {PRICE:g} × SGD's wall-clock."
    said = []
    for f in cheap:
        d, _, p = welch(acc[f], acc["sgd"])
        test = "" if math.isnan(p) else f", {_p(p)}"
        said.append(f"{FORMS[f]} ({forms[f]['x_sgd']:.2f} ×, {_signed(d)} points{test})")
    return f"At most {PRICE:g} × SGD's wall-clock, against SGD: " + "; ".join(said) + "."


def goal_words(by: dict[str, list]) -> str:
    """The goal's verdict on one setting, in words, each number from ``by``."""
    g = goal(by)
    want = (
        f"at least {KEEP:.0%} of full GAM's accuracy gain over SGD at a cost of at most {PRICE:g} × "
        "SGD's wall-clock"
    )
    if not g["judged"]:
        return (
            f"The goal ({want}) needs 2 seeds or more of SGD, of {FORMS[TABLE_SGD]} and of "
            f"{FORMS[FULL]}: not judged."
        )
    gain = f"{_signed(g['gain'])} points, {'p is undefined' if math.isnan(g['p']) else _p(g['p'])}"
    if not g["significant"]:
        return (
            f"{FORMS[FULL]}'s gain over {OWN} is not significant ({gain}): there is no gain to keep, "
            f"so the goal ({want}) is neither met nor missed, and the curve is reported as it is. "
            + _cheap_line(by, g["forms"])
        )
    head = (
        f"{FORMS[FULL]} gains {_signed(g['gain'])} points over {OWN} ({_p(g['p'])}). "
        f"The goal ({want})"
    )
    shares = {
        f: f"{FORMS[f]} keeps {x['keeps']:.0%} at {x['x_sgd']:.2f} ×" for f, x in g["forms"].items()
    }
    if g["met"]:
        rest = [shares[f] for f in g["forms"] if f not in g["met"]]
        return (
            f"{head} is met by {len(g['met'])} of {len(g['forms'])}: "
            + "; ".join(shares[f] for f in g["met"])
            + "."
            + (f" The others: {'; '.join(rest)}." if rest else "")
        )
    return f"{head} is met by no form: " + "; ".join(shares.values()) + "."


def pareto(by: dict[str, list]) -> list[str]:
    """The forms no other form beats in both mean test accuracy (higher) and mean × SGD (lower), by
    increasing × SGD; the SGD measured beside this run's (`BESIDE`) is no form of the front."""
    acc = {f: statistics.mean(a) for f, a in _acc(by).items() if f not in BESIDE}
    x = {f: _x(by[f]) for f in acc}
    front = [
        f
        for f in acc
        if not any(
            acc[o] >= acc[f] and x[o] <= x[f] and (acc[o] > acc[f] or x[o] < x[f]) for o in acc
        )
    ]
    return sorted(front, key=lambda f: x[f])


def cheap_prose(record: dict) -> str:
    """What the section states in words per setting with runs: the goal, the Pareto front."""
    out = []
    for setting, by in record["runs"].items():
        if not by.get("sgd"):
            continue
        front = ", ".join(
            f"{FORMS[f]} ({statistics.mean(_acc(by)[f]):.2f}% at {_x(by[f]):.2f} ×)"
            for f in pareto(by)
        )
        bullets = [
            goal_words(by),
            f"The Pareto front (mean test accuracy against mean × SGD): {front}.",
        ]
        lines = "\n".join(f"- {b}" for b in bullets)
        out.append(f"{SETTING_NAMES.get(setting, setting)}:\n\n{lines}")
    return "\n\n".join(out)


GUIDE_HEAD = (
    "Which form to start with"  # docs/guides/concepts.md's paragraph that `start_with` writes
)
SETTING_WORDS = {"clean": "clean Fashion-MNIST", "noise40": "40% label noise"}


def _lam(by: dict[str, list], f: str) -> float:
    return statistics.mean(r["lambda_max"] for r in by[f])


def _start_clause(by: dict[str, list]) -> str:
    """One setting's part of `start_with`: the goal's verdict, the most accurate form at most
    `PRICE` × SGD and the one of them that lowered λ_max most, and what to start with: a form that
    meets the goal, else one of them that beat SGD significantly, else full GAM where its gain is
    significant, else SGD for accuracy and the flattest of them for flatness."""
    g, acc = goal(by), _acc(by)
    cheap = [f for f, x in g["forms"].items() if x["x_sgd"] <= PRICE]
    if not cheap:
        return f"no form besides SGD cost at most {PRICE:g} × SGD's wall-clock"
    best = max(cheap, key=lambda f: statistics.mean(acc[f]))
    flat = min(cheap, key=lambda f: _lam(by, f))
    d, _, p = welch(acc[best], acc["sgd"])
    lam = (
        f"lowered λ_max most ({_signed(100 * (_lam(by, flat) / _lam(by, 'sgd') - 1), '.0f')}% "
        f"against SGD's, at {g['forms'][flat]['x_sgd']:.2f} ×)"
    )
    said = (
        f"of the forms at most {PRICE:g} × SGD's wall-clock, {FORMS[best]} was the most accurate "
        f"({statistics.mean(acc[best]):.2f}% at {g['forms'][best]['x_sgd']:.2f} ×, "
        f"{_signed(d)} points against SGD, {_p(p)}) and "
        + (lam if flat == best else f"{FORMS[flat]} {lam}")
    )
    gain = f"{_signed(g['gain'])} points over {OWN} ({_p(g['p'])})"
    if g["met"]:
        pick = max(g["met"], key=lambda f: statistics.mean(acc[f]))
        return (
            f"{FORMS[FULL]} gained {gain} and {FORMS[pick]} kept "
            f"{g['forms'][pick]['keeps']:.0%} of it at {g['forms'][pick]['x_sgd']:.2f} × SGD; {said}: "
            f"start with {FORMS[pick]}"
        )
    if d > 0 and p < LEVEL:
        return f"{said}: start with {FORMS[best]}, which beat SGD significantly"
    if g["significant"]:
        return (
            f"{FORMS[FULL]} gained {gain} and no form at most {PRICE:g} × SGD kept "
            f"{KEEP:.0%} of it; {said}: start with {FORMS[FULL]} where its price is affordable"
        )
    return (
        f"{FORMS[FULL]}'s gain over {OWN} was not significant ({_signed(g['gain'])} points, "
        f"{_p(g['p'])}), so there was no accuracy for a cheap form to keep; {said}: start with SGD "
        f"where test accuracy is the aim, and with {FORMS[flat]} where a flatter minimum is"
    )


def start_with(record: dict | None) -> str:
    """docs/guides/concepts.md's paragraph on which form to start with, from ``record`` alone: per
    setting with 2 seeds or more, `goal`'s verdict and the most accurate and the flattest form at
    most `PRICE` × SGD (Welch's two-sided t-test at `LEVEL`); before the JSON, that it states no
    numbers."""
    if record is None:
        return (
            f"{GUIDE_HEAD} is a matter of measurement on real data: this paragraph states it from "
            "`reproduce/results/fmnist/cheap.json` once that is committed, and until then states "
            "no numbers."
        )
    said = []
    for setting, by in record["runs"].items():
        if goal(by)["judged"]:
            name = SETTING_WORDS.get(setting, setting)
            said.append(f"on {name} ({seeds_words(by)}), {_start_clause(by)}")
    if not said:
        return start_with(None)
    return (
        f"{GUIDE_HEAD}, as measured (`reproduce.evidence.cheap` on one "
        f"{record['platform']['device']}; Welch's two-sided t-test at the {LEVEL:.0%} level): "
        + "; ".join(said)
        + "."
    )


INTRO = f"""The cheap forms of flatness beside SGD, SAM and full GAM, on the Fashion-MNIST harness of the
section above (its presets, recipe, seeds and validated ρ, α; SAM's ρ for MSAM, RWP's σ = 0.01 of
each filter's norm, LookGAM's k = 5): GAM and SAM flat only in the last quarter of the steps
(`--when=late:0.75`), fd GAM under AE-SAM's adaptive trigger (`--when=adaptive`: the policy reads
a boolean each step, between a CUDA graph of its probe and one of the chosen branch; SGD under the
same policy beside it prices that read), LookGAM, and the one-pass MSAM and RWP.
`python -m reproduce.evidence.cheap` trains them in three `reproduce/train.py` processes per setting
and seed, each alone on the GPU; "× SGD" is a form's cost as a multiple of SGD's: SGD's steady-state
images per second in the first process of the same seed over the form's (timed between
synchronisations of the device, the first interval, of compilation and warm-up, left out); "train s"
is the steps' wall time as the host saw it. SAM and GAM on every step are the table's above, and
so is "{FORMS[TABLE_SGD]}", the SGD of their process there: each form is compared with the SGD of
its own process (the cheap forms with this run's, SAM and GAM on every step with the table's),
because the SGD of one seed differs between processes by run-to-run variation; the table shows
both. A table's cell is the mean ± sample std over seeds; × SGD (the tables, the goal, the Pareto
front and the figure) is the mean of the per-seed ratios. **The goal:** a form that keeps at least
{KEEP:.0%} of full GAM's accuracy gain over SGD (GAM with exact H·v) at a cost of at most
{PRICE:g} × SGD's wall-clock; if GAM's gain is not significant (Welch's two-sided t-test at the
{LEVEL:.0%} level), the section says so and reports the curve as it is."""


def _not_run(setting: str) -> str:
    return (
        f"Not run yet; `{COMMAND} --settings={setting}` runs it, and `--merge=JSON` adds its seeds "
        "to the record."
    )


def _added(added: list[dict]) -> str:
    """The seeds added to a record, by the run that measured them where it is known (``--merge``:
    its command, date and seconds; ``--add``: a run's folder, none of these)."""
    runs: dict[tuple, list[dict]] = {}
    for a in added:
        runs.setdefault((tuple(a.get("argv", ())), a.get("date"), a.get("seconds")), []).append(a)
    said = []
    for (argv, date, seconds), items in runs.items():
        by: dict[str, list[int]] = {}
        for a in items:
            by.setdefault(a["setting"], []).append(a["seed"])
        words = "; ".join(
            f"{setting} seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
            for setting, seeds in by.items()
        )
        if date:
            cmd = " ".join(["python -m reproduce.evidence.cheap", *argv])
            took = f", {seconds:.0f} s" if seconds is not None else ""
            words += f" (`{cmd}`, {date}{took})"
        said.append(words)
    return "; ".join(said)


def rwp_timing(record: dict) -> str:
    """The sentence on what RWP's × SGD timed, where some of its rows come from runs whose RWP drew
    its noise tensor by tensor (``rwp_noise`` `PER_TENSOR`: of an added seed's run where it says,
    else of the record's); else nothing."""
    added = {(a["setting"], a["seed"]): a for a in record.get("added", []) if "rwp_noise" in a}
    codes = [
        added.get((setting, r["seed"]), record["platform"]).get("rwp_noise")
        for setting, by in record["runs"].items()
        for r in by.get("rwp", [])
    ]
    old = [c for c in codes if c == PER_TENSOR]
    if not old:
        return ""
    which = "RWP's" if len(old) == len(codes) else f"{len(old)} of RWP's {len(codes)}"
    return (
        f" {which} rows were timed by runs whose RWP drew its noise tensor by tensor; one draw now "
        "covers many tensors, with the same numbers (CHANGELOG): their × SGD is the earlier code's."
    )


def few_seeds(record: dict) -> str:
    """The sentence on the tests of the settings where a form has fewer than 3 seeds; else
    nothing."""
    few = [
        SETTING_NAMES.get(setting, setting)
        for setting, by in record["runs"].items()
        if any(0 < len(rs) < 3 for rs in by.values())
    ]
    if not few:
        return ""
    return (
        f"{' and '.join(few)} {'has' if len(few) == 1 else 'have'} fewer than 3 seeds of a form: "
        "Welch's test on 2 seeds a side has at most 2 degrees of freedom, so its p-values there "
        "are rough (a form of 1 seed has none)."
    )


def cheap_section(record: dict | None, minutes: float | None = None) -> str:
    """reproduce/RESULTS.md's whole section, from ``record`` alone; None: not run yet, and the run
    would take an estimated ``minutes`` of one GPU (`reproduce.evidence.cheap.estimate`)."""
    parts = [HEADING, INTRO]
    if record is None:
        parts.append(
            f"**Not run yet.** `{COMMAND}` runs it (an estimated {minutes:.0f} minutes of one "
            "GPU; `reproduce.evidence.cheap` says how the time splits by setting and seed, and how "
            "`--deadline` fits a shorter slot); then `python -m reproduce.evidence.cheap --docs` "
            "writes this section from `reproduce/results/fmnist/cheap.json`."
        )
        return "\n\n".join(parts) + "\n"
    plat = record["platform"]
    cmd = " ".join(["python -m reproduce.evidence.cheap", *record["settings"].get("argv", [])])
    line = (
        f"The command: `{cmd}` on one {plat['device']}, torch {plat['torch'].split('+')[0]}, "
        f"{plat['date']} ({record['seconds']:.0f} s); recipe `{record['values']['recipe']}`."
    )
    if record.get("added"):
        line += f" Added afterwards: {_added(record['added'])}."
    borrowed = sorted({r["device"] for by in record["runs"].values() for f in by for r in by[f]
                       if r.get("group") == "table"})  # fmt: skip
    if borrowed:
        line += (
            f" SAM, GAM (exact) and GAM (fd) on every step and {FORMS[TABLE_SGD]} are the runs of "
            f"the Fashion-MNIST table above for the same seeds ({', '.join(borrowed)}), their × SGD "
            "against the SGD of their own process there."
        )
    parts.append(line + rwp_timing(record))
    for setting, by in record["runs"].items():
        name = SETTING_NAMES.get(setting, setting)
        if not any(by.values()):
            parts.append(f"**{name}.** {_not_run(setting)}")
            continue
        parts += [f"**{name}, {seeds_words(by)}.** {DATA}", setting_table(by)]
    few = few_seeds(record)
    parts.append(
        f"What this shows, plainly (Welch's two-sided t-test at the {LEVEL:.0%} level)"
        + (f". {few} The verdicts:" if few else ":")
    )
    parts.append(cheap_prose(record))
    parts.append(
        "Test accuracy against cost as × SGD: ![Flatness at SGD's price](results/fmnist/cheap.png)"
    )
    return "\n\n".join(p for p in parts if p) + "\n"


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


MARKERS = "osD^v<>ph*XP"  # the figure's, one per form of `FORMS` (the colours cycle at 10)


def figure(record: dict, path: Path) -> None:
    """The Pareto figure: test accuracy (mean ± std over seeds) against × SGD (mean ± std), one point
    per form, a panel per setting with runs; the price limit and the goal's accuracy dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = {k: by for k, by in record["runs"].items() if by.get("sgd")}
    fig, axes = plt.subplots(1, len(done), figsize=(8 * len(done), 4.2), squeeze=False)
    for ax, (setting, by) in zip(axes[0], done.items(), strict=True):
        acc = _acc(by)
        for f, a in acc.items():  # a marker of its own for each form: 10 colours cycle
            x = [r["x_sgd"] for r in by[f]]
            mx, my = statistics.mean(x), statistics.mean(a)
            marker = MARKERS[list(FORMS).index(f) % len(MARKERS)]
            ax.errorbar(mx, my, xerr=_sd(x), yerr=_sd(a), fmt=marker, capsize=3, label=FORMS[f])
        front = pareto(by)
        ax.plot([_x(by[f]) for f in front], [statistics.mean(acc[f]) for f in front], "k:", lw=1)
        ax.axvline(PRICE, color="grey", ls="--", lw=1)
        g = goal(by)
        if g["judged"] and g["significant"]:
            ax.axhline(statistics.mean(acc["sgd"]) + KEEP * g["gain"], color="grey", ls="--", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel(f"cost, × SGD's ({record['platform']['device']})")
        ax.set_ylabel("test accuracy %")
        name = SETTING_NAMES.get(setting, setting).replace("`", "")
        ax.set_title(f"Fashion-MNIST, {name}, {seeds_words(by)}")
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_section(
    record: dict | None, results: Path, picture: Path | None = None, minutes: float | None = None
) -> None:
    """Put `cheap_section` into ``results`` (a RESULTS.md): in place of its own section, else before
    the section that follows the Fashion-MNIST one; the paragraph of docs/guides/concepts.md beside
    ``results``'s checkout that starts with `GUIDE_HEAD` with `start_with`'s; and draw `figure` to
    ``picture`` when there is a record."""
    text, section = results.read_text(), cheap_section(record, minutes)
    if HEADING in text:
        head, _, rest = text.partition(HEADING)
        tail = rest.split("\n## ", 1)
        text = head + section + ("\n## " + tail[1] if len(tail) > 1 else "")
    else:
        cut = text.index("\n## ", text.index(FMNIST_HEADING)) + 1
        text = text[:cut] + section + "\n" + text[cut:]
    results.write_text(text)
    guide = results.parent.parent / "docs" / "guides" / "concepts.md"
    write_paragraph(guide, GUIDE_HEAD, start_with(record))
    if record is not None and picture is not None:
        figure(record, picture)
