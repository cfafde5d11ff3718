#!/usr/bin/env bash
# Be the newcomer: clone the committed HEAD into a fresh directory and run the README's first command there,
# exactly as the README writes it, several times (default 2), checking the table `hpcdl demo` prints each time
# and the demo's own time (at most 3 minutes; the install of the first run is not counted).
#
#   bash tools/newcomer.sh          # 2 runs (CI)
#   bash tools/newcomer.sh 3        # 3 runs
#
# The first run builds a fresh .venv in the clone; later runs reuse it, as a newcomer who runs the command
# again would. A failure prints the run's whole output and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-2}
repo=$(pwd)
command=$(python3 tools/check_newcomer.py --readme-command README.md)
work=$(mktemp -d "${TMPDIR:-/tmp}/hpcdl-newcomer.XXXXXX")
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/hpcdl"
echo "newcomer: in a fresh clone ($work/hpcdl): $command"
for run in $(seq 1 "$runs"); do
    start=$(date +%s)
    if ! (cd "$work/hpcdl" && bash -c "$command") >"$work/stdout-$run" 2>"$work/stderr-$run"; then
        echo "newcomer: run $run of the README's first command FAILED; its output:" >&2
        cat "$work/stdout-$run" "$work/stderr-$run" >&2
        exit 1
    fi
    seconds=$(( $(date +%s) - start ))
    if ! python3 tools/check_newcomer.py --demo-table "$work/stdout-$run"; then
        cat "$work/stdout-$run" >&2
        exit 1
    fi
    echo "newcomer: run $run passed in $seconds s (setup included; $(grep '^demo time:' "$work/stdout-$run")); the table it printed:"
    sed -n '1,/^$/p' "$work/stdout-$run"
done
