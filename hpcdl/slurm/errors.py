"""The error of a job request Slurm cannot take, or of Slurm's own answer."""

from hpcdl.errors import HpcdlError


class SlurmError(HpcdlError, ValueError):
    """A job request that cannot become a script (a field, the system, the command), or sbatch/squeue refusing it."""
