"""``hpcdl.compressed(model, policy)``: compress what autograd saves for backward, and give it back on demand.

The session is a ``torch.autograd.graph.saved_tensors_hooks`` context plus
forward pre/post hooks on every submodule (to know which module is saving).

Pack (during forward), for each saved tensor:

* parameters, buffers and views of them are returned as they are (they stay
  alive anyway); so are tensors under ``threshold`` bytes, non-strided
  tensors and dtypes no codec takes;
* a storage span that is already packed at the same version (a ReLU output
  the next conv saves again, a transposed view) is shared, not packed again;
* what an op whose backward compares its saved tensors for equality saves
  (``amax``, a whole-tensor ``max``, an infinity norm:
  :mod:`hpcdl.runtime.exact_saves`) is kept as it is, whatever its size, and
  shares only entries kept as they are;
* a small floating tensor saved inside the model's forward is copied into its
  module's arena (:mod:`hpcdl.runtime.arena`), which is encoded as a whole
  when the open arenas pass ``arena_bytes``, when the model's forward ends or
  when the session closes;
* otherwise the policy picks a codec by kind (bool -> ``bitmask``, integer ->
  ``int``, floating -> the policy's codec) and what the view's :class:`Layout`
  packs (its storage span, or its distinct elements) is encoded at once.
  Nothing in the session keeps a reference to the original, so autograd's
  copy is freed as soon as the forward code drops it. A codec that raises
  leaves the tensor as it is, with a :class:`CompressionFallbackWarning`.

Unpack (during backward) decodes into a fresh tensor and returns the view
autograd saved (same size; same strides and offset when its span was packed)
without ever writing into it, so expanded and overlapping views restore too. A decoded span is reused by a
second view only while the first unpacked tensor is still alive (the session's
:class:`~hpcdl.runtime.stats.Stats` count the decoded bytes alive, through a
finalizer on each decoded storage, and their peak). Packed data
lives in entries owned by the handles autograd holds, so it is freed as soon
as autograd drops the graph (after backward) or when :meth:`Session.release`
is called.

:meth:`Session.recompute` runs a block whose forward is recomputed in backward,
with what the recomputation saves packed by this session too
(:mod:`hpcdl.runtime.recompute`).
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator

import torch

from hpcdl.compress import Codec, Packed, check_bound
from hpcdl.errors import HpcdlRunError
from hpcdl.runtime.arena import DEFAULT_ARENA_BYTES, Arenas, Slot, member_codec
from hpcdl.runtime.chunked import DEFAULT_CHUNK_BYTES, chunked_layers
from hpcdl.runtime.classify import Footprint, Layout, ModelStorages, is_plain_strided, kind_of, normalized_channels
from hpcdl.runtime.concat import concat_gradients
from hpcdl.runtime.exact_saves import ExactSaves, saving_for_equality
from hpcdl.runtime.observe import OUTSIDE, Frame, ModuleTracker
from hpcdl.runtime.policy import Policy, SavedTensorInfo, as_policy
from hpcdl.runtime.recompute import RecomputedBlock
from hpcdl.runtime.stats import Row, Stats

DEFAULT_THRESHOLD = 64 * 1024

_active = threading.local()


# The session's own tensor calls in its hooks (the codecs': most of a compressed forward's calls) run without
# torch-function modes, so that the ExactSaves mode, which watches the model's calls, does not see them.
_OWN_WORK = getattr(torch._C, "DisableTorchFunction", contextlib.nullcontext)


class CompressionFallbackWarning(UserWarning):
    """A codec failed on a saved tensor; the tensor was kept uncompressed (once per module and policy)."""


class VerificationError(HpcdlRunError, AssertionError):
    """In ``verify=True`` mode, a decompressed tensor broke its codec's guarantee."""


class ReleasedError(HpcdlRunError, RuntimeError):
    """Backward asked for a saved tensor whose packed data was already released."""


class SavedTensorModifiedError(HpcdlRunError, RuntimeError):
    """A tensor the session kept as it is for backward was modified in place before backward read it (PyTorch
    refuses the same for the tensors it saves itself; a packed copy is not affected)."""


