"""Data parallel over prompts: 2 gloo processes give what one process gives.

One spawned group computes every sharded analysis once (start-up paid once, module fixture);
each result is compared with the single-process result: numbers within 1e-6 relative,
verdicts identical, and both ranks hold the same merged result.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from interp import distributed
from interp.capture import MomentAccumulator, PerPromptAccumulator
from interp.data import random_tokens, repeated_tokens

RTOL, ATOL = 1e-6, 1e-9
D_VOCAB = 40


def _model():
    from interp.models import GPTConfig, HookedGPT

    return HookedGPT(GPTConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=D_VOCAB, n_ctx=64, seed=0)).eval()


def every_analysis() -> dict[str, pd.DataFrame]:
    """Every sharded analysis on a tiny model, small batches so each rank runs several
    (18 prompts in batches of 4: 5 batches, split 2 / 3 between two ranks)."""
    from interp.analyses import circuits, induction, positional, redundancy, report
    from interp.analyses import claims as hc
    from interp.claims import test_claims
    from interp.models.constructed import induction_circuit

    torch.set_num_threads(1)
    model = _model()
    prompts = repeated_tokens(18, 8, D_VOCAB, seed=3)
    out = {
        "focus": positional.focus(model, prompts, batch_size=4),
        "offsets": positional.offset_profile(model, prompts, batch_size=4),
        "induction": induction.scores(model, prompts, batch_size=4),
        "pattern_similarity": redundancy.pattern_similarity(model, prompts, batch_size=4),
        "output_similarity": redundancy.output_similarity(model, prompts, batch_size=4),
        "importance_mean": redundancy.importance(model, prompts, "mean", batch_size=4),
        "importance_resample": redundancy.importance(model, prompts, "resample", batch_size=4, gradient=False),
        "joint_ablation": redundancy.joint_ablation(model, prompts, [((0, 0), (0, 1)), ((1, 2), (1, 3))], batch_size=4),
        "direct_logit_attribution": circuits.direct_logit_attribution(model, prompts, batch_size=4),
    }
    out.update(_second_order_compensation_pruning(model, prompts))
    patterns = report.mean_patterns(model, prompts, [0, 1], batch_size=4)
    out["mean_patterns"] = pd.DataFrame({"layer": [0, 1], "sum": [float(patterns[0].sum()), float(patterns[1].sum())],
                                         "first": [float(patterns[0].ravel()[5]), float(patterns[1].ravel()[7])]})
    circuit = induction_circuit(d_vocab=32, n_ctx=64)
    claims = [hc.previous_token_head(0, 0), hc.induction_head(1, 0), hc.induction_head(0, 0), hc.first_token_head(0, 0)]
    claim_prompts = repeated_tokens(32, 12, 31, bos=31, seed=1)
    table = test_claims(circuit, claims, claim_prompts, batch_size=4)
    out["claims"] = table.drop(columns=[c for c in ("evidence",) if c in table.columns])
    from interp.analyses import leakage
    from interp.models.zoo import build

    for name in ("hooked_gpt", "single_pair"):
        audit = leakage.audit(build(name), max_len=16, localise_leaks=False)
        out[f"leakage_{name}"] = audit.table.assign(verdict=audit.verdict)
    part = distributed.shard(prompts, 4)
    out["group"] = {"world": distributed.world_size(), "rank": distributed.rank(), "shard": part.indices}
    return out


def _second_order_compensation_pruning(model, prompts) -> dict:
    """second_order, compensation (resample: keyed draws; and one batch, so rank 0 has no prompts) and the
    pruning curve; `work`: how many prompts went through the model's embedding on this rank, per analysis."""
    from interp.analyses import redundancy

    seen: list[int] = []
    handle = model.embed.register_forward_hook(lambda module, args, output: seen.append(output.shape[0]))
    out, work = {}, {}
    try:
        for name, part, batch_size in (("", prompts, 4), ("_one_batch", prompts[:6], 8)):
            seen.clear()
            out[f"second_order{name}"] = redundancy.second_order(model, part, "resample", batch_size=batch_size)
            work[f"second_order{name}"] = sum(seen)
            seen.clear()
            result = redundancy.compensation(model, part, "resample", heads=[(0, 1), (0, 3)], batch_size=batch_size)
            out[f"compensation{name}_effects"], out[f"compensation{name}_matrix"] = result.effects, result.matrix
            work[f"compensation{name}"] = sum(seen)
        seen.clear()
        curve = redundancy.pruning_curve(model, prompts, "mean", n_random=2, batch_size=4)
        work["pruning_curve"] = sum(seen)
    finally:
        handle.remove()
    out["pruning_curve"] = curve.assign(n_removable=curve.order.map(curve.attrs["n_removable"]),
                                        importance_order=" ".join(curve.attrs["importance_order"]))
    out["work"] = work
    return out


