"""Make the test codec distribution in tests/plugins/hpcdl_testcodec importable and discoverable, without pip.

``install_testcodec(directory)`` writes the metadata that installing the distribution would write
(``hpcdl_testcodec-0.1.dist-info`` with METADATA and the entry points of its pyproject.toml) into
``directory`` and returns the path entries to add (sys.path or PYTHONPATH): the package's source folder
and ``directory``. importlib.metadata then finds the ``hpcdl.codecs`` entry point exactly as it would
for an installed package, in this process and in any child that gets those entries.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

PLUGIN = Path(__file__).parent / "plugins" / "hpcdl_testcodec"


def install_testcodec(directory: Path) -> list[str]:
    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    dist_info = Path(directory) / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, entries in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines.extend(f"{name} = {target}" for name, target in entries.items())
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return [str(PLUGIN / "src"), str(directory)]