class _Entry:
    """One packed view (its storage span, or its distinct elements), shared by every handle that saved a view it holds.

    ``kept`` is the original tensor when nothing was encoded (no codec, or the
    codec failed); ``copy`` is an uncompressed copy of what the layout packs (a
    small view of a large storage); ``slot`` is its place in an arena (a small
    tensor compressed with others); otherwise ``packed`` holds the encoded data.
    """

    __slots__ = (
        "codec", "packed", "kept", "kept_version", "copy", "slot", "original", "layout", "storage", "dtype",
        "device", "row", "stats", "decoded", "decoded_layout", "decoded_finalizer", "handles", "released",
        "substitute", "__weakref__",
    )

    def __init__(self, tensor: torch.Tensor, layout: Layout, row: Row, stats: Stats):
        self.layout = layout
        self.storage = weakref.ref(tensor.untyped_storage())
        self.dtype, self.device = tensor.dtype, tensor.device
        self.row, self.stats = row, stats
        self.codec: Codec | None = None
        self.packed: Packed | None = None
        self.kept: torch.Tensor | None = None
        self.kept_version = tensor._version  # what ``kept`` must still be at when backward reads it
        self.copy: torch.Tensor | None = None
        self.slot: Slot | None = None
        self.original: torch.Tensor | None = None
        self.decoded = None  # weak reference to the storage of the last decoded span
        self.decoded_layout = None
        self.decoded_finalizer: weakref.finalize | None = None  # counts the span freed in the stats
        self.handles = 0  # live _SavedRefs: how many saved tensors autograd still holds through this entry
        self.released = False
        self.substitute: tuple[Codec, Packed] | None = None  # restored from instead, while Session.substituted

    def shares(self, tensor: torch.Tensor, footprint: Footprint) -> bool:
        """Whether ``tensor`` is a view this entry can rebuild: same live storage, inside a packed span."""
        if self.released or tensor.dtype != self.dtype or self.storage() is not tensor.untyped_storage():
            return False
        own = self.layout.footprint
        return footprint.within(own.lo, own.hi) if self.layout.span else footprint == own

    @property
    def uncompressed(self) -> bool:
        """Whether the entry holds its view as it is (kept, or a copy), not encoded."""
        return self.kept is not None or self.copy is not None

    @property
    def nbytes(self) -> int:
        if self.packed is not None:
            return self.packed.nbytes
        if self.copy is not None:
            return self.copy.numel() * self.copy.element_size()
        if self.slot is not None:
            return self.slot.nbytes
        return self.layout.numel * self.kept.element_size() if self.kept is not None else 0

    def restore(self, footprint: Footprint) -> torch.Tensor:
        if self.released:
            raise ReleasedError(
                "backward needs a saved activation whose packed data was released (session.release() ran before "
                "backward used it); run loss.backward() first and release afterwards, or do not call release()"
            )
        if self.substitute is not None:
            codec, packed = self.substitute
            return self.layout.rebuild(codec.decode(packed).contiguous(), footprint)
        if self.kept is not None:
            if self.kept._version != self.kept_version:
                raise SavedTensorModifiedError(
                    f"a {tuple(self.kept.shape)} {self.kept.dtype} tensor saved for backward (kept uncompressed) was "
                    "modified in place after it was saved, so backward would compute wrong gradients; do not modify "
                    "it in place (use the out-of-place op), or compress it (a packed copy is not affected)")
            return torch.as_strided(self.kept, footprint.size, footprint.stride, footprint.offset)
        if self.slot is not None:
            base = self.slot.values()
            if self.original is not None:
                _verify(self.codec, self.original, base)
                self.stats.verified += 1
        else:
            base = self.copy if self.copy is not None else self._decoded_base()
        return self.layout.rebuild(base, footprint)

    def _decoded_base(self) -> torch.Tensor:
        """The decoded span: reused while a tensor unpacked from it is still alive, else decoded afresh."""
        storage = self.decoded() if self.decoded is not None else None
        if storage is not None:
            size, stride = self.decoded_layout
            return torch.empty(0, dtype=self.dtype, device=self.device).set_(storage, 0, size, stride)
        start = time.perf_counter()
        base = self.codec.decode(self.packed).contiguous()
        self.row.decode_s += time.perf_counter() - start
        if self.original is not None:
            _verify(self.codec, self.original, base)
            self.stats.verified += 1
        if base.storage_offset():
            base = base.clone()
        # A weak reference to the storage (not to `base`): the unpacked views keep the storage alive, not `base`.
        storage = base.untyped_storage()
        self.decoded, self.decoded_layout = weakref.ref(storage), (base.size(), base.stride())
        self.stats.decoded(storage.nbytes())
        self.decoded_finalizer = weakref.finalize(storage, self.stats.decoded_freed, storage.nbytes())
        return base

    def give_up_decoded(self, storage: torch.UntypedStorage) -> bool:
        """If ``storage`` is this entry's last decoded span and one saved tensor is all autograd still holds
        through this entry (the one being used), forget the span (the stats count it freed now) and say so.
        With a second handle alive (a ReLU's output is also the next convolution's input) the span is kept for
        it: handing it over would cost a second decode."""
        decoded = self.decoded() if self.decoded is not None else None
        if self.handles != 1 or decoded is None or decoded.data_ptr() != storage.data_ptr():
            return False
        self.decoded = self.decoded_layout = None
        if self.decoded_finalizer is not None:
            self.decoded_finalizer()
        return True

    def release(self) -> None:
        if self.slot is not None:
            self.slot.arena.release()
        self.packed = self.kept = self.copy = self.slot = self.original = self.decoded = None
        self.released = True


