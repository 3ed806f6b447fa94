"""Command-line scale-out: `--workers N`, `--device`, `--dtype` on every `interp` command (and `--logits-key`
on those that read the model's logits).

Kept apart from `interp.distributed` and free of torch at import time, so `interp --help`
stays instant. `add_flags(parser)` adds the flags to every subcommand and wraps each
handler in `Scaled`, which:
- under `torchrun` (RANK / WORLD_SIZE in the environment) joins that process group;
- with `--workers N > 1`, starts a local gloo group of N processes (`spawn_local`): this
  process is rank 0, the others are spawned children;
- on ranks other than 0, silences stdout / stderr and points `--out`, `--json`, `--sarif`, `--junit` and
  `--png` away (every rank computes the same merged results; only rank 0 prints and writes);
- records `--device` / `--dtype` / `--logits-key` for `place(model)`, which the CLI's loader applies.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from typing import TYPE_CHECKING, Callable, Union

from interp.workercap import MAX_WORKERS_PER_CORE, max_workers, workers_problem

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")
Device = Union[str, "torch.device", None]  # "cpu", "cuda", "cuda:1", a torch.device; the analyses' `device=`
DType = Union[str, "torch.dtype", None]  # "float32", "bfloat16", "float16", or the torch dtype; their `dtype=`
_PLACEMENT: dict[str, str | None] = {"device": None, "dtype": None, "output": None}


NO_LOGITS_KEY = ("demo", "heads", "qk")  # commands that never read the model's logits (the demo's model is embedded)


def add_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add --workers / --device / --dtype to every subcommand of `parser` (not `train`), and --logits-key to those
    that read the model's logits; returns it."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, sub in action.choices.items():
            handler = sub.get_default("handler")
            if name == "train" or handler is None or isinstance(handler, Scaled):
                continue
            group = sub.add_argument_group("scale-out")
            group.add_argument("--workers", type=_workers, default=1, metavar="N",
                               help="run on N local processes (a gloo group; numbers identical to 1), at most "
                                    f"{MAX_WORKERS_PER_CORE} per CPU core ({max_workers()} here); "
                                    "or launch with torchrun --nproc-per-node N -m interp.cli ...")
            group.add_argument("--device", default=None, metavar="DEV",
                               help="cpu, cuda, cuda:1 ... (default: cpu; under torchrun on GPUs, each rank's own GPU)")
            group.add_argument("--dtype", choices=DTYPES, default=None,
                               help="model weights' dtype (statistics are accumulated in float32 or float64)")
            if name not in NO_LOGITS_KEY:
                group.add_argument("--logits-key", default=None, metavar="KEY",
                                   help="which part of a forward returning a dict or tuple is the logits: a key "
                                        "(logits) or a tuple index (1); see interp.load(..., output=)")
                group.add_argument("--output", action=_Renamed, new="--logits-key", help=argparse.SUPPRESS)
            sub.set_defaults(handler=Scaled(handler))
            _alias(sub, "--n", "--n-prompts")
    return parser


class _Renamed(argparse.Action):
    """A flag's former name: refused with a usage error (exit 2) naming the new one. `--output` read like an output
    FILE (and `--out` was taken for it as an abbreviation), so the logits key is `--logits-key`."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        self.new = new
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs="?", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} was renamed {self.new} (which part of the forward's output is the logits); "
                     f"pass {self.new} {values or 'KEY'}.")


def _alias(parser: argparse.ArgumentParser, option: str, alias: str) -> None:
    """`alias` for `option`: torchrun's own parser refuses `--n` (an ambiguous prefix of its
    --nnodes / --nproc-per-node) anywhere on its command line, so `--n-prompts` gets through."""
    action = parser._option_string_actions.get(option)
    if action is not None and alias not in parser._option_string_actions:
        action.option_strings = [*action.option_strings, alias]  # typeshed: a read-only Sequence
        parser._option_string_actions[alias] = action


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of processes") from None
    problem = workers_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters (malloc.h)
KEEP_BLOCKS_BELOW = 2**30  # blocks up to 1 GiB come from the heap and are kept for reuse once freed


def tune_allocator() -> bool:
    """Tell glibc malloc to keep freed blocks (up to 1 GiB) for reuse instead of unmapping them.

    Why: activations of 32 MiB and more are above glibc's default mmap threshold, so every
    forward maps fresh pages and page-faults them in; with a full attention cache that, not
    the arithmetic, is most of the cost (benchmarks/bench_forward: 1.58x of no hooks with the
    default allocator, about 1.2x kept). Trade-off: the process's RSS stays near its peak
    instead of shrinking between forwards. The CLI calls this for every command; set
    INTERP_DEFAULT_ALLOCATOR=1 to opt out. Returns False where it does not apply (not glibc).
    """
    if os.environ.get("INTERP_DEFAULT_ALLOCATOR") or not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, KEEP_BLOCKS_BELOW)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):  # musl, macOS: nothing to tune
        return False


