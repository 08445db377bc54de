"""benchmarks/RESULTS.md is what ``python -m benchmarks.report`` makes of ``benchmarks/results/``, and
what every benchmark shares (benchmarks/_common.py): where its JSON goes and what names the device."""

from __future__ import annotations

import json

import pytest

from benchmarks import _common, report


def test_the_committed_results_md_is_generated_from_the_results():
    assert report.OUT.read_text() == report.render(), "run: python -m benchmarks.report"


def test_results_keep_one_file_per_benchmark_part_and_device():
    files = sorted(_common.RESULTS.glob("*"))
    assert (
        0 < len(files) <= 24
    )  # one per benchmark, part and device: a handful per benchmark at most
    for path in files:
        result = json.loads(path.read_text())
        meta = result["meta"]
        assert path.name == _common.file_name(meta)
        assert {"device_name", "date", "torch"} <= set(meta)


def test_a_table_per_file_headed_by_device_date_and_torch(tmp_path):
    meta = {"benchmark": "vmap_members", "device_name": "NVIDIA H100 80GB HBM3", "gpus": 2}
    meta |= {"slug": "2xh100", "date": "2026-11-27T10:00:00+00:00", "torch": "2.11.0"}
    rows = [{"members": 8, "vmapped_ms": 2.0, "looped_ms": 10.0, "looped_over_vmapped": 5.0}]
    _common.save(
        {"benchmark": "vmap_members", "meta": meta, "rows": rows}, str(tmp_path / "v.json")
    )
    text = report.render(tmp_path)
    assert "## Many models in one step" in text
    assert "### 2 × NVIDIA H100 80GB HBM3, 2026-11-27, torch 2.11.0 (`results/v.json`)" in text
    assert "| 8 | 2.00 | 10.00 | 5.00 |" in text
    (tmp_path / "x.json").write_text(json.dumps({"benchmark": "nothing", "meta": {}, "rows": []}))
    with pytest.raises(ValueError, match="unknown benchmark 'nothing'"):
        report.render(tmp_path)


@pytest.mark.parametrize(
    ("name", "gpus", "want"),
    [
        ("NVIDIA H100 80GB HBM3", 1, "h100"),
        ("NVIDIA H200", 2, "2xh200"),
        ("NVIDIA A100-SXM4-80GB", 4, "4xa100"),
        ("NVIDIA GeForce RTX 4090", 1, "rtx4090"),
    ],
)
def test_a_device_slug_names_the_gpu_and_how_many(name, gpus, want):
    assert _common.slug(name, gpus) == want


def test_the_json_goes_where_out_says_else_into_results(tmp_path):
    meta = _common.metadata("step_cost", "cpu", extra_setting=3)
    assert meta["slug"] == "cpu" and meta["gpus"] == 0 and meta["extra_setting"] == 3
    assert _common.out_path(None, meta) == _common.RESULTS / "step_cost_cpu.json"
    quick = _common.metadata("step_cost", "cpu", quick=True)
    assert _common.out_path(None, quick).parent != _common.RESULTS  # a smoke run is no result
    out = tmp_path / "deep" / "r.json"
    assert _common.save({"benchmark": "step_cost", "meta": meta, "rows": []}, str(out)) == out
    assert json.loads(out.read_text())["meta"]["torch"] == meta["torch"]
    with pytest.raises(ValueError, match="gpus"):
        _common.slug("NVIDIA H100", 0)


def test_a_file_name_says_benchmark_part_and_device():
    meta = {"benchmark": "step_cost", "slug": "h100"}
    assert _common.file_name(meta) == "step_cost_h100.json"
    assert _common.file_name({**meta, "part": "family"}) == "step_cost_family_h100.json"


