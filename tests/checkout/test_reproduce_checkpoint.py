"""reproduce/run/checkpoint.py: atomic writes, digests that catch corruption, config refusal, RNG state."""

import pytest
import torch

from reproduce.config import as_dict, resolve
from reproduce.run import checkpoint as ckpt


def body(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "params": {
            "w": torch.randn(64, 64, generator=g),
            "b": torch.zeros(3, dtype=torch.bfloat16),
        },
        "state": {"step": torch.tensor(7), "lr": torch.tensor(0.1, dtype=torch.float64)},
        "history": [{"epoch": 1, "test_acc": 50.0}],
        "finished": False,
    }


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert_same(a[k], b[k])
        elif isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])
        else:
            assert a[k] == b[k]


def test_round_trip_is_exact_and_loadable_with_torch_load(tmp_path):
    path = tmp_path / "c.pt"
    ckpt.save(path, body())
    assert_same(ckpt.load(path), body())
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == ckpt.FORMAT and torch.equal(
        raw["body"]["params"]["w"], body()["params"]["w"]
    )
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left


def test_digest_detects_a_flipped_byte_in_tensor_data(tmp_path):
    path = tmp_path / "c.pt"
    ckpt.save(path, body())
    raw = bytearray(path.read_bytes())
    w = body()["params"]["w"].numpy().tobytes()
    at = raw.find(w[:64]) + 1000  # inside the stored weights
    raw[at] ^= 0xFF
    path.write_bytes(raw)
    with pytest.raises(ckpt.CheckpointError, match=r"corrupt.*digest"):
        ckpt.load(path)


@pytest.mark.parametrize("keep", [0.5, 0.01])
def test_truncated_file_gives_a_clear_error(tmp_path, keep):
    path = tmp_path / "c.pt"
    ckpt.save(path, body())
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])
    with pytest.raises(ckpt.CheckpointError, match="corrupt or truncated"):
        ckpt.load(path)


def test_foreign_and_missing_files(tmp_path):
    torch.save({"model": 1}, tmp_path / "other.pt")
    with pytest.raises(ckpt.CheckpointError, match=r"not a reproduce/train\.py checkpoint"):
        ckpt.load(tmp_path / "other.pt")
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint"):
        ckpt.load(tmp_path / "absent.pt")


def test_stale_temporary_files_are_removed_by_the_next_save(tmp_path):
    stale = tmp_path / ".c.pt.tmp-12345"
    stale.write_bytes(b"half a checkpoint")
    ckpt.save(tmp_path / "c.pt", body())
    assert not stale.exists()


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    ckpt.save(path, body(0))

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save(path, body(1))
    monkeypatch.undo()
    assert_same(ckpt.load(path), body(0))
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_config_mismatch_names_every_differing_field():
    saved = as_dict(resolve([]))
    now = resolve(["--lr=0.2", "--rho=0.3", "--max-steps=5"])
    with pytest.raises(ckpt.ConfigMismatch) as err:
        ckpt.check_config(saved, now)
    msg = str(err.value)
    assert "differing fields: lr, rho" in msg and "max_steps" not in msg
    assert "checkpoint 0.05, now 0.2" in msg
    ckpt.check_config(saved, resolve(["--max-steps=5", "--logdir=/x"]))  # allowed differences


def test_rng_state_round_trip():
    state = ckpt.rng_state()
    a = torch.rand(3)
    torch.rand(5)
    ckpt.set_rng_state(state)
    assert torch.equal(torch.rand(3), a)


def test_a_typed_step_state_round_trips_through_a_checkpoint(tmp_path):
    """The loop saves ``as_dict(to(state, "cpu"))`` and resumes with ``like(saved, fresh state)``:
    the same StepState (types, fields, bits) comes back, and a foreign one is refused by name."""
    import gamfunc
    from gamfunc.training.state import as_dict
    from gamfunc.wrappers.precision import LossScale, fp16
    from reproduce.run.evaluation import to
    from reproduce.run.loop import like

    loss_fn = fp16(lambda p, b, buffers: (((b[0] @ p["w"] - b[1]) ** 2).mean(), buffers))
    opt = gamfunc.chain(gamfunc.clip_by_global_norm(1.0), gamfunc.adamw(1e-2))
    step = gamfunc.make_step(gamfunc.sam(0.05), opt, loss_fn, every=2)
    params = {"w": torch.zeros(3)}
    state = step.init(params, {"m": torch.ones(2)})
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        batch = (torch.randn(8, 3, generator=g), torch.randn(8, generator=g))
        params, state, _ = step(params, state, batch)
    saved = to(state, "cpu")
    assert type(saved) is gamfunc.StepState and type(saved.loss) is LossScale
    ckpt.save(tmp_path / "c.pt", {"state": as_dict(saved)})
    assert "StepState" not in repr(torch.load(tmp_path / "c.pt", weights_only=True))
    restored = like(ckpt.load(tmp_path / "c.pt")["state"], step.init(params, {"m": torch.ones(2)}))
    assert type(restored) is gamfunc.StepState and type(restored.opt) is gamfunc.ChainState
    (got, got_spec), (want, want_spec) = (
        torch.utils._pytree.tree_flatten(s) for s in (restored, state)
    )
    assert got_spec == want_spec
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want, strict=True))
    other = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(0.1), loss_fn, every=2)
    with pytest.raises(ckpt.CheckpointError, match=r"state\.opt has entries \['states'\]"):
        like(ckpt.load(tmp_path / "c.pt")["state"], other.init(params, {"m": torch.ones(2)}))
