"""Two directions for the adaptive policy's remaining ratio gap (issue 13's 15x), measured before building either.

1. An entropy coder over sz's quantization codes. sz packs each block of 32 codes at one bit width, and the zstd
   stage then works on those bit-packed blocks. The lower bound of an order-0 entropy coder over the codes
   (Huffman, rANS) is the codes' empirical entropy per tensor, plus the outliers sz stores exactly (32 bits
   each, counted as 8 bytes) and a 256-byte table. Compared with sz + zstd, with int16 codes + zstd, and with
   the zigzagged codes split into byte planes (the low bytes of all codes, then the next bytes where any is
   nonzero) + zstd, which lets zstd's own Huffman stage see one code per byte, on the floating tensors of at
   least 64 KiB each tiny zoo model saves in its first step (as entropy-gain.py).
2. LayerNorm inputs bounded per row (the ``channels`` stage's idea for batch norms, applied to the rows a layer
   norm normalizes). Each row divided by the power of two nearest its standard deviation, encoded at the bound
   that gives the same summed error in units of the normalized value ``xhat`` as a tensor-wide bound ``b``
   (``b' = b * sqrt(mean(invstd^2) / mean((2^k * invstd)^2))``), one exponent byte per row added; ``b`` is
   ``rel`` times the tightest row's standard deviation. The particle transformer's layer norms, first step.

Run: python docs/results/headroom.py > docs/results/headroom.txt
"""
import torch
import zstandard

from hpcdl.compress import get_codec
from hpcdl.compress.blocks import reference
from hpcdl.compress.blocks.params import SzParams
from hpcdl.memory import Workload
from hpcdl.runtime.observe import observe_saved

torch.set_num_threads(1)
ZSTD = zstandard.ZstdCompressor(level=1)


def entropy_bytes(flat: torch.Tensor, rel: float) -> float:
    """The order-0 entropy coder's bytes for sz's codes of ``flat`` at range-relative bound ``rel``."""
    codes, outliers = reference.quantize(flat, SzParams.for_tensor("rel", rel, flat, reference.sz_stats))
    counts = torch.unique(codes, return_counts=True)[1].double() / codes.numel()
    return float(-(counts * counts.log2()).sum()) * codes.numel() / 8 + int(outliers.sum()) * 8 + 256


def byte_planes(codes: torch.Tensor) -> bytes:
    """The zigzagged int32 ``codes`` as byte planes: the low byte of every code, then each higher byte plane that is
    not all zero."""
    zigzag = ((codes << 1) ^ (codes >> 31)).to(torch.int64) & 0xFFFFFFFF
    planes = (((zigzag >> (8 * k)) & 0xFF).to(torch.uint8) for k in range(4))
    return b"".join(plane.numpy().tobytes() for k, plane in enumerate(planes) if k == 0 or bool(plane.any()))


print("1. sz's codes entropy-coded (order 0) vs sz + zstd; ratios over all the tensors' bytes")
for name, batch in (("hep-cnn", 64), ("particle-transformer", 64), ("deeplabv3p-climate", 8), ("resnet18-cifar", 32)):
    model, x, y, loss = Workload.of(name, scale="tiny").build(batch, 0)
    saved = {}

    def keep(tensor, module):
        if tensor.dtype.is_floating_point and tensor.numel() * tensor.element_size() >= 65536:
            saved[(tensor.untyped_storage().data_ptr(), tensor._version)] = tensor.detach().float().clone()

    with observe_saved(model, keep):
        loss(model(x), y)
    raw = sum(t.numel() * 4 for t in saved.values())
    for rel in (1e-1, 1e-2):
        config = {"id": "sz", "mode": "rel", "bound": rel}
        sz = sum(get_codec(config).encode(t).nbytes for t in saved.values())
        sz_zstd = sum(get_codec({**config, "entropy": "zstd"}).encode(t).nbytes for t in saved.values())
        coded = sum(entropy_bytes(t.reshape(-1), rel) for t in saved.values())
        int16_zstd = planes_zstd = 0
        for t in saved.values():
            codes, outliers = reference.quantize(t.reshape(-1), SzParams.for_tensor("rel", rel, t.reshape(-1), reference.sz_stats))
            int16_zstd += len(ZSTD.compress(codes.clamp(-32768, 32767).to(torch.int16).numpy().tobytes()))
            planes_zstd += len(ZSTD.compress(byte_planes(codes))) + int(outliers.sum()) * 8
        print(f"{name:22s} rel {rel:<5g} sz {raw / sz:6.2f}x  sz+zstd {raw / sz_zstd:6.2f}x  int16 codes+zstd"
              f" {raw / int16_zstd:6.2f}x  byte planes+zstd {raw / planes_zstd:6.2f}x  order-0 entropy of the codes {raw / coded:6.2f}x"
              f" ({sz_zstd / coded:.2f}x of sz+zstd)")

print("\n2. particle-transformer's layer-norm inputs: tensor-wide sz + zstd vs per-row scaled, same xhat error")
model, x, y, loss = Workload.of("particle-transformer", scale="tiny").build(64, 0)
inputs = []
hooks = [m.register_forward_pre_hook(lambda m, args: inputs.append((m.eps, args[0].detach().clone())))
         for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
loss(model(x), y)
for eps, tensor in inputs:
    rows = tensor.reshape(-1, tensor.shape[-1])
    std = (rows.var(1, unbiased=False) + eps).sqrt()
    exponent = torch.round(torch.log2(std))
    scaled = rows * torch.exp2(-exponent)[:, None]
    factor = torch.exp2(exponent) / std  # the scaled rows' error, in xhat units, per unit of bound
    for rel in (1e-2, 1e-1):
        bound = rel * float(std.min())
        row_bound = bound * float((std.pow(-2).mean() / factor.pow(2).mean()).sqrt())
        whole = get_codec({"id": "sz", "mode": "abs", "bound": bound, "entropy": "zstd"}).encode(rows).nbytes
        per_row = get_codec({"id": "sz", "mode": "abs", "bound": row_bound, "entropy": "zstd"}).encode(scaled).nbytes
        per_row += rows.shape[0]
        print(f"{str(tuple(tensor.shape)):14s} row std {float(std.min()):.3g}..{float(std.max()):.3g}  rel {rel:<5g}"
              f" whole {rows.numel() * 4 / whole:6.2f}x  per row {rows.numel() * 4 / per_row:6.2f}x"
              f"  ({whole / per_row:.2f}x)")
