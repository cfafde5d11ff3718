"""The training loop: ``run_training(config) -> RunResult``.

One process per rank. The global batch ``train.batch`` is split evenly over
the ranks, each rank reads its strided share of one global, seeded sample
order, and the backend averages gradients, so a run on N ranks takes the same
optimizer steps as one rank on the same global batch. Per step, the forward
runs under the configured activation method (an object of
:mod:`hpcdl.runtime.methods`, built by :func:`hpcdl.train.activation.activation_method`):

- ``none``: plain autograd (the baseline);
- ``codec``: inside ``hpcdl.compressed(model, policy)``, which compresses what
  autograd saves with the configured codec;
- ``recompute``: each of the model's blocks (``ModelFamily.blocks``) recomputed
  in backward (``torch.utils.checkpoint``, non-reentrant; PyTorch's activation
  checkpointing, once spelled ``checkpoint`` here);
- ``offload``: saved tensors moved to pinned host memory
  (``torch.autograd.graph.save_on_cpu``), CUDA only;
- ``recompute+codec``, ``recompute+offload``: the blocks recomputed, and what
  the model saves (block inputs, the rest; with a codec also what each block's
  recomputation saves) compressed or offloaded.

The step itself is :func:`hpcdl.runtime.methods.train_step`, the same function
the batch search (:mod:`hpcdl.memory`) measures, with this run's optimizer.

Every step is seeded from (seed, step, rank), so a run resumed from a
checkpoint replays exactly the random numbers (dropout masks) the
uninterrupted run would have drawn.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Subset

from hpcdl.memory.peak import PeakMemory
from hpcdl.runtime import methods
from hpcdl.train import checkpoint as ckpt
from hpcdl.train.activation import activation_method, compression_policy, method_name
from hpcdl.train.config import canonical_method, check_run_name, load_config
from hpcdl.train.evaluate import ValidationSums
from hpcdl.train.inputs import datasets, model_options
from hpcdl.train.optim import build_optimizer, build_scheduler, optimizer_factory
from hpcdl.train.progress import Progress
from hpcdl.train.runlog import RunLog, latest_run_dir, new_run_dir
from hpcdl.train.signals import StopRequest, TrainingInterrupted

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What one training run measured; also written to ``summary.json``."""

    run_dir: str
    epochs: list[dict]  # per epoch: {epoch, step, train_loss, val_loss, val_metric, val_<metric name>}
    metric_name: str  # "auc", "accuracy" or "miou"
    median_step_time_s: float
    samples_per_s: float  # global batch / median step time
    activation_original_bytes: int  # summed over all steps of this process
    activation_packed_bytes: int
    activation_ratio: float
    per_module: dict[str, dict]  # {module: {"original": int, "packed": int, "ratio": float}}
    peak_memory_bytes: int  # see hpcdl.train.peak for what is measured
    peak_memory_kind: str  # "cuda_max_allocated" or "cpu_peak_rss_delta"
    wall_time_s: float
    batch_size: int  # global batch
    per_device_batch: int
    world_size: int
    rank: int  # of the process that returned this result; rank 0 wrote the run directory
    steps: int
    method: str  # "none", "codec:<spec>", "recompute" or "offload"
    resumed_from_step: int | None = None
    config: dict = field(default_factory=dict)
    model_options: dict = field(default_factory=dict)  # constructor arguments the model was built with
    # train.batch: auto: {"budget_bytes", "per_device_batch", "peak_bytes", "probes": {batch: measured peak}}
    batch_search: dict | None = None

    @property
    def final_val_metric(self) -> float:
        return self.epochs[-1]["val_metric"] if self.epochs else float("nan")


def _seed_step(seed: int, step: int, rank: int) -> None:
    torch.manual_seed((seed * 1_000_003 + step) * 1_009 + rank)