def test_notes_render_as_the_last_section_with_their_provenance(tmp_path):
    note = {
        "title": "A finding",
        "guide": "docs/guides/concepts.md",
        "device": "2 CPU cores",
        "date": "2026-11-29",
        "torch": "2.14",
        "how": "a loop",
        "finding": "It is faster.",
        "rows": [["one way", "1.0 s"], ["the other", "2.0 s"]],
    }
    notes = tmp_path / "notes.json"
    notes.write_text(json.dumps({"notes": [note]}))
    (tmp_path / "results").mkdir()
    text = report.render(tmp_path / "results", notes)
    section = text.split(f"## {report.NOTES_TITLE}", 1)[1]
    assert "### A finding (2 CPU cores, 2026-11-29, torch 2.14)" in section
    assert "It is faster. Measured: a loop." in section
    assert "[docs/guides/concepts.md](../docs/guides/concepts.md)" in section
    assert "| one way | 1.0 s |" in section and "| the other | 2.0 s |" in section
    assert report.NOTES_TITLE not in report.render(tmp_path / "results", None)
    for broken, match in (
        ({k: v for k, v in note.items() if k != "date"}, "lacks date"),
        ({**note, "rows": [["only what"]]}, "pair"),
        ({**note, "rows": [["x", "y" * 121]]}, "120 characters"),
    ):
        notes.write_text(json.dumps({"notes": [broken]}))
        with pytest.raises(ValueError, match=match):
            report.render(tmp_path / "results", notes)


def test_every_note_is_stated_in_a_guide_that_links_it():
    """A note's finding stays in its guide in words, with a link to the notes' section."""
    root = report.OUT.parent.parent
    anchor = "RESULTS.md#" + report.NOTES_TITLE.lower().replace(" ", "-")
    for note in json.loads(report.NOTES.read_text())["notes"]:
        assert anchor in (root / note["guide"]).read_text(), note["title"]


# The performance guide's H·v table, row by row: its results file and the rows it reads there.
HVP_ROWS = {
    "step_cost_hvp_cpu.json": ("resnet18", "fp32", "eager"),
    "step_cost_hvp_h200.json": ("resnet50", "bf16", "eager"),
    "step_cost_h100.json": ("resnet50", "fp32", "pass-reduce-overhead"),
}
HVP_METHODS = ("gam_exact", "gam_fd", "gam_reverse")


def test_the_guides_hvp_costs_are_those_of_the_results():
    """docs/guides/benchmarks.md's "Which H·v backend costs what": each cell is the ``× grad step``
    of its results file, to one decimal; a dash where the file has no such row."""
    guide = (report.OUT.parent.parent / "docs" / "guides" / "benchmarks.md").read_text()
    section = guide.split("## Which H·v backend costs what", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and ".json`)" in line]
    assert len(rows) == len(HVP_ROWS)
    for line in rows:
        name = line.split("(`", 1)[1].split("`)", 1)[0]
        model, dtype, mode = HVP_ROWS[name]
        results = json.loads((_common.RESULTS / name).read_text())["rows"]
        x_grad = {
            r["method"]: r["x_grad"]
            for r in results
            if (r["model"], r["dtype"], r["mode"]) == (model, dtype, mode) and r.get("x_grad")
        }
        want = [f"{x_grad[m]:.1f}" if m in x_grad else "—" for m in HVP_METHODS]
        assert [c.strip() for c in line.strip("|").split("|")[1:]] == want, line


def test_a_gpu_checks_parts_and_failed_cases_are_listed_under_its_table():
    meta = {
        "parts": [
            {"args": "", "date": "2026-12-07T19:52:40+00:00", "cases": 2, "note": "a worker died"},
            {"args": "--models resnet", "date": "2026-12-07T18:06:16+00:00", "cases": 1},
        ]
    }
    case = {"model": "resnet", "precision": "fp32", "mode": "graph"}
    rows = [
        {**case, "estimator": "sam", "status": "pass", "update_rel_err": 1e-6, "tolerance": 1e-4},
        {**case, "estimator": "adaptive", "status": "fail", "update_rel_err": 1.84e-4,
         "tolerance": 1e-4},
        {**case, "estimator": "-", "status": "fail", "error": "worker died: Traceback | line 2"},
    ]  # fmt: skip
    assert report.gpu_check_notes({"meta": meta, "rows": rows}) == [
        "",
        "- 2 cases from the full check of 2026-12-07 19:52: a worker died.",
        "- 1 case from `--models resnet` of 2026-12-07 18:06.",
        "- Failed: resnet fp32 graph adaptive: relative error 0.000184 against a tolerance of 0.0001.",
        "- Failed: resnet fp32 graph -: worker died: Traceback.",
    ]
    assert report.gpu_check_notes({"meta": {}, "rows": rows[:1]}) == []  # all passed, one part
