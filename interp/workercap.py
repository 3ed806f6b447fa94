"""How many local worker processes `--workers` / `spawn_local` accept: a stated cap, free of torch
(the CLI's argument parser checks it before anything heavy is imported)."""
from __future__ import annotations

import os

MAX_WORKERS_PER_CORE = 4  # local processes per CPU core that --workers / spawn_local accept


def max_workers() -> int:
    """The most local worker processes accepted: MAX_WORKERS_PER_CORE x the CPU cores of this machine."""
    return MAX_WORKERS_PER_CORE * (os.cpu_count() or 1)


def workers_problem(value: int) -> str | None:
    """Why `value` local worker processes are refused, or None when they are fine."""
    if value < 1:
        return f"--workers {value}: need at least 1 process"
    if value > max_workers():
        return (f"--workers {value}: at most {max_workers()} ({MAX_WORKERS_PER_CORE} per CPU core, "
                f"{os.cpu_count() or 1} cores here); more processes only compete for the same cores")
    return None
