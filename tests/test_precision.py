"""The scoring LM's precision: auto is bfloat16 only where the CPU computes it natively."""

import pytest

from gradfuse.rerank import RerankSettings, load_scorer
from gradfuse.hardware import AVX2_ONLY, BF16_CPU_FLAGS, KERNEL_CAPS, native_bf16
from gradfuse.rerank.precision import resolve_dtype


@pytest.mark.parametrize("flags, expected", [
    ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"),
    ({"avx2", "amx_bf16", "amx_tile"}, "bfloat16"),
    ({"avx2", "avx512f", "fma"}, "float32"),  # AVX-512 without its bf16 extension emulates bf16: slower than fp32
    (set(), "float32"),  # no /proc/cpuinfo (not Linux)
])
def test_auto_is_bfloat16_only_with_the_cpus_bf16_instructions(flags, expected, monkeypatch):
    for name in KERNEL_CAPS:
        monkeypatch.delenv(name, raising=False)
    assert resolve_dtype("auto", "cpu", frozenset(flags)) == expected


def test_a_named_precision_is_kept_whatever_the_cpu():
    assert resolve_dtype("float32", "cpu", frozenset(BF16_CPU_FLAGS)) == "float32"
    assert resolve_dtype("bfloat16", "cpu", frozenset()) == "bfloat16"


def test_the_default_scoring_lm_runs_in_what_this_machines_cpu_supports():
    import torch

    assert RerankSettings().dtype == "auto"
    expected = torch.bfloat16 if native_bf16() else torch.float32
    lm = load_scorer("smollm2", 48)  # the default precision, as a request loads it
    assert next(lm.model.parameters()).dtype == expected


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="unknown dtype 'float16'"):
        RerankSettings(dtype="float16")


@pytest.mark.parametrize("variable, value", [*AVX2_ONLY.items(), ("DNNL_MAX_CPU_ISA", "AVX512_CORE")])
def test_kernels_capped_below_bf16_make_auto_float32_on_a_bf16_cpu(variable, value, monkeypatch):
    monkeypatch.setenv(variable, value)  # PyTorch would emulate bf16 here, as on an AVX2-only machine
    assert resolve_dtype("auto", "cpu", frozenset(BF16_CPU_FLAGS)) == "float32"


@pytest.mark.parametrize("variable, value", [("ATEN_CPU_CAPABILITY", "avx512"), ("ONEDNN_MAX_CPU_ISA", "ALL"),
                                             ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")])
def test_caps_that_keep_bf16_kernels_keep_auto_bfloat16(variable, value, monkeypatch):
    for name in KERNEL_CAPS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    assert resolve_dtype("auto", "cpu", frozenset(BF16_CPU_FLAGS)) == "bfloat16"
