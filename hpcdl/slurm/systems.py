"""The Slurm systems hpcdl has job templates for, and what each one requires.

Each template is ``hpcdl/slurm/templates/<system>.sbatch`` (also reachable as ``jobs/slurm/`` in a checkout):
a complete sbatch script with ``{{name}}`` placeholders, holding the node, GPU, CPU-binding, module and
environment lines of that system as its user guide gives them. What varies per job (account, nodes,
time, job name, array) is rendered into ``{{directives}}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources

from hpcdl.slurm.errors import SlurmError


@dataclass(frozen=True)
class SlurmSystem:
    """One system: its template, which request fields it needs, and its defaults."""

    name: str
    description: str
    template: str  # file name under hpcdl/slurm/templates
    required: tuple[str, ...] = ()  # JobRequest fields that must be given, e.g. ("account",)
    defaults: dict = field(default_factory=dict)  # JobRequest field -> value when not given
    gpu: bool = True
    gpus_per_node_max: int | None = None  # None: any (generic clusters)
    cpus_per_node: int | None = None  # logical CPUs a node offers to --cpus-per-task x tasks; None: any
    threads_per_core: int = 1  # OMP_NUM_THREADS = cpus_per_task / threads_per_core (one thread per core)
    single_node_qos: tuple[str, ...] = ()  # QOS values whose jobs share one node (e.g. Perlmutter's shared)

    def template_text(self) -> str:
        return (resources.files("hpcdl.slurm") / "templates" / self.template).read_text()


SYSTEMS: dict[str, SlurmSystem] = {
    system.name: system
    for system in (
        SlurmSystem(
            "perlmutter",
            "NERSC Perlmutter GPU nodes (4x A100 per node, -C gpu, QOS regular; --qos shared --gpus-per-node 1 "
            "for part of a node)",
            "perlmutter.sbatch",
            required=("account",),
            defaults={"qos": "regular", "gpus_per_node": 4, "cpus_per_task": 32},
            gpus_per_node_max=4,
            cpus_per_node=128,  # 64 cores x 2 hardware threads
            threads_per_core=2,
            single_node_qos=("shared",),
        ),
        SlurmSystem(
            "delta",
            "NCSA Delta A100 nodes (partition gpuA100x4, 4x A100 per node)",
            "delta.sbatch",
            required=("account",),
            defaults={"partition": "gpuA100x4", "gpus_per_node": 4, "cpus_per_task": 16},
            gpus_per_node_max=4,
            cpus_per_node=64,
        ),
        SlurmSystem(
            "generic-gpu",
            "any Slurm cluster with NVIDIA GPU nodes (--gpus-per-node, --cpus-per-task, --partition)",
            "generic-gpu.sbatch",
            defaults={"gpus_per_node": 4, "cpus_per_task": 8},
        ),
        SlurmSystem(
            "local",
            "CPU ranks under mpirun on a local or test Slurm cluster (tools/slurm_cluster.sh)",
            "local-cpu.sbatch",
            defaults={"tasks_per_node": 2, "cpus_per_task": 1},
            gpu=False,
        ),
    )
}


def get_system(name: str | None) -> SlurmSystem:
    if not name:
        raise SlurmError(f"a system is required (--system); choose one of {', '.join(SYSTEMS)}")
    try:
        return SYSTEMS[name]
    except KeyError:
        raise SlurmError(f"unknown Slurm system {name!r}; choose one of {', '.join(SYSTEMS)}") from None
