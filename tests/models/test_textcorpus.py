"""The natural-text model `stdlib-bytes`: its corpus, shipped checkpoint and card, its loading by name, and natural
repeats as a prompt property (models/textcorpus.py; its training recipe: tests/interp/experiments/test_train_text.py).
Notebook 04, once about this model, is now about `stdlib-bpe` (tests/interp/experiments/test_stdlib_bpe.py)."""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interp.models.io import checkpoint_paths, load_checkpoint
from interp.models.textcorpus import (
    SEPARATOR,
    as_tensor,
    compare_corpus,
    corpus_files,
    decode,
    encode,
    eval_windows,
    evaluate_text,
    held_out_report,
    is_held_out,
    load_corpus,
    named_corpus,
    ngram_bits,
    planted_repeats,
    text_windows,
)

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = ROOT / "models" / "checkpoints" / "stdlib-bytes"


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture(scope="module")
def mini_root(tmp_path_factory):
    """A fake standard library: kept files, excluded folders, a non-.py file; enough files that both
    sides of the hash split are non-empty."""
    files = {f"pkg/mod{i}.py": f"def f{i}(x):\n    return x + {i}  # {'abc' * 200}\n" for i in range(40)}
    files.update({"test/test_a.py": "EXCLUDED", "tests/b.py": "EXCLUDED", "idlelib/c.py": "EXCLUDED",
                  "site-packages/d.py": "EXCLUDED", "e.txt": "EXCLUDED", "top.py": "import os\n" * 50})
    return write_tree(tmp_path_factory.mktemp("stdlib"), files)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


# ---------------------------------------------------------------- corpus: filter, split, checksum


def test_filter_keeps_py_files_outside_the_excluded_folders(mini_root):
    files = corpus_files(mini_root)
    assert len(files) == 41 and "top.py" in files and "pkg/mod0.py" in files
    assert not any(f.startswith(("test/", "tests/", "idlelib/", "site-packages/")) or not f.endswith(".py") for f in files)
    assert files == sorted(files)


def test_a_named_corpus_leaves_out_its_folders_and_an_unknown_name_is_refused(mini_root):
    with_tests = named_corpus("stdlib-with-tests", mini_root)
    files = set(with_tests.train_files + with_tests.held_out_files)
    assert files == set(corpus_files(mini_root)) | {"test/test_a.py", "tests/b.py", "idlelib/c.py"}
    assert "site-packages" in with_tests.summary()["filter"] and "idlelib" not in with_tests.summary()["filter"]
    assert named_corpus("stdlib", mini_root) == load_corpus(mini_root)
    assert with_tests.checksum != load_corpus(mini_root).checksum
    with pytest.raises(ValueError, match=r"unknown corpus 'stdlib-all'; expected one of \['stdlib', 'stdlib-with-tests'\]"):
        named_corpus("stdlib-all", mini_root)


def test_split_is_decided_by_the_path_alone_and_deterministic(mini_root, tmp_path):
    a, b = load_corpus(mini_root), load_corpus(mini_root)
    assert a == b and a.checksum == b.checksum
    assert set(a.held_out_files) == {f for f in corpus_files(mini_root) if is_held_out(f)}
    assert a.held_out_files and a.train_files
    # a file's side does not depend on the other files: drop half of them and no file changes side
    kept = corpus_files(mini_root)[::2]
    fewer = load_corpus(write_tree(tmp_path, {f: (mini_root / f).read_text() for f in kept}))
    assert set(fewer.held_out_files) == set(a.held_out_files) & set(kept)


def test_checksum_changes_with_any_file_and_comparison_says_so(mini_root, tmp_path):
    first = load_corpus(mini_root)
    changed = write_tree(tmp_path / "copy", {f: (mini_root / f).read_text() for f in corpus_files(mini_root)})
    assert load_corpus(changed).checksum == first.checksum  # same files, other folder: same corpus
    (changed / "top.py").write_text("import sys\n")
    second = load_corpus(changed)
    assert second.checksum != first.checksum
    assert compare_corpus(first.summary(), first) is None
    note = compare_corpus(first.summary(), second)
    assert "differs" in note and "41 files" in note and "not the card's" in note


def test_corpus_streams_are_bytes_joined_by_the_separator(mini_root):
    found = load_corpus(mini_root)
    assert found.train.count(SEPARATOR) == len(found.train_files) - 1
    assert found.n_bytes == sum((mini_root / f).stat().st_size for f in found.train_files + found.held_out_files)


