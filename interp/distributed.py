"""Data parallel over prompts with `torch.distributed`: the same numbers on 1 or N processes.

Vocabulary:
- *process group*: started by `torchrun` (env:// rendezvous), by `interp ... --workers N`
  (`spawn_local`, a gloo group on this machine), or by the caller's own
  `torch.distributed.init_process_group`. gloo on CPU, NCCL on GPUs.
- *shard*: the prompts one rank runs. Shards are **contiguous** runs of whole batches, in
  global prompt order: with `n_batches = ceil(n / batch_size)`, rank r runs batches
  `[r * n_batches // world, (r + 1) * n_batches // world)`. Every batch a rank runs is
  exactly a batch the single process runs (same prompts, same shapes, so the same kernels
  and bit-identical per-prompt values); concatenating shards in rank order is global order.
- *merge*: after streaming its shard, each rank combines accumulators with collectives:
  sums and counts (`MomentAccumulator`) with `all_reduce`; per-prompt values
  (`PerPromptAccumulator`, and any accumulator with `merge`) with `all_gather_object`,
  merged in rank order, i.e. global prompt order. **Every** rank ends with the full result,
  so the statistics that follow (bootstrap, permutation tests, BH) run on identical data on
  every rank and give identical numbers; only rank 0 prints or writes.

Randomness: everything drawn on the whole prompt set (prompt generation, shuffled controls,
splits, bootstraps over prompts) runs before sharding or after merging, identically on every
rank. Randomness drawn *inside* a sharded loop is keyed by the prompt's global index
(`prompt_generator`), never by rank or batch, so results do not depend on the worker count.

Without a process group (or with one process, or inside `local()`), every helper is a no-op:
`shard` returns the prompts unchanged and `merge` returns the accumulator.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import os
import pickle
import socket
import sys
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from interp.errors import EXIT_INTERNAL, BadInput, InternalError, RemoteFailure, exit_code_for
from interp.workercap import workers_problem

_LOCAL_DEPTH = [0]  # > 0 inside `local()`: collectives are off for this process


# ---------------------------------------------------------------------------------------------
# rank and world


def _dist():
    import torch.distributed as dist

    return dist


def active() -> bool:
    """True when analyses shard over a process group: one is initialised, it has > 1 rank,
    and we are not inside `local()`."""
    dist = _dist()
    return _LOCAL_DEPTH[0] == 0 and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    dist = _dist()
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    """Number of ranks (1 without a process group)."""
    dist = _dist()
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main() -> bool:
    """True on rank 0, the one that prints and writes (and without a process group)."""
    return rank() == 0


@contextlib.contextmanager
def local() -> Iterator[None]:
    """Inside, analyses run on this rank alone (no sharding, no collectives): for code that
    only one rank executes, e.g. rendering on rank 0. A collective missed by one rank would
    leave the others waiting."""
    _LOCAL_DEPTH[0] += 1
    try:
        yield
    finally:
        _LOCAL_DEPTH[0] -= 1


# ---------------------------------------------------------------------------------------------
# sharding


def shard_range(n_prompts: int, batch_size: int, rank_: int | None = None, world: int | None = None) -> range:
    """Global prompt indices this rank runs: a contiguous run of whole batches (module docstring)."""
    if batch_size < 1:
        raise BadInput(f"batch_size={batch_size} must be at least 1.")
    world = world_size() if world is None else world
    rank_ = rank() if rank_ is None else rank_
    if not 0 <= rank_ < world:
        raise BadInput(f"rank={rank_} is outside a world of {world} processes.")
    if world == 1:
        return range(n_prompts)
    n_batches = -(-n_prompts // batch_size)
    first, last = rank_ * n_batches // world, (rank_ + 1) * n_batches // world
    return range(min(first * batch_size, n_prompts), min(last * batch_size, n_prompts))


@dataclass(frozen=True)
class Shard:
    """The part of a PromptSet this rank runs, and where it sits in the whole set."""

    prompts: Any  # PromptSet, possibly empty
    indices: range  # global prompt indices of `prompts`

    def batches(self, batch_size: int) -> Iterator[tuple[range, Any]]:
        """(global indices, batch) pairs: the same batches the single process runs."""
        for start in range(0, len(self.indices), batch_size):
            stop = min(start + batch_size, len(self.indices))
            yield self.indices[start:stop], self.prompts[start:stop]


def shard(prompts, batch_size: int) -> Shard:
    """This rank's shard of `prompts` (all of them when not `active()`)."""
    indices = shard_range(len(prompts), batch_size) if active() else range(len(prompts))
    return Shard(prompts[indices.start : indices.stop], indices)


