"""The scoring LM's precision: `auto` is bfloat16 where the hardware computes it natively, float32 elsewhere.

bf16 gave the same UPR scores at 2.2x less CPU here (Spearman 0.976-0.998 against fp32, the same top passage;
results/latency). Without AVX512-BF16 or AMX (or with the kernels capped below them, gradfuse.hardware), PyTorch
emulates bf16 on the CPU and is slower than fp32, so those CPUs keep fp32. bf16 numerics also differ between CPUs
that have it, so whatever must give the same numbers on every machine (the quick benchmarks checked in CI) names
float32 itself.
"""

from __future__ import annotations

from gradfuse.hardware import native_bf16


def resolve_dtype(dtype: str, device: str = "cpu", flags: frozenset[str] | None = None) -> str:
    """`dtype` itself unless it is auto; then bfloat16 on a GPU that supports it or where the CPU computes it
    natively (`gradfuse.hardware.native_bf16`, with these `flags` if given)."""
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if native_bf16(flags) else "float32"
