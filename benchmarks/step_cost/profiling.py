"""``--profile N``: N more steps of a runner under ``torch.profiler``, summarised per step (kernel
counts, device and host time, the top kernels; on CPU the top aten ops)."""

from __future__ import annotations

import time

from benchmarks.step_cost.timing import steps_per_sample, sync

TOP = 15  # kernels (CUDA) or aten ops (CPU) kept per profiled method
NAME_CHARS = 80


def _top(table: dict, n_steps: int, time_key: str) -> list[dict]:
    """``table`` name -> [calls, µs] as the ``TOP`` entries with the most µs, per step."""
    top = sorted(table.items(), key=lambda kv: -kv[1][1])[:TOP]
    return [
        {"name": name[:NAME_CHARS], "calls_per_step": calls / n_steps, time_key: us / n_steps}
        for name, (calls, us) in top
    ]


def profile_steps(runner, n: int, device) -> dict:
    """Run ``n`` more steps (rounded up to a multiple of ``every``) under ``torch.profiler.profile``,
    CPU and CUDA activities on CUDA, and summarise them per step.

    ``host_ms``: wall time of the loop that issues the steps, without waiting for the device, under
    the profiler (which slows the host); ``host_ms_unprofiled``: the same loop just before, without
    it. CUDA: ``device_kernels`` and ``device_ms`` (kernel count and summed kernel time),
    ``device_memops`` and ``device_memops_ms`` (memcpy and memset), ``graph_launches``
    (``cudaGraphLaunch`` calls) and ``top_kernels``. Kernels replayed from a CUDA graph appear one by
    one only where CUPTI traces graph nodes; otherwise a replay is a graph launch with no kernels, and
    ``note`` says so. CPU: ``aten_ops`` (every ``aten::`` call, nested ones too) and ``top_ops`` by
    self CPU time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    steps = steps_per_sample(runner, n)
    cuda = device.type == "cuda"
    out = {"steps": steps}

    def host_ms() -> float:  # issuing the steps, without waiting for the device
        t = time.perf_counter()
        for _ in range(steps):
            runner()
        return (time.perf_counter() - t) * 1e3 / steps

    sync(device)
    out["host_ms_unprofiled"] = host_ms()
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        out["host_ms"] = host_ms()
        sync(device)
    events = prof.events()
    if cuda:
        kernels, memops, launches = {}, {}, 0
        for e in events:
            if e.device_type == DeviceType.CPU:
                launches += e.name == "cudaGraphLaunch"
                continue
            if e.device_type != DeviceType.CUDA:
                continue
            # Device-side annotations span kernels: counting them would count twice.
            # (torch 2.11 has no activity_type on its events: tell them apart by name.)
            kind = getattr(e, "activity_type", None) or ""
            memop = e.name.startswith(("Memcpy", "Memset")) or "memcpy" in kind or "memset" in kind
            if memop:
                table = memops
            elif kind == "kernel" or not (kind or getattr(e, "is_user_annotation", False)):
                table = kernels
            else:
                continue
            entry = table.setdefault(e.name, [0, 0.0])
            entry[0] += 1
            entry[1] += e.time_range.elapsed_us()
        out["device_kernels"] = sum(c for c, _ in kernels.values()) / steps
        out["device_ms"] = sum(us for _, us in kernels.values()) / steps / 1e3
        out["device_memops"] = sum(c for c, _ in memops.values()) / steps
        out["device_memops_ms"] = sum(us for _, us in memops.values()) / steps / 1e3
        out["graph_launches"] = launches / steps
        out["top_kernels"] = _top(kernels, steps, "us_per_step")
        if launches:
            out["note"] = (
                "CUDA graphs: kernels replayed from a graph are counted only where the profiler "
                "traced them one by one"
                + ("" if kernels else "; it traced none, so device_* hold no graph work")
            )
    else:
        ops = {}
        for e in events:
            if e.device_type == DeviceType.CPU and e.name.startswith("aten::"):
                entry = ops.setdefault(e.name, [0, 0.0])
                entry[0] += 1
                entry[1] += e.self_cpu_time_total
        out["aten_ops"] = sum(c for c, _ in ops.values()) / steps
        out["top_ops"] = _top(ops, steps, "self_us_per_step")
    return out


def profile_summary(p: dict) -> str:
    """One line of ``profile_steps``' result."""
    if "error" in p:
        return f"profile failed, {p['error'][:200]}"
    s = f"profile over {p['steps']} steps: host {p['host_ms']:.3f} ms/step"
    s += f" ({p['host_ms_unprofiled']:.3f} unprofiled)"
    if "device_kernels" in p:
        s += f", {p['device_kernels']:.1f} kernels/step, device {p['device_ms']:.3f} ms/step"
        if p["graph_launches"]:
            s += f", {p['graph_launches']:.1f} graph launches/step"
        top = p["top_kernels"]
    else:
        s += f", {p['aten_ops']:.1f} aten ops/step"
        top = p["top_ops"]
    if top:
        us = top[0].get("us_per_step", top[0].get("self_us_per_step"))
        s += f"; top: {top[0]['name'][:60]} {us:.1f} µs/step"
    return s