class Scaled:
    """A CLI handler run on every rank of a process group (see the module docstring)."""

    def __init__(self, handler: Callable):
        self.handler = handler

    def __call__(self, args) -> int:
        from interp.specnames import check_spec

        check_spec(getattr(args, "spec", None))  # a misspelt name is refused before torch is imported
        tune_allocator()
        workers = getattr(args, "workers", 1) or 1
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun
            return _run_rank(self.handler, args)
        if workers > 1:
            from interp.distributed import spawn_local

            threads = None if "OMP_NUM_THREADS" in os.environ else max(1, (os.cpu_count() or 1) // workers)
            return spawn_local(_run_rank, (self.handler, args), workers=workers, threads=threads)
        _PLACEMENT.update(device=getattr(args, "device", None), dtype=getattr(args, "dtype", None),
                          output=getattr(args, "logits_key", None))
        return self.handler(args)


def _run_rank(handler: Callable, args) -> int:
    import interp.distributed as distributed

    tune_allocator()  # spawned ranks are fresh processes

    distributed.init_from_env()
    device = getattr(args, "device", None)
    if device is None and distributed.default_backend() == "nccl":
        device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}"
    _PLACEMENT.update(device=device, dtype=getattr(args, "dtype", None), output=getattr(args, "logits_key", None))
    if distributed.is_main():
        return handler(args)
    with tempfile.TemporaryDirectory(prefix=f"interp-rank{distributed.rank()}-") as scratch, _silenced():
        if getattr(args, "out", None):
            args.out, args.force = os.path.join(scratch, "out"), True
        for flag in ("json", "sarif", "junit", "png"):  # one writer per output: a pipe or a device gets one document
            if getattr(args, flag, None):
                setattr(args, flag, os.path.join(scratch, f"result.{flag}"))
        return handler(args)


@contextlib.contextmanager
def _silenced():
    with open(os.devnull, "w") as devnull:
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = devnull
        try:
            yield
        finally:
            sys.stdout, sys.stderr = saved


def place(model):
    """Move a loaded model to the --device / --dtype of the running command (unchanged if unset), and record
    its --logits-key selector (`interp.validate.select_output`; a digit is a tuple index)."""
    output = _PLACEMENT.get("output")
    if output is not None:
        from interp.validate import select_output

        select_output(model, int(output) if output.lstrip("-").isdigit() else output)
    return move(model, device=_PLACEMENT["device"], dtype=_PLACEMENT["dtype"])


def move(model, *, device: Device = None, dtype: DType = None, copy: bool = False):
    """`model` on `device` ("cpu", "cuda:1", a torch.device) in `dtype` (a name of `DTYPES` or a
    torch dtype); unchanged where both are None or already so. `copy=True` leaves the caller's
    model as it was and moves a copy (what the analyses' `device=` / `dtype=` do). A device or
    dtype this process cannot use, or a model without `.to` (a plain callable), raises BadInput,
    before anything moves."""
    if device is None and dtype is None:
        return model
    if not callable(getattr(model, "to", None)):
        from interp.errors import BadInput

        raise BadInput(f"device= / dtype= need a model with .to() (an nn.Module); a {type(model).__name__} cannot be "
                       "moved: move or cast it yourself and leave both unset.")
    target = {}
    if device is not None:
        target["device"] = _check_device(device)
    if dtype is not None:
        target["dtype"] = _check_dtype(dtype)
    if _already(model, **target):
        return model  # no copy, nothing moved
    if copy:
        import copy as copying

        model = copying.deepcopy(model)
    return model.to(**target)


def _already(model, device=None, dtype=None) -> bool:
    """Whether the model's first parameter is already on `device` (any index for a bare "cuda") in `dtype`."""
    current = next(model.parameters(), None) if hasattr(model, "parameters") else None
    if current is None:
        return False
    same_device = device is None or (current.device.type == device.type and device.index in (None, current.device.index))
    return same_device and (dtype is None or current.dtype == dtype)


def _check_dtype(dtype):
    """A torch floating dtype of `DTYPES`, from its name or itself; BadInput otherwise."""
    import torch

    from interp.errors import BadInput

    resolved = (getattr(torch, dtype) if dtype in DTYPES else None) if isinstance(dtype, str) else dtype
    allowed = {getattr(torch, name) for name in DTYPES}
    if resolved not in allowed:
        raise BadInput(f"dtype={dtype!r} is not supported; expected one of {list(DTYPES)} (or the torch dtype).")
    return resolved


def _check_device(device):
    """A torch.device this process can use; BadInput naming the problem otherwise."""
    import torch

    from interp.errors import BadInput

    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise BadInput(f"device={device!r} is not a device: {error}. Use e.g. 'cpu', 'cuda' or 'cuda:1'.") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise BadInput(f"device={device!r}: this machine has no CUDA device (torch sees none); use 'cpu'.")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise BadInput(f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s) here "
                           f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1}).")
    elif resolved.type not in ("cpu", "mps"):
        raise BadInput(f"device={device!r}: {resolved.type} devices are not supported; use 'cpu' or 'cuda'.")
    return resolved
