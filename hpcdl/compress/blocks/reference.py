"""The plain PyTorch reference of the sz/int block format: it is the specification.

Readable, vectorised over blocks, and bit-identical to the kernels in
kernels/sz_block.cuh (tests compare the bytes). Works on any device; it is the
fallback when the host library is not built. It implements
hpcdl.compress.blocks.protocol.BlockKernels; its per-block passes (sz_headers,
sz_pack, decode_blocks) have twins of the same name and signature in cuda.py.
"""

from __future__ import annotations

import torch

from hpcdl.compress.blocks import twopass
from hpcdl.compress.blocks.params import KERNEL_MODE_PW_REL, MAX_Q, STAT_BITS, SzParams, compute_dtype
from hpcdl.compress.blocks.protocol import BlockPayload
from hpcdl.compress.blocks.stream import BLOCK, Layout, block_count, word_offsets

__all__ = ["RESOLVES_PARAMS", "block_headers", "checksum", "codes_decode", "codes_encode", "codes_escapes",
           "decode_blocks", "pack", "sz_decode", "sz_encode", "sz_headers", "sz_pack", "sz_stats", "unpack"]

PRED_ZIGZAG, PRED_UNSIGNED, PRED_LORENZO, PRED_SPARSE = 0, 1, 2, 3
_CHUNK_BLOCKS = 2048  # bounds the (blocks, 32, 32) bit tensors to 16 MiB
_INT_OF = {torch.float32: torch.int32, torch.float64: torch.int64}


def _wrap32(values: torch.Tensor) -> torch.Tensor:
    """int64 values taken modulo 2^32 into the int32 range (two's complement), as int64."""
    return ((values + 2**31) & 0xFFFFFFFF) - 2**31


def _zigzag(d: torch.Tensor) -> torch.Tensor:
    """Zigzag of int32-range int64 values, as non-negative int64 < 2^32."""
    return ((d << 1) ^ (d >> 63)) & 0xFFFFFFFF


def _unzigzag(u: torch.Tensor) -> torch.Tensor:
    return (u >> 1) ^ -(u & 1)


def _bit_width(u: torch.Tensor) -> torch.Tensor:
    """Bits needed for each non-negative int64 value < 2^53 (0 for 0)."""
    return torch.frexp(u.to(torch.float64)).exponent.to(torch.int64)


# ---------------------------------------------------------------- quantizer


def _by_sign(negative: torch.Tensor, pair: tuple[float, float], dtype: torch.dtype) -> torch.Tensor:
    """pair[1] where ``negative``, else pair[0], each rounded once from float64 to ``dtype``."""
    values = torch.tensor(pair, dtype=torch.float64).to(dtype).to(negative.device)
    return torch.where(negative, values[1], values[0])


def value_of(q: torch.Tensor, dtype: torch.dtype, params: SzParams) -> torch.Tensor:
    """Decoded value of each code, in ``dtype`` (computed in float32, or float64 for float64)."""
    compute = compute_dtype(dtype)
    magnitude = q.to(torch.int64).abs()
    negative = q < 0
    if params.kernel_mode == KERNEL_MODE_PW_REL:
        low = torch.where(negative, int(params.base[1]), int(params.base[0]))
        bits = ((magnitude - 1).clamp(min=0) << params.shift) | low
        value = bits.to(_INT_OF[compute]).view(compute)
    else:
        step = torch.tensor(params.step, dtype=torch.float64).to(compute)
        binned = _wrap32(magnitude - 2).to(compute) * step + _by_sign(negative, params.base, compute)
        value = torch.where(magnitude == 1, _by_sign(negative, params.sub, compute), binned)
    value = torch.where(negative, -value, value)
    return torch.where(q == 0, torch.zeros_like(value), value).to(dtype)


