"""Rendering sbatch scripts: every system's template, the checks made before anything is submitted, the CLI."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl.cli import check_command, main
from hpcdl.slurm import SYSTEMS, JobRequest, render_job
from hpcdl.slurm.render import fill_template

REPO = Path(__file__).resolve().parents[1]
ACCOUNTS = {"perlmutter": "m1234", "delta": "abcd-delta-gpu"}


def request(system: str, **fields) -> JobRequest:
    fields.setdefault("account", ACCOUNTS.get(system))
    return JobRequest(system=system, config="hep-jets", **fields)


def directives(script: str) -> list[str]:
    return re.findall(r"^#SBATCH (\S+)$", script, flags=re.MULTILINE)


def launch_line(script: str) -> str:
    """The line that starts the ranks (in the background, so the batch shell can forward signals)."""
    (line,) = [line for line in script.splitlines() if line.endswith(" &")]
    return line[:-2]


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_every_system_renders_a_complete_valid_script(system):
    script = render_job(request(system, nodes=2, time="00:30:00", overrides=("train.epochs=1",)))
    assert script.startswith("#!/bin/bash\n")
    assert "{{" not in script and "}}" not in script
    lines = directives(script)
    assert "--nodes=2" in lines and "--time=00:30:00" in lines and "--job-name=hpcdl-hep-jets" in lines
    command = launch_line(script)
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
    command = shlex.split(launch_line(script))
    assert command[0] == str(Path(sys.executable).parent / "mpirun")
    assert command[command.index("--oversubscribe") + 1 :][:3] == [sys.executable, "-m", "hpcdl"]


def test_array_runs_study_shards():
    script = render_job(request("perlmutter", array=4, extra_args=("--models", "hep-cnn", "--methods", "baseline",
                                                                   "--out", "study")))
    assert "--array=0-3" in directives(script)
    assert "--output=%x-%A_%a.out" in directives(script)
    assert launch_line(script).endswith(
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
        (dict(system="local", account="a b"), r"--account 'a b' is not allowed in a job script; use letters"),
        (dict(system="local", job_name="x;rm"), r"--job-name 'x;rm' is not allowed.*1 to 200 letters"),
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
        render_job(JobRequest(system=system, config="hep-jets", **fields), check_command=check_command)


def test_the_cli_checks_the_command_inside_the_job(capsys):
    """The slurm layer cannot import the CLI; the CLI hands it the check (a bad job argument is exit 2)."""
    assert main(["slurm", "render", "--system", "local", "hep-jets", "--", "--bogus"]) == 2
    assert "command inside the job" in capsys.readouterr().err
    assert "--bogus" in render_job(JobRequest(system="local", config="hep-jets", extra_args=("--bogus",)))


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
    assert "#SBATCH --nodes=8" in out and launch_line(out).endswith('python -m hpcdl train hep-jets "${run_args[@]}"')
    assert "\nrun_dir=runs/x\n" in out
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


# --- Shell injection: a bounded fuzz campaign over every value that reaches a job script -------------------

PAYLOADS = ["$(touch pwned)", "`touch pwned`", "${HOME}", "a;touch pwned", "a|b", "a&b", "a&&b", "a\ntouch pwned",
            "a'b", 'a"b', "a b", "a\n#SBATCH --uid=0", "#SBATCH --uid=0", "--uid=0", "-x", "a\\", "a\rb", "a\tb",
            "a>b", "*", "~root", "é", "a\u202eb", "a\u2028b", "a\x00b", "", "x" * 300, "ok-value_1.2"]


def _command_line(script: str) -> str:
    return launch_line(script)


BENIGN = "zq7benign"  # a harmless value, to render the script each fuzzed one is compared with
# field -> (the request fields for a value, benign value, how the value shows in the script: "directive" line
# text or "argument" (one shell word of the command line)).
FUZZ_FIELDS = {
    "job_name": (lambda v: dict(job_name=v), BENIGN, "directive"),
    "account": (lambda v: dict(account=v), BENIGN, "directive"),
    "partition": (lambda v: dict(partition=v), BENIGN, "directive"),
    "qos": (lambda v: dict(qos=v), BENIGN, "directive"),
    "time": (lambda v: dict(time=v), "10", "directive"),
    "output": (lambda v: dict(output=v), BENIGN, "directive"),
    "chdir": (lambda v: dict(chdir=v), BENIGN, "directive"),
    "nodes": (lambda v: dict(nodes=v), 1, "directive"),
    "sbatch option": (lambda v: dict(extra_directives=(f"--constraint={v}",)), BENIGN, "directive"),
    "--set": (lambda v: dict(overrides=(f"description={v}",)), BENIGN, "argument"),
    "job argument": (lambda v: dict(extra_args=("--run-dir", v)), BENIGN, "argument"),
    "config": (None, BENIGN, "argument"),
}


def _fuzz_request(field: str, value, directory: Path) -> JobRequest:
    if field == "config":  # the value is the config file's name; the file names its run, so only quoting is tested
        path = directory / f"{value}.yaml"
        path.write_text("extends: hep-jets\nname: fuzzed\n")
        return JobRequest(system="local", config=str(path))
    return JobRequest(system="local", config="hep-jets", **FUZZ_FIELDS[field][0](value))


def _only_quoted(field: str, value, script: str, baseline: str, benign) -> None:
    """``script`` is ``baseline`` with ``value`` in place of ``benign``, and in nowhere else."""
    lines, base = script.splitlines(), baseline.splitlines()
    assert len(lines) == len(base), f"{field}={value!r} added lines:\n{script}"
    changed = [i for i, (a, b) in enumerate(zip(lines, base)) if a != b]
    if field == "config":  # the default job name follows the file's name, in the job-name characters
        renamed = [i for i in changed if lines[i].startswith("#SBATCH --job-name=")]
        assert all(re.fullmatch(r"#SBATCH --job-name=hpcdl-[A-Za-z0-9][A-Za-z0-9._+-]*", lines[i]) for i in renamed)
        changed = [i for i in changed if i not in renamed]
    assert len(changed) <= 1, f"{field}={value!r} changed several lines"
    if FUZZ_FIELDS[field][2] == "directive":
        assert all(not lines[i].startswith("#SBATCH") or re.fullmatch(r"#SBATCH --[\w-]+=[^\s'\"\\#]+", lines[i])
                   for i in changed)
        assert any(lines[i].endswith(f"={value}") for i in changed) or value == benign
    else:
        command_lines = [i for i, line in enumerate(base) if line.endswith(" &") or line.startswith("run_dir=")]
        assert len(changed) == 1 and changed[0] in command_lines, \
            f"{field}={value!r} changed a line other than the command or its run directory"
        words, base_words = shlex.split(lines[changed[0]]), shlex.split(base[changed[0]])
        expected = [word.replace(str(benign), str(value)) if str(benign) in word and word != "hep-jets" else word
                    for word in base_words]
        assert words == expected, f"{field}={value!r}: the command's words changed: {words} != {expected}"


def test_fuzz_every_script_value_is_refused_or_only_quoted(tmp_path):
    """Shell metacharacters, newlines, quotes, spaces, #SBATCH lines and unicode in every field: each is a
    one-line error naming the value, or a script that `bash -n` accepts holding the value only where it belongs."""
    counts = {"cases": 0, "errors": 0, "rendered": 0}
    scripts = []
    for field, (_, benign, _) in FUZZ_FIELDS.items():
        directory = tmp_path / field.replace(" ", "_").strip("-")
        directory.mkdir()
        baseline = render_job(_fuzz_request(field, benign, directory))
        for value in PAYLOADS + [1.5, None, 0, -3]:
            if field == "config" and (not isinstance(value, str) or not value or "\x00" in value
                                      or len(value) > 200 or "/" in value):
                continue  # not a possible file name
            counts["cases"] += 1
            try:
                script = render_job(_fuzz_request(field, value, directory))
            except (ValueError, FileNotFoundError) as err:
                message = str(err)
                named = repr(value)[1:-1] in message or str(value) in message or (
                    field == "--set" and "config key 'description'" in message)  # a YAML comment: null
                assert "\n" not in message and named, message
                counts["errors"] += 1
                continue
            counts["rendered"] += 1
            if value is not None:  # None leaves the field to its default
                _only_quoted(field, value, script, baseline, benign)
            scripts.append(directory / f"{len(scripts)}.sh")
            scripts[-1].write_text(script)
    assert counts["cases"] > 300 and counts["errors"] > 150 and counts["rendered"] > 50, counts
    if shutil.which("bash"):
        checked = subprocess.run(["bash", "-c", 'for f; do bash -n "$f" || echo "FAILED $f"; done', "_",
                                  *map(str, scripts)], capture_output=True, text=True)
        assert "FAILED" not in checked.stdout and checked.returncode == 0, checked.stdout + checked.stderr


def test_default_job_name_from_a_hostile_config_file_name(tmp_path):
    path = tmp_path / "x\ntouch pwned; --uid=0 $(id).yaml"
    path.write_text("extends: hep-jets\nname: fine\n")
    with pytest.raises(ValueError, match=r"config '.*x\\ntouch pwned.*' holds a control character"):
        render_job(JobRequest(system="local", config=str(path)))
    path = path.rename(tmp_path / "a b;$(id)|c.yaml")
    script = render_job(JobRequest(system="local", config=str(path)))
    assert "--job-name=hpcdl-a-b-id-c" in directives(script)
    assert shlex.split(_command_line(script))[-2] == str(path)


def test_status_parsing_survives_separators_in_job_names():
    from hpcdl.slurm.submit import _from_sacct_line, _from_scontrol_line, _from_squeue

    job = _from_squeue("17|evil|COMPLETED|x|RUNNING|1:00|1:00:00|1|node1")
    assert (job.job_id, job.name, job.state, job.detail) == ("17", "evil|COMPLETED|x", "RUNNING", "node1")
    assert not job.finished
    job = _from_sacct_line("18|a|COMPLETED|FAILED|00:01:00|01:00:00|1|1:0")
    assert (job.name, job.state, job.succeeded) == ("a|COMPLETED", "FAILED", False)
    job = _from_scontrol_line("JobId=19 JobName=x JobState=COMPLETED y UserId=root(0) GroupId=root(0) "
                              "JobState=RUNNING Reason=None ExitCode=0:0 RunTime=00:00:05 TimeLimit=01:00:00 NumNodes=1")
    assert (job.job_id, job.name, job.state, job.finished) == ("19", "x JobState=COMPLETED y", "RUNNING", False)
    with pytest.raises(ValueError, match="fewer than 7"):
        _from_squeue("17|name|RUNNING")


def test_training_jobs_ask_for_a_warning_signal_and_requeue_with_a_stable_run_dir():
    script = render_job(request("perlmutter", time="00:30:00"))
    assert {"--signal=B:USR1@120", "--requeue"} <= set(directives(script))
    assert "\nrun_dir=runs/hep-jets-slurm-\"$SLURM_JOB_ID\"\n" in script
    assert 'run_args=(--resume "$run_dir")' in script and 'scontrol requeue "$SLURM_JOB_ID"' in script
    assert launch_line(script).endswith('"${run_args[@]}"')
    assert "--signal=B:USR1@600" in directives(render_job(request("delta", signal_lead=600)))
    quiet = render_job(request("delta", signal_lead=0))
    assert not any(line.startswith(("--signal", "--requeue")) for line in directives(quiet))
    assert "run_args" not in quiet
    study = render_job(request("perlmutter", array=2, extra_args=("--models", "hep-cnn", "--methods", "baseline",
                                                                    "--out", "study")))
    assert not any(line.startswith(("--signal", "--requeue")) for line in directives(study))
    with pytest.raises(ValueError, match="--signal-lead -1 must be whole seconds"):
        render_job(request("delta", signal_lead=-1))


@pytest.mark.parametrize("fields, message", [
    (dict(gpus_per_node=2, cpus_per_task=8, tasks_per_node=3), "--tasks-per-node 3 must equal --gpus-per-node 2"),
    (dict(gpus_per_node=8), "more than the 4 GPUs of a perlmutter node"),
    (dict(gpus_per_node=4, cpus_per_task=64), "more than the 128 CPUs of a perlmutter node; use at most 32"),
    (dict(qos="shared", nodes=2, gpus_per_node=1), "QOS 'shared' on perlmutter shares one node"),
])
def test_perlmutter_refuses_what_it_cannot_honour(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        render_job(request("perlmutter", **fields))


def test_node_shape_options_are_honoured_not_dropped():
    lines = directives(render_job(request("perlmutter", gpus_per_node=2, cpus_per_task=8)))
    assert {"--ntasks-per-node=2", "--gpus-per-node=2", "--cpus-per-task=8"} <= set(lines)
    shared = render_job(request("perlmutter", qos="shared", gpus_per_node=1))
    assert {"--qos=shared", "--ntasks-per-node=1", "--gpus-per-node=1", "--cpus-per-task=32"} <= set(directives(shared))
    assert "export OMP_NUM_THREADS=16" in shared  # 32 hardware threads are 16 cores
    delta = render_job(request("delta", gpus_per_node=1, cpus_per_task=16))
    assert {"--ntasks-per-node=1", "--gpus-per-node=1"} <= set(directives(delta))
    with pytest.raises(ValueError, match="system 'local' runs CPU ranks and has no GPUs"):
        render_job(request("local", gpus_per_node=1))
