"""Where the training stream stood idle in a profiler timeline, and what ran and waited meanwhile.

Reads a Chrome trace written by ``torch.profiler`` (``profile_trace.json.gz`` of ``train.py
--profile_steps``, the ``--trace`` folder of :mod:`benchmarks.input_pipeline`). The training stream is the
stream with the most GPU events. For it: the span from its first event to its last, the time it was
busy, and each gap longer than ``--min_ms`` with the other streams' GPU work inside the gap (how
much, how long after the gap opened it began) and the host's waits for the device that were under
way when the gap opened and ended inside it (which thread, since when). Then the other streams' GPU
time, and how much of it overlapped the training stream's work: decoding that overlaps costs a step
nothing, decoding that fills gaps costs it all.

    python -m benchmarks.data_parallel.trace_gaps TRACE.json.gz [TRACE...] [--min_ms 0.3] [--out gaps.json]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import itertools
import json
from collections import Counter
from pathlib import Path

__all__ = ["gaps", "load"]

GPU = ("kernel", "gpu_memcpy", "gpu_memset")
WAITS = ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize")


def load(path: str | Path) -> list[dict]:
    """The complete events (``"ph": "X"``) of a trace, gzipped or not."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _merged(intervals: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _overlap(a: float, b: float, merged: list[list[float]], starts: list[float]) -> float:
    """The time of [a, b] inside the disjoint, sorted intervals ``merged``."""
    total, k = 0.0, bisect.bisect_right(starts, b) - 1
    while k >= 0 and merged[k][1] > a:
        total += max(0.0, min(b, merged[k][1]) - max(a, merged[k][0]))
        k -= 1
    return total


def gaps(events: list[dict], min_ms: float = 0.3) -> dict:
    """The training stream's gaps and what filled them (times in ms; see the module's docstring)."""
    gpu = [e for e in events if e.get("cat") in GPU]
    if not gpu:
        raise ValueError("the trace holds no GPU events")
    train = Counter(e["tid"] for e in gpu).most_common(1)[0][0]
    busy = _merged([(e["ts"], e["ts"] + e["dur"]) for e in gpu if e["tid"] == train])
    other = [e for e in gpu if e["tid"] != train]
    waits = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"] in WAITS]
    origin = busy[0][0]
    found = []
    for (_, a), (b, _) in itertools.pairwise(busy):
        if b - a <= min_ms * 1e3:
            continue
        inside = [e for e in other if e["ts"] < b and e["ts"] + e["dur"] > a]
        held = [e for e in waits if e["ts"] < a < e["ts"] + e["dur"] <= b]
        found.append(
            {
                "at_ms": round((a - origin) / 1e3, 3),
                "ms": round((b - a) / 1e3, 3),
                "other_streams_ms": round(
                    sum(min(b, e["ts"] + e["dur"]) - max(a, e["ts"]) for e in inside) / 1e3, 3
                ),
                "other_streams_from_ms": (
                    round((min(e["ts"] for e in inside) - a) / 1e3, 3) if inside else None
                ),
                "other_kinds": dict(Counter(e["name"][:40] for e in inside).most_common(3)),
                "waits_ending_inside": [
                    {
                        "call": e["name"],
                        "thread": e["tid"],
                        "began_ms_before": round((a - e["ts"]) / 1e3, 3),
                        "ended_ms_after": round((e["ts"] + e["dur"] - a) / 1e3, 3),
                    }
                    for e in held
                ],
            }
        )
    starts = [m[0] for m in busy]
    other_us = sum(e["dur"] for e in other)
    overlap_us = sum(_overlap(e["ts"], e["ts"] + e["dur"], busy, starts) for e in other)
    span = busy[-1][1] - origin
    busy_us = sum(b - a for a, b in busy)
    return {
        "training_stream": train,
        "span_ms": round(span / 1e3, 3),
        "busy_ms": round(busy_us / 1e3, 3),
        "idle_ms": round((span - busy_us) / 1e3, 3),
        "gaps_over_min_ms": round(sum(g["ms"] for g in found), 3),
        "other_streams_ms": round(other_us / 1e3, 3),
        "other_streams_overlapping_ms": round(overlap_us / 1e3, 3),
        "gaps": found,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--min_ms", type=float, default=0.3, help="gaps longer than this")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    out = {}
    for path in a.traces:
        g = out[Path(path).name if len(a.traces) == 1 else str(path)] = gaps(load(path), a.min_ms)
        print(
            f"{path}: stream {g['training_stream']} busy {g['busy_ms']} of {g['span_ms']} ms; "
            f"{len(g['gaps'])} gaps, {g['gaps_over_min_ms']} ms; other streams {g['other_streams_ms']}"
            f" ms, {g['other_streams_overlapping_ms']} ms of it beside the training stream's work"
        )
    if a.out:
        from reproduce.run.report import write_json

        write_json(a.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