class _SavedRef:
    """What autograd holds for one saved tensor: its entry and the view to rebuild."""

    __slots__ = ("entry", "footprint")

    def __init__(self, entry: _Entry, footprint: Footprint):
        self.entry, self.footprint = entry, footprint
        entry.handles += 1

    def unpack(self) -> torch.Tensor:
        return self.entry.restore(self.footprint)

    def __del__(self):
        self.entry.handles -= 1


class _MemberRef(_SavedRef):
    """A handle on an arena member: its arena keeps decoded values until every such handle is unpacked or dropped."""

    __slots__ = ("arena",)

    def __init__(self, entry: _Entry, footprint: Footprint):
        super().__init__(entry, footprint)
        self.arena = entry.slot.arena  # until this handle is first unpacked
        self.arena.wait()

    def unpack(self) -> torch.Tensor:
        tensor = self.entry.restore(self.footprint)
        self._done()
        return tensor

    def _done(self) -> None:
        if self.arena is not None:
            self.arena.done()
            self.arena = None

    def __del__(self):
        self._done()
        super().__del__()


def _ref(entry: _Entry, footprint: Footprint) -> _SavedRef:
    return _MemberRef(entry, footprint) if entry.slot is not None else _SavedRef(entry, footprint)


def _hold(saved: _SavedRef) -> None:
    """A finalizer's callback, whose only job was to hold ``saved`` until it ran."""


def _verify(codec: Codec, original: torch.Tensor, restored: torch.Tensor) -> None:
    """Check one decoded span against its original by the codec's own guarantee."""
    if restored.shape != original.shape or restored.dtype != original.dtype:
        raise VerificationError(
            f"codec {codec!r} returned {tuple(restored.shape)} {restored.dtype} for {tuple(original.shape)} {original.dtype}"
        )
    if codec.lossless:
        if not torch.equal(restored.reshape(-1).view(torch.uint8), original.reshape(-1).view(torch.uint8)):
            raise VerificationError(f"lossless codec {codec!r} changed the bits of a saved tensor")
    elif codec.error_bounded:
        config = codec.get_config()
        report = check_bound(original, restored, config["mode"], config["bound"])
        if not report.ok:
            raise VerificationError(f"codec {codec!r} broke its bound on a saved tensor: {report}")