def _codes(xt: torch.Tensor, params: SzParams) -> torch.Tensor:
    """Codes before verification (kernels/sz_block.cuh, hp_sz_code) of ``xt`` in its compute type, as int64:
    0 for zero, NaN, +-Inf and levels past MAX_Q."""
    compute = xt.dtype
    magnitude = xt.abs()
    if params.kernel_mode == KERNEL_MODE_PW_REL:
        bits = magnitude.view(_INT_OF[compute]).to(torch.int64)
        level = (bits >> params.shift) + 1
        usable = (bits != 0) & torch.isfinite(magnitude) & (level <= MAX_Q)
    else:
        above = magnitude - torch.tensor(params.eb, dtype=torch.float64).to(compute)
        scaled = torch.where(above > 0, above, 0) * torch.tensor(params.inv, dtype=torch.float64).to(compute)
        usable = (magnitude > 0) & (scaled <= MAX_Q - 1)  # false for NaN and Inf
        level = 1 + torch.ceil(torch.where(usable, scaled, torch.zeros_like(scaled))).to(torch.int64)
    code = torch.where(xt < 0, -level, level)
    return torch.where(usable, code, torch.zeros_like(code))


def quantize(x: torch.Tensor, params: SzParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (int32) and outlier flags (uint8) of a flat float tensor.

    An element is an outlier, stored exactly with code 0, when it is NaN, +-Inf or
    -0.0, when its code would pass MAX_Q, or when its decoded value in x's dtype
    breaks the bound, zero or sign (rounding at bin edges, underflow, overflow).
    """
    xt = x.to(compute_dtype(x.dtype))
    xd = xt.to(torch.float64)
    code = _codes(xt, params)
    tolerance = params.bound * xd.abs() if params.kernel_mode == KERNEL_MODE_PW_REL else torch.full_like(xd, params.eb)
    zero = xd == 0
    yd = value_of(code, x.dtype, params).to(torch.float64)
    exact = ((xd - yd).abs() <= tolerance) & ((xd > 0) == (yd > 0)) & ((xd < 0) == (yd < 0))
    good = (code != 0) & exact
    outlier = ~good & ~(zero & ~torch.signbit(xt))
    return torch.where(good, code, torch.zeros_like(code)).to(torch.int32), outlier.to(torch.uint8)


def sz_stats(x: torch.Tensor, params: SzParams) -> tuple[int, ...]:
    """The 8 integer sums the unbiased reconstruction is computed from (kernels/sz_block.cuh, hp_sz_stat_lanes): for
    x > 0 then x < 0, abs: count and sum of |x| / unit of level 1, then count and sum of (|x| - bin centre) / unit
    of the levels >= 2, unit = eb / 2^STAT_BITS; pw_rel: zeros, then count and sum of the dropped low bits (their
    top STAT_BITS bits)."""
    compute = compute_dtype(x.dtype)
    xt = x.to(compute)
    code = _codes(xt, params)
    magnitude, negative = code.abs(), code < 0
    if params.kernel_mode == KERNEL_MODE_PW_REL:
        drop = max(params.shift - STAT_BITS, 0)
        units = (xt.abs().view(_INT_OF[compute]).to(torch.int64) & ((1 << params.shift) - 1)) >> drop
        binned = code != 0
    else:
        def cast(value: float) -> torch.Tensor:
            return torch.tensor(value, dtype=torch.float64).to(compute)

        scale = cast(float(1 << STAT_BITS) / params.eb)
        centre = _wrap32(magnitude - 2).to(compute) * cast(params.step) + cast(params.eb + 0.5 * params.step)
        offset = torch.where(magnitude == 1, xt.abs(), xt.abs() - centre) * scale
        limit = float(2 << STAT_BITS)
        offset = torch.where(offset < limit, offset, limit)
        offset = torch.where(offset > -limit, offset, -limit)
        units = offset.to(torch.int64)
        binned = magnitude >= 2
    sums = []
    for level_group in (magnitude == 1, binned):
        for side in (~negative, negative):
            chosen = level_group & side & (code != 0)
            sums += [int(chosen.sum()), int(torch.where(chosen, units, 0).sum())]
    if params.kernel_mode == KERNEL_MODE_PW_REL:
        sums[:4] = [0, 0, 0, 0]
    return tuple(sums)


# ---------------------------------------------------------------- blocks


def _lanes(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes as (blocks, 32) int64, zero-padded, and the mask of lanes that hold elements."""
    n = q.numel()
    padded = torch.zeros(block_count(n) * BLOCK, dtype=torch.int64, device=q.device)
    padded[:n] = q.to(torch.int64)
    present = torch.arange(block_count(n) * BLOCK, device=q.device) < n
    return padded.view(-1, BLOCK), present.view(-1, BLOCK)


def _candidates(lanes: torch.Tensor, present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The unsigned values u of each predictor (zigzag, unsigned, Lorenzo); 0 in lanes without elements."""
    previous = torch.nn.functional.pad(lanes[:, :-1], (1, 0))
    zero = torch.zeros_like(lanes)
    return (torch.where(present, _zigzag(lanes), zero), torch.where(present, lanes & 0xFFFFFFFF, zero),
            torch.where(present, _zigzag(_wrap32(lanes - previous)), zero))


def _predicted(lanes: torch.Tensor, present: torch.Tensor, predictor: torch.Tensor) -> torch.Tensor:
    """The unsigned values u each block packs, for each block's predictor."""
    zigzag, unsigned, lorenzo = _candidates(lanes, present)
    chosen = predictor.view(-1, 1)
    return torch.where(chosen == PRED_ZIGZAG, zigzag, torch.where(chosen == PRED_UNSIGNED, unsigned, lorenzo))


def _sparse_planes(words: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Bit planes a sparse block of ``words`` words with k nonzero lanes holds: as many as fit, at most 32."""
    return torch.where(k > 0, (32 * (words - 1) // k.clamp(min=1)).clamp(max=32), 0)


def block_headers(q: torch.Tensor) -> torch.Tensor:
    """One byte per block: the predictor needing the fewest words and that count (ties: zigzag, unsigned, Lorenzo, sparse)."""
    lanes, present = _lanes(q)
    if lanes.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=q.device)
    w_zigzag, w_unsigned, w_lorenzo = (_bit_width(u.amax(dim=1)) for u in _candidates(lanes, present))
    non_negative = ~(torch.where(present, lanes, 0) < 0).any(dim=1)
    w_unsigned = torch.where(non_negative, w_unsigned, 64)
    nonzero = present & (lanes != 0)
    w_values = _bit_width(torch.where(nonzero, lanes - 1, 0).amax(dim=1))
    w_sparse = torch.where(non_negative, 1 + (nonzero.sum(dim=1) * w_values + 31) // 32, 64)
    best, predictor = w_zigzag, torch.full_like(w_zigzag, PRED_ZIGZAG)
    for width, code in ((w_unsigned, PRED_UNSIGNED), (w_lorenzo, PRED_LORENZO), (w_sparse, PRED_SPARSE)):
        better = width < best
        best, predictor = torch.where(better, width, best), torch.where(better, code, predictor)
    return (best | (predictor << 6)).to(torch.uint8)


def _sparse_words(lanes: torch.Tensor, present: torch.Tensor, n_words: torch.Tensor) -> torch.Tensor:
    """(blocks, 32) words of sparse blocks: the mask of nonzero lanes, then bit j of the r-th nonzero lane's q - 1
    at stream bit j * k + r (k = nonzero lanes), from the low bit of word 1 up."""
    bit = torch.arange(32, device=lanes.device)
    nonzero = present & (lanes != 0)
    k = nonzero.sum(dim=1)
    rank = torch.cumsum(nonzero, dim=1) - 1
    planes = _sparse_planes(n_words, k)
    values = torch.where(nonzero, lanes - 1, 0)
    set_bits = nonzero.unsqueeze(2) & (bit < planes.view(-1, 1, 1)) & (((values.unsqueeze(2) >> bit) & 1) == 1)
    position = bit.view(1, 1, 32) * k.view(-1, 1, 1) + rank.unsqueeze(2)  # (blocks, lane, plane)
    stream = torch.zeros(lanes.shape[0], 33 * 32, dtype=torch.int64, device=lanes.device)
    stream.scatter_(1, torch.where(set_bits, position, 32 * 32).reshape(lanes.shape[0], -1), 1)
    stream_words = (stream[:, : 31 * 32].view(-1, 31, 32) << bit).sum(dim=2)
    mask = (nonzero.to(torch.int64) << bit).sum(dim=1, keepdim=True)
    return torch.cat([mask, stream_words], dim=1)


def sz_headers(x: torch.Tensor, params: SzParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoding pass 1: block headers (uint8) and outliers per block (int32) of a flat float tensor."""
    q, outlier = quantize(x, params)
    per_block = torch.zeros(block_count(x.numel()) * BLOCK, dtype=torch.int32, device=x.device)
    per_block[: x.numel()] = outlier.to(torch.int32)
    return block_headers(q), per_block.view(-1, BLOCK).sum(dim=1, dtype=torch.int32)


def sz_pack(x: torch.Tensor, params: SzParams, headers: torch.Tensor, offsets: torch.Tensor,
            outlier_offsets: torch.Tensor, words: torch.Tensor, indices: torch.Tensor, values: torch.Tensor) -> None:
    """Encoding pass 2: the blocks' words, then the outliers' sorted flat indices and exact values."""
    q, outlier = quantize(x, params)
    pack(q, headers, offsets, words)
    found = torch.nonzero(outlier).reshape(-1)
    indices.copy_(found)
    values.copy_(x[found])


def pack(q: torch.Tensor, headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor) -> None:
    """Write each block's words into ``words`` (int32) at its offset: bit planes (word j = bit j of the 32 lanes)
    for zigzag, unsigned and Lorenzo; mask and dense stream for sparse blocks."""
    lanes_all, present_all = _lanes(q)
    bit = torch.arange(32, device=q.device)
    for start in range(0, lanes_all.shape[0], _CHUNK_BLOCKS):
        chunk = slice(start, start + _CHUNK_BLOCKS)
        header = headers[chunk].to(torch.int64)
        n_words, predictor = header & 63, header >> 6
        lanes, present = lanes_all[chunk], present_all[chunk]
        u = _predicted(lanes, present, predictor)
        planes = (((u.unsqueeze(2) >> bit) & 1) << bit.view(1, 32, 1)).sum(dim=1)  # (blocks, plane)
        planes = torch.where((predictor == PRED_SPARSE).unsqueeze(1), _sparse_words(lanes, present, n_words), planes)
        used = bit < n_words.unsqueeze(1)
        position = offsets[chunk].unsqueeze(1) + bit
        words[position[used]] = _wrap32(planes[used]).to(torch.int32)


def unpack(headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor, numel: int) -> torch.Tensor:
    """Codes (int32) of ``numel`` elements from validated block headers (at most 32 words each), offsets and words."""
    bit = torch.arange(32, device=headers.device)
    # one spare zero word, so that gathering unused planes never indexes an empty tensor
    all_words = torch.cat([words.to(torch.int64) & 0xFFFFFFFF, torch.zeros(1, dtype=torch.int64, device=words.device)])
    blocks = []
    for start in range(0, headers.numel(), _CHUNK_BLOCKS):
        chunk = slice(start, start + _CHUNK_BLOCKS)
        header = headers[chunk].to(torch.int64)
        n_words, predictor = header & 63, (header >> 6).unsqueeze(1)
        used = bit < n_words.unsqueeze(1)
        position = torch.where(used, offsets[chunk].unsqueeze(1) + bit, all_words.numel() - 1)
        planes = all_words[position]  # (blocks, word)
        u = (((planes.unsqueeze(1) >> bit.view(1, 32, 1)) & 1) << bit).sum(dim=2)  # (blocks, lane)
        q = torch.where(predictor == PRED_UNSIGNED, u, _unzigzag(u))
        q = torch.where(predictor == PRED_LORENZO, torch.cumsum(q, dim=1), q)
        q = torch.where(predictor == PRED_SPARSE, _sparse_lanes(planes, n_words), q)
        blocks.append(_wrap32(q).reshape(-1))
    if not blocks:
        return torch.empty(0, dtype=torch.int32, device=headers.device)
    return torch.cat(blocks)[:numel].to(torch.int32)


def _sparse_lanes(block_words: torch.Tensor, n_words: torch.Tensor) -> torch.Tensor:
    """(blocks, 32) codes of sparse blocks from their words (inverse of _sparse_words)."""
    bit = torch.arange(32, device=block_words.device)
    nonzero = ((block_words[:, :1] >> bit) & 1) == 1
    k = nonzero.sum(dim=1)
    rank = torch.cumsum(nonzero, dim=1) - 1
    planes = _sparse_planes(n_words, k)
    stream = ((block_words[:, 1:].unsqueeze(2) >> bit) & 1).reshape(-1, 31 * 32)
    position = bit.view(1, 1, 32) * k.view(-1, 1, 1) + rank.unsqueeze(2)  # (blocks, lane, plane)
    wanted = nonzero.unsqueeze(2) & (bit < planes.view(-1, 1, 1))
    bits = torch.gather(stream, 1, torch.where(wanted, position, 0).reshape(stream.shape[0], -1)).view(-1, 32, 32)
    values = (torch.where(wanted, bits, 0) << bit).sum(dim=2)
    return torch.where(nonzero, values + 1, 0)


def decode_blocks(headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor, numel: int, dtype: torch.dtype,
                  params: SzParams) -> torch.Tensor:
    """Decoded flat tensor of ``dtype`` from validated block headers and their word offsets (outliers still 0)."""
    return value_of(unpack(headers, offsets, words, numel), dtype, params)


RESOLVES_PARAMS = False  # the codec computes SzParams.for_tensor with sz_stats below


def sz_encode(x: torch.Tensor, params: SzParams, raw_size: int) -> tuple[SzParams, BlockPayload | None]:
    """BlockKernels.sz_encode: sz_headers, the prefix sums, then sz_pack."""
    return params, twopass.sz_encode(sz_headers, sz_pack, checksum, x, params, raw_size)


# ---------------------------------------------------------------- the entropy stage's codes layout


def codes_encode(headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor, numel: int,
                 bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The codes layout of hpcdl.compress.codes: the ``numel`` codes of a stream's blocks (validated headers, their
    word offsets, the words; codes of magnitude at most MAX_Q), zigzagged and packed ``bits`` bits each (2, 4 or 8),
    code ``i`` in bits ``(i mod 8/bits) * bits`` of byte ``i // (8/bits)``, unused bits zero; a zigzag value of
    ``e = 2^bits - 1`` or more is written as ``e`` and its excess over ``e`` goes, in code order, to the escapes.
    Returns the bytes (uint8) and the escapes (int32)."""
    escape, per_byte = (1 << bits) - 1, 8 // bits
    q = unpack(headers, offsets, words, numel)
    values = (q << 1) ^ (q >> 31)  # zigzag; |q| <= MAX_Q keeps it below 2^31
    escaped = values >= escape
    escapes = values[escaped] - escape
    small = values.clamp(max=escape).to(torch.uint8)
    small = torch.cat([small, small.new_zeros(-numel % per_byte)]).view(-1, per_byte)
    packed = small[:, 0].clone()
    for lane in range(1, per_byte):
        packed |= small[:, lane] << (lane * bits)
    return packed, escapes


def codes_escapes(headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor, numel: int) -> torch.Tensor:
    """How many of the ``numel`` codes of a stream's blocks (as codes_encode takes them) codes_encode would write
    as escapes at 2, 4 and 8 bits: int64 counts of zigzag values of 3, 15 and 255 or more."""
    q = unpack(headers, offsets, words, numel)
    values = (q << 1) ^ (q >> 31)  # zigzag; |q| <= MAX_Q keeps it below 2^31
    return torch.stack([torch.count_nonzero(values >= (1 << bits) - 1) for bits in (2, 4, 8)])


def codes_decode(packed: torch.Tensor, numel: int, bits: int, escapes: torch.Tensor, max_zigzag: int,
                 headers: torch.Tensor, words: torch.Tensor) -> int:
    """The inverse of codes_encode from untrusted bytes: writes the block headers and the words of the ``numel``
    codes in ``packed`` (their escapes: ``escapes``, each in [0, max_zigzag - 2^bits + 1]) into ``headers`` and
    ``words`` (int32, exactly as many words as the codes need). Returns 0; -1 if an escape is missing, out of
    range or left over; -2 if a bit past the last code is set; -3 if the codes need another number of words."""
    escape, per_byte = (1 << bits) - 1, 8 // bits
    values = torch.stack([(packed >> (lane * bits)) & escape for lane in range(per_byte)], dim=1).view(-1)
    if bool(values[numel:].any()):
        return -2
    values = values[:numel].to(torch.int64)
    escaped = values == escape
    if int(escaped.sum()) != escapes.numel():
        return -1
    if escapes.numel() and bool(((escapes < 0) | (escapes > max_zigzag - escape)).any()):
        return -1
    values[escaped] += escapes.to(torch.int64)
    q = ((values >> 1) ^ -(values & 1)).to(torch.int32)
    block_header = block_headers(q)
    offsets, n_words = word_offsets(block_header)
    if n_words != words.numel():
        return -3
    headers.copy_(block_header)
    pack(q, block_header, offsets, words)
    return 0


def _decode(headers: torch.Tensor, n_words: int, words: torch.Tensor, numel: int, dtype: torch.dtype,
            params: SzParams) -> torch.Tensor:
    return twopass.sz_decode(decode_blocks, headers, n_words, words, numel, dtype, params)


def sz_decode(data: torch.Tensor, layout: Layout, expected_checksum: int, dtype: torch.dtype,
              params: SzParams) -> torch.Tensor:
    """BlockKernels.sz_decode: the checks, the blocks (decode_blocks), the outliers."""
    return twopass.sz_decode_checked(checksum, _decode, data, layout, expected_checksum, dtype, params)


_MIX = (0xBF58476D1CE4E5B9 - 2**64, 0x94D049BB133111EB - 2**64)  # splitmix64's multipliers, as int64


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finalizer of int64 ``x`` read as u64 (a bijection; int64 products wrap modulo 2^64)."""
    x = (x ^ ((x >> 30) & (2**34 - 1))) * _MIX[0]
    x = (x ^ ((x >> 27) & (2**37 - 1))) * _MIX[1]
    return x ^ ((x >> 31) & (2**33 - 1))


def checksum(data: torch.Tensor) -> int:
    """sum((2 i + 1) * mix(w_i)) mod 2^64 over the payload as little-endian u64 words w_i (length a multiple of 8),
    mix the bijective splitmix64 finalizer: one changed word always changes the sum, and unlike a plain
    weighted sum, changes of the same high bit in two words do not cancel."""
    if data.numel() == 0:
        return 0
    w = data.view(torch.int64)
    weights = 2 * torch.arange(w.numel(), dtype=torch.int64, device=w.device) + 1
    return int((_mix64(w) * weights).sum()) & 0xFFFFFFFFFFFFFFFF
