"""Process set-up shared by every entry point. Import before paddle.

- Threads: Paddle pins itself to one OpenMP thread unless OMP_NUM_THREADS is set; use every core.
- MKL_DEBUG_CPU_TYPE=5 on AMD CPUs only: Paddle's bundled MKL takes a slow code path there (~2x measured on an EPYC);
  on Intel the same setting forces its AVX2 path (a Xeon with AVX-512: 2048^3 GEMM 116 -> 68 GFLOP/s, 2 threads).
- FLAGS_use_stride_kernel=0: paddle 3's transpose returns a strided view, and the copy that later makes it contiguous
  (a reshape, a matmul operand, a gradient) runs at ~50 ns per element on the CPU: the attention's head transposes
  took 24% of a QA training step (one [16, 256, 4, 64] transpose + copy 67 ms; with the flag 0.9-2.8 ms). Without
  stride kernels transpose is paddle 2.x's copying kernel: QA step seq 256 x 16, 2 threads, 4.42 -> 1.79 s (Xeon).
- scipy.linalg is imported before paddle: with paddlepaddle-gpu 2.6.2 a later import fails (zlib clash).
- glibc keeps freed blocks up to 32 MiB for reuse (`keep_freed_memory`): by default it hands every block above its
  mmap threshold back to the OS, and paddle's CPU allocator then page-faults fresh memory for each new tensor.
"""
import ctypes
import logging
import os
import sys


def cpu_vendor(cpuinfo="/proc/cpuinfo") -> str:
    """The CPU's vendor_id ('AuthenticAMD', 'GenuineIntel', ...), '' where /proc/cpuinfo cannot tell."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
if cpu_vendor() == "AuthenticAMD":
    os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")
os.environ.setdefault("FLAGS_use_stride_kernel", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "0")

# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit


def keep_freed_memory() -> bool:
    """Serve tensors up to 32 MiB from glibc's heap and never trim it: a [4096, 256] float multiply then takes 0.07 ms
    instead of 1.2 ms (measured here: the 1.1 ms were page faults on freshly mmapped memory, numpy's own multiply
    of the same arrays 0.15 ms). Costs resident memory: peak heap use is kept. MRC_KEEP_FREED_MEMORY=0 turns it off."""
    if os.environ.get("MRC_KEEP_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (e.g. musl): nothing to tune
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


KEPT_FREED_MEMORY = keep_freed_memory()

import scipy.linalg  # noqa: E402,F401  (must precede `import paddle`, see above)

from .errors import MRCError  # noqa: E402

logging.basicConfig(
    level=os.environ.get("MRC_LOG_LEVEL", "INFO"),
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    datefmt="%H:%M:%S",
)
log = logging.getLogger("mrc")


def run_main(main):
    """Run an entry point: bad input ends in one line on stderr and exit code 1, never a traceback."""
    try:
        code = main()
    except MRCError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    from .distributed import finish

    finish(code or 0)  # launched workers: barrier + os._exit (Paddle's gloo teardown can abort); else no-op
    sys.exit(code or 0)