class Session:
    """One compressed forward (and the backward that follows); create it with :func:`compressed`."""

    def __init__(self, model: torch.nn.Module, policy: Policy | None, threshold: int, verify: bool, arena_bytes: int,
                 chunk_bytes: int):
        self.model = model
        self.policy = policy
        self.threshold = threshold
        self.verify = verify
        self.stats = Stats()
        self._arenas = Arenas(arena_bytes, self._fall_back)
        self._seal_hook: torch.utils.hooks.RemovableHandle | None = None
        self._entries: weakref.WeakSet[_Entry] = weakref.WeakSet()
        self._by_storage: dict[tuple, list[weakref.ref]] = {}
        self._modules: ModuleTracker | None = None
        self._storages: ModelStorages | None = None
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._watch: contextlib.AbstractContextManager = contextlib.nullcontext()
        self.recompute_stats = Stats()  # the rows of what recomputed blocks packed in backward (:meth:`recompute`)
        self._rows = self.stats  # where pack counts tensors: the step's rows, or recompute_stats while recomputing
        self._chunk_bytes = chunk_bytes
        self._chunked = chunked_layers(model, chunk_bytes, self._hooks_innermost, self._claim_decoded)
        self._forward_step = 0  # the policy's step during this forward, for recomputations after it
        # the entries whose codec the policy was asked for, in the order they were packed, with what it was asked
        # and whether the tensor was small (an arena's candidate): what :meth:`substituted` goes through
        self._asked: list[tuple[weakref.ref, SavedTensorInfo, bool]] = []
        self.recomputed_blocks = 0  # blocks of this forward recomputed in backward (:meth:`recompute`)
        self._concat = concat_gradients(model)
        self._state = "new"

    # -- context manager ------------------------------------------------------------------------------------
    def __enter__(self) -> Session:
        if self._state != "new":
            raise RuntimeError("a session covers one forward pass; open a new one with hpcdl.compressed(model, policy)")
        if getattr(_active, "session", None) is not None:
            raise RuntimeError(
                "hpcdl.compressed sessions cannot be nested: exit the outer `with hpcdl.compressed(...)` block first "
                "(to compress parts of a model differently, use one session with Policy.per_module)"
            )
        self._storages = ModelStorages(self.model)
        if self.policy is not None:
            self._forward_step = self.policy.step
        if self.policy is not None:  # the controller may watch the forward (an adaptive one captures probe inputs)
            self._watch = self.policy.watch(self.model, self.threshold)
        self._watch.__enter__()
        self._chunked.__enter__()
        self._concat.__enter__()
        self._exact_saves = ExactSaves().__enter__()
        self._modules = ModuleTracker(self.model).__enter__()
        self._seal_hook = self.model.register_forward_hook(lambda *_: self._seal_arenas(), always_call=True)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self._hooks.__enter__()
        _active.session = self
        self._state = "open"
        return self

    def __exit__(self, *exc) -> None:
        _active.session = None
        self._hooks.__exit__(*exc)
        self._modules.__exit__(*exc)
        self._seal_hook.remove()
        self._seal_arenas()
        self._exact_saves.__exit__(*exc)
        self._concat.__exit__(*exc)
        self._chunked.__exit__(*exc)
        self._watch.__exit__(*exc)
        self._by_storage.clear()
        self._state = "closed"
        if self.policy is not None:
            self.policy.forward_closed(self.stats.original_bytes, self.stats.packed_bytes)

    def _seal_arenas(self) -> None:
        """Encode the open arenas (the model's forward ended, or the session closes)."""
        with _OWN_WORK():
            self._arenas.seal_all()

    # -- what the session holds -----------------------------------------------------------------------------
    @property
    def held_bytes(self) -> int:
        """Bytes of packed (or kept) data the session's live entries hold right now."""
        return sum(entry.nbytes for entry in list(self._entries))

    @property
    def live_entries(self) -> int:
        """Entries still held by autograd (0 once the graph is freed or the session released)."""
        return sum(1 for entry in list(self._entries) if not entry.released)

    def release(self) -> None:
        """Free every packed tensor now; a backward that still needs one then raises :class:`ReleasedError`."""
        self._arenas.release()
        for entry in list(self._entries):
            entry.release()

    # -- backward again, some saved tensors compressed ------------------------------------------------------
    @contextlib.contextmanager
    def substituted(self, codec_for: Callable[[SavedTensorInfo], Codec | None]) -> Iterator[None]:
        """Inside, every entry kept as it is restores as if it had been packed with ``codec_for(info)`` (``info``:
        what the policy was asked about it; None keeps it), encoded now and decoded whenever backward reads it;
        on the way out every entry restores what it keeps again.

        So that one forward's graph, kept with ``retain_graph``, serves several backward passes that each
        compress other saved tensors: a probe's perturbed replays (:mod:`hpcdl.runtime.probe`) without running
        the forward again. What a codec is given is what :meth:`pack` would have given it: a small tensor goes
        through its arena's member codec (:func:`~hpcdl.runtime.arena.member_codec`) and stays as it is where
        no arena would take it, and a codec that fails leaves the tensor as it is, as in training.
        """
        changed: list[_Entry] = []
        try:
            for ref, info, small in self._asked:
                entry = ref()
                if entry is None or entry.released or (entry.kept is None and entry.copy is None):
                    continue
                codec = codec_for(info)
                if codec is None:
                    continue
                source = entry.copy if entry.copy is not None else entry.layout.source(entry.kept)
                if small:
                    codec = member_codec(codec, source, self.policy.codec)
                    if codec is None or source.dtype not in codec.dtypes:
                        continue
                try:
                    entry.substitute = (codec, codec.encode(source))
                except Exception:  # a codec that fails in training keeps the tensor as it is (_new_entry)
                    continue
                changed.append(entry)
            yield
        finally:
            for entry in changed:
                entry.substitute = None

    # -- recomputed blocks -----------------------------------------------------------------------------------
    def recompute(self, forward: Callable, *args, **kwargs):
        """``forward(*args, **kwargs)`` as a block recomputed in backward, whose recomputed tensors this session
        packs too (:mod:`hpcdl.runtime.recompute`). Call it inside the session's forward, in place of
        ``torch.utils.checkpoint``; without a policy it still recomputes, keeping what it saves as it is."""
        if self._state != "open":
            raise RuntimeError("Session.recompute runs a block inside the session's forward (its `with` block)")
        self.recomputed_blocks += 1
        return RecomputedBlock(self, self._modules.current, forward, args, kwargs).run(args)

    @contextlib.contextmanager
    def recomputing(self, module: str) -> Iterator[None]:
        """The context of a block's recomputation in backward: the session's module names (starting inside
        ``module``), chunked layers and forward step as in the forward; what it packs is counted in the rows of
        :attr:`recompute_stats`, and the bytes decoded from it in :attr:`stats` (decoded tensors alive in backward,
        whichever pass packed them). The caller pushes the hooks that call :meth:`pack`."""
        modules = ModuleTracker(self.model)
        modules.frames.append(Frame(module))
        forward_modules = self._modules
        step = self.policy.step if self.policy is not None else None
        self._modules, self._rows = modules, self.recompute_stats
        if self.policy is not None:
            self.policy.step = self._forward_step
        try:
            with modules, chunked_layers(self.model, self._chunk_bytes, self._hooks_innermost, self._claim_decoded), \
                    ExactSaves():
                yield
            self._seal_arenas()
        finally:
            self._modules, self._rows = forward_modules, self.stats
            if self.policy is not None:
                self.policy.step = step
            self._by_storage.clear()

    def unpack_once(self, saved):
        """:meth:`unpack` for a handle its holder drops now (a recomputed block's placeholder). A decoded handle
        then lives on while its tensor does, as autograd holds a saved tensor through its consumer's backward, so
        that the handle counts :meth:`_claim_decoded` reads stay true."""
        tensor = self.unpack(saved)
        if isinstance(saved, _SavedRef) and saved.entry.packed is not None:
            # the entry holds its decoded span weakly, so this does not keep the span alive in turn
            weakref.finalize(tensor.untyped_storage(), _hold, saved)
        return tensor

    def share(self, saved):
        """Another handle on what :meth:`pack` returned (``saved``), for the same tensor saved again."""
        return _ref(saved.entry, saved.footprint) if isinstance(saved, _SavedRef) else saved

    # -- saved-tensor hooks ---------------------------------------------------------------------------------
    def _hooks_innermost(self) -> bool:
        """Whether this session's hooks are the ones autograd applies now (not a checkpointed region's).

        Asked by the chunked layers (:mod:`hpcdl.runtime.chunked`); False where PyTorch does not say, so that
        they then run plainly.
        """
        top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
        hooks = top_hooks(False) if top_hooks is not None else None
        if hooks is None:
            return False
        owner = getattr(hooks[0], "__self__", None)  # this session, or one of its recomputed blocks
        return owner is self or getattr(owner, "session", None) is self

    def _claim_decoded(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is a whole span this session decoded and nothing else holds. If so, the session
        forgets it and the caller may overwrite it: the chunked layers write the input's gradient over their
        decoded input, one chunk after its last use (:mod:`hpcdl.runtime.chunked`). False where PyTorch does not
        say how many hold the storage."""
        storage = tensor.untyped_storage()
        use_count = getattr(torch._C, "_storage_Use_Count", None)
        if (use_count is None or tensor.storage_offset() or not tensor.is_contiguous()
                or storage.nbytes() != tensor.numel() * tensor.element_size()
                or use_count(storage._cdata) != 2):  # held by ``tensor`` and by ``storage`` here, nothing else
            return False
        return any(entry.give_up_decoded(storage) for entry in list(self._entries))

    def pack(self, tensor: torch.Tensor):
        """The session's pack hook: what autograd holds for ``tensor`` (see the module docstring)."""
        with _OWN_WORK():
            return self._pack(tensor)

    def _pack(self, tensor: torch.Tensor):
        if not is_plain_strided(tensor):  # a parameter (a leaf: holding it closes no cycle) or another subclass
            return tensor
        # Not ``tensor`` itself: an op that saves its own output (ReLU, sigmoid, softmax) would then hold that output,
        # which holds the op, a cycle through autograd's C++ graph that Python's collector cannot see, and a graph
        # dropped without a backward (or kept with retain_graph) would never be freed. A detached alias shares the
        # storage and the version counter.
        tensor = tensor.detach()
        kind = kind_of(tensor)
        if kind is None:
            return tensor
        module = self._modules.current
        if self._storages.owns(tensor):
            self._rows.row(module, "parameter").count += 1
            return tensor
        footprint = Footprint.of(tensor)
        row = self._rows.row(module, kind)
        row.count += 1
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor._version)
        exact = saving_for_equality()  # a lossy copy would break its backward's comparisons
        shared = self._find_shared(key, tensor, footprint, exact)
        if shared is not None:
            row.shared += 1
            return _ref(shared, footprint)
        layout = Layout.of(footprint)
        nbytes = layout.numel * tensor.element_size()
        small = self._counted_bytes(tensor, nbytes) < self.threshold
        info = None if exact else self._info(tensor, layout, module, kind, small)
        if exact:
            entry = self._kept_entry(tensor, layout, row)
        elif small:
            entry = (self._arena_entry(tensor, layout, module, info, row) if info is not None else None) \
                or self._kept_entry(tensor, layout, row)
        else:
            entry = self._new_entry(tensor, layout, info, row)
        if info is not None:
            self._asked.append((weakref.ref(entry), info, small))
        # Every entry, kept ones too, is found by a later save of the same tensor: which tensors share (and so
        # which the policy is asked about) must not depend on what the policy chose for them.
        self._entries.add(entry)
        self._by_storage.setdefault(key, []).append(weakref.ref(entry))
        return _ref(entry, footprint)

    def _counted_bytes(self, tensor: torch.Tensor, nbytes: int) -> int:
        """The bytes ``tensor`` counts for against the size threshold (a probe replaying part of the batch counts
        them at the whole batch's size: :meth:`Policy.counted_bytes`)."""
        return self.policy.counted_bytes(tensor, nbytes) if self.policy is not None else nbytes

    def _kept_entry(self, tensor: torch.Tensor, layout: Layout, row: Row) -> _Entry:
        """A tensor kept as it is: a small one no arena takes, or one saved for equality comparisons (or, a small
        view of a much larger storage, as a copy of its span, so that it does not pin the large storage)."""
        nbytes = layout.numel * tensor.element_size()
        row.kept += 1
        row.original += nbytes
        row.packed += nbytes
        entry = _Entry(tensor, layout, row, self.stats)
        if tensor.untyped_storage().nbytes() <= 2 * nbytes:
            entry.kept = tensor
        else:
            entry.copy = layout.source(tensor).clone(memory_format=torch.contiguous_format)
        return entry

    def _find_shared(self, key: tuple, tensor: torch.Tensor, footprint: Footprint, exact: bool) -> _Entry | None:
        """A live entry that holds ``tensor``'s view (with ``exact``, one that holds it as it is), or None."""
        for ref in self._by_storage.get(key, ()):
            entry = ref()
            if entry is not None and entry.shares(tensor, footprint) and (not exact or entry.uncompressed):
                return entry
        return None

    def _info(self, tensor: torch.Tensor, layout: Layout, module: str, kind: str, small: bool) -> SavedTensorInfo | None:
        """What the policy is asked about ``tensor``, or None where it is not asked: there is no policy, or the
        tensor is small and no arena may take it.

        Only activations saved inside the model's forward join arenas: masks and indices stay exact as they are,
        and the loss's small tensors (``(outside)``: log-probabilities, see docs/runtime.md) stay uncompressed.
        """
        if self.policy is None:
            return None
        if small:
            if not self._arenas.enabled or kind != "activation" or module == OUTSIDE:
                return None
            return self.policy.info(module, kind, tensor, channels=self._channels(tensor, layout))
        # a max pool's indices in their standard layout, which is what the window codec is given to encode
        window = self._modules.frame.window if kind == "index" and tensor.is_contiguous() else None
        channels = self._channels(tensor, layout) if kind == "activation" else None
        return self.policy.info(module, kind, tensor, window, channels)

    def _arena_entry(self, tensor: torch.Tensor, layout: Layout, module: str, info: SavedTensorInfo,
                     row: Row) -> _Entry | None:
        """Copy a small floating tensor into its module's arena; None keeps it as it is."""
        codec = self.policy.codec_for(info)
        if codec is None:
            return None
        source = layout.source(tensor)
        arena_codec = member_codec(codec, source, self.policy.codec)
        if arena_codec is None or tensor.dtype not in arena_codec.dtypes:
            return None
        entry = _Entry(tensor, layout, row, self.stats)
        entry.codec = codec
        entry.slot = self._arenas.add(module, arena_codec, source, row)
        nbytes = layout.numel * tensor.element_size()
        row.arena += 1
        row.original += nbytes
        row.packed += nbytes  # until the arena is sealed, then this member's share of its packed bytes
        if self.verify:
            entry.original = source.detach().clone(memory_format=torch.contiguous_format)
        return entry

    def _new_entry(self, tensor: torch.Tensor, layout: Layout, info: SavedTensorInfo | None, row: Row) -> _Entry:
        entry = _Entry(tensor, layout, row, self.stats)
        nbytes = layout.numel * tensor.element_size()
        row.original += nbytes
        codec = self.policy.codec_for(info) if info is not None else None
        if codec is None:
            entry.kept = tensor
            row.kept += 1
            row.packed += nbytes
            return entry
        start = time.perf_counter()
        base = layout.source(tensor)  # a view of the storage, or (for a view with gaps) a compact copy
        try:
            entry.packed = codec.encode(base)
        except Exception as err:  # a codec bug or an input it cannot take must not break training
            self._fall_back(info.module, codec, tensor, err)
            entry.kept = tensor
            row.fallbacks += 1
            row.packed += nbytes
            return entry
        row.encode_s += time.perf_counter() - start
        row.packed += entry.packed.nbytes
        self.stats.packing(tensor.untyped_storage())
        self.stats.largest_packed_original = max(self.stats.largest_packed_original, nbytes)
        entry.codec = codec
        if self.verify:
            entry.original = base.detach().clone(memory_format=torch.contiguous_format)
        return entry

    def _channels(self, tensor: torch.Tensor, layout: Layout) -> int | None:
        """The channel dim of what is encoded for ``tensor`` when it is a running batch norm's input (the policy
        may bound its error per channel: :mod:`hpcdl.compress.channels`), else None."""
        return normalized_channels(self._modules.frame.batch_norm_input, tensor, layout)

    def _fall_back(self, module: str, codec: Codec, tensor: torch.Tensor, err: Exception) -> None:
        warned = self.policy.warned_modules
        if module in warned:
            return
        warned.add(module)
        warnings.warn(
            f"codec {codec!r} failed on a {tuple(tensor.shape)} {tensor.dtype} tensor saved by module {module!r} "
            f"({type(err).__name__}: {err}); keeping such tensors uncompressed (stats count the fallbacks)",
            CompressionFallbackWarning,
            stacklevel=2,
        )

    def unpack(self, saved):
        """The session's unpack hook: the tensor ``saved`` (what :meth:`pack` returned) stands for."""
        if isinstance(saved, _SavedRef):
            return saved.unpack()
        return saved


