"""mrc.runtime: the process set-up every entry point imports first."""
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def fresh_process(code: str, drop=(), **env) -> str:
    """stdout of `code` run in a new interpreter (runtime acts at import), env vars in `drop` removed first."""
    base = {k: v for k, v in os.environ.items() if k not in drop}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**base, "PYTHONPATH": str(ROOT / "src"), **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def kept_freed_memory(**env) -> str:
    return fresh_process("from mrc import runtime; print(runtime.KEPT_FREED_MEMORY)", **env)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the malloc settings are glibc's")
def test_glibc_keeps_freed_memory_unless_turned_off():
    assert kept_freed_memory() == "True"
    assert kept_freed_memory(MRC_KEEP_FREED_MEMORY="0") == "False"


def test_cpu_vendor_reads_proc_cpuinfo(tmp_path):
    from mrc.runtime import cpu_vendor

    amd = tmp_path / "amd"
    amd.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n", encoding="utf-8")
    intel = tmp_path / "intel"
    intel.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R)\n", encoding="utf-8")
    assert cpu_vendor(str(amd)) == "AuthenticAMD"
    assert cpu_vendor(str(intel)) == "GenuineIntel"
    assert cpu_vendor(str(tmp_path / "absent")) == ""


def test_mkl_amd_path_only_on_amd_and_never_over_the_users_choice():
    # MKL_DEBUG_CPU_TYPE=5 lifts paddle's MKL on AMD but forces the AVX2 path on an AVX-512 Intel CPU
    code = "import os; from mrc import runtime; print(repr(runtime.cpu_vendor()), os.environ.get('MKL_DEBUG_CPU_TYPE'))"
    vendor, mkl = fresh_process(code, drop=("MKL_DEBUG_CPU_TYPE",)).split()
    assert mkl == ("5" if vendor == "'AuthenticAMD'" else "None")
    assert fresh_process(code, MKL_DEBUG_CPU_TYPE="4").split()[1] == "4"


def test_transpose_copies_instead_of_striding():
    # paddle 3's strided copies cost ~50 ns per element on the CPU; runtime turns stride kernels off
    code = ("from mrc import runtime; import paddle; x = paddle.randn([2, 3, 4]); t = x.transpose([0, 2, 1]); "
            "print(paddle.get_flags(['FLAGS_use_stride_kernel'])['FLAGS_use_stride_kernel'], t.is_contiguous(), "
            "bool((t.numpy() == x.numpy().transpose(0, 2, 1)).all()))")
    assert fresh_process(code).split()[-3:] == ["False", "True", "True"]
