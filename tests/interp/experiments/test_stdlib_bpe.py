"""`stdlib-bpe`, the natural-text model with induction heads: its tokenizer, recipe, tracking metrics,
shipped checkpoint and card (interp/experiments/stdlib_bpe.py, models/tokenizers.py)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import interp
from interp.analyses import induction, positional
from interp.analyses.head_types import TargetBatch
from interp.data import PromptSet, Repeats
from interp.experiments import stdlib_bpe
from interp.models.config import GPTConfig
from interp.models.gpt import HookedGPT
from interp.models.io import load_checkpoint, read_checkpoint_config
from interp.models.textcorpus import compare_corpus, load_corpus, named_corpus
from interp.models.tokenizers import BPETokenizer, shipped_tokenizer, train_bpe
from interp.stats import bootstrap

ROOT = Path(__file__).resolve().parents[3]
CHECKPOINT = ROOT / "models" / "checkpoints" / "stdlib-bpe"
TEXTS = ["def add(first, second):\n    return first + second\n", "class Point:\n    def __init__(self, x):\n        self.x = x\n"] * 20


@pytest.fixture(scope="module")
def small_tokenizer():
    return train_bpe(TEXTS, 300, special_tokens=[stdlib_bpe.SEPARATOR_TOKEN])


@pytest.fixture(scope="module")
def shipped():
    return read_checkpoint_config(CHECKPOINT)["metadata"]


@pytest.fixture(scope="module")
def corpus(shipped):
    """The standard library found here; the tests that re-measure the card skip, saying why, when it is not the card's."""
    found = named_corpus(stdlib_bpe.Recipe(**shipped["recipe"]).corpus)
    differs = compare_corpus(shipped["corpus"], found)
    if differs:
        pytest.skip(differs)
    return found


@pytest.fixture(scope="module")
def data(shipped, corpus):
    tokenizer = BPETokenizer(shipped["tokenizer"]["json"])
    return stdlib_bpe.token_corpus(tokenizer.vocab_size, corpus=corpus, tokenizer=tokenizer)


# ---------------------------------------------------------------- tokenizer


def test_bpe_round_trips_text_and_rebuilds_from_its_json(small_tokenizer):
    text = "def add(first, second):\n    return first + second  # é\n"
    ids = small_tokenizer.encode(text)
    assert small_tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode())  # merges happened
    again = BPETokenizer(small_tokenizer.to_str())
    assert again.encode(text) == ids and again.sha256 == small_tokenizer.sha256
    assert small_tokenizer.token_id(stdlib_bpe.SEPARATOR_TOKEN) == 0
    assert train_bpe(TEXTS, 300, special_tokens=[stdlib_bpe.SEPARATOR_TOKEN]).sha256 == small_tokenizer.sha256  # deterministic


def test_bpe_refuses_unknown_pieces_and_ids(small_tokenizer):
    with pytest.raises(ValueError, match="not a token"):
        small_tokenizer.token_id("<|nothing|>")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        small_tokenizer.decode([small_tokenizer.vocab_size])


def test_shipped_tokenizer_is_rebuilt_from_metadata_and_must_fit_the_model(small_tokenizer):
    metadata = {"tokenizer": {"kind": "bpe", "json": small_tokenizer.to_str()}}
    assert shipped_tokenizer(metadata, small_tokenizer.vocab_size).encode("x = 1") == small_tokenizer.encode("x = 1")
    with pytest.raises(ValueError, match="belongs to another model"):
        shipped_tokenizer(metadata, small_tokenizer.vocab_size + 1)


# ---------------------------------------------------------------- the training stream and the probes


def test_plant_copies_repeats_a_span_of_the_row_itself_and_only_when_asked():
    windows = torch.arange(4 * 64).view(4, 64)  # every token distinct
    assert torch.equal(stdlib_bpe.plant_copies(windows, 0.0, torch.Generator().manual_seed(0)), windows)
    planted = stdlib_bpe.plant_copies(windows, 1.0, torch.Generator().manual_seed(0))
    for row, original in zip(planted, windows):
        changed = (row != original).nonzero().flatten()
        assert 8 <= changed.numel() <= 16 and torch.equal(changed, torch.arange(changed[0], changed[-1] + 1))
        source = int(row[changed[0]]) - int(original[0])  # the copied span's first position in the row
        assert source + changed.numel() <= int(changed[0])  # copied from earlier in the row, not overlapping
        assert torch.equal(row[changed], original[source : source + changed.numel()])


