"""Training loop, tasks, and the shipped toy-induction checkpoint (interp/experiments/train.py and tasks.py)."""
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from interp.analyses import induction, positional
from interp.data import PromptSet, Repeats
from interp.experiments.tasks import InductionTask, evaluate_induction, fixed_prefix_task, repeated_prompts
from interp.experiments.train import (
    INDUCTION_THRESHOLD,
    PREV_TOKEN_THRESHOLD,
    TrainConfig,
    main,
    toy_induction_config,
    train,
)
from interp.models.config import GPTConfig
from interp.models.constructed import induction_circuit
from interp.models.io import checkpoint_paths, load_checkpoint

CHECKPOINT = Path(__file__).resolve().parents[3] / "models" / "checkpoints" / "toy-induction"

TINY_TASK = InductionTask(d_vocab=16, n_pos=32, prefix_lens=(4, 5, 6, 8), held_out_prefix_lens=(7,), max_offset=4)


def tiny_config(seed=0):
    return toy_induction_config(seed=seed, d_model=32, n_ctx=32, d_vocab=16)


# ---------------------------------------------------------------- tasks


def test_task_sequences_repeat_a_prefix_of_an_allowed_length():
    tokens = TINY_TASK.sample(64, torch.Generator().manual_seed(0))
    assert tokens.shape == (64, 32) and tokens.dtype == torch.long
    assert 0 <= int(tokens.min()) and int(tokens.max()) < 16
    lengths_seen = set()
    for row in tokens:
        matches = [(start, n) for n in TINY_TASK.prefix_lens for start in range(0, TINY_TASK.max_offset + 2)
                   if torch.equal(row[start + n :], row[start : len(row) - n])]
        assert matches, f"row {row.tolist()} repeats no allowed prefix"
        lengths_seen.add(min(n for _, n in matches))
    assert len(lengths_seen) >= 3  # the length really varies