@pytest.fixture(scope="module")
def single():
    return every_analysis()


@pytest.fixture(scope="module")
def ranks():
    return distributed.spawn_local(every_analysis, workers=2, threads=1, return_all=True, timeout_s=600)


def assert_same(frame: pd.DataFrame, expected: pd.DataFrame, name: str) -> None:
    assert list(frame.columns) == list(expected.columns), name
    assert len(frame) == len(expected), name
    for column in expected.columns:
        a, b = frame[column].to_numpy(), expected[column].to_numpy()
        if np.issubdtype(b.dtype, np.number) and not np.issubdtype(b.dtype, np.bool_):
            np.testing.assert_allclose(a.astype(float), b.astype(float), rtol=RTOL, atol=ATOL, equal_nan=True,
                                       err_msg=f"{name}.{column}")
        else:
            assert [str(x) for x in a] == [str(x) for x in b], f"{name}.{column}"


ANALYSES = ["focus", "offsets", "induction", "pattern_similarity", "output_similarity", "importance_mean",
            "importance_resample", "joint_ablation", "direct_logit_attribution", "second_order", "second_order_one_batch", "compensation_effects",
            "compensation_matrix", "compensation_one_batch_effects", "compensation_one_batch_matrix", "pruning_curve",
            "mean_patterns", "claims", "leakage_hooked_gpt",
            "leakage_single_pair"]


@pytest.mark.heavy
@pytest.mark.parametrize("name", ANALYSES)
def test_two_processes_equal_one(single, ranks, name):
    for rank_result in ranks:
        assert_same(rank_result[name], single[name], name)


@pytest.mark.heavy
def test_each_rank_ran_its_own_shard(single, ranks):
    assert single["group"] == {"world": 1, "rank": 0, "shard": range(18)}
    assert [r["group"] for r in ranks] == [{"world": 2, "rank": 0, "shard": range(0, 8)},
                                           {"world": 2, "rank": 1, "shard": range(8, 18)}]


@pytest.mark.heavy
def test_ranks_share_the_work_of_second_order_compensation_and_pruning(single, ranks):
    """Sharded, not repeated: every prompt's forwards run on exactly one rank."""
    for name, total in single["work"].items():
        assert [r["work"][name] for r in ranks] != [total, total], name
        assert sum(r["work"][name] for r in ranks) == total, name
    assert [r["work"]["second_order_one_batch"] for r in ranks][0] == 0  # rank 0's shard of one batch is empty


@pytest.mark.heavy
def test_claim_verdicts_identical_and_meaningful(single, ranks):
    verdicts = single["claims"].set_index(["label", "claim"])["verdict"]
    assert verdicts[("L0H0", "previous_token")] == "supported"
    assert verdicts[("L1H0", "induction")] == "supported"
    assert verdicts[("L0H0", "induction")] == "refuted"
    for rank_result in ranks:
        assert list(rank_result["claims"]["verdict"]) == list(single["claims"]["verdict"])


def test_analyses_without_a_group_are_unchanged():
    assert not distributed.active()
    assert distributed.world_size() == 1 and distributed.rank() == 0 and distributed.is_main()
    acc = PerPromptAccumulator.from_result({"x": torch.arange(3.0)[:, None]})
    assert distributed.merge(acc) is acc
    values = torch.arange(4.0)
    assert distributed.gather_prompts(values) is values
    assert distributed.gather_objects(7) == [7]
    prompts = random_tokens(5, 4, 10)
    part = distributed.shard(prompts, 2)
    assert part.indices == range(5) and torch.equal(part.prompts.tokens, prompts.tokens)