def measured_batch_search(config: dict, model_options: dict, budget_bytes: int, device: str = "cpu",
                          **search_options):
    """The largest per-device batch of this config's model and method whose measured step peak fits.

    Each probe measures :func:`hpcdl.runtime.methods.train_step` under this config's activation
    method with this config's optimizer (rebuilt in the measuring process from the ``optimizer``
    section; its learning rate is taken at ``optimizer.base_batch``, which changes no memory).
    ``search_options`` go to :func:`hpcdl.memory.search_batch` (``limit=``, ``process=``, ...).
    Returns :class:`hpcdl.memory.BatchSearch` (batch size, its peak, every probe).
    """
    from hpcdl import memory

    optimizer = config["optimizer"]
    workload = (config["model"]["name"], config["model"]["scale"], model_options)
    return memory.search_batch(workload, None, budget_bytes, device=device, seed=config["train"]["seed"],
                               method=activation_method(config["compression"]),
                               optimizer=optimizer_factory(optimizer, optimizer["base_batch"]), **search_options)


def _auto_batch(config: dict, model_options: dict, backend):
    """``train.batch: auto``: the measured search for the largest per-device batch under the budget."""
    budget = config["train"]["memory_budget"]
    if budget is None:
        if backend.device.type != "cuda":
            raise ValueError("train.batch: auto needs train.memory_budget (e.g. 2GiB) on a CPU; on a GPU it "
                             "defaults to the device's memory")
        budget = torch.cuda.get_device_properties(backend.device).total_memory
    return measured_batch_search(config, model_options, budget, str(backend.device))


def _resume_source(resume, config: dict) -> tuple[Path, Path, dict]:
    """(run directory, checkpoint file, its state) to resume from.

    ``resume`` names a checkpoint file (exactly that one is loaded), a run directory, or (True) the newest run;
    from a directory, the newest checkpoint that loads (see :func:`checkpoint.load_latest_good`).
    """
    if resume is True:
        run_dir = latest_run_dir(config["logging"]["out_dir"], config["name"])
    else:
        run_dir = Path(resume)
    if run_dir.is_file():
        return run_dir.parent.parent, run_dir, ckpt.load_checkpoint(run_dir)
    path, state = ckpt.load_latest_good(run_dir / "checkpoints")
    return run_dir, path, state


def _identity(config: dict, global_batch: int) -> dict:
    """What a checkpoint must share with the run that resumes it."""
    return {
        "model": config["model"], "dataset": config["data"]["dataset"], "features": config["data"]["features"],
        "val_fraction": config["data"]["val_fraction"], "global_batch": global_batch, "seed": config["train"]["seed"],
        "optimizer": config["optimizer"]["name"], "compression": config["compression"]["method"],
    }