def prompt_generator(seed: int, purpose: str, index: int, *key: int) -> torch.Generator:
    """A CPU generator for one prompt, keyed by (seed, purpose, global prompt index, *key):
    the same draw whichever rank runs the prompt and however the set is batched."""
    text = "/".join(str(part) for part in (seed, purpose, index, *key))
    return torch.Generator().manual_seed(zlib.crc32(text.encode()))


# ---------------------------------------------------------------------------------------------
# collectives


def gather_objects(value: Any) -> list[Any]:
    """Every rank's `value`, in rank order, on every rank ([value] when not `active()`)."""
    if not active():
        return [value]
    parts: list[Any] = [None] * world_size()
    _dist().all_gather_object(parts, value)
    return parts


def gather_prompts(value: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Concatenate each rank's per-prompt tensor along `dim` in rank (= global prompt) order."""
    if not active():
        return value
    return torch.cat([part.to(value.device) for part in gather_objects(value.cpu())], dim=dim)


def all_reduce_sum(tensors: list[torch.Tensor]) -> None:
    """Sum each tensor over ranks, in place (float64 stays float64)."""
    if not active():
        return
    dist = _dist()
    backend = dist.get_backend()
    for tensor in tensors:
        if backend == "nccl" and tensor.device.type != "cuda":
            moved = tensor.cuda()
            dist.all_reduce(moved)
            tensor.copy_(moved.cpu())
        else:
            dist.all_reduce(tensor)


def merge(accumulator):
    """Combine this rank's accumulator with every other rank's; every rank returns the whole.

    Moment-style accumulators (with `tensors()`, e.g. `MomentAccumulator`) are summed with
    `all_reduce` (shapes agreed first, so a rank with an empty shard contributes zeros);
    others (with `merge`, e.g. `PerPromptAccumulator`) are gathered and merged in rank order.
    """
    if not active():
        return accumulator
    if hasattr(accumulator, "tensors") and hasattr(accumulator, "align"):
        layout: dict[str, tuple[int, ...]] = next((part for part in gather_objects(accumulator.layout()) if part), {})
        accumulator.align(layout)
        all_reduce_sum(accumulator.tensors())
        return accumulator
    if not hasattr(accumulator, "merge"):
        raise BadInput(
            f"{type(accumulator).__name__} cannot be merged across processes: give it a `merge(other)` "
            "method (appending other's prompts) or `tensors()` + `layout()` + `align()` for sums."
        )
    parts = gather_objects(accumulator)
    merged = parts[0]
    for part in parts[1:]:
        merged.merge(part)
    return merged


def mine(index: int) -> bool:
    """Whether work item `index` of a shared-out loop is this rank's (every world-th; all without a group)."""
    return not active() or index % world_size() == rank()


def fmax_merge(value: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum over ranks, NaN meaning "not measured here" (`torch.fmax`): exact, so the
    result does not depend on the order of the ranks."""
    if not active():
        return value
    merged = functools.reduce(torch.fmax, gather_objects(value.cpu()))  # one part per rank, at least one
    return merged.to(value.device)


def broadcast_object(value: Any, src: int = 0) -> Any:
    """Rank `src`'s value on every rank (the value itself when not `active()`)."""
    if not active():
        return value
    box = [value]
    _dist().broadcast_object_list(box, src=src)
    return box[0]


# ---------------------------------------------------------------------------------------------
# process groups


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def default_backend() -> str:
    """NCCL when this process has a CUDA device, else gloo."""
    return "nccl" if torch.cuda.is_available() else "gloo"


TORCHRUN_HINT = ("torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT: launch with "
                 "`torchrun --nproc-per-node N -m interp.cli ...`, or unset them to run in one process.")


def _env_int(env, name: str, low: int, high: int | None = None) -> int:
    """The whole number `env[name]` within [low, high]; BadInput naming the variable otherwise."""
    text = env[name]
    try:
        value = int(text.strip())
    except ValueError:
        raise BadInput(f"{name}={text!r} (from the environment) is not a whole number. {TORCHRUN_HINT}") from None
    if value < low or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"within {low} .. {high}"
        raise BadInput(f"{name}={value} (from the environment) must be {bounds}. {TORCHRUN_HINT}")
    return value


def check_torchrun_env(env=None) -> dict[str, int]:
    """RANK, WORLD_SIZE (and LOCAL_RANK, MASTER_PORT where set) as integers, checked before any process
    group starts: a rank outside the world would wait for its peers forever. BadInput otherwise."""
    env = os.environ if env is None else env
    world = _env_int(env, "WORLD_SIZE", 1)
    rank_ = _env_int(env, "RANK", -(2**63))
    if not 0 <= rank_ < world:
        raise BadInput(f"RANK={rank_} is outside a world of WORLD_SIZE={world} processes (ranks 0 .. {world - 1}). "
                       f"{TORCHRUN_HINT}")
    values = {"RANK": rank_, "WORLD_SIZE": world}
    if "LOCAL_RANK" in env:
        values["LOCAL_RANK"] = _env_int(env, "LOCAL_RANK", 0)
    if "MASTER_PORT" in env:
        values["MASTER_PORT"] = _env_int(env, "MASTER_PORT", 1, 65535)
    if not env.get("MASTER_ADDR", "").strip():
        raise BadInput(f"MASTER_ADDR is not set (or empty): the address of rank 0 is needed. {TORCHRUN_HINT}")
    return values


def init_from_env(backend: str | None = None, timeout_s: float = 1800) -> bool:
    """Join the process group `torchrun` describes in the environment (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT; checked first by `check_torchrun_env`); False (and nothing done)
    when not launched that way."""
    dist = _dist()
    if dist.is_initialized() or "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return dist.is_initialized()
    values = check_torchrun_env()
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(values.get("LOCAL_RANK", 0))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return True


def _worker(rank_: int, world: int, port: int, fn: Callable, args: tuple, backend: str, threads: int | None,
            on_error: Callable[[BaseException], None] | None = None,
            before_teardown: Callable[[bool], None] | None = None):
    """`fn(*args)` as rank `rank_` of the group; `on_error(error)` runs before the group is torn down, so
    a failure is reported before the other ranks can see this one go; `before_teardown(failed)` runs just
    before this rank's group goes (rank 0: waiting for the other ranks to leave first, `_run_rank_0`)."""
    if threads is not None:
        torch.set_num_threads(threads)
    group_env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank_), WORLD_SIZE=str(world),
                     LOCAL_RANK=str(rank_))
    saved = {key: os.environ.get(key) for key in group_env}
    os.environ.update(group_env)
    failed = True
    try:
        init_from_env(backend)
        value = fn(*args)
        failed = False
        return value
    except BaseException as error:
        if on_error is not None:
            on_error(error)
        raise
    finally:
        if before_teardown is not None:
            before_teardown(failed)
        if _dist().is_initialized():
            _dist().destroy_process_group()
        for key, value in saved.items():  # this process may run later commands without a group
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _child(rank_: int, world: int, port: int, fn: Callable, args: tuple, backend: str, threads: int | None,
           silent: bool, results, return_value: bool) -> None:
    if silent:
        devnull = open(os.devnull, "w")
        sys.stdout = sys.stderr = devnull
    def report(error: BaseException) -> None:  # its class and message go to the parent, which raises them again
        results.put((rank_, "error", RemoteFailure.of(error, f"worker rank {rank_}")))

    value = _worker(rank_, world, port, fn, args, backend, threads, on_error=report)
    if return_value:  # plain pickle bytes: tensors copied, not shared through descriptors of a dead process
        results.put((rank_, "ok", pickle.dumps(value)))


