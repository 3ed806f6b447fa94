"""Issue 24, processes: the torchrun environment is checked before a process group starts (#10, #17),
`--workers` has a stated cap (#10), and an error raised in a worker process keeps its class, its
message and so its exit code in the parent (#14).

Table-driven: `ENV_CASES` (a torchrun environment, the exit code, a regex for stderr) run in one
subprocess so a case that would wait forever for its peers times out instead of hanging pytest;
`WORKER_CASES` (a user model failing on one rank only, run with `--workers 1` and `--workers 2`).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from interp import distributed
from interp.errors import BadInput, InternalError, ModelError, exit_code_for

ROOT = Path(__file__).resolve().parents[2]

# (name, environment, exit code, stderr regex); MASTER_ADDR / MASTER_PORT of a real free port are
# added where a case does not set them, so an unchecked environment really starts to rendezvous
ENV_CASES = [
    ("rank above the world", {"RANK": "5", "WORLD_SIZE": "2"}, 2, r"RANK=5 .*WORLD_SIZE=2.*0 \.\. 1"),
    ("rank equal to the world", {"RANK": "2", "WORLD_SIZE": "2"}, 2, r"RANK=2 .*WORLD_SIZE=2"),
    ("negative rank", {"RANK": "-1", "WORLD_SIZE": "2"}, 2, r"RANK=-1"),
    ("world not a number", {"RANK": "0", "WORLD_SIZE": "abc"}, 2, r"WORLD_SIZE='abc' .*not a whole number"),
    ("rank not a number", {"RANK": "one", "WORLD_SIZE": "2"}, 2, r"RANK='one' .*not a whole number"),
    ("world of zero", {"RANK": "0", "WORLD_SIZE": "0"}, 2, r"WORLD_SIZE=0 .*at least 1"),
    ("fractional world", {"RANK": "0", "WORLD_SIZE": "2.0"}, 2, r"WORLD_SIZE='2\.0' .*not a whole number"),
    ("local rank not a number", {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "x"}, 2, r"LOCAL_RANK='x'"),
    ("negative local rank", {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "-2"}, 2, r"LOCAL_RANK=-2"),
    ("port not a number", {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "http"}, 2, r"MASTER_PORT='http'"),
    ("port out of range", {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "70000"}, 2, r"MASTER_PORT=70000 .*1 \.\. 65535"),
    ("no master address", {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": None}, 2, r"MASTER_ADDR is not set"),
]

_ENV_RUNNER = textwrap.dedent("""
    import contextlib, io, json, os, socket, sys
    from interp import cli

    out = {}
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    for name, env in json.loads(sys.argv[1]):
        for key in keys:
            os.environ.pop(key, None)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **env}
        os.environ.update({k: v for k, v in env.items() if v is not None})
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                code = cli.main(["verify", "toy-induction", "-q"])
            except SystemExit as exit_:
                code = exit_.code
        out[name] = [code, err.getvalue()]
    print(json.dumps(out))
