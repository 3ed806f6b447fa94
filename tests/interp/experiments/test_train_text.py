"""`stdlib-bytes`'s training recipe (interp/experiments/train.py, `--task stdlib-bytes`): a few seeded steps, the
time budget refused before training, the command line's checkpoint and card, and the shipped curve's first point
retrained (its corpus and card: tests/models/test_textcorpus.py)."""
import json
from pathlib import Path

import pytest
import torch

from interp.experiments.tasks import TextTask
from interp.experiments.train import TrainConfig, check_time_budget, main, text_lm_config, train
from interp.models.io import checkpoint_paths, load_checkpoint
from interp.models.textcorpus import as_tensor, compare_corpus, eval_windows, evaluate_text, load_corpus

ROOT = Path(__file__).resolve().parents[3]
CHECKPOINT = ROOT / "models" / "checkpoints" / "stdlib-bytes"


@pytest.fixture(scope="module")
def mini_root(tmp_path_factory):
    """A fake standard library (as tests/models/test_textcorpus.py's): 40 kept files, excluded folders, a non-.py file."""
    root = tmp_path_factory.mktemp("stdlib")
    files = {f"pkg/mod{i}.py": f"def f{i}(x):\n    return x + {i}  # {'abc' * 200}\n" for i in range(40)}
    files.update({"test/test_a.py": "EXCLUDED", "tests/b.py": "EXCLUDED", "idlelib/c.py": "EXCLUDED",
                  "site-packages/d.py": "EXCLUDED", "e.txt": "EXCLUDED", "top.py": "import os\n" * 50})
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


@pytest.fixture(scope="module")
def shipped():
    if not checkpoint_paths(CHECKPOINT)[0].exists():
        pytest.fail(f"{CHECKPOINT}.safetensors is missing; rebuild it with the command in {CHECKPOINT}.md.")
    return load_checkpoint(CHECKPOINT)


# ---------------------------------------------------------------- recipe


def test_a_few_training_steps_run_and_lower_the_loss(corpus):
    task = TextTask(as_tensor(corpus.train[:200_000]), n_pos=64)
    cfg = text_lm_config(n_layers=1, d_model=32, n_ctx=64)
    model, losses = train(cfg, TrainConfig(task="stdlib-bytes", steps=30, batch_size=8, lr=3e-3, warmup_steps=5),
                          task, progress=False)
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < losses[0] - 0.5
    again, losses_again = train(cfg, TrainConfig(task="stdlib-bytes", steps=3, batch_size=8, warmup_steps=1), task,
                                progress=False)
    first, _ = train(cfg, TrainConfig(task="stdlib-bytes", steps=3, batch_size=8, warmup_steps=1), task, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))  # seeded


def test_budget_check_refuses_before_training_with_the_estimate():
    assert check_time_budget(0.5, 600, 20, 2) == pytest.approx(5.0)
    with pytest.raises(ValueError, match=r"about 50.0 min .* over the budget of 20 min.*about 2400 fit"):
        check_time_budget(0.5, 6000, 20, 2)


def test_command_line_trains_and_writes_checkpoint_and_card(mini_root, tmp_path):
    out = tmp_path / "mini-text"
    assert main(["--task", "stdlib-bytes", "--steps", "2", "--batch-size", "2", "--corpus-root", str(mini_root),
                 "--out", str(out), "--no-progress"]) == 0
    meta = json.loads(checkpoint_paths(out)[1].read_text())["metadata"]
    card = out.with_name("mini-text.md").read_text()
    assert meta["corpus"]["n_files"] == 41 and meta["corpus"]["checksum"] in card
    assert f"{meta['held_out']['bigram_bits']:.3f}" in card and meta["command"] in card
    assert "does NOT meet" in card  # two steps make no language model, and the card says so
    assert load_checkpoint(out).cfg.n_layers == 4


def test_command_line_refuses_a_run_over_budget(mini_root, tmp_path):
    with pytest.raises(ValueError, match="over the budget"):
        main(["--task", "stdlib-bytes", "--steps", "100000", "--batch-size", "2", "--corpus-root", str(mini_root),
              "--max-minutes", "0.01", "--out", str(tmp_path / "never"), "--no-progress"])
    assert not list(tmp_path.iterdir())  # nothing written



@pytest.mark.slow
def test_retraining_reproduces_the_first_point_of_the_shipped_curve(shipped, corpus):
    """The first 100 steps are all warm-up, so their learning rates do not depend on the total step count:
    100 steps of the card's recipe (same seed, one thread) must give the curve's first held-out figure."""
    meta = shipped.metadata
    if compare_corpus(meta["corpus"], corpus) is not None or meta["torch"] != torch.__version__ or meta["threads"] != 1:
        pytest.skip("another corpus, torch build or thread count: the figures may differ in rounding")
    training = meta["training"]
    first = meta["curve"][0]
    assert first["step"] == training["warmup_steps"] == 100
    torch.set_num_threads(1)
    task = TextTask(as_tensor(corpus.train), n_pos=shipped.cfg.n_ctx)
    cfg = TrainConfig(task="stdlib-bytes", seed=training["seed"], steps=first["step"], batch_size=training["batch_size"],
                      lr=training["lr"], warmup_steps=training["warmup_steps"])
    model, _ = train(text_lm_config(seed=training["seed"]), cfg, task, progress=False)
    windows = eval_windows(as_tensor(corpus.held_out), shipped.cfg.n_ctx, 32)
    assert evaluate_text(model, windows)["bits"] == pytest.approx(first["held_out_bits"], abs=1e-3)