class _Run:
    """The state of one training run on one rank; :func:`run_training` drives it."""

    def __init__(self, config: dict, run_dir, progress: bool, resume):
        from hpcdl import models
        from hpcdl.data import ShardedLoader
        from hpcdl.train.distributed import init_backend

        self.config, self.progress = config, progress
        self.start = time.perf_counter()
        self.backend = init_backend(config["distributed"]["backend"])
        rank, size = self.backend.rank, self.backend.size
        self.family = models.family(config["model"]["name"])
        scale = config["model"]["scale"]
        self.family.scale(scale)  # unknown scale: the registry's error, before any data is read
        self.train_set, self.val_set = datasets(config, self.family)
        self.model_options = options = model_options(config, self.family, self.train_set)

        batch, self.batch_search = config["train"]["batch"], None
        if batch == "auto":
            self.batch_search = _auto_batch(config, options, self.backend)
            batch = self.batch_search.batch_size * size
        self.global_batch = batch
        if self.global_batch % size:
            raise ValueError(f"train.batch {self.global_batch} (the global batch) must divide evenly over {size} ranks")
        self.per_device = self.global_batch // size

        torch.manual_seed(config["train"]["seed"])  # same initial weights on every rank and for every method
        self.model = self.family.build(scale, **options).to(self.backend.device)
        compression = config["compression"]
        self.method = method_name(compression)
        self.policy = compression_policy(compression)
        if self.policy is not None:
            self.policy.average_over(self.backend.ranks())
        self.activation = activation_method(compression, self.family.blocks, self.policy)
        self.activation.prepare(self.model)

        self.loader = ShardedLoader(self.train_set, self.per_device, rank=rank, world_size=size,
                                    seed=config["train"]["seed"], shuffle=True, drop_last=True)
        cap = config["train"]["steps_per_epoch"]
        self.steps_per_epoch = min(len(self.loader), cap) if cap else len(self.loader)
        self.total_steps = self.steps_per_epoch * config["train"]["epochs"]

        self.ddp_model = self.backend.wrap_model(self.model)
        optimizer = build_optimizer(self.model.parameters(), config["optimizer"], self.global_batch)
        self.optimizer = self.backend.wrap_optimizer(optimizer, self.model)
        self.scheduler = build_scheduler(self.optimizer, config["optimizer"], self.total_steps)
        self.step, self.resumed_from = 0, None
        self.epochs: list[dict] = []
        self.epoch_losses: list[float] = []  # this rank's step losses in the current epoch

        if resume:
            self.run_dir, checkpoint_path, state = _resume_source(resume, config)
            if self.backend.is_root:
                ckpt.remove_stale_temporaries(self.run_dir / "checkpoints")
            self._restore(checkpoint_path, state)
        else:
            self.run_dir = Path(run_dir) if run_dir else self._new_run_dir()
            self.backend.broadcast_state(self.model, self.optimizer)
        self.log = RunLog(self.run_dir, writes=self.backend.is_root, tensorboard=config["logging"]["tensorboard"],
                          mlflow=config["logging"]["mlflow"], mlflow_uri=config["logging"]["mlflow_uri"])
        self.stop = StopRequest()  # entered by run_training around run()

    def _new_run_dir(self) -> Path:
        # Rank 0's clock names the directory; the mean of (t, 0, 0, ...) times size carries it to every rank.
        now = time.time() if self.backend.is_root else 0.0
        stamp = round(self.backend.allreduce_mean({"t": now})["t"] * self.backend.size)
        return new_run_dir(self.config["logging"]["out_dir"], self.config["name"], stamp)

    def _state(self) -> dict:
        return {
            "identity": _identity(self.config, self.global_batch),
            "epoch_records": self.epochs,
            "epoch_losses": self.epoch_losses,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "loader": self.loader.state_dict(),
            "rng": ckpt.rng_state(),
            "compression": self.policy.state_dict() if self.policy is not None else {},
        }

    def _restore(self, path: Path, state: dict) -> None:
        """Continue from ``state``, the checkpoint loaded from ``path``: weights, optimizer, schedule, data
        position, every random generator (torch, NumPy, Python) and the compression policy."""
        saved = state.get("identity", {})
        if isinstance(saved.get("compression"), str):  # a checkpoint of a run that spelled recompute "checkpoint"
            saved["compression"] = canonical_method(saved["compression"])
        ckpt.check_compatible(state, _identity(self.config, self.global_batch), path)
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise ckpt.CheckpointError(f"checkpoint {path} does not fit this model/optimizer: {err}") from None
        self.scheduler.load_state_dict(state["scheduler"])
        self.loader.load_state_dict(state["loader"])
        ckpt.set_rng_state(state["rng"])
        if self.policy is not None and state["compression"]:
            try:
                self.policy.load_state_dict(state["compression"])
            except ValueError as err:
                raise ckpt.CheckpointError(f"checkpoint {path}: its compression policy state does not fit this "
                                           f"run's policy: {err}") from None
        self.step = self.resumed_from = state["step"]
        self.epochs = list(state["epoch_records"])
        self.epoch_losses = list(state["epoch_losses"])

    def _save(self) -> Path:
        """Rank 0 writes the checkpoint of the current step; every rank returns its path."""
        if self.backend.is_root:
            ckpt.save_checkpoint(self.run_dir / "checkpoints", self.step, self._state(),
                                 keep=self.config["checkpoint"]["keep"])
        return self.run_dir / "checkpoints" / ckpt.checkpoint_name(self.step)

    def _stop_if_signalled(self) -> None:
        """At a step boundary: if any rank got SIGUSR1/SIGTERM, all checkpoint this step and stop together."""
        if self.stop.agreed(self.backend):
            path = self._save()
            self.backend.barrier()  # the checkpoint is on disk before any rank exits
            raise TrainingInterrupted(self.stop.name, self.step, str(path))

    def _train_step(self, x, y, stats) -> float:
        device = self.backend.device
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        _seed_step(self.config["train"]["seed"], self.step, self.backend.rank)
        result = methods.train_step(self.model, self.activation, x, y, self.family.loss, self.optimizer,
                                    forward=self.ddp_model, scheduler=self.scheduler,
                                    reduced_gradients=self.backend.reduced_gradients)
        if result.stats is not None:
            for key, row in result.stats.rows.items():
                stats.rows[key].add(row)
        value = result.loss.item()
        if not math.isfinite(value):
            raise FloatingPointError(f"training loss became {value} at step {self.step}; lower optimizer.lr or "
                                     "check the data")
        return value

    @torch.no_grad()
    def _validate(self) -> dict:
        self.model.eval()
        rank, size = self.backend.rank, self.backend.size
        indices = list(range(rank, len(self.val_set), size))
        batches = DataLoader(Subset(self.val_set, indices), batch_size=self.per_device)
        sums = ValidationSums(self.family.task, self.family.num_classes, miou=self.config["train"]["miou"])
        cap = self.config["train"]["val_steps"]
        for index, (x, y) in enumerate(batches):
            if cap is not None and index >= cap:
                break
            x, y = x.to(self.backend.device), y.to(self.backend.device)
            logits = self.model(x)
            sums.update(logits, y, float(self.family.loss(logits, y)))
        self.model.train()
        totals = {k: v * size for k, v in self.backend.allreduce_mean(sums.sums).items()}
        return sums.metrics(totals)

    def run(self) -> RunResult:
        from hpcdl.runtime.stats import Stats

        config = self.config
        self.log.write_config(config)
        self.log.open_metrics(keep_through_step=self.resumed_from)
        every_ckpt, every_log = config["checkpoint"]["every_steps"], config["logging"]["every_steps"]
        stats, step_times = Stats(), []
        peak = PeakMemory(self.backend.device)
        bar = Progress(config["name"], self.total_steps, self.step,
                       enabled=self.progress and config["logging"]["progress"] and self.backend.is_root)
        peak.start()
        first_epoch = len(self.epochs)  # epochs finished and validated; a resumed one may be part-trained
        for epoch in range(first_epoch, config["train"]["epochs"]):
            if not (self.resumed_from is not None and epoch == first_epoch):
                self.loader.set_epoch(epoch)  # a resumed epoch continues from the restored loader position
                self.epoch_losses = []
            # closing(): an epoch cut short by steps_per_epoch joins its prefetch thread before validation
            with contextlib.closing(iter(self.loader)) as batches:
                for x, y in batches:
                    if self.step >= (epoch + 1) * self.steps_per_epoch:
                        break
                    began = time.perf_counter()
                    loss = self._train_step(x, y, stats)
                    step_times.append(time.perf_counter() - began)
                    self.step += 1
                    self.epoch_losses.append(loss)
                    bar.update(self.step, epoch, loss)
                    if self.step % every_log == 0:
                        self._log_step(epoch, loss, step_times[-1], stats, peak)
                    self._log_compression(epoch)
                    if every_ckpt and self.step % every_ckpt == 0 and self.step < self.total_steps:
                        self._save()
                    self._stop_if_signalled()
            mean_loss = self.backend.allreduce_mean(
                {"loss": sum(self.epoch_losses) / max(len(self.epoch_losses), 1)})["loss"]
            record = {"epoch": epoch, "step": self.step, "train_loss": mean_loss, **self._validate()}
            self.epochs.append(record)
            self.log.log({"kind": "val", **record})
        bar.close()
        self._save()
        result = self._result(stats, step_times, peak)
        self.log.write_summary(asdict(result))
        self.log.write_hparams(config, {f"final/{key}": value for key, value in (self.epochs or [{}])[-1].items()})
        self.log.close()
        return result

    def close_data(self) -> None:
        """Close this run's data files now, so a later run in this process starts with none of them open."""
        for data in (self.train_set, self.val_set):
            if hasattr(data, "close"):  # file-backed data sets; random and synthetic data hold no files
                data.close()

    def _log_step(self, epoch: int, loss: float, step_time: float, stats, peak: PeakMemory) -> None:
        self.log.log({
            "kind": "train", "step": self.step, "epoch": epoch, "loss": loss,
            "lr": self.optimizer.param_groups[0]["lr"],
            "samples_per_s": self.global_batch / step_time, "step_time_s": step_time,
            "activation_ratio": stats.ratio if self.policy is not None else None,
            # Running totals, so that the ratio of any span of steps is a difference (hpcdl.study.decisions).
            "activation_original_bytes": stats.original_bytes if self.policy is not None else None,
            "activation_packed_bytes": stats.packed_bytes if self.policy is not None else None,
            "peak_memory_bytes": peak.bytes(),
        })

    def _log_compression(self, epoch: int) -> None:
        """A ``"compression"`` record of what the policy's controller decided, whenever it reports something
        (the adaptive controller: after each probe; docs/adaptive.md)."""
        report = self.policy.controller.report() if self.policy is not None else None
        if report is not None:
            self.log.log({"kind": "compression", "step": self.step, "epoch": epoch, **report})

    def _batch_search_record(self) -> dict | None:
        """The batch search behind ``train.batch: auto``; every peak is the one it held to the budget: a step's,
        or its method's learning steps' (an adaptive policy's first probe) where higher."""
        search = self.batch_search
        if search is None:
            return None
        return {"budget_bytes": search.budget_bytes, "per_device_batch": search.batch_size,
                "peak_bytes": search.report.worst_bytes,
                "probes": {str(batch): report.worst_bytes for batch, report in search.probes}}

    def _result(self, stats, step_times: list[float], peak: PeakMemory) -> RunResult:
        median = statistics.median(step_times) if step_times else float("nan")
        per_module = {name: {"original": row["original"], "packed": row["packed"], "ratio": row["ratio"]}
                      for name, row in stats.per_module().items()}
        return RunResult(
            run_dir=str(self.run_dir), epochs=self.epochs,
            metric_name=ValidationSums(self.family.task, self.family.num_classes).name,
            median_step_time_s=median, samples_per_s=self.global_batch / median if step_times else float("nan"),
            activation_original_bytes=stats.original_bytes, activation_packed_bytes=stats.packed_bytes,
            activation_ratio=stats.ratio, per_module=per_module,
            peak_memory_bytes=peak.bytes(),
            peak_memory_kind="cuda_max_allocated" if self.backend.device.type == "cuda" else "cpu_peak_rss_delta",
            wall_time_s=time.perf_counter() - self.start, batch_size=self.global_batch,
            per_device_batch=self.per_device, world_size=self.backend.size, rank=self.backend.rank, steps=self.step, method=self.method,
            resumed_from_step=self.resumed_from, config=self.config,
            model_options=self.model_options, batch_search=self._batch_search_record(),
        )