""")


def _subprocess_env(**extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return {**keep, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *extra.pop("path", "").split(os.pathsep)]),
            **extra}


@pytest.fixture(scope="module")
def env_results() -> dict[str, list]:
    """Every ENV_CASES environment through `interp verify`, in one process (one torch import); before the
    fix `RANK=5 WORLD_SIZE=2` waited for its peers until this timeout."""
    cases = json.dumps([(name, env) for name, env, _, _ in ENV_CASES])
    try:
        done = subprocess.run([sys.executable, "-c", _ENV_RUNNER, cases], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, env=_subprocess_env())
    except subprocess.TimeoutExpired:
        pytest.fail("a torchrun environment case waited for peers that never come (no check before the rendezvous)")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name, env, code, match", ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_torchrun_environment_is_checked_before_the_group_starts(env_results, name, env, code, match):
    got, err = env_results[name]
    assert got == code, err
    assert re.search(match, err, re.S), err
    assert "Traceback" not in err and "internal error" not in err


def test_check_torchrun_env_accepts_what_torchrun_sets():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert distributed.check_torchrun_env(env) == {"RANK": 1, "WORLD_SIZE": 2, "LOCAL_RANK": 1, "MASTER_PORT": 29500}
    with pytest.raises(BadInput, match=r"RANK=2 is outside"):
        distributed.check_torchrun_env({**env, "RANK": "2"})


# ---------------------------------------------------------------------------------------------
# --workers cap


def test_workers_above_the_cap_are_refused_with_exit_2(capsys):
    from interp import cli, launch

    cap = launch.max_workers()
    assert cap == launch.MAX_WORKERS_PER_CORE * (os.cpu_count() or 1)
    with pytest.raises(SystemExit) as info:
        cli.main(["heads", "--workers", str(cap + 1), "-q"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(rf"--workers {cap + 1}: at most {cap} .*{launch.MAX_WORKERS_PER_CORE} per CPU core", err), err
    with pytest.raises(SystemExit):
        cli.main(["heads", "--workers", "999", "-q"])
    assert cli.build_parser().parse_args(["heads", "--workers", str(cap)]).workers == cap  # the cap itself is allowed


def test_workers_cap_is_stated_in_help(capsys):
    from interp import cli, launch

    with pytest.raises(SystemExit):
        cli.main(["heads", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"at most {launch.MAX_WORKERS_PER_CORE} per CPU core ({launch.max_workers()} here)" in text


def test_spawn_local_refuses_more_workers_than_the_cap():
    from interp import launch

    with pytest.raises(BadInput, match=r"workers=\d+: at most"):
        distributed.spawn_local(print, workers=launch.max_workers() + 1)


# ---------------------------------------------------------------------------------------------
# the error class survives worker processes

# 75 prompts in batches of 32: batches of 32, 32 and 11; with two workers rank 0 runs the first,
# rank 1 the other two, so only rank 1 ever sees a batch of 11 prompts (the trigger below)
USER_PACKAGE = '''
import torch
from interp.errors import BadInput
from interp.models import GPTConfig, HookedGPT


class Picky(HookedGPT):
    """Fails only on a batch of 11 prompts, as a model that checks its input would: on rank 1 alone."""

    failure = None

    def forward(self, tokens, *args, **kwargs):
        if tokens.shape[0] == 11:
            raise self.failure
        return super().forward(tokens, *args, **kwargs)


def _picky(failure):
    model = Picky(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=40, n_ctx=32, seed=0))
    model.failure = failure
    return model


class UserOwnError(Exception):
    pass


def bad_input():
    return _picky(BadInput("token batch of 11 prompts refused: pass at most 10 (a BadInput from the model)"))


def value_error():
    return _picky(ValueError("vocabulary row 7 is reserved (a ValueError from the model)"))


def zero_division():
    return _picky(ZeroDivisionError("the user's forward divides by zero"))


def own_error():
    return _picky(UserOwnError("a class of the user's own"))
'''

# (factory, exit code, stderr regex): the same with one process and with two. Each case starts three
# processes (about 10 s on an idle machine, a minute on a loaded one): one in the default suite
SLOW = pytest.mark.slow
WORKER_CASES = [
    pytest.param("bad_input", 2, r"interp heads: error: token batch of 11 prompts refused: pass at most 10 \(a BadInput",
                 id="bad_input"),
    pytest.param("value_error", 2, r"interp heads: error: vocabulary row 7 is reserved", id="value_error", marks=SLOW),
    pytest.param("zero_division", 2, r"raised ZeroDivisionError at .*workerpkg\.py:\d+: the user's forward divides by zero",
                 id="zero_division", marks=SLOW),
    pytest.param("own_error", 2, r"raised UserOwnError at .*workerpkg\.py:\d+: a class of the user's own", id="own_error",
                 marks=SLOW),
]


@pytest.fixture(scope="module")
def user_package(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("workers")
    (root / "workerpkg.py").write_text(USER_PACKAGE)
    return root


def _run_heads(package: Path, factory: str, workers: int) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "interp.cli", "heads", f"workerpkg:{factory}", "--n", "75", "--quiet",
               "--workers", str(workers)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=_subprocess_env(path=str(package)))


@pytest.mark.heavy
@pytest.mark.parametrize("factory, code, match", WORKER_CASES)
def test_a_worker_error_keeps_its_class_and_message(user_package, factory, code, match):
    """Before: exit 3 and "worker process ... exited with code 1" under --workers 2, whatever the class."""
    one, two = _run_heads(user_package, factory, 1), _run_heads(user_package, factory, 2)
    assert one.returncode == code, one.stderr[-3000:]
    assert re.search(match, one.stderr, re.S), one.stderr[-3000:]
    assert two.returncode == code, two.stderr[-3000:]
    assert re.search(match, two.stderr, re.S), two.stderr[-3000:]
    last = [line for line in two.stderr.splitlines() if line.startswith("interp heads:")]
    assert last == [line for line in one.stderr.splitlines() if line.startswith("interp heads:")]
    assert "Traceback" not in two.stderr and "internal error" not in two.stderr


def _fails_on_rank_1(kind: str):
    if distributed.rank() == 1:
        raise {"bad": BadInput("prompt row 9 is empty"), "key": KeyError("no head 'L9H9'"),
               "bug": RuntimeError("an index went wrong")}[kind]
    return distributed.gather_objects(distributed.rank())  # rank 0 waits in a collective for rank 1


@pytest.mark.heavy
@pytest.mark.parametrize("kind, cls, code, text", [
    pytest.param("bad", BadInput, 2, "prompt row 9 is empty", id="BadInput"),
    pytest.param("key", KeyError, 2, "no head 'L9H9'", id="KeyError", marks=SLOW),
    # raised in this file, i.e. outside the toolkit: the worker's own traceback makes it the caller's code
    pytest.param("bug", ModelError, 2, "raised RuntimeError at " + __file__, id="user-code", marks=SLOW),
])
def test_spawn_local_reraises_the_workers_class(kind, cls, code, text):
    """Both modes: rank 0 in this process (the CLI's) and every rank in a child (`return_all`)."""
    for return_all in (False, True):
        with pytest.raises(cls) as info:
            distributed.spawn_local(_fails_on_rank_1, (kind,), workers=2, threads=1, return_all=return_all, timeout_s=120)
        assert text in str(info.value)
        assert exit_code_for(info.value) == code
        assert "worker rank 1" in "\n".join(getattr(info.value, "__notes__", []))


def _fails_on_rank(failing: int):
    if distributed.rank() == failing:
        raise BadInput(f"rank {failing} refuses")
    return distributed.gather_objects(distributed.rank())


@pytest.mark.parametrize("failing, settled", [(1, True), (-1, True), (0, False)], ids=["worker fails", "none fails",
                                                                                      "rank 0 fails first"])
def test_rank_0_destroys_its_group_after_the_workers_left(monkeypatch, failing, settled):
    """Item 13 of issue 36 (a SIGABRT once under --workers 2 when a worker raised during rank 0's collective): rank 0
    hosts the group's store, so it tears its group down last, once the workers exited, except when it failed first
    (the workers wait on it in a collective and leave only when its group goes)."""
    import multiprocessing

    alive_at_teardown = []
    real = distributed._dist()

    class Recording:
        def __getattr__(self, name):
            return getattr(real, name)

        def destroy_process_group(self, *args, **kwargs):
            alive_at_teardown.append(len(multiprocessing.active_children()))
            return real.destroy_process_group(*args, **kwargs)

    monkeypatch.setattr(distributed, "_dist", lambda: Recording())
    if failing < 0:
        assert distributed.spawn_local(_fails_on_rank, (failing,), workers=2, threads=1, timeout_s=120) == [0, 1]
    else:
        with pytest.raises(BadInput, match=f"rank {failing} refuses"):
            distributed.spawn_local(_fails_on_rank, (failing,), workers=2, threads=1, timeout_s=120)
    assert alive_at_teardown == [0] if settled else alive_at_teardown == [1]


@pytest.mark.slow
def test_a_toolkit_failure_in_a_worker_stays_internal():
    """An exception whose frames are all the toolkit's and the standard library's: a bug, exit 3, in any process."""
    import operator

    with pytest.raises(IndexError) as info:
        distributed.spawn_local(operator.getitem, ([], 1), workers=2, threads=1, return_all=True, timeout_s=120)
    assert exit_code_for(info.value) == 3
    assert "worker rank" in "\n".join(info.value.__notes__)


def test_remote_failure_rebuilds_or_names_the_class():
    from interp.errors import RemoteFailure

    rebuilt = RemoteFailure.of(BadInput("x=3 is wrong"), "worker rank 1").rebuild()
    assert type(rebuilt) is BadInput and str(rebuilt) == "x=3 is wrong"

    class Unpicklable(Exception):  # a local class: pickle cannot find it by name
        pass

    lost = RemoteFailure.of(Unpicklable("odd"), "worker rank 1").rebuild()
    assert isinstance(lost, InternalError) and "Unpicklable: odd" in str(lost) and exit_code_for(lost) == 3
    assert isinstance(RemoteFailure.of(ModelError("m"), "w").rebuild(), ModelError)


def _rank_1_is_killed():
    if distributed.rank() == 1:
        os._exit(9)  # as the out-of-memory killer would: no report, no exception
    return distributed.rank()


def test_every_rank_mode_does_not_wait_for_a_killed_child():
    """`return_all` (the tests' mode): a child that dies without a report ends the call with an InternalError."""
    started = time.monotonic()
    with pytest.raises(InternalError, match="died with exit code 9 without reporting"):
        distributed.spawn_local(_rank_1_is_killed, workers=2, threads=1, return_all=True, timeout_s=300)
    assert time.monotonic() - started < 120