def test_a_missing_or_empty_root_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        corpus_files(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no .py files"):
        corpus_files(tmp_path)


def test_ngram_baselines_have_known_answers():
    stream = torch.tensor([1, 2] * 500)  # strictly alternating: the bigram is (nearly) certain
    windows = torch.tensor([[1, 2, 1, 2, 1]])
    found = ngram_bits(stream, windows)
    # add-one: 500 pairs (1, 2) and 499 pairs (2, 1), so P(2 | 1) = 501 / 756, P(1 | 2) = 500 / 755;
    # the windows predict each twice. Unigram: P(x) = (500 + 1) / (1000 + 256)
    assert found["bigram_bits"] == pytest.approx(-(math.log2(501 / 756) + math.log2(500 / 755)) / 2, rel=1e-9)
    assert found["unigram_bits"] == pytest.approx(-math.log2(501 / 1256), rel=1e-6)
    assert found["n_predicted"] == 4


def test_windows_prompts_and_planted_repeats():
    stream = encode("abcdefgh" * 20 + "\x00" + "0123456789" * 20)
    windows = text_windows(stream, 16, 12, seed=0)
    assert windows.shape == (16, 12) and not (windows == 0).any()  # no window crosses a file boundary
    assert torch.equal(windows, text_windows(stream, 16, 12, seed=0))
    planted = planted_repeats(stream, 4, 10, 5, seed=1)
    assert planted.shape == (4, 25) and torch.equal(planted[:, 5:15], planted[:, 15:])
    assert decode(encode("héllo")) == "héllo"
    assert eval_windows(stream, 50, 3).shape == (3, 50)
    with pytest.raises(ValueError, match="shorter seq_len"):
        text_windows(encode("ab\x00cd"), 1, 4)


# ---------------------------------------------------------------- natural repeats as a prompt property


def test_ngram_repeats_define_queries_and_targets():
    from interp.analyses.induction import ngram_targets, repeat_queries
    from interp.data import PromptSet

    tokens = encode("xabcdyabcdz").unsqueeze(0)  # 'abcd' at 1..4 and 6..9
    real = torch.ones_like(tokens, dtype=torch.bool)
    targets = ngram_targets(tokens, real, 4)[0]
    assert targets.nonzero().tolist() == [[9, 4]]  # the 4-gram ending at 9 ended before at 4
    assert ngram_targets(tokens, real, 1)[0, 9].nonzero().flatten().tolist() == [4]
    queries = repeat_queries(PromptSet(tokens, meta={"match_len": 4}))
    assert queries[0].nonzero().flatten().tolist() == [9]
    queries = repeat_queries(PromptSet(tokens, meta={"match_len": 2}))
    assert queries[0].nonzero().flatten().tolist() == [7, 8, 9]
    with pytest.raises(ValueError, match="positive integer"):
        ngram_targets(tokens, real, 0)
    # a run of spaces: the 4-gram ending at q also ends at q - 1, but overlapping matches do not count
    run = encode("a" + " " * 9).unsqueeze(0)
    targets = ngram_targets(run, torch.ones_like(run, dtype=torch.bool), 4)[0]
    assert targets[9].nonzero().flatten().tolist() == [4, 5]  # 4-grams ending at 4 and 5 end 4+ back


def test_behaviour_mask_and_ideal_pattern_follow_natural_repeats():
    from interp.analyses.claims.causal import behaviour_mask, content_pattern
    from interp.data import PromptSet

    prompts = PromptSet(encode("xabcdyabcdz").unsqueeze(0), meta={"match_len": 4})
    mask, name = behaviour_mask(prompts)
    assert mask[0].nonzero().flatten().tolist() == [9] and "4-gram" in name  # query 9 predicts 'z'
    induction = content_pattern(prompts, "induction")[0]
    assert induction[9].nonzero().flatten().tolist() == [5]  # the token after the earlier 'abcd'
    assert content_pattern(prompts, "duplicate_token")[0, 9].nonzero().flatten().tolist() == [4]


# ---------------------------------------------------------------- the shipped checkpoint


@pytest.fixture(scope="module")
def shipped():
    if not checkpoint_paths(CHECKPOINT)[0].exists():
        pytest.fail(f"{CHECKPOINT}.safetensors is missing; rebuild it with the command in {CHECKPOINT}.md.")
    return load_checkpoint(CHECKPOINT)


def test_card_states_the_recorded_metrics(shipped):
    meta, card = shipped.metadata, CHECKPOINT.with_name("stdlib-bytes.md").read_text()
    held = meta["held_out"]
    assert meta["command"] in card and meta["corpus"]["checksum"] in card
    for value in (held["bits_per_byte"], held["unigram_bits"], held["bigram_bits"]):
        assert f"{value:.3f}" in card
    assert f"{meta['corpus']['n_files']} files" in card and f"{meta['train_seconds']:.0f} s wall" in card
    assert all(f"| {point['step']} | {point['train_bits']:.3f} | {point['held_out_bits']:.3f} |" in card
               for point in meta["curve"])
    assert held["ratio_to_bigram"] == pytest.approx(held["bits_per_byte"] / held["bigram_bits"], abs=1e-3)
    assert held["ratio_to_bigram"] <= 0.75 and "meets the bar" in card  # a real language model
    assert held["unigram_bits"] > held["bigram_bits"] > held["bits_per_byte"]


def test_recorded_check_slice_is_recomputed_exactly(shipped, corpus):
    meta = shipped.metadata
    if compare_corpus(meta["corpus"], corpus) is not None:
        pytest.skip(compare_corpus(meta["corpus"], corpus))
    windows = eval_windows(as_tensor(corpus.held_out), shipped.cfg.n_ctx, meta["held_out"]["n_windows"])
    check = evaluate_text(shipped, windows[: meta["check_slice"]["n_windows"]])
    assert check["bits"] == pytest.approx(meta["check_slice"]["bits"], abs=1e-4)


def test_held_out_report_on_the_corpus_found(shipped, corpus):
    found = held_out_report(shipped, shipped.metadata["corpus"], n_windows=32, corpus=corpus)
    assert found.corpus_matches_card and found.note is None
    assert found.ratio_to_bigram < 0.8 and found.unigram_bits > found.bigram_bits
    other = held_out_report(shipped, {**shipped.metadata["corpus"], "checksum": "0" * 64}, n_windows=4, corpus=corpus)
    assert not other.corpus_matches_card and "differs" in other.note


def test_loads_by_name():
    import interp

    model = interp.load("stdlib-bytes")
    assert model.cfg.d_vocab == 256 and model.cfg.n_layers == 4 and not model.cfg.attn_only
    logits = model(encode("def f(self):\n    return self").unsqueeze(0))
    assert logits.shape[-1] == 256


@pytest.mark.slow
def test_interp_report_runs_on_it(tmp_path):
    result = subprocess.run([sys.executable, "-m", "interp.cli", "report", "stdlib-bytes", "--n", "8", "--out",
                             str(tmp_path / "report")], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    assert any((tmp_path / "report").iterdir())
