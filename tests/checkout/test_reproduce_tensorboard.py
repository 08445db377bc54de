"""reproduce/run/tensorboard.py: TensorBoard helpers write what a reader gets back."""

import math

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from reproduce.run import tensorboard as tblog


def read(path) -> EventAccumulator:
    events = EventAccumulator(str(path), size_guidance={"images": 0, "scalars": 0, "histograms": 0})
    events.Reload()
    return events


def test_scalars_histograms_figures_and_config_round_trip(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    with SummaryWriter(str(tmp_path)) as w:
        logged = tblog.scalars(
            w,
            {"loss": torch.tensor(0.25, dtype=torch.float64), "lr": 0.1, "nan": float("nan")},
            7,
            "train/",
        )
        tblog.histograms(w, {"w": torch.arange(6.0).reshape(2, 3), "empty": torch.zeros(0)}, 7)
        tblog.figure(w, "fig", fig, 7)
        table = tblog.config(w, {"lr": 0.1, "model": "mlp"})
    assert (
        logged["train/loss"] == 0.25
        and logged["train/lr"] == 0.1
        and math.isnan(logged["train/nan"])
    )
    assert "| lr | `0.1` |" in table
    events = read(tmp_path)
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(7, 0.25)]
    assert math.isnan(events.Scalars("train/nan")[0].value)
    assert events.Tags()["histograms"] == ["params/w"]  # empty tensors are skipped
    hist = events.Histograms("params/w")[0].histogram_value
    assert (hist.min, hist.max, hist.num) == (0.0, 5.0, 6.0)
    assert events.Tags()["images"] == ["fig"]


def test_scalars_reject_tensors_with_several_elements(tmp_path):
    with SummaryWriter(str(tmp_path)) as w, pytest.raises(ValueError, match="one element"):
        tblog.scalars(w, {"v": torch.ones(2)}, 0)


def test_the_final_table_stays_aligned_with_long_labels_and_names_sams_own_radius():
    from reproduce.run import report

    base = {"final": {"train_acc": 90.0, "test_acc": 80.0}, "best_val": None}
    base |= {"images_per_s": 100.0, "train_seconds": 3.0}
    cfg = {"rho": 0.5, "alpha": 1.0, "every": 1, "sam_rho": 0.2}
    cfg |= {"rho_prime": 0.02, "beta": 0.1, "gamma": 0.05}
    names = ("sgd", "sam", "gam_accelerated_official", "sam+gam")
    lines = report.table([dict(base, estimator=e, config=cfg) for e in names]).splitlines()
    assert len({line.index("80.00") for line in lines[2:]}) == 1  # one column for test acc
    assert lines[0].index("test acc") + len("test acc") == lines[2].index("80.00") + len("80.00")
    assert "sam ρ=0.2" in lines[3]
