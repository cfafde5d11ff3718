"""Element-wise verification of the error-bound guarantee.

Used by the tests, the benchmark and the runtime's checking mode, so that all
three judge a codec by one definition: for every finite element the error is
within the bound (computed in float64 from values in the tensor's own dtype);
NaN, +Inf and -Inf come back exactly; zero comes back zero; a positive value
stays positive and a negative one negative.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpcdl.compress.base import ErrorBound


@dataclass(frozen=True)
class BoundReport:
    """Result of :func:`check_bound`; ``ok`` is True when every rule holds."""

    max_error: float
    max_error_over_bound: float
    bound_violations: int
    nonfinite_mismatches: int
    zero_mismatches: int
    sign_flips: int

    @property
    def ok(self) -> bool:
        return (self.bound_violations, self.nonfinite_mismatches, self.zero_mismatches, self.sign_flips) == (0, 0, 0, 0)


def check_bound(original: torch.Tensor, restored: torch.Tensor, mode: str, bound: float) -> BoundReport:
    """Check ``restored`` against ``original`` under an error bound; shapes and dtypes must match."""
    if original.shape != restored.shape or original.dtype != restored.dtype:
        raise ValueError(
            f"restored tensor is {tuple(restored.shape)} {restored.dtype}, original is {tuple(original.shape)} {original.dtype}"
        )
    x = original.detach().reshape(-1).to("cpu", torch.float64)
    y = restored.detach().reshape(-1).to("cpu", torch.float64)
    finite = torch.isfinite(x)
    error = (x - y).abs()
    error = torch.where(finite, error, torch.zeros_like(error))
    tolerance = ErrorBound(mode, bound).tolerance(original.detach().reshape(-1).cpu())
    nan_mismatch = torch.isnan(x) != torch.isnan(y)
    inf_mismatch = torch.isinf(x) & (x != y)
    zero_mismatch = (x == 0) != (y == 0)
    sign_flip = ((x > 0) & ~(y > 0)) | ((x < 0) & ~(y < 0))
    over = finite & (error > tolerance)
    with torch.no_grad():
        ratio = torch.where(tolerance > 0, error / tolerance, torch.where(error > 0, torch.inf, 0.0))
    return BoundReport(
        max_error=float(error.max()) if error.numel() else 0.0,
        max_error_over_bound=float(ratio[finite].max()) if finite.any() else 0.0,
        bound_violations=int(over.sum()),
        nonfinite_mismatches=int((nan_mismatch | inf_mismatch).sum()),
        zero_mismatches=int(zero_mismatch.sum()),
        sign_flips=int(sign_flip.sum()),
    )
