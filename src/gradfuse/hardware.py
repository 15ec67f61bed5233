"""What this process's CPU computes natively, as the precision choices and every benchmark file need to know.

bf16 is native where the CPU has AVX512-BF16 or AMX *and* the kernels may use them: PyTorch's own kernels follow
`ATEN_CPU_CAPABILITY`, its matrix products (oneDNN) follow `ONEDNN_MAX_CPU_ISA`. Both set to AVX2 run an AVX2-only
machine's kernels on a larger CPU: with only the first, bf16 products still ran at native speed (measured by hand:
23.7 passages per CPU-second, against 3.6 with both), so a run meant as "an AVX2 machine" sets both (`AVX2_ONLY`).
"""

from __future__ import annotations

import os
import platform
from functools import cache
from pathlib import Path

BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
SHOWN_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # what a benchmark file says of the CPU
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}  # an AVX2-only machine's kernels
KERNEL_CAPS = (*AVX2_ONLY, "DNNL_MAX_CPU_ISA")  # every variable that can cap them (DNNL_: oneDNN's older name)


@cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), frozenset()
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line and line.startswith(("model name",
                                                                                                     "flags")))
    names = {key.strip(): value.strip() for key, value in fields.items()}
    return names.get("model name", platform.machine()), frozenset(names.get("flags", "").split())


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (empty elsewhere: then nothing is native bf16)."""
    return _cpuinfo()[1]


def kernels_capped() -> bool:
    """Whether the environment keeps PyTorch's kernels below bf16 ones (see the module's text)."""
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    onednn = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    aten_capped = aten in ("default", "avx2", "zvector", "vsx")
    onednn_capped = onednn not in ("", "ALL") and not any(part in onednn for part in ("BF16", "AMX", "AVX10"))
    return aten_capped or onednn_capped


def native_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether bf16 runs natively here: the CPU has `BF16_CPU_FLAGS` and the kernels are not capped."""
    return bool((cpu_flags() if flags is None else flags) & BF16_CPU_FLAGS) and not kernels_capped()


def cpu_description() -> str:
    """The CPU a measurement ran on, as benchmark files record it: model, cores, flags, and any kernel cap."""
    model, flags = _cpuinfo()
    shown = ", ".join(flag for flag in SHOWN_FLAGS if flag in flags) or "none of " + ", ".join(SHOWN_FLAGS)
    caps = {name: os.environ[name] for name in KERNEL_CAPS if os.environ.get(name)}
    capped = f"; kernels capped by {', '.join(f'{k}={v}' for k, v in caps.items())}" if caps else ""
    return f"{model}, {os.cpu_count()} cores, {shown}{capped}; bf16 native: {'yes' if native_bf16() else 'no'}"
