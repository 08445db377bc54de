"""benchmarks/trace_gaps.py on a small hand-made timeline: the gaps, what filled them, what waited."""

from __future__ import annotations

import gzip
import json

import pytest

from benchmarks import trace_gaps


def _trace(tmp_path):
    def gpu(tid, ts, dur, name="k"):
        return {"ph": "X", "cat": "kernel", "tid": tid, "ts": ts, "dur": dur, "name": name}

    train = [gpu(7, 0, 1000), gpu(7, 1000, 500), gpu(7, 3500, 1000), gpu(7, 4600, 400)]
    decode = [gpu(20, 2000, 1000, "rgba2rgb"), gpu(20, 4000, 200, "rgba2rgb"), gpu(21, 2500, 300)]
    host = [
        # a decoder thread waits from within the first step until the gap has opened
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "tid": 99,
            "ts": 200,
            "dur": 1400,
            "name": "cudaEventSynchronize",
        },
        # a wait that ends after the gap, and a call that is no wait: neither held it
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "tid": 98,
            "ts": 100,
            "dur": 5000,
            "name": "cudaStreamSynchronize",
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "tid": 99,
            "ts": 1400,
            "dur": 300,
            "name": "cudaLaunchKernel",
        },
        {"ph": "i", "cat": "kernel", "tid": 7, "ts": 0, "name": "an instant, not an event"},
    ]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": train + decode + host}, f)
    return path


def test_gaps_and_what_filled_them(tmp_path):
    g = trace_gaps.gaps(trace_gaps.load(_trace(tmp_path)), min_ms=0.3)
    assert g["training_stream"] == 7
    assert g["span_ms"] == 5.0 and g["busy_ms"] == 2.9 and g["idle_ms"] == 2.1
    assert [(x["at_ms"], x["ms"]) for x in g["gaps"]] == [(1.5, 2.0)]  # 0.1 ms at 4.5 is too short
    gap = g["gaps"][0]
    assert gap["other_streams_ms"] == pytest.approx(1.3)  # 1.0 of stream 20, 0.3 of stream 21
    assert gap["other_streams_from_ms"] == 0.5
    assert gap["other_kinds"] == {"rgba2rgb": 1, "k": 1}
    assert gap["waits_ending_inside"] == [
        {
            "call": "cudaEventSynchronize",
            "thread": 99,
            "began_ms_before": 1.3,
            "ended_ms_after": 0.1,
        }
    ]
    # the decoder's 1.5 ms: 0.2 ms beside training work (4.0-4.2 inside 3.5-4.5)
    assert g["other_streams_ms"] == 1.5 and g["other_streams_overlapping_ms"] == 0.2


def test_the_command_writes_a_summary_per_trace(tmp_path, capsys):
    out = tmp_path / "gaps.json"
    assert trace_gaps.main([str(_trace(tmp_path)), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert list(got) == ["t.json.gz"] and got["t.json.gz"]["gaps_over_min_ms"] == 2.0
    assert "1 gaps, 2.0 ms" in capsys.readouterr().out


def test_a_trace_without_gpu_work_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no GPU events"):
        trace_gaps.gaps([{"ph": "X", "cat": "cpu_op", "tid": 1, "ts": 0, "dur": 1, "name": "x"}])