def spawn_local(fn: Callable, args: tuple = (), *, workers: int, backend: str = "gloo",
                threads: int | None = None, return_all: bool = False, timeout_s: float = 1800):
    """Run `fn(*args)` on `workers` processes of a fresh local process group.

    Rank 0 runs in *this* process (so it prints, writes and returns `fn`'s value); ranks
    1..N-1 are spawned children with their output silenced. With `return_all`, every rank
    runs in a child and the list of their return values (rank order) is returned: what tests
    use to compare ranks. `threads`: torch threads per process (None: unchanged).
    A child that fails makes this call raise the child's exception again: the same class and
    message (`interp.errors.RemoteFailure`), so the same exit code, with a note naming the rank.
    """
    problem = workers_problem(workers)
    if problem is not None:
        raise BadInput(problem.replace("--workers ", "workers=", 1) + ".")
    if workers == 1 and not return_all:
        return fn(*args)
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    port = _free_port()
    results = context.SimpleQueue()
    first_child = 0 if return_all else 1
    children = []
    for r in range(first_child, workers):
        child = context.Process(target=_child, args=(r, workers, port, fn, args, backend, threads, not return_all, results,
                                                     return_all), daemon=True)
        child.start()
        children.append(child)
    if return_all:
        return _collect(children, results, workers, timeout_s)
    return _run_rank_0(children, results, workers, port, fn, args, backend, threads)


# rank 0 hosts the group's TCPStore; before its group (and the store) goes, it waits this long for the other
# ranks to tear down their own and exit (well inside `_Watcher.GRACE_S`, which ends a stuck rank 0)
SETTLE_S = 10.0