def test_task_sampling_is_seeded():
    a = TINY_TASK.sample(8, torch.Generator().manual_seed(3))
    b = TINY_TASK.sample(8, torch.Generator().manual_seed(3))
    c = TINY_TASK.sample(8, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_bos_is_placed_with_its_probability():
    always = InductionTask(d_vocab=16, n_pos=32, prefix_lens=(4,), held_out_prefix_lens=(), max_offset=4, bos_prob=1.0)
    assert (always.sample(16, torch.Generator().manual_seed(0))[:, 0] == 15).all()
    assert always.bos_token == 15  # -1 counts from the end of the vocabulary


def test_distinct_prefix_draws_each_prefix_without_replacement():
    task = InductionTask(d_vocab=16, n_pos=32, prefix_lens=(4, 8, 12), held_out_prefix_lens=(), max_offset=4,
                         bos_prob=0.0, distinct_prefix=True)
    tokens = task.sample(64, torch.Generator().manual_seed(0))
    for row in tokens:
        # the copy starts after 0..4 noise tokens; some (start, length) repeats with a duplicate-free prefix
        matches = [(start, n) for n in task.prefix_lens for start in range(task.max_offset + 1)
                   if torch.equal(row[start + n :], row[start : len(row) - n])
                   and len(set(row[start : start + n].tolist())) == n]
        assert matches, f"row {row.tolist()} repeats no duplicate-free prefix"
    # 64 prefixes of 4..12 tokens out of 16 drawn with replacement would repeat a token almost surely
    plain = dataclasses.replace(task, distinct_prefix=False).sample(64, torch.Generator().manual_seed(0))
    assert any(len(set(row[4:8].tolist())) < 4 for row in plain)
    with pytest.raises(ValueError, match="distinct_prefix=True needs d_vocab >= the longest prefix \\(12\\)"):
        InductionTask(d_vocab=8, n_pos=32, prefix_lens=(4, 12), held_out_prefix_lens=(), max_offset=4,
                      distinct_prefix=True)


def test_fixed_prefix_task_is_bos_prefix_prefix():
    task = fixed_prefix_task(5, d_vocab=16)
    tokens = task.sample(4, torch.Generator().manual_seed(0))
    assert tokens.shape == (4, 11)
    assert (tokens[:, 0] == 15).all()
    assert torch.equal(tokens[:, 1:6], tokens[:, 6:11])


@pytest.mark.parametrize("kwargs,match", [
    (dict(prefix_lens=()), "prefix_lens is empty"),
    (dict(prefix_lens=(4, 7), held_out_prefix_lens=(7,)), r"\[7\] are both trained on and held out"),
    (dict(prefix_lens=(40,), n_pos=64), "cannot hold two copies"),
    (dict(bos_token=99), "bos_token=99"),
    (dict(bos_prob=1.5), "bos_prob=1.5"),
])
def test_task_rejects_bad_settings(kwargs, match):
    base = dict(d_vocab=64, n_pos=128)
    with pytest.raises(ValueError, match=match):
        InductionTask(**{**base, **kwargs})


def test_repeated_prompts_layout():
    tokens, start = repeated_prompts(3, 6, 16, offset=4, bos=15, seed=0)
    assert tokens.shape == (3, 1 + 4 + 12) and start == 5
    assert torch.equal(tokens[:, 5:11], tokens[:, 11:17]) and (tokens[:, 0] == 15).all()
    with pytest.raises(ValueError, match="prefix_len=1"):
        repeated_prompts(3, 1, 16)


def test_evaluate_induction_on_the_constructed_circuit():
    """Known answer: the hand-set circuit has L0H0 previous-token and L1H0 induction scores near 1."""
    model = induction_circuit(d_vocab=64, n_ctx=128)
    result = evaluate_induction(model, 20, bos=63, d_vocab=63, n=32)
    assert result["prev_token"]["L0H0"] >= 0.999
    # chance repeats inside a random prefix split the attention equally between every key that follows an
    # earlier occurrence of the query's token: all of them are induction targets (the toolkit's metric), so the
    # score is near 1; the logits are readout_gain (30) times the share of the attention on each copied token
    tokens, start = repeated_prompts(32, 20, 63, bos=63, seed=1234)
    losses = []
    for row in tokens:
        for query in range(start + 20, start + 39):  # predicting x_1 .. x_{L-1} of the second copy
            keys = [key for key in range(1, query + 1) if row[key - 1] == row[query]]
            logits = torch.zeros(64)
            logits[63] = -40.0  # BOS
            for key in keys:
                logits[row[key]] += 30.0 / len(keys)
            losses.append(float(torch.logsumexp(logits, 0) - logits[row[query + 1]]))
    assert result["induction"]["L1H0"] == pytest.approx(1.0, abs=1e-3)
    assert result["loss_second"] == pytest.approx(sum(losses) / len(losses), abs=1e-3)
    assert max(v for k, v in result["induction"].items() if k != "L1H0") < 0.1
    assert result["loss_first"] > math.log(62)  # unpredictable, and chance repeats are copied confidently


def test_evaluate_induction_reads_the_toolkits_metrics():
    """The scores are `induction.scores_per_prompt` and `positional.focus` on the same prompts (their repeat
    structure: the second copy), averaged over prompts."""
    model = induction_circuit(d_vocab=64, n_ctx=128)
    result = evaluate_induction(model, 12, offset=5, bos=63, n=16, seed=3)
    tokens, start = repeated_prompts(16, 12, 64, offset=5, bos=63, seed=3)
    prompts = PromptSet(tokens, repeats=Repeats(period=12, offset=start, n_repeats=2))
    induction_scores = induction.scores_per_prompt(model, prompts)["induction"].mean(0)  # (layer, head)
    previous = positional.focus_per_prompt(model, prompts)["prev_token"].mean(0)
    for layer in range(2):
        for head in range(model.cfg.n_heads):
            label = f"L{layer}H{head}"
            assert result["induction"][label] == pytest.approx(float(induction_scores[layer, head]), abs=1e-4)
            assert result["prev_token"][label] == pytest.approx(float(previous[layer, head]), abs=1e-4)


def test_evaluate_induction_rejects_prompts_longer_than_context():
    model = induction_circuit(d_vocab=16, n_ctx=20)
    with pytest.raises(ValueError, match="exceed n_ctx=20"):
        evaluate_induction(model, 15)


# ---------------------------------------------------------------- the training loop


def test_train_config_rejects_bad_values():
    with pytest.raises(ValueError, match="task='lm'"):
        TrainConfig(task="lm")
    with pytest.raises(ValueError, match="steps=0"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="does not fit the model"):
        train(tiny_config(), TrainConfig(steps=1), InductionTask(d_vocab=64, n_pos=128), progress=False)


def test_training_lowers_the_loss():
    _, losses = train(tiny_config(), TrainConfig(steps=60, lr=3e-3, warmup_steps=5), TINY_TASK, progress=False)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert first > math.log(16) - 0.3
    assert last < first - 0.3


def test_training_is_deterministic_for_a_seed():
    cfg = TrainConfig(steps=8, warmup_steps=2)
    a, losses_a = train(tiny_config(), cfg, TINY_TASK, progress=False)
    b, losses_b = train(tiny_config(), cfg, TINY_TASK, progress=False)
    assert losses_a == losses_b
    for (name, wa), (_, wb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(wa, wb), name
    c, _ = train(tiny_config(), TrainConfig(steps=8, warmup_steps=2, seed=1), TINY_TASK, progress=False)
    assert not torch.equal(a.blocks[0].attn.W_Q, c.blocks[0].attn.W_Q)


def test_main_writes_checkpoint_json_and_card(tmp_path):
    out = tmp_path / "mini"
    assert main(["--steps", "3", "--control-steps", "2", "--no-progress", "--out", str(out)]) == 0
    weights, config = checkpoint_paths(out)
    assert weights.exists() and config.exists() and (tmp_path / "mini.md").exists()
    meta = json.loads(config.read_text())["metadata"]
    assert meta["command"].startswith("interp train --steps 3")
    assert meta["training"]["steps"] == 3 and meta["training"]["seed"] == 0
    assert {"loss_first", "loss_second", "prev_token", "induction"} <= set(meta["evaluation"][0])
    assert meta["control"]["steps"] == 2
    card = (tmp_path / "mini.md").read_text()
    assert meta["command"] in card and "held-out length" in card
    model = load_checkpoint(out)
    assert isinstance(model.cfg, GPTConfig) and model.cfg.attn_only


# ---------------------------------------------------------------- the shipped checkpoint


@pytest.fixture(scope="module")
def shipped():
    if not checkpoint_paths(CHECKPOINT)[0].exists():
        pytest.fail(f"{CHECKPOINT}.safetensors is missing; rebuild it with "
                    "`interp train --task induction --seed 0 --out models/checkpoints/toy-induction`.")
    return load_checkpoint(CHECKPOINT)


def test_shipped_checkpoint_is_small_and_documented(shipped):
    weights, config = checkpoint_paths(CHECKPOINT)
    assert weights.stat().st_size < 1_000_000
    card = CHECKPOINT.with_name("toy-induction.md").read_text()
    meta = shipped.metadata
    assert meta["command"] in card
    for label in meta["head_roles"]["previous_token_heads"] + meta["head_roles"]["induction_heads"]:
        assert label in card
    assert shipped.cfg.n_layers == 2 and shipped.cfg.attn_only


@pytest.mark.parametrize("prefix_len,offset,bos", [(25, 0, None), (37, 0, 255), (49, 3, None), (20, 40, None)])
def test_shipped_model_does_induction_on_untrained_lengths_and_offsets(shipped, prefix_len, offset, bos):
    assert prefix_len in shipped.metadata["task"]["held_out_prefix_lens"] or offset > shipped.metadata["task"]["max_offset"]
    result = evaluate_induction(shipped, prefix_len, offset=offset, bos=bos, n=32, seed=7)
    assert result["loss_first"] > 3.5  # random tokens: nothing to predict
    assert result["loss_second"] < 0.25 * result["loss_first"]


def test_shipped_head_roles_match_the_card(shipped):
    roles = shipped.metadata["head_roles"]
    assert roles["previous_token_heads"] and roles["induction_heads"]
    # fresh prompts (a seed the card did not use), a held-out length
    result = evaluate_induction(shipped, 25, n=32, seed=2024)
    for label in roles["previous_token_heads"]:
        assert label.startswith("L0") and result["prev_token"][label] >= PREV_TOKEN_THRESHOLD
    for label in roles["induction_heads"]:
        assert label.startswith("L1") and result["induction"][label] >= INDUCTION_THRESHOLD
    others = [h for h in result["induction"] if h not in roles["induction_heads"]]
    assert all(result["induction"][h] < INDUCTION_THRESHOLD for h in others)


def test_shipped_control_figures_show_the_fixed_length_failure(shipped):
    control = shipped.metadata["control"]
    trained = [r for r in control["evaluation"] if r["kind"] == "trained"][0]
    others = [r for r in control["evaluation"] if r["kind"] == "other length"]
    assert trained["loss_second"] < 0.1
    assert all(r["loss_second"] > 3.0 for r in others)


@pytest.mark.slow
def test_full_retrain_reproduces_the_shipped_checkpoint(tmp_path, shipped):
    """The card's command, rerun single-threaded, gives the same model (same torch build)."""
    if shipped.metadata["torch"] != torch.__version__:
        pytest.skip(f"checkpoint made with torch {shipped.metadata['torch']}, running {torch.__version__}")
    out = tmp_path / "toy-induction"
    main(["--task", "induction", "--seed", "0", "--no-progress", "--out", str(out)])
    retrained = load_checkpoint(out)
    # bit-identical while models/components.py computes the forward the same way; a re-ordered
    # (but equal) computation changes float rounding, so compare weights and figures with tolerances
    for name, weight in shipped.state_dict().items():
        torch.testing.assert_close(retrained.state_dict()[name], weight, atol=1e-3, rtol=1e-3, msg=name)
    for key in ("previous_token_heads", "induction_heads"):
        assert retrained.metadata["head_roles"][key] == shipped.metadata["head_roles"][key]
    for new, old in zip(retrained.metadata["evaluation"], shipped.metadata["evaluation"]):
        assert new["loss_second"] == pytest.approx(old["loss_second"], abs=0.02)
