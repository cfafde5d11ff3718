"""The stream fuzzing campaign (tests/stream_fuzz.py) over every registered codec, in one child process.

A few seconds per codec by default; set HPCDL_FUZZ_SECONDS (per codec) for a longer campaign. Every
corrupted, truncated or extended stream must raise CodecError or decode to exactly what the intact
stream gives; random CRC-valid headers must raise CodecError or decode consistently; nothing may crash
(a segfault or abort fails this test, naming the case) or allocate from an unvalidated header (the child
runs with a limited address space). The counts are printed (pytest -s) and kept in the assertion message.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).resolve().parent / "stream_fuzz.py"


def test_no_stream_crashes_or_decodes_silently_wrong(tmp_path):
    seconds = float(os.environ.get("HPCDL_FUZZ_SECONDS", "1.5"))
    progress = tmp_path / "case.txt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(WORKER), str(seconds), str(progress)], capture_output=True, text=True,
                         env=env, timeout=120 + 20 * seconds)
    case = progress.read_text()[:2000] if progress.exists() else "(none started)"
    assert run.returncode == 0, f"the fuzzing process died ({run.returncode}) on: {case}\n{run.stderr[-3000:]}"
    report = json.loads(run.stdout)
    lines = []
    for codec_id, kinds in report["counts"].items():
        total = {outcome: sum(kind.get(outcome, 0) for kind in kinds.values())
                 for outcome in ("clear", "same", "forged", "silent", "crash")}
        lines.append(f"{codec_id}: tried {sum(total.values())}, " + ", ".join(f"{k} {v}" for k, v in total.items()))
        assert sum(total.values()) >= 50 * len(kinds), f"{codec_id} ran too few cases: {kinds}"
    summary = "\n".join(lines)
    print(summary)
    bad = {codec_id: kinds for codec_id, kinds in report["counts"].items()
           if any(kind.get("silent") or kind.get("crash") for kind in kinds.values())}
    assert not bad, f"{summary}\nexamples:\n" + "\n".join(report["examples"])