def _run_rank_0(children, results, workers: int, port: int, fn: Callable, args: tuple, backend: str, threads: int | None):
    """Rank 0's share in this process while `_Watcher` reads the children's failures.

    Teardown order: rank 0 hosts the group's store, so its group goes last. When a worker has failed (or every
    rank has finished), rank 0 waits for the workers to tear down their groups and exit (`SETTLE_S`) before
    destroying its own: a worker's gloo pairs and store client otherwise close while rank 0 destroys the pairs
    and the store server under them, the race that aborted `--workers 2` once (SIGABRT) when a worker raised
    during rank 0's collective. When rank 0 fails first it does not wait: the workers may be blocked in a
    collective on it, and leave only when its group goes."""
    watcher = _Watcher(children, results)
    earlier: list[RemoteFailure | None] = []  # a worker's failure reported before rank 0's own error

    def note_earlier(error: BaseException) -> None:  # before rank 0's group goes, which makes the workers fail too
        earlier.append(watcher.failure())

    def settle(failed: bool) -> None:
        if failed and watcher.failure() is None:
            return  # rank 0 failed first
        deadline = time.monotonic() + SETTLE_S
        for child in children:
            child.join(timeout=max(0.0, deadline - time.monotonic()))

    try:
        value = _worker(0, workers, port, fn, args, backend, threads, on_error=note_earlier, before_teardown=settle)
    except Exception as error:
        if earlier and earlier[0] is not None and exit_code_for(error) == EXIT_INTERNAL:  # rank 0 saw its peer go
            raise earlier[0].rebuild() from None
        raise
    finally:
        watcher.stop()
        for child in children:
            child.join(timeout=60)
    failure = watcher.failure()
    if failure is not None:  # rank 0 finished, a worker did not: its result is not the whole
        raise failure.rebuild()
    return value


def _next_report(children, results, deadline: float) -> tuple[int, str, Any]:
    """The next (rank, status, value) a child put on `results`; an InternalError when a child died without
    reporting (killed, out of memory) or the deadline passed, never a wait for ever."""
    while results.empty():
        silent = [child for child in children if child.exitcode not in (None, 0)]
        if silent or time.monotonic() > deadline:
            for child in children:
                child.terminate()
            why = (f"worker process {silent[0].name} died with exit code {silent[0].exitcode} without reporting"
                   if silent else "the worker processes did not finish within timeout_s")
            raise InternalError(f"{why}; nothing was returned. Rerun with one worker to see its own error.")
        time.sleep(0.1)
    return results.get()


def _collect(children, results, workers: int, timeout_s: float) -> list[Any]:
    values: dict[int, Any] = {}
    failure: RemoteFailure | None = None
    deadline = time.monotonic() + timeout_s
    for _ in range(workers):
        rank_, status, value = _next_report(children, results, deadline)
        if status == "ok":
            values[rank_] = pickle.loads(value)  # bytes our own child wrote, never a user's file
        else:
            failure = value
            break
    for child in children:
        child.join(timeout=5 if failure else timeout_s)
        if child.is_alive():
            child.terminate()
    if failure is not None:
        raise failure.rebuild()
    return [values[r] for r in range(workers)]


class _Watcher:
    """A thread that reads the children's failure reports and ends this process when a child has
    failed and rank 0 stays blocked (the collectives of the surviving ranks would otherwise wait for
    it until the group times out): with the child's message and exit code, or 3 for a child that died
    without a report (killed, out of memory)."""

    GRACE_S = 20  # for rank 0 to see its peer gone and raise the worker's error itself

    def __init__(self, children, results):
        import threading

        self.children, self.results = children, results
        self.failures: list[RemoteFailure] = []
        self.lock, self.done = threading.Lock(), threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _read(self) -> None:
        with self.lock:
            while not self.results.empty():
                _, status, value = self.results.get()
                if status == "error":
                    self.failures.append(value)

    def failure(self) -> RemoteFailure | None:
        """The first failure a child has reported (a child reports before its group goes), or None."""
        self._read()
        return self.failures[0] if self.failures else None

    def stop(self) -> None:
        self.done.set()

    def _run(self) -> None:
        failed_at = None
        while not self.done.wait(0.5):
            self._read()
            dead = [child for child in self.children if child.exitcode not in (None, 0)]
            if not dead and not self.failures:
                continue
            failed_at = failed_at or time.monotonic()
            if self.failures and time.monotonic() - failed_at < self.GRACE_S:
                continue  # rank 0 normally raises the worker's error itself, through the CLI
            self._end(dead)

    def _end(self, dead) -> None:
        if self.done.is_set():
            return
        if self.failures:
            error = self.failures[0].rebuild()
            print(f"interp: error in {self.failures[0].process}: {error}", file=sys.__stderr__)
            os._exit(exit_code_for(error))
        print(f"interp: worker process {dead[0].name} exited with code {dead[0].exitcode}; stopping.", file=sys.__stderr__)
        os._exit(EXIT_INTERNAL)
