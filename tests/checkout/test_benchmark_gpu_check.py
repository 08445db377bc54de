"""``python -m benchmarks.gpu_check``: the GPU check's cases (tests/gpu_check.py, run as a process
of its own) written as a benchmark result, with the run's metadata, for benchmarks/report.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks import gpu_check as command

ROWS = [
    {"model": "vit", "precision": "fp32", "mode": "eager", "estimator": "sam", "status": "pass"},
    {"model": "vit", "precision": "bf16", "mode": "eager", "estimator": "sam", "status": "fail"},
]


def test_the_command_writes_the_rows_and_a_summary_of_them(tmp_path, monkeypatch, capsys):
    asked = []

    def run(cmd):
        asked.append(cmd)
        path = Path(cmd[cmd.index("--rows") + 1])
        path.write_text(json.dumps({"seconds": 3.0, "rows": ROWS}))
        return 1

    monkeypatch.setattr(command, "_run", run)
    out = tmp_path / "check.json"
    argv = ["--device", "cpu", "--models", "vit", "--estimators", "sam", "--size", "8"]
    assert command.main([*argv, "--out", str(out)]) == 1  # a case failed
    (cmd,) = asked
    assert cmd[1] == str(command.CHECK) and cmd[2:4] == ["--device", "cpu"]
    assert cmd[-6:] == ["--models", "vit", "--estimators", "sam", "--size", "8"]
    result = json.loads(out.read_text())
    assert result["benchmark"] == "gpu_check" and result["rows"] == ROWS
    meta = result["meta"]
    assert (meta["slug"], meta["passed"], meta["failed"], meta["seconds"]) == ("cpu", 1, 1, 3.0)
    assert capsys.readouterr().out.strip() == f"wrote {out}"


def test_a_model_it_does_not_know_is_refused_and_no_file_is_written(tmp_path, capsys):
    out = tmp_path / "check.json"
    code = command.main(["--device", "cpu", "--models", "resnet,mlp", "--out", str(out)])
    assert code == 2 and not out.exists()


def test_a_workers_flags_are_refused(capsys):
    import pytest

    for flag in (["--group", "extras"], ["--rows=x.json"]):
        with pytest.raises(SystemExit) as e:
            command.main(["--device", "cpu", *flag])
        assert e.value.code == 2 and "a worker's flags" in capsys.readouterr().err


def test_the_check_process_imports_the_checkout_installed_or_not(tmp_path):
    # Python puts the script's folder (tests/) first on its path, not the checkout: without the
    # checkout on PYTHONPATH, `import gamfunc` in tests/models.py fails where gamfunc is not installed
    probe = tmp_path / "probe.py"
    probe.write_text("import sys\nsys.exit(0 if sys.argv[1] in sys.path else 3)\n")
    root = str(command.CHECK.parents[1])
    assert command._run([sys.executable, str(probe), root]) == 0
