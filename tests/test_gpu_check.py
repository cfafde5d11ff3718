"""tools/gpu_check.py on a machine without a usable GPU: exit status 3 and a report that says why."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_without_a_device_it_exits_3_with_a_report(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 3, run.stdout + run.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verdict"] == "no device" and "CUDA" in report["reason"]
    assert "no device" in (tmp_path / "report.md").read_text()