@pytest.mark.parametrize("n,batch,world", [(18, 4, 2), (5, 2, 3), (3, 4, 2), (100, 7, 4), (1, 1, 2)])
def test_shards_are_whole_batches_covering_every_prompt_once(n, batch, world):
    ranges = [distributed.shard_range(n, batch, r, world) for r in range(world)]
    assert [i for part in ranges for i in part] == list(range(n))  # contiguous, in rank order
    for part in ranges[:-1]:
        assert len(part) % batch == 0  # every batch but the very last is a full single-process batch


def test_shard_range_refuses_bad_input():
    with pytest.raises(ValueError, match="batch_size=0"):
        distributed.shard_range(4, 0, 0, 2)
    with pytest.raises(ValueError, match="rank=2 is outside a world of 2"):
        distributed.shard_range(4, 2, 2, 2)


def test_prompt_generator_is_keyed_by_global_index_not_call_order():
    a = torch.randint(0, 1000, (4,), generator=distributed.prompt_generator(0, "resample", 17, 1, 2))
    distributed.prompt_generator(0, "resample", 3)  # other draws in between change nothing
    b = torch.randint(0, 1000, (4,), generator=distributed.prompt_generator(0, "resample", 17, 1, 2))
    c = torch.randint(0, 1000, (4,), generator=distributed.prompt_generator(0, "resample", 18, 1, 2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_moment_accumulator_align_lets_an_empty_shard_join():
    full = MomentAccumulator()
    full.update({"w": torch.tensor([[1.0, 2.0], [3.0, float("nan")]])})
    empty = MomentAccumulator()
    empty.align(full.layout())
    assert empty.layout() == full.layout() == {"w": (2,)}
    assert all(float(t.abs().sum()) == 0 for t in empty.tensors())


def test_merge_refuses_an_accumulator_it_cannot_combine(monkeypatch):
    monkeypatch.setattr(distributed, "active", lambda: True)
    with pytest.raises(ValueError, match="cannot be merged across processes"):
        distributed.merge(object())


def test_local_turns_sharding_off(monkeypatch):
    monkeypatch.setattr(distributed, "_dist", lambda: _FakeDist())
    assert distributed.active()
    with distributed.local():
        assert not distributed.active()
        assert distributed.shard(random_tokens(6, 3, 10), 2).indices == range(6)
    assert distributed.shard(random_tokens(6, 3, 10), 2).indices == range(2, 4)  # rank 1 of 3


class _FakeDist:
    """Stands in for torch.distributed: rank 1 of 3 (no collective is called)."""

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def get_world_size(self):
        return 3

    def get_rank(self):
        return 1


# ---------------------------------------------------------------------------------------------
# the command line: --workers, --device, --dtype


def assert_same_json(actual, expected, where: str = "result") -> None:
    """Equal JSON, floats within RTOL / ATOL."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), where
        for key in expected:
            assert_same_json(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for i, (x, y) in enumerate(zip(actual, expected)):
            assert_same_json(x, y, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert actual == pytest.approx(expected, rel=RTOL, abs=ATOL, nan_ok=True), where
    else:
        assert actual == expected, where


@pytest.mark.heavy
def test_cli_two_workers_write_what_one_writes(tmp_path):
    import json

    from interp.cli import main

    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert main(["heads", "--n", "72", "--quiet", "--json", str(one)]) == 0  # 3 batches of 32: both ranks work
    assert main(["heads", "--n", "72", "--quiet", "--json", str(two), "--workers", "2"]) == 0
    a, b = json.loads(one.read_text())["result"], json.loads(two.read_text())["result"]
    assert len(a["heads"]) == 8
    assert_same_json(b, a)
    assert not distributed.active() and "RANK" not in __import__("os").environ  # nothing left behind


def test_scale_flags_on_every_command_but_train():
    from interp.cli import build_parser
    from interp.launch import Scaled

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, command in sub.choices.items():
        options = {o for a in command._actions for o in a.option_strings}
        if name == "train":
            assert "--workers" not in options
            continue
        assert {"--workers", "--device", "--dtype"} <= options, name
        assert isinstance(command.get_default("handler"), Scaled)
    with pytest.raises(SystemExit):
        parser.parse_args(["heads", "--workers", "0"])
    with pytest.raises(SystemExit):
        parser.parse_args(["heads", "--dtype", "float64"])


def test_place_applies_dtype_and_device(monkeypatch):
    from interp import launch

    monkeypatch.setitem(launch._PLACEMENT, "dtype", "bfloat16")
    monkeypatch.setitem(launch._PLACEMENT, "device", "cpu")
    model = launch.place(_model())
    assert next(model.parameters()).dtype == torch.bfloat16


def test_move_copies_only_when_asked_and_needed():
    from interp import launch
    from interp.errors import BadInput

    model = _model()
    assert launch.move(model, device="cpu", dtype="float32", copy=True) is model  # already there: no copy
    half = launch.move(model, dtype=torch.bfloat16, copy=True)
    assert half is not model and next(half.parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32
    assert launch.move(model, dtype="float16") is model and next(model.parameters()).dtype == torch.float16
    with pytest.raises(BadInput, match="expected one of"):
        launch.move(model, dtype="half")


# ---------------------------------------------------------------------------------------------
# GPU (skipped without CUDA)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_positional_on_gpu_equals_cpu():
    from interp.analyses.positional import focus_per_prompt

    prompts = repeated_tokens(12, 8, D_VOCAB, seed=3)
    cpu = focus_per_prompt(_model(), prompts, batch_size=4)
    gpu = focus_per_prompt(_model().cuda(), prompts, batch_size=4)
    for name in cpu:
        torch.testing.assert_close(gpu[name], cpu[name], rtol=1e-4, atol=1e-5, equal_nan=True)


def _nccl_focus():
    from interp.analyses.positional import focus_per_prompt

    return focus_per_prompt(_model().cuda(), repeated_tokens(12, 8, D_VOCAB, seed=3), batch_size=4)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_nccl_two_gpus_equal_one_cpu_process():
    from interp.analyses.positional import focus_per_prompt

    ranks = distributed.spawn_local(_nccl_focus, workers=2, backend="nccl", return_all=True, timeout_s=300)
    cpu = focus_per_prompt(_model(), repeated_tokens(12, 8, D_VOCAB, seed=3), batch_size=4)
    for name, value in cpu.items():
        for rank_result in ranks:
            torch.testing.assert_close(rank_result[name].cpu(), value, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_tune_allocator_applies_on_glibc_and_can_be_refused(monkeypatch):
    import subprocess
    import sys

    from interp import launch

    monkeypatch.setenv("INTERP_DEFAULT_ALLOCATOR", "1")
    assert launch.tune_allocator() is False
    # in a fresh process: glibc accepts the thresholds (True), and nothing else changes
    code = "from interp.launch import tune_allocator; print(tune_allocator())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in __import__("os").environ.items() if k != "INTERP_DEFAULT_ALLOCATOR"})
    assert out.stdout.strip() == ("True" if sys.platform.startswith("linux") else "False"), out.stderr


@pytest.mark.slow
def test_torchrun_two_processes_write_what_one_writes(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from interp.cli import main

    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert main(["heads", "--n", "72", "--quiet", "--json", str(one)]) == 0
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "interp.cli", "heads",
               "--quiet", "--json", str(two), "--n-prompts", "72"]  # --n-prompts: torchrun takes --n as its own
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("L1H3") == 1  # rank 0 prints, rank 1 is silent
    assert_same_json(json.loads(two.read_text())["result"], json.loads(one.read_text())["result"])


def test_n_prompts_alias_for_torchrun():
    from interp.cli import build_parser

    assert build_parser().parse_args(["heads", "--n-prompts", "7"]).n == 7