def test_repeated_spans_are_text_then_a_span_then_the_same_span():
    stream = torch.arange(1, 5000)
    stream[2500] = 0  # a file separator: no window crosses it
    prompts = stdlib_bpe.repeated_spans(stream, 16, span=20, offset=30, separator=0, seed=1)
    assert prompts.shape == (16, 70)
    assert torch.equal(prompts[:, 30:50], prompts[:, 50:70]) and not (prompts == 0).any()


def test_repeat_reliability_has_known_answers():
    periodic = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])  # every repeat is followed as before
    assert stdlib_bpe.repeat_reliability(periodic, 1) == {"k": 1, "reliability": 1.0, "share": 4 / 7}
    assert stdlib_bpe.repeat_reliability(periodic, 2) == {"k": 2, "reliability": 1.0, "share": 3 / 7}
    broken = torch.tensor([[5, 6, 5, 7], [5, 6, 5, 6]])  # 5 is followed by 7, not 6, in the first window only
    assert stdlib_bpe.repeat_reliability(broken, 1) == {"k": 1, "reliability": 0.5, "share": 2 / 6}
    assert stdlib_bpe.repeat_reliability(broken, 4)["share"] == 0


def test_repetition_groups_the_training_files_by_folder(small_tokenizer, tmp_path):
    from interp.models.textcorpus import named_corpus

    for i in range(40):
        (tmp_path / "pkg" / f"m{i}.py").parent.mkdir(exist_ok=True)
        (tmp_path / "pkg" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x\n" * 10)
        (tmp_path / "test" / f"t{i}.py").parent.mkdir(exist_ok=True)
        (tmp_path / "test" / f"t{i}.py").write_text("        self.x = x\n" * 10)
    data = stdlib_bpe.token_corpus(300, corpus=named_corpus("stdlib-with-tests", tmp_path), tokenizer=small_tokenizer)
    rows = stdlib_bpe.repetition(data, 32, ks=(1,))
    by_group = {r["files"]: r for r in rows}
    assert set(by_group) == {"modules", "tests"}
    assert by_group["tests"]["n_files"] == sum(f.startswith("test/") for f in data.corpus.train_files)
    assert by_group["tests"]["reliability"] > 0.9  # one line over and over
    only_modules = stdlib_bpe.token_corpus(300, corpus=named_corpus("stdlib", tmp_path), tokenizer=small_tokenizer)
    assert {r["files"] for r in stdlib_bpe.repetition(only_modules, 32, ks=(1,))} == {"modules"}
    assert "| tests (" in "\n".join(stdlib_bpe._repetition_table(rows))


def test_tracking_metrics_are_the_toolkits():
    """`track` reads the toolkit's head types: per window, the same numbers as `induction.scores_per_prompt` on
    natural repeats and `positional.focus`'s previous-token column."""
    model = HookedGPT(GPTConfig(n_layers=2, n_heads=2, d_model=32, n_ctx=40, d_vocab=12, attn_only=True, init_range=0.3,
                                seed=3)).eval()
    tokens = torch.randint(0, 12, (6, 40), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    batch = TargetBatch.from_prompts(PromptSet(tokens))
    ours = [stdlib_bpe.tracked_scores(cache["pattern", layer], batch) for layer in range(2)]
    theirs = induction.scores_per_prompt(model, PromptSet(tokens, repeats=Repeats(match_len=1)))["induction"]
    torch.testing.assert_close(torch.stack([o["induction"] for o in ours], 1), theirs, atol=1e-6, rtol=0)
    previous = torch.stack([o["previous_token"].mean(0) for o in ours])
    focus = positional.focus(model, PromptSet(tokens)).set_index(["layer", "head"])["prev_token"]
    torch.testing.assert_close(previous.flatten().double(), torch.tensor(focus.values), atol=1e-5, rtol=0)


def test_far_induction_counts_only_occurrences_16_or_more_back():
    """Known answers on one-hot patterns: period-8 text copied from 8 back is induction but not far induction;
    period-16 text copied from 16 back is both."""
    def copying(period: int) -> tuple[torch.Tensor, TargetBatch]:
        tokens = torch.arange(period).repeat(48 // period)[None]  # (1, 48): distinct tokens within a period
        pattern = torch.zeros(1, 1, 48, 48)  # (batch, head, query, key)
        for query in range(48):
            pattern[0, 0, query, query - period + 1 if query >= period else 0] = 1.0
        return pattern, TargetBatch.from_prompts(PromptSet(tokens))

    near = stdlib_bpe.tracked_scores(*copying(8))
    assert float(near["induction"]) == 1.0 and float(near["induction_far"]) == 0.0
    far = stdlib_bpe.tracked_scores(*copying(16))
    assert float(far["induction"]) == 1.0 and float(far["induction_far"]) == 1.0


def test_card_intervals_are_interp_stats_percentile_bootstrap():
    values = torch.linspace(0, 1, 40, dtype=torch.float64)
    _, low, high = bootstrap(values, **stdlib_bpe.BOOTSTRAP)
    assert stdlib_bpe._interval(low, high) == (float(low), float(high)) and low < values.mean() < high
    assert stdlib_bpe.BOOTSTRAP["method"] == "percentile" and stdlib_bpe.BOOTSTRAP["n_resamples"] == 2000


# ---------------------------------------------------------------- training


@pytest.fixture(scope="module")
def mini_data(tmp_path_factory, small_tokenizer):
    root = tmp_path_factory.mktemp("stdlib")
    for i in range(40):
        (root / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 30)
    return stdlib_bpe.token_corpus(300, corpus=load_corpus(root), tokenizer=small_tokenizer)


def test_training_is_seeded_and_writes_a_snapshot_and_log_row_per_evaluation(mini_data, tmp_path):
    recipe = stdlib_bpe.Recipe(n_ctx=32, batch_size=2, d_model=16, n_heads=2, warmup_steps=2, copy_fraction=0.5)
    stdlib_bpe.train_recipe(recipe, mini_data, minutes=1, steps=4, eval_every=2, out=tmp_path / "a", log=lambda line: None)
    stdlib_bpe.train_recipe(recipe, mini_data, minutes=1, steps=4, eval_every=2, out=tmp_path / "b", log=lambda line: None)
    rows = stdlib_bpe.read_log(tmp_path / "a")
    assert [r["step"] for r in rows] == [0, 2, 4]
    untimed = [{k: v for k, v in row.items() if k != "train_seconds"} for row in rows]  # wall time varies with load
    again = [{k: v for k, v in row.items() if k != "train_seconds"} for row in stdlib_bpe.read_log(tmp_path / "b")]
    assert untimed == again  # same seed, same thread count: same numbers
    assert sorted(p.name for p in (tmp_path / "a").glob("step*.safetensors")) == [
        "step000000.safetensors", "step000002.safetensors", "step000004.safetensors"]
    snapshot = load_checkpoint(tmp_path / "a" / "step000004")
    assert snapshot.cfg.d_vocab == mini_data.tokenizer.vocab_size and snapshot.cfg.attn_only


def test_learning_rate_warms_up_then_stays_or_decays_to_a_tenth():
    constant = stdlib_bpe.Recipe(lr=1e-3, warmup_steps=10)
    assert stdlib_bpe.recipe_learning_rate(0, constant) == pytest.approx(1e-4)
    assert [stdlib_bpe.recipe_learning_rate(s, constant) for s in (9, 500, 10**6)] == [pytest.approx(1e-3)] * 3
    cosine = stdlib_bpe.Recipe(lr=1e-3, warmup_steps=10, decay_steps=110)
    assert stdlib_bpe.recipe_learning_rate(9, cosine) == pytest.approx(1e-3)  # the warm-up is the same
    assert stdlib_bpe.recipe_learning_rate(60, cosine) == pytest.approx(0.55e-3)  # half-way down the cosine
    assert stdlib_bpe.recipe_learning_rate(110, cosine) == stdlib_bpe.recipe_learning_rate(10**6, cosine) == pytest.approx(1e-4)
    rates = [stdlib_bpe.recipe_learning_rate(s, cosine) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))


@pytest.mark.heavy
def test_training_over_the_budget_is_refused(mini_data, tmp_path):
    with pytest.raises(ValueError, match="exceeds --max-minutes 90"):
        stdlib_bpe.train_recipe(stdlib_bpe.Recipe(), mini_data, minutes=91, out=tmp_path)
    result = subprocess.run([sys.executable, "-m", "interp.cli", "train", "stdlib-bpe", "train", "--minutes", "1", "--steps",
                             "100000000", "--out", str(tmp_path / "run")], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode != 0 and "refused: 100000000 steps" in result.stderr
    unknown = subprocess.run([sys.executable, "-m", "interp.cli", "train", "stdlib-bpe", "train", "--minutes", "1", "--corpus",
                              "stdlib-all", "--out", str(tmp_path / "other")], capture_output=True, text=True, cwd=ROOT)
    assert unknown.returncode == 2 and "invalid choice: 'stdlib-all'" in unknown.stderr and "stdlib-with-tests" in unknown.stderr
    assert not (tmp_path / "other").exists()


TINY = ["train", "--vocab-size", "300", "--n-ctx", "32", "--d-model", "16", "--n-heads", "2", "--n-layers", "1",
        "--minutes", "1", "--warmup-steps", "2", "--eval-every", "1"]


@pytest.mark.parametrize("extra, match", [
    (["--eval-every", "0"], r"argument --eval-every: 0 must be at least 1"),  # B05
    (["--minutes", "100"], r"--minutes 100 of training exceeds --max-minutes 90"),  # B07
    (["--minutes", "nan"], r"argument --minutes: nan must be a finite number above 0"),
    (["--max-minutes", "-1"], r"argument --max-minutes: -1 must be a finite number above 0"),
    (["--n-heads", "3"], r"--d-model 16 is not divisible by --n-heads 3"),  # B09
    (["--n-heads", "16"], r"rotary positions need an even d_head = --d-model / --n-heads, got 1"),
    (["--batch-size", "0"], r"argument --batch-size: 0 must be at least 1"),  # B13
    (["--threads", "0"], r"argument --threads: 0 must be at least 1"),  # B10
    (["--steps", "-1"], r"argument --steps: -1 must be at least 0"),  # B04: never stopped
    (["--vocab-size", "10"], r"argument --vocab-size: 10 must be at least 257"),  # B08: silently 257
    (["--lr", "inf"], r"argument --lr: inf must be a finite number above 0"),
    (["--warmup-steps", "0"], r"argument --warmup-steps: 0 must be at least 1"),
    (["--copy-fraction", "1.5"], r"argument --copy-fraction: 1.5 must be a finite number at least 0 and at most 1"),
    (["--copy-fraction", "0.5", "--copy-max", "0.1"], r"--copy-max 0.1: a planted span is 8 tokens or longer"),
    (["--n-ctx", "8"], r"argument --n-ctx: 8 must be at least 24"),
    (["--seed", "-3"], r"argument --seed: -3 must be in \[0, 4294967295\]"),
])
def test_train_arguments_are_refused_before_any_work(tmp_path, monkeypatch, capsys, extra, match):
    """B04 B05 B07 B08 B09 B10 B13: exit 2 at parse time, before the corpus is tokenised, nothing written."""
    monkeypatch.setattr(stdlib_bpe, "token_corpus", lambda *a, **k: pytest.fail("tokenised before refusing"))
    with pytest.raises(SystemExit) as exit_:
        stdlib_bpe.main([*TINY, *extra, "--out", str(tmp_path / "run")])
    assert exit_.value.code == 2 and re.search(match, capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("field, value, match", [
    ("lr", float("nan"), r"Recipe lr=nan: nan must be a finite number above 0"),
    ("vocab_size", 10, r"Recipe vocab_size=10: 10 must be at least 257"),
    ("corpus", "stdlib-all", r"Recipe corpus='stdlib-all': 'stdlib-all' is not one of \['stdlib', 'stdlib-with-tests'\]"),
    ("seed", True, r"Recipe seed=True: a bool is not a recipe value"),
    ("warmup_steps", 0, r"Recipe warmup_steps=0: 0 must be at least 1"),
])
def test_a_recipe_checks_its_fields_as_its_flags_do(field, value, match):
    """The Python API (`train(Recipe(...), ...)`) refuses what the command line refuses."""
    with pytest.raises(ValueError, match=match):
        stdlib_bpe.Recipe(**{field: value})


def test_earlier_run_files_refuse_a_file_a_foreign_file_and_a_run_without_force(tmp_path):
    """B02 B11: the run folder's own names only, and only with --force; the user's files are never deleted."""
    assert stdlib_bpe.earlier_run_files(tmp_path / "absent", force=False) == []
    (tmp_path / "file").write_text("precious")
    with pytest.raises(ValueError, match=r"--out .*file is a file; give a folder"):
        stdlib_bpe.earlier_run_files(tmp_path / "file", force=True)
    run = tmp_path / "run"
    run.mkdir()
    assert stdlib_bpe.earlier_run_files(run, force=False) == []
    names = ["log.jsonl", "run.json", "step000000.json", "step000000.safetensors", "tokenizer.json"]
    for name in names:
        (run / name).write_text("x")
    with pytest.raises(ValueError, match=r"is not empty \(5 entries, e.g. log.jsonl, .*\): a new run there would mix"):
        stdlib_bpe.earlier_run_files(run, force=False)
    assert [p.name for p in stdlib_bpe.earlier_run_files(run, force=True)] == names
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files no training run writes \(notes.txt\); --force replaces only"):
        stdlib_bpe.earlier_run_files(run, force=True)


def test_force_replaces_the_earlier_run_whole(tmp_path, monkeypatch, mini_data, capsys):
    """B02: a second run onto the first is refused (nothing changes); with --force no snapshot of the first stays beside
    the second's log and tokenizer."""
    monkeypatch.setattr(stdlib_bpe, "token_corpus", lambda *a, **k: mini_data)
    out = tmp_path / "run"
    assert stdlib_bpe.main([*TINY, "--steps", "2", "--out", str(out)]) == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "step000002.safetensors" in first
    with pytest.raises(SystemExit) as exit_:
        stdlib_bpe.main([*TINY, "--steps", "1", "--seed", "7", "--out", str(out)])
    assert exit_.value.code == 2 and "Pass --force to replace an earlier run" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
    assert stdlib_bpe.main([*TINY, "--steps", "1", "--seed", "7", "--force", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["log.jsonl", "run.json", "step000000.json", "step000000.safetensors",
                                                     "step000001.json", "step000001.safetensors", "tokenizer.json"]
    seeds = {read_checkpoint_config(out / f"step00000{i}")["metadata"]["recipe"]["seed"] for i in (0, 1)}
    assert seeds == {7}


def test_train_py_arguments_are_refused_before_any_work(tmp_path, capsys):
    """interp.experiments.train had the same defects: 0 steps silently became 3000, --threads 0 a traceback."""
    from interp.experiments import train

    for extra, match in [(["--steps", "0"], r"--steps: 0 must be at least 1"), (["--threads", "0"], r"--threads: 0"),
                         (["--lr", "nan"], r"--lr: nan must be a finite number"), (["--batch-size", "-2"], "--batch-size"),
                         (["--control-prefix-len", "40"], r"--control-prefix-len: 40 must be in \[4, 31\]"),
                         (["--max-minutes", "0"], r"--max-minutes: 0 must be a finite number above 0")]:
        with pytest.raises(SystemExit) as exit_:
            train.main([*extra, "--out", str(tmp_path / "m")])
        assert exit_.value.code == 2 and re.search(match, capsys.readouterr().err)
    with pytest.raises(SystemExit):
        train.main(["--out", str(tmp_path)])
    assert "names a folder" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- the shipped checkpoint and its card


def test_loads_by_name_offline_with_its_tokenizer(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = interp.load("stdlib-bpe")
    assert isinstance(model.tokenizer, BPETokenizer) and model.cfg.attn_only and model.cfg.n_layers == 3
    tokens = model.to_tokens("def f(x):\n    return x")
    assert model.tokenizer.decode(tokens[0].tolist()).endswith("def f(x):\n    return x")
    assert model(tokens).shape == (1, tokens.shape[1], model.cfg.d_vocab)


def test_card_records_recipe_curve_baselines_copying_and_heads(shipped):
    card = CHECKPOINT.with_suffix(".md").read_text()
    held = shipped["held_out"]
    assert held["bits_per_token"] < held["bigram_bits_per_token"] < held["unigram_bits_per_token"]
    assert f"{held['bits_per_byte']:.3f}" in card and f"{held['copy_ratio']:.3f}" in card
    assert shipped["command"] in card and "### Pilot: " in card and "## Training curve" in card
    assert len(shipped["curve"]) >= 10 and shipped["curve"][0]["step"] == 0
    assert shipped["heads"]["induction_heads"] and "## Heads" in card
    assert shipped["tokenizer"]["sha256"] == BPETokenizer(shipped["tokenizer"]["json"]).sha256


def test_a_replaced_checkpoint_carries_its_runs_and_the_run_it_shipped_into_the_new_card(shipped):
    runs = stdlib_bpe.earlier_runs(shipped)
    assert runs[:-1] == shipped["variants"]
    before = runs[-1]
    assert before["name"].endswith("(shipped before)") and before["recipe"] == shipped["recipe"]
    assert before["curve"] == shipped["curve"] and before["last"] == shipped["curve"][-1]
    assert shipped["command"].endswith(" ".join(before["argv"][1:]))
    table = stdlib_bpe._card_variants({"variants": runs})
    assert all(f"| {run['name']} |" in table for run in runs)


def test_a_runs_opening_is_read_as_its_pilot_with_the_command_that_stops_there(tmp_path):
    import json

    rows = [{"step": 500 * i, "tokens": 512000 * i, "train_seconds": 100.0 * i, "induction": 0.1 * i} for i in range(11)]
    (tmp_path / "run.json").write_text(json.dumps({"recipe": {"n_ctx": 256}, "argv": ["stdlib_bpe.py", "train", "--minutes",
                                                                                     "85", "--steps", "5000"]}))
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pilot = stdlib_bpe.opening_pilot(tmp_path, 5)
    assert pilot["curve"] == rows[:4] and pilot["last"] == rows[3] and pilot["name"] == f"{tmp_path.name}, its first 5 min"
    assert pilot["argv"][2:] == ["--minutes", "85", "--steps", "1500"]
    with pytest.raises(ValueError, match=r"1 snapshot\(s\) within its first 1 min"):
        stdlib_bpe.opening_pilot(tmp_path, 1)


def test_a_pilots_trend_is_extrapolated_to_the_tokens_asked():
    rows = [{"tokens": 10**k, **{key: 5.0 - k for key in ("held_out_nats", "induction", "previous_token", "copy_ratio")}}
            for k in range(2, 8)]
    pilot = {"name": "p", "recipe": {"batch_size": 4, "n_ctx": 256}, "curve": rows}
    ahead = stdlib_bpe.extrapolated(pilot, 1e9)
    assert ahead["extrapolated_to"] == 1e9 and "extrapolated" not in pilot  # a copy, the input untouched
    assert ahead["extrapolated"]["held_out_nats"] == pytest.approx(-4.0)  # the line 5 - log10(tokens)
    assert ahead["aoyama_tokens"] == pytest.approx(10**5.7 * 32)


def test_card_names_the_corpus_the_recipe_trained_on(shipped):
    for corpus, words in stdlib_bpe.CORPUS_WORDS.items():
        metadata = {**shipped, "recipe": {**shipped["recipe"], "corpus": corpus}}
        assert words in stdlib_bpe._card_intro(metadata) and f"corpus `{corpus}`" in stdlib_bpe._recipe_line(metadata["recipe"])
        assert ("on the same held-out files" in stdlib_bpe._card_held_out(metadata)) == (corpus == "stdlib")


@pytest.mark.heavy
def test_card_figures_are_remeasured_on_a_slice(shipped, data):
    """The held-out figures measured again: bits per byte on a quarter of the card's windows (a slice, so within
    sampling noise), the ICL score and the copy ratio on the card's own prompts (so equal up to float rounding)."""
    model = interp.load("stdlib-bpe")
    card = shipped["held_out"]
    again = stdlib_bpe.held_out_figures(model, data, n_windows=card["n_windows"] // 4, n_repeats=card["copy_n_prompts"])
    assert abs(again["bits_per_byte"] - card["bits_per_byte"]) < 0.05
    assert again["bigram_bits_per_byte"] == pytest.approx(card["bigram_bits_per_byte"], abs=0.1)
    assert again["icl_score"] == pytest.approx(card["icl_score"], abs=1e-4)
    assert again["copy_ratio"] == pytest.approx(card["copy_ratio"], abs=1e-4)


@pytest.mark.heavy
def test_a_short_training_run_reproduces_the_recorded_early_loss(shipped, data):
    """The recipe retrained for the few steps `finish` recorded gives the recorded losses. float32 sums differ
    across CPUs, so within 0.02 nats, not bit for bit (same machine and thread count: identical)."""
    recorded = shipped["reproduction"]
    again = stdlib_bpe.reproduction_row(stdlib_bpe.Recipe(**shipped["recipe"]), data, threads=shipped["threads"],
                                        steps=recorded["step"])
    assert again["step"] == recorded["step"] == stdlib_bpe.REPRODUCTION_STEPS
    assert abs(again["held_out_nats"] - recorded["held_out_nats"]) < 0.02
    assert abs(again["train_nats"] - recorded["train_nats"]) < 0.02


@pytest.mark.slow
def test_a_training_run_reproduces_the_first_snapshots_loss(shipped, data):
    """The recipe retrained to the run's first logged snapshot after step 0 (minutes) gives that row's losses."""
    first = shipped["curve"][1]
    again = stdlib_bpe.reproduction_row(stdlib_bpe.Recipe(**shipped["recipe"]), data, threads=shipped["threads"],
                                        steps=first["step"])
    assert again["step"] == first["step"]
    assert abs(again["held_out_nats"] - first["held_out_nats"]) < 0.02
    assert abs(again["train_nats"] - first["train_nats"]) < 0.02


@pytest.mark.heavy
def test_interp_report_runs_on_it(tmp_path):
    result = subprocess.run([sys.executable, "-m", "interp.cli", "report", "stdlib-bpe", "--n", "8", "--out", str(tmp_path),
                             "--quiet"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "report.html").exists()


# ---------------------------------------------------------------- notebook 04


def test_notebook_is_generated_from_the_script():
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("jupytext")
    import importlib.util

    spec = importlib.util.spec_from_file_location("notebooks_build", ROOT / "notebooks" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stored = nbformat.read(ROOT / "notebooks" / "04_text_model.ipynb", as_version=4)
    built = module.notebook(ROOT / "notebooks" / "04_text_model.py")
    assert [c.source for c in stored.cells] == [c.source for c in built.cells]


def _execute_notebook(name: str) -> dict[str, str]:
    """Run a notebook top to bottom; tag -> the cell's text output (as tests/notebooks/test_notebooks.py reads them)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = {}
    for cell in notebook.cells:
        texts = [o.text if o.output_type == "stream" else o.data.get("text/markdown") or o.data.get("text/plain", "")
                 for o in cell.get("outputs", []) if o.output_type in ("stream", "execute_result", "display_data")]
        for tag in cell.metadata.get("tags", []):
            outputs[tag] = "\n".join(texts)
    return outputs


@pytest.mark.notebook
def test_notebook_runs_and_concludes_from_its_results(shipped):
    out = _execute_notebook("04_text_model.ipynb")
    held = shipped["held_out"]
    assert f"held-out {held['bits_per_byte']:.3f} bits/byte" in out["load"]
    assert "corpus matches the card" in out["corpus"] or "differs" in out["corpus"]
    first, second = map(float, re.search(r"first copy ([\d.]+), on the second copy ([\d.]+)", out["repeat-benefit"]).groups())
    assert second < first  # the model copies a held-out span
    conclusion = out["conclusion"]
    removed = re.search(r"removes ([\d.]+) \[([\d.-]+), ([\d.-]+)\] of the copy gap", conclusion)
    assert removed and "a random set of as many other heads removes" in conclusion, conclusion
    assert "**False claims**" in conclusion and "of the copy gap on held-out spans" in conclusion
    assert "with the layer-0 carriers' own inputs added" in conclusion and "**On the repeated spans**" in conclusion
    # the false claims (induction for the previous-token head, previous-token for the induction head) never hold
    assert "supported" not in re.search(r"\*\*False claims\*\*[^\n]*", conclusion).group(0).split("not supported")[1]
