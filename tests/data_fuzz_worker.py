"""Worker of tests/test_data_fuzz.py: open damaged copies of a committed sample file and read every item.

    python tests/data_fuzz_worker.py CASES.json FIRST

CASES.json holds a list of cases ``{"sample": "climate-sample"|"hep-sample", "file": name,
"damage": "truncate"|"bytes", "at": [offsets], "length": n, "seed": s}``. From case FIRST on, the
worker prints ``start I`` before case I and one JSON line ``{"case": I, "outcome": ...}`` after it:
``"same"`` (read fine, every value as in the intact file), ``"different"`` (read fine, some value
changed: only a checksum can catch that), ``"DataError:<class>"`` with the message, or
``"OTHER:<type>"`` (any other exception: a bug). A crash leaves a ``start I`` without its result,
and the test restarts the worker at I + 1.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from hpcdl.data import DataError, load_dataset
from hpcdl.data.manifest import file_entry
from hpcdl.data.samples import sample_path

FEATURES = {"climate-sample": [None], "hep-sample": ["images", "constituents"]}


def damaged_copy(case: dict, root: Path) -> Path:
    """A data set directory holding only the damaged file, with a manifest that matches its new bytes."""
    source = sample_path(case["sample"])
    manifest = json.loads((source / "manifest.json").read_text())
    entry = next(e for e in manifest["files"] if e["path"] == case["file"])
    data = bytearray((source / case["file"]).read_bytes())
    if case["damage"] == "truncate":
        data = data[: case["at"][0]]
    else:
        rng = np.random.default_rng(case["seed"])
        for offset in case["at"]:
            end = min(offset + case["length"], len(data))
            data[offset:end] = rng.integers(0, 256, end - offset, dtype=np.uint8).tobytes()
    (root / case["file"]).write_bytes(bytes(data))
    manifest["files"] = [file_entry(root, root / case["file"], entry["samples"])]
    manifest["count"] = entry["samples"]
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def read_all(root: Path, features) -> list[np.ndarray]:
    data = load_dataset(root, "all", features=features)
    try:
        return [np.stack([x.numpy() for x, _ in data.__getitems__(list(range(i, min(i + 256, len(data)))))])
                for i in range(0, len(data), 256)]
    finally:
        data.close()  # the damaged file is deleted next: close it now, not when collected


def run_case(case: dict, reference: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = damaged_copy(case, Path(tmp))
        same = True
        for features in FEATURES[case["sample"]]:
            try:
                values = read_all(root, features)
            except DataError as err:
                return {"outcome": f"DataError:{type(err).__name__}", "message": str(err)[:300]}
            except Exception as err:  # noqa: BLE001 - any other exception type is what the test looks for
                return {"outcome": f"OTHER:{type(err).__name__}", "message": str(err)[:300]}
            expected = reference[(case["file"], features)]
            same = same and all(np.array_equal(a, b, equal_nan=True) for a, b in zip(values, expected))
        return {"outcome": "same" if same else "different"}


def reference_values(cases: list[dict]) -> dict:
    """Every item of each intact file the cases damage, read the same way."""
    reference = {}
    for case in cases:
        for features in FEATURES[case["sample"]]:
            key = (case["file"], features)
            if key not in reference:
                with tempfile.TemporaryDirectory() as tmp:
                    intact = dict(case, damage="bytes", at=[], length=0, seed=0)
                    reference[key] = read_all(damaged_copy(intact, Path(tmp)), features)
    return reference


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    first = int(sys.argv[2])
    reference = reference_values(cases)
    for index in range(first, len(cases)):
        print(f"start {index}", flush=True)
        print(json.dumps({"case": index, **run_case(cases[index], reference)}), flush=True)


if __name__ == "__main__":
    main()
