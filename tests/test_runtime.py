"""mrc.runtime: the process set-up every entry point imports first."""
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def kept_freed_memory(**env) -> str:
    code = "from mrc import runtime; print(runtime.KEPT_FREED_MEMORY)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the malloc settings are glibc's")
def test_glibc_keeps_freed_memory_unless_turned_off():
    assert kept_freed_memory() == "True"
    assert kept_freed_memory(MRC_KEEP_FREED_MEMORY="0") == "False"
