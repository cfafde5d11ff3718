"""Checks for tools/newcomer.sh: the README's first command, and the table `hpcdl demo` printed.

Standard library only: it runs before (and outside) the virtual environment the command creates.

    python3 tools/check_newcomer.py --readme-command README.md   # print the command to run
    python3 tools/check_newcomer.py --demo-table STDOUT_FILE     # exit 1, saying why, unless the table is sound
                                                                 # and the demo took at most 3 minutes
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

#: The method column of the demo's compressed rows: hpcdl.train.comparison.DEFAULT_METHOD_LABEL, the default
#: policy's label (written out: this script runs without hpcdl; tests/test_newcomer_check.py checks they agree).
DEFAULT_LABEL = "sz rel 1e-3"
#: (model column, method column) of every row the demo must print.
EXPECTED_ROWS = {
    ("deeplabv3p-climate (tiny)", "baseline"), ("deeplabv3p-climate (tiny)", DEFAULT_LABEL),
    ("hep-cnn (small)", "baseline"), ("hep-cnn (small)", DEFAULT_LABEL),
}
#: The least activation ratio the sz rows may show (the README reports 7.9x and 12.3x).
MIN_SZ_RATIO = 3.0
#: The most seconds the demo itself may take (issue 9: a newcomer's first run finishes within 3 minutes). The
#: demo prints its own time (hpcdl.demo.elapsed_line), so the first run's install is not counted.
DEMO_LIMIT_S = 180
_DEMO_TIME = re.compile(r"^demo time: (\d+) s\b", re.M)


def readme_command(path: str) -> str:
    """The first line of the README's first ```bash block, without its trailing comment."""
    text = Path(path).read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    if block is None:
        raise SystemExit(f"{path}: no ```bash block; the README must open with the two commands")
    first = block.group(1).splitlines()[0]
    return first.split("  #")[0].strip()


def table_rows(text: str) -> list[dict[str, str]]:
    """The rows of the demo's table (columns are separated by two or more spaces)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("model ") and "batch @ budget" in line), None)
    if start is None:
        raise ValueError("no table header ('model ... batch @ budget') in the demo's output")
    header = re.split(r"\s{2,}", lines[start].strip())
    rows = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        rows.append(dict(zip(header, re.split(r"\s{2,}", line.strip()))))
    return rows


def check_table(text: str) -> list[str]:
    """What is wrong with the demo's printed output (empty when it is sound)."""
    problems = [line for line in text.splitlines() if line.startswith("NOT RUN")]
    try:
        rows = table_rows(text)
    except ValueError as err:
        return [str(err)]
    seen = {(row.get("model"), row.get("activations")) for row in rows}
    if seen != EXPECTED_ROWS:
        problems.append(f"rows {sorted(map(str, seen))}, expected {sorted(map(str, EXPECTED_ROWS))}")
    batches = {}
    for row in rows:
        where = f"{row.get('model')} / {row.get('activations')}"
        metric = re.fullmatch(r"(miou|auc|accuracy) (\d\.\d+)", row.get("val metric", ""))
        if metric is None or not 0.0 <= float(metric.group(2)) <= 1.0:
            problems.append(f"{where}: val metric {row.get('val metric')!r} is not a metric in [0, 1]")
        ratio = re.fullmatch(r"(\d+\.\d)x", row.get("ratio", ""))
        batch = re.fullmatch(r"(\d+) under .+", row.get("batch @ budget", ""))
        if ratio is None or batch is None:
            problems.append(f"{where}: unreadable ratio {row.get('ratio')!r} or batch {row.get('batch @ budget')!r}")
            continue
        batches[(row["model"], row["activations"])] = int(batch.group(1))
        if row["activations"] != "baseline" and float(ratio.group(1)) < MIN_SZ_RATIO:
            problems.append(f"{where}: activation ratio {ratio.group(1)}x, expected at least {MIN_SZ_RATIO}x")
        if int(batch.group(1)) < 1:
            problems.append(f"{where}: no batch fits the budget")
    for model in {model for model, _ in EXPECTED_ROWS}:
        base, sz = batches.get((model, "baseline")), batches.get((model, DEFAULT_LABEL))
        if base is not None and sz is not None and sz < base:
            problems.append(f"{model}: sz fits batch {sz}, less than the baseline's {base}")
    return problems


def demo_seconds(text: str) -> int | None:
    """The seconds the demo's last line reports, None if it printed no such line."""
    found = _DEMO_TIME.search(text)
    return int(found.group(1)) if found else None


def check_time(text: str) -> list[str]:
    """Whether the demo reported its time and stayed within DEMO_LIMIT_S (empty when it did)."""
    seconds = demo_seconds(text)
    if seconds is None:
        return ["no 'demo time: N s' line in the demo's output; the demo must report how long it took"]
    if seconds > DEMO_LIMIT_S:
        return [f"the demo took {seconds} s, over its limit of {DEMO_LIMIT_S} s (3 minutes, the install not "
                "counted): a newcomer's first run must finish within 3 minutes on 2 cores"]
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--readme-command", metavar="README")
    group.add_argument("--demo-table", metavar="STDOUT_FILE")
    args = parser.parse_args()
    if args.readme_command:
        print(readme_command(args.readme_command))
        return 0
    text = Path(args.demo_table).read_text(encoding="utf-8")
    problems = check_table(text) + check_time(text)
    for problem in problems:
        print(f"check_newcomer: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
