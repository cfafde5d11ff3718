"""``hpcdl slurm render|submit|status|systems``: Slurm batch jobs for national-lab GPU systems."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _add_job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--system", help="perlmutter, delta, generic-gpu or local (see `hpcdl slurm systems`)")
    parser.add_argument("--nodes", type=int, default=1, help="number of nodes (default 1)")
    parser.add_argument("--time", default="01:00:00", help="time limit, HH:MM:SS or D-HH:MM:SS (default 01:00:00)")
    parser.add_argument("--account", help="allocation to charge (required on perlmutter and delta)")
    parser.add_argument("--qos", help="quality of service (perlmutter default: regular; e.g. debug)")
    parser.add_argument("--partition", help="partition (delta default: gpuA100x4)")
    parser.add_argument("--job-name", help="job name (default hpcdl-<config>)")
    parser.add_argument("--output", help="sbatch --output pattern (default %%x-%%j.out)")
    parser.add_argument("--chdir", help="directory the job runs in (default: where it was submitted)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="training config override passed to the job (repeatable)")
    parser.add_argument("--array", type=int, metavar="N",
                        help="a study sweep as an array of N tasks: task i runs `hpcdl study run ... --shard i/N` "
                             "(put the study's arguments after `--`)")
    parser.add_argument("--setup", action="append", default=[], metavar="LINE",
                        help="shell line run before the ranks start, e.g. 'source ~/venvs/hpcdl/bin/activate' "
                             "(repeatable)")
    parser.add_argument("--tasks-per-node", type=int,
                        help="ranks per node (local system, default 2; on GPU systems it must equal --gpus-per-node)")
    parser.add_argument("--cpus-per-task", type=int,
                        help="CPUs per rank (perlmutter default 32, delta 16, generic-gpu 8, local 1)")
    parser.add_argument("--gpus-per-node", type=int,
                        help="GPUs (= ranks) per node (default 4; e.g. 1 with --qos shared on perlmutter)")
    parser.add_argument("--signal-lead", type=int, default=120, metavar="SECONDS",
                        help="a training job gets SIGUSR1 this long before its time limit, checkpoints, requeues "
                             "itself and resumes (default 120; 0 = no signal, no requeue)")
    parser.add_argument("--sbatch-option", dest="extra_directives", action="append", default=[], metavar="OPTION",
                        help="another #SBATCH line, e.g. --sbatch-option=--mail-type=END (repeatable)")
    parser.add_argument("config", help="shipped training config name (e.g. climate-deeplab) or a YAML path")
    parser.add_argument("job_args", nargs="*", metavar="-- ARGS",
                        help="more arguments for `hpcdl train` (or, with --array, `hpcdl study run`), after `--`; "
                             "options of this command go before CONFIG")


def register(subparsers) -> None:
    slurm = subparsers.add_parser(
        "slurm", help="render, submit and follow Slurm batch jobs (Perlmutter, Delta, any GPU cluster, local)",
        description="Slurm batch jobs that run `hpcdl train CONFIG` data-parallel with one rank per GPU, from "
                    "templates holding each system's node, GPU, CPU-binding and module lines.")
    commands = slurm.add_subparsers(dest="slurm_command", metavar="SUBCOMMAND", required=True)

    render = commands.add_parser(
        "render", help="print a ready sbatch script",
        usage="hpcdl slurm render --system SYSTEM [options] CONFIG [-- ARGS...]",
        description="Print a ready sbatch script, e.g. `hpcdl slurm render --system perlmutter --nodes 8 "
                    "--time 02:00:00 --account m1234 climate-deeplab > job.sh`.")
    _add_job_arguments(render)
    render.set_defaults(handler=_render)

    submit = commands.add_parser(
        "submit", help="render a job and submit it with sbatch; prints the job id",
        usage="hpcdl slurm submit --system SYSTEM [options] CONFIG [-- ARGS...]",
        description="Render the job as `render` does, submit it with sbatch and print the job id.")
    submit.add_argument("--save", metavar="PATH", help="also write the submitted script here")
    submit.add_argument("--wait", action="store_true",
                        help="wait until the job ends; print its final state; exit 1 unless it COMPLETED")
    submit.add_argument("--wait-timeout", type=float, default=24 * 3600, metavar="SECONDS",
                        help="give up waiting after this long (default a day)")
    _add_job_arguments(submit)
    submit.set_defaults(handler=_submit)

    status = commands.add_parser("status", help="your queued and running jobs, or one job wherever it is",
                                 description="Read squeue (and sacct or scontrol for finished jobs).")
    status.add_argument("job_id", nargs="?", help="a job id; default: all of your queued and running jobs")
    status.set_defaults(handler=_status)

    systems = commands.add_parser("systems", help="list the systems with job templates")
    systems.set_defaults(handler=_systems)


def _request(args: argparse.Namespace):
    from hpcdl.slurm import JobRequest

    return JobRequest(
        system=args.system, config=args.config, nodes=args.nodes, time=args.time, account=args.account,
        qos=args.qos, partition=args.partition, job_name=args.job_name, output=args.output, chdir=args.chdir,
        overrides=tuple(args.overrides), extra_args=tuple(args.job_args), array=args.array, setup=tuple(args.setup),
        tasks_per_node=args.tasks_per_node, cpus_per_task=args.cpus_per_task, gpus_per_node=args.gpus_per_node,
        extra_directives=tuple(args.extra_directives), signal_lead=args.signal_lead,
    )


def _render(args: argparse.Namespace) -> int:
    from hpcdl.cli import check_command
    from hpcdl.slurm import render_job

    sys.stdout.write(render_job(_request(args), check_command=check_command))
    return 0


def _submit(args: argparse.Namespace) -> int:
    from hpcdl.cli import check_command
    from hpcdl.slurm import format_jobs, render_job, submit_script, wait_for_job

    script = render_job(_request(args), check_command=check_command)
    if args.save:
        Path(args.save).write_text(script)
    job_id = submit_script(script)
    print(job_id, flush=True)
    if not args.wait:
        return 0
    jobs = wait_for_job(job_id, timeout=args.wait_timeout)
    print(format_jobs(jobs))
    return 0 if all(job.succeeded for job in jobs) else 1


def _status(args: argparse.Namespace) -> int:
    import getpass

    from hpcdl.slurm import format_jobs, job_status

    jobs = job_status(args.job_id, user=None if args.job_id else getpass.getuser())
    print(format_jobs(jobs))
    return 0


def _systems(args: argparse.Namespace) -> int:
    from hpcdl.slurm import SYSTEMS

    width = max(len(name) for name in SYSTEMS)
    for system in SYSTEMS.values():
        needs = f" [needs --{', --'.join(system.required)}]" if system.required else ""
        print(f"{system.name.ljust(width)}  {system.description}{needs}")
    return 0