def run_training(config: dict | str, run_dir: str | Path | None = None, progress: bool = True,
                 resume: bool | str | Path = False, overrides: list[str] | tuple[str, ...] = ()) -> RunResult:
    """Train as ``config`` says (a config dict, e.g. from :func:`load_config`, or a name/path) and return what it measured.

    ``run_dir``: where to write (default ``logging.out_dir/<name>-<timestamp>``).
    ``resume``: True (the newest run of this config under ``logging.out_dir``), a
    run directory, or a checkpoint file; training continues from its latest
    checkpoint to the same result the uninterrupted run would have reached.
    """
    config = load_config(config, overrides)  # validates a dict too; a resolved config resolves to itself
    if run_dir is None and resume in (False, True):
        check_run_name(config["name"])  # it will name the run directory: say so before any work
    run = _Run(config, run_dir, progress, resume)
    try:
        with run.stop:
            result = run.run()
        run.backend.barrier()  # only after success: a failed rank must not leave the others waiting here
        return result
    except TrainingInterrupted:
        run.log.close("KILLED")  # checkpointed on a signal: the MLflow run says stopped, not finished
        raise
    except BaseException:
        run.log.close("FAILED")
        raise
    finally:
        run.close_data()
        run.log.close()
        run.backend.shutdown()
