"""``ShardedLoader``: the batches of one rank's shard of a data set, shuffled per epoch, prefetched.

Sharding. Each epoch every rank draws the same permutation of all N sample indices (seeded by
``(seed, epoch)``) and takes every ``world_size``-th entry starting at its rank, so shards are
disjoint. Shards must be equal in size (every rank takes the same number of steps, or the
gradient all-reduce would hang):

- ``drop_last=True`` (default): the permutation's last ``N mod world_size`` entries are dropped,
  so each sample is read at most once per epoch and, because the permutation changes every
  epoch, no sample is dropped for good; an incomplete last batch is dropped too.
- ``drop_last=False``: the permutation is padded by wrapping around to a multiple of
  ``world_size`` (those few samples are read twice that epoch), and an incomplete last batch is kept.

When N is a multiple of ``world_size`` both read every sample exactly once per epoch.

Prefetch. A background thread reads and collates up to ``prefetch`` batches ahead of the
training loop. A thread rather than worker processes because the work is I/O plus a
normalisation (h5py/netCDF and numpy release the GIL for the copies), the batch order stays
trivially deterministic, nothing is pickled or copied between processes, and the HDF5/netCDF
handles are never shared across a fork (all library calls run in the one I/O owner thread, see
``io_thread``; a forked child starts its own, so the datasets also work under a torch DataLoader
with worker processes). An iteration that stops early (``break``, an exception, ``close()`` of
the iterator) stops and joins its thread before it returns, so no reader of an earlier loop is
still running when the next one starts.

Resume. ``state_dict()`` records the epoch and the number of batches already handed out;
``load_state_dict`` makes the next iteration continue from exactly the next batch.
"""

from __future__ import annotations

import queue
import threading

import numpy as np
import torch

_DONE = object()


class ShardedLoader:
    """Iterate over ``(x, y)`` batches of rank ``rank``'s shard of ``dataset`` for the current epoch."""

    def __init__(self, dataset, batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = True, prefetch: int = 2) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0 batches, got {prefetch}")
        if drop_last and len(dataset) < world_size * batch_size:
            raise ValueError(f"{len(dataset)} samples give no full batch of {batch_size} on each of {world_size} "
                             "ranks; use a smaller batch, fewer ranks or drop_last=False")
        self.dataset = dataset
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.seed, self.shuffle, self.drop_last, self.prefetch = seed, shuffle, drop_last, prefetch
        self.epoch = 0
        self.position = 0  # batches of this epoch already handed out

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; a different epoch starts from its first batch."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = 0

    def shard_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's sample indices, in reading order, for ``epoch`` (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        n = len(self.dataset)
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(n)
        else:
            order = np.arange(n)
        if self.drop_last:
            order = order[: n - n % self.world_size]
        else:
            padded = -(-n // self.world_size) * self.world_size
            order = np.concatenate([order, order[: padded - n]])
        return order[self.rank :: self.world_size]

    def __len__(self) -> int:
        per_rank = len(self.shard_indices())
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def _batches(self, start: int):
        indices = self.shard_indices()
        for b in range(start, len(self)):
            chosen = indices[b * self.batch_size : (b + 1) * self.batch_size]
            fetch = getattr(self.dataset, "__getitems__", None)  # a whole batch at once, where the data set can
            items = fetch([int(i) for i in chosen]) if fetch else [self.dataset[int(i)] for i in chosen]
            yield torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    def __iter__(self):
        if self.position >= len(self):
            self.position = 0  # the previous pass over this epoch finished: start it again
        source = self._batches(self.position) if self.prefetch == 0 else self._prefetched(self.position)
        try:
            for batch in source:
                self.position += 1
                yield batch
        finally:
            source.close()  # an iteration stopped early joins its prefetch thread here, not when collected
        self.position = 0

    def _prefetched(self, start: int):
        buffer: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item) -> bool:
            """Hand ``item`` over unless the consumer stopped (it may stop early and never drain the buffer)."""
            while not stop.is_set():
                try:
                    buffer.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                for batch in self._batches(start):
                    if not put(batch):
                        return
                put(_DONE)
            except BaseException as err:  # handed to the training loop, which re-raises it
                put(err)

        worker = threading.Thread(target=produce, name="hpcdl-prefetch", daemon=True)
        worker.start()
        try:
            while True:
                item = buffer.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            worker.join()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size, "batch_size": self.batch_size, "num_samples": len(self.dataset),
                "shuffle": self.shuffle, "drop_last": self.drop_last}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; the data set, world size, batch size and seed must match."""
        current = self.state_dict()
        for key in ("seed", "world_size", "batch_size", "num_samples", "shuffle", "drop_last"):
            if state[key] != current[key]:
                raise ValueError(f"cannot resume: the saved loader has {key}={state[key]!r}, this one "
                                 f"{current[key]!r}; resume with the same data and settings")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
