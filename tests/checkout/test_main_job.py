"""The main job prints what its docs say: reproduce/results/main_job.json, the docs written from it
(`reproduce.main_job`), and the job run again (the short form on any CPU, the whole job on the
JSON's own CPU and torch)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from reproduce import main_job

RECORD = json.loads(main_job.JSON.read_text())
SAME_TORCH = torch.__version__ == RECORD["platform"]["torch"]
SAME_PLATFORM = SAME_TORCH and main_job.cpu_model() == RECORD["platform"]["cpu"]
# what a run's summaries are compared on: the losses and metrics behind the printed rows
FINAL = ("train_loss", "test_loss", "train_eval_acc", "test_acc", "lambda_max", "trace", "r1")


def test_docs_say_what_the_json_says():
    for path, text in main_job.render_docs(RECORD).items():
        assert path.read_text() == text, f"{path}: run python -m reproduce.main_job --docs"


def test_the_json_rows_are_those_the_run_printed():
    for key in ("main", "short"):
        assert RECORD[key]["printed"] == main_job.rows(RECORD[key]["summaries"]), key
    assert [s["status"] for s in RECORD["main"]["summaries"]] == ["finished", "finished"]
    assert [s["config"]["preset"] for s in RECORD["main"]["summaries"]] == ["mnist1d"] * 2
    assert RECORD["main"]["command"] == "python " + " ".join(main_job.COMMAND)


def test_one_duration_in_every_doc():
    """README, guide and train.py give the main job's time in the same words, the JSON's."""
    span = main_job.duration(RECORD)
    for path in main_job.DOCS.values():
        text = path.read_text().replace("\n", " ")
        assert text.count(span) == 1, path
        for stale in ("2–4 minutes", "a few minutes on 2", "about one minute"):
            assert stale not in text, (path, stale)


def test_rows_without_the_machine_columns_end_at_r1():
    rows = main_job.rows(RECORD["main"]["summaries"], machine_columns=False)
    assert rows[0].endswith("R1") and "img/s" not in rows[0]
    assert rows[2].endswith(f"{RECORD['main']['summaries'][0]['final']['r1']:.4f}")


def _close(new: dict, old: dict, rel: float) -> None:
    for a, b in zip(new["summaries"], old["summaries"], strict=True):
        for k in FINAL:
            x, y = a["final"][k], b["final"][k]
            assert x == y if rel == 0 else math.isclose(x, y, rel_tol=rel), (
                a["estimator"],
                k,
                x,
                y,
            )


@pytest.mark.slow
@pytest.mark.skipif(
    not SAME_TORCH, reason=f"the JSON was made with torch {RECORD['platform']['torch']}"
)
def test_short_form_prints_the_committed_rows(tmp_path):
    """5 epochs of the main job: the same rows on any CPU, the losses and metrics to 1e-4 (CPU
    instruction sets move them by about 1e-8) and bit for bit on the JSON's own CPU."""
    new = main_job.run(main_job.SHORT, tmp_path)
    old = RECORD["short"]
    assert main_job.rows(new["summaries"], False) == main_job.rows(old["summaries"], False)
    _close(new, old, 0 if SAME_PLATFORM else 1e-4)


@pytest.mark.slow
@pytest.mark.skipif(
    not SAME_PLATFORM,
    reason=f"the main job's table was made on {RECORD['platform']['cpu']} with torch "
    f"{RECORD['platform']['torch']}; another CPU rounds differently (the short form is rerun here)",
)
def test_main_job_prints_its_documented_table(tmp_path):
    new = main_job.run(main_job.COMMAND, tmp_path)
    old = RECORD["main"]
    assert main_job.rows(new["summaries"], False) == main_job.rows(old["summaries"], False)
    _close(new, old, 0)