def active_session() -> Session | None:
    """The session whose forward is running in this thread (inside its ``with`` block), or None.

    For code that runs inside a forward and reports on it, e.g. the measured step of
    :mod:`hpcdl.memory`, which reads :attr:`Session.held_bytes` at the end of the forward.
    """
    return getattr(_active, "session", None)


def compressed(
    model: torch.nn.Module,
    policy: Policy | str | dict | None,
    *,
    threshold: int = DEFAULT_THRESHOLD,
    verify: bool = False,
    arena_bytes: int = DEFAULT_ARENA_BYTES,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Session:
    """Compress everything autograd saves while ``model``'s forward runs inside the returned context.

    ``policy`` is a :class:`Policy`, a method spec (``"sz:rel=1e-2"``), a codec
    config dict (used for every floating tensor), or None (nothing compressed,
    stats only). Floating tensors under ``threshold`` bytes saved inside the
    model's forward are compressed together in arenas; ``arena_bytes`` is the
    most their open (not yet encoded) arenas hold at once (0: no arenas). Other
    tensors under ``threshold`` bytes are kept as they are.
    ``verify=True`` keeps each original and checks every decompressed tensor
    against it by its codec's guarantee (a test mode: it costs the memory the
    session otherwise saves). Convolutions (forward and backward) and batch
    norms (backward) on the CPU whose input exceeds ``chunk_bytes`` run in
    chunks of the batch (:mod:`hpcdl.runtime.chunked`; 0: whole). A large
    concatenation's gradient is freed after its first consumer has run
    (:mod:`hpcdl.runtime.concat`).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"hpcdl.compressed needs the torch.nn.Module whose forward runs inside the block, got {type(model).__name__}"
        )
    scripted = next((name or "the model" for name, module in model.named_modules()
                     if isinstance(module, torch.jit.ScriptModule)), None)
    if scripted is not None:
        raise TypeError(
            f"hpcdl.compressed cannot follow a TorchScript module ({scripted} is one, from torch.jit.script or "
            "torch.jit.trace): the session needs forward hooks on the modules, which TorchScript does not run; "
            "train the eager nn.Module under hpcdl.compressed and script it afterwards for inference"
        )
    policy = as_policy(policy)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
        raise ValueError(f"threshold is a size in bytes >= 0 (default {DEFAULT_THRESHOLD}), got {threshold!r}")
    if isinstance(arena_bytes, bool) or not isinstance(arena_bytes, int) or arena_bytes < 0:
        raise ValueError(
            f"arena_bytes is the most bytes of small saved tensors held before an arena is encoded, >= 0 "
            f"(default {DEFAULT_ARENA_BYTES}; 0 keeps small tensors as they are), got {arena_bytes!r}"
        )
    return Session(model, policy, threshold, bool(verify), arena_bytes, chunk_bytes)
