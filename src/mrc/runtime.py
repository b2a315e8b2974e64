"""Process set-up shared by every entry point. Import before paddle.

- Threads: Paddle pins itself to one OpenMP thread unless OMP_NUM_THREADS is set; use every core.
- MKL_DEBUG_CPU_TYPE=5: Paddle's bundled MKL takes a slow code path on AMD CPUs (~2x measured here).
- scipy.linalg is imported before paddle: with paddlepaddle-gpu 2.6.2 a later import fails (zlib clash).
"""
import logging
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")
os.environ.setdefault("HF_HUB_OFFLINE", "0")

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
