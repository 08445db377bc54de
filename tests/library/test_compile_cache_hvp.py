"""A warm compile of exact GAM loads its passes from AOTAutograd's cache, and steps as eager does.

Dynamo writes the state that an H·v pass sets (the attention kernel, forward-mode AD's levels) into
the pass's graph as calls that AOTAutograd's cache refuses unless they are named as cacheable, which
`gamfunc.compile.compile_with` does (`gamfunc._compat.cacheable_state_calls`). Without that, every
process traced each exact H·v pass again: most of a warm compile of exact GAM.
"""

from __future__ import annotations

import pytest
import torch
from helpers import mlp_batch, mlp_loss, mlp_params
from torch._dynamo.utils import counters

import gamfunc

COUNTS = ("autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass")


def aot_counts() -> dict[str, int]:
    return {k: int(counters["aot_autograd"][k]) for k in COUNTS}


def since(before: dict[str, int]) -> dict[str, int]:
    now = aot_counts()
    return {k: now[k] - before[k] for k in COUNTS}


@pytest.mark.slow
def test_a_warm_compile_of_exact_gam_loads_its_passes_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    params, batch = mlp_params(), mlp_batch()
    step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), gamfunc.sgd(lr=0.1), mlp_loss)
    want, _, _ = step(params, step.init(params), batch)
    got = {}
    for start in ("cold", "warm"):
        torch._dynamo.reset()  # a new process's compile, but for the caches on disk
        before = aot_counts()
        got[start], _, _ = step.compile(scope="pass")(params, step.init(params), batch)
        got[start + " counts"] = since(before)
    torch._dynamo.reset()
    assert got["cold counts"]["autograd_cache_bypass"] == 0
    assert got["cold counts"]["autograd_cache_miss"] > 0
    warm = got["warm counts"]
    assert warm["autograd_cache_hit"] == got["cold counts"]["autograd_cache_miss"]
    assert warm["autograd_cache_miss"] == warm["autograd_cache_bypass"] == 0
    for start in ("cold", "warm"):
        for k in want:
            torch.testing.assert_close(got[start][k], want[k], rtol=1e-12, atol=1e-14)
