"""Rendering sbatch scripts: every system's template, the checks made before anything is submitted, the CLI."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl.cli import main
from hpcdl.slurm import SYSTEMS, JobRequest, render_job
from hpcdl.slurm.render import fill_template

REPO = Path(__file__).resolve().parents[1]
ACCOUNTS = {"perlmutter": "m1234", "delta": "abcd-delta-gpu"}


def request(system: str, **fields) -> JobRequest:
    fields.setdefault("account", ACCOUNTS.get(system))
    return JobRequest(system=system, config="hep-jets", **fields)


def directives(script: str) -> list[str]:
    return re.findall(r"^#SBATCH (\S+)$", script, flags=re.MULTILINE)


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_every_system_renders_a_complete_valid_script(system):
    script = render_job(request(system, nodes=2, time="00:30:00", overrides=("train.epochs=1",)))
    assert script.startswith("#!/bin/bash\n")
    assert "{{" not in script and "}}" not in script
    lines = directives(script)
    assert "--nodes=2" in lines and "--time=00:30:00" in lines and "--job-name=hpcdl-hep-jets" in lines
    command = script.strip().splitlines()[-1]
    assert "-m hpcdl train hep-jets --set train.epochs=1" in command
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_perlmutter_has_the_nersc_gpu_lines():
    script = render_job(request("perlmutter", nodes=8, time="02:00:00"))
    lines = directives(script)
    for line in ("--account=m1234", "--qos=regular", "--constraint=gpu", "--ntasks-per-node=4",
                 "--gpus-per-node=4", "--cpus-per-task=32", "--gpu-bind=none"):
        assert line in lines
    assert "module load pytorch" in script
    assert 'export SLURM_CPU_BIND="cores"' in script
    assert 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in script
    assert "srun --cpu-bind=cores python -m hpcdl train hep-jets" in script


def test_generic_gpu_takes_the_node_shape_and_setup():
    script = render_job(request("generic-gpu", gpus_per_node=8, cpus_per_task=12, partition="gpu",
                                setup=("module load cuda", "source /opt/venv/bin/activate")))
    lines = directives(script)
    assert {"--partition=gpu", "--ntasks-per-node=8", "--gpus-per-node=8", "--cpus-per-task=12"} <= set(lines)
    assert not any(line.startswith("--account") for line in lines)  # optional there
    assert "module load cuda\nsource /opt/venv/bin/activate\n" in script


def test_local_runs_this_python_under_its_mpirun():
    script = render_job(request("local", tasks_per_node=3))
    assert "--ntasks-per-node=3" in directives(script)
    command = shlex.split(script.strip().splitlines()[-1])
    assert command[0] == str(Path(sys.executable).parent / "mpirun")
    assert command[command.index("--oversubscribe") + 1 :][:3] == [sys.executable, "-m", "hpcdl"]


def test_array_runs_study_shards():
    script = render_job(request("perlmutter", array=4, extra_args=("--models", "hep-cnn", "--methods", "baseline",
                                                                   "--out", "study")))
    assert "--array=0-3" in directives(script)
    assert "--output=%x-%A_%a.out" in directives(script)
    assert script.rstrip().endswith(
        'python -m hpcdl study run --config hep-jets --models hep-cnn --methods baseline --out study '
        '--shard "$SLURM_ARRAY_TASK_ID/4"'
    )


def test_config_file_becomes_an_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text("extends: hep-jets\ntrain:\n  epochs: 1\n")
    monkeypatch.chdir(tmp_path)
    script = render_job(JobRequest(system="local", config="mine.yaml"))
    assert f"train {tmp_path / 'mine.yaml'}" in script
    assert "--job-name=hpcdl-mine" in directives(script)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(system=None), r"a system is required \(--system\); choose one of perlmutter"),
        (dict(system="frontier"), r"unknown Slurm system 'frontier'"),
        (dict(system="perlmutter", account=None), r"system 'perlmutter' needs --account"),
        (dict(system="delta", account=""), r"system 'delta' needs --account"),
        (dict(system="local", nodes=0), r"--nodes must be a whole number >= 1, got 0"),
        (dict(system="local", array=0), r"--array must be a whole number >= 1"),
        (dict(system="local", time="2h"), r"--time '2h' is not a Slurm time limit"),
        (dict(system="local", account="a b"), r"--account 'a b' must be one word"),
        (dict(system="local", job_name="x;rm"), r"--job-name 'x;rm' must be one word"),
        (dict(system="local", overrides=("train.epochz=2",)), r"unknown config key 'train.epochz'.*train.epochs"),
        (dict(system="local", extra_args=("--bogus",)), r"command inside the job.*unrecognized arguments: --bogus"),
        (dict(system="local", array=2, extra_args=("--methods", "baseline")),
         r"required: --models, --out"),
        (dict(system="local", setup=("a\nb",)), r"--setup takes one shell line"),
        (dict(system="local", extra_directives=("mail",)), r"must be one option like --mail-type=END"),
    ],
)
def test_bad_requests_are_clear_errors(fields, message):
    fields.setdefault("account", None)
    system = fields.pop("system")
    with pytest.raises(ValueError, match=message):
        render_job(JobRequest(system=system, config="hep-jets", **fields))


def test_unknown_config_is_an_error():
    with pytest.raises(FileNotFoundError, match="no shipped config named 'hep-jetz'"):
        render_job(JobRequest(system="local", config="hep-jetz"))


def test_fill_template_never_leaves_a_placeholder():
    assert fill_template("a {{x}} b {{x}}", {"x": "1"}) == "a 1 b 1"
    with pytest.raises(ValueError, match="placeholders without a value: y"):
        fill_template("{{x}} {{y}}", {"x": "1"})


def test_jobs_slurm_holds_the_shipped_templates():
    shipped = {system.template for system in SYSTEMS.values()}
    assert shipped == {path.name for path in (REPO / "jobs" / "slurm").glob("*.sbatch")}


def test_cli_render_prints_the_script_and_reports_errors(capsys):
    assert main(["slurm", "render", "--system", "perlmutter", "--nodes", "8", "--time", "02:00:00",
                 "--account", "m1234", "hep-jets", "--", "--run-dir", "runs/x"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --nodes=8" in out and out.rstrip().endswith("python -m hpcdl train hep-jets --run-dir runs/x")
    assert main(["slurm", "render", "--system", "perlmutter", "hep-jets"]) == 2
    assert "hpcdl slurm: error: system 'perlmutter' needs --account" in capsys.readouterr().err
    assert main(["slurm", "systems"]) == 0
    assert "perlmutter" in capsys.readouterr().out


def test_cli_submit_fails_before_sbatch_on_missing_account(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "")  # no sbatch either: the missing account must be reported first
    assert main(["slurm", "submit", "--system", "delta", "hep-jets"]) == 2
    assert "needs --account" in capsys.readouterr().err
    assert main(["slurm", "submit", "--system", "local", "hep-jets"]) == 2
    assert "`sbatch` is not on PATH" in capsys.readouterr().err
