"""Issue 24, loading models (items 4, 5, 6, 12 and part of 17): every bad model file or folder is a
clear `CheckpointError` (exit 2) naming the file and the fix, on every route (native, sdpa, bridge).

`CASES` is the table: a folder or file built locally from a small config (nothing is downloaded),
the backend, and a regex the message must match. Each case runs through `interp.load` (class and
exit code) and through `interp verify` (exit 2, no traceback). Every case failed on main before
the fix (a wrong exit code, a silent load, or a message that named nothing). The hypothesis tests
below fuzz checkpoint and index files: truncations, bit flips, wrong dtypes, paths outside the folder.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import interp  # noqa: E402
from interp import cli  # noqa: E402
from interp.errors import CheckpointError, exit_code_for  # noqa: E402

MLP_IN = "transformer.h.0.mlp.c_fc.weight"


def gpt2_folder(root: Path, name: str = "gpt2", **overrides) -> Path:
    """A one-layer GPT-2 folder saved by transformers (config.json + model.safetensors, no tokenizer)."""
    fields = {"vocab_size": 40, "n_positions": 16, "n_embd": 12, "n_layer": 1, "n_head": 3, **overrides}
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(**fields)).eval().save_pretrained(root / name)
    return root / name


def edit_config(folder: Path, **fields) -> Path:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return folder


def edit_tensors(folder: Path, edit: Callable[[dict], None], name: str = "model.safetensors") -> Path:
    tensors = load_file(str(folder / name))
    edit(tensors)
    save_file(tensors, str(folder / name), metadata={"format": "pt"})
    return folder


def as_index(folder: Path, weight_map) -> Path:
    """Replace model.safetensors by an index whose weight_map is `weight_map` (a callable of the tensor names)."""
    names = sorted(load_file(str(folder / "model.safetensors")))
    os.replace(folder / "model.safetensors", folder / "shard.safetensors")
    value = weight_map(names) if callable(weight_map) else weight_map
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": value}))
    return folder


def _outside(root: Path, name: str) -> Path:
    folder = gpt2_folder(root, name)
    other = gpt2_folder(root, name + "-other")
    return as_index(folder, lambda names: {n: f"../{other.name}/model.safetensors" for n in names})


def _symlinked_outside(root: Path, name: str) -> Path:
    folder = gpt2_folder(root, name)
    other = gpt2_folder(root, name + "-other")
    folder = as_index(folder, lambda names: {n: "link.safetensors" for n in names})
    (folder / "link.safetensors").symlink_to(other / "model.safetensors")
    return folder


def _missing_from_shard(root: Path, name: str) -> Path:
    folder = as_index(gpt2_folder(root, name), lambda names: {**{n: "shard.safetensors" for n in names},
                                                             "transformer.h.7.ln_1.weight": "shard.safetensors"})
    return folder


def _bin(root: Path, name: str, content: bytes | object) -> Path:
    folder = gpt2_folder(root, name)
    (folder / "model.safetensors").unlink()
    if isinstance(content, bytes):
        (folder / "pytorch_model.bin").write_bytes(content)
    else:
        torch.save(content, folder / "pytorch_model.bin")
    return folder


def _bytes(root: Path, name: str, cut: Callable[[bytes], bytes]) -> Path:
    folder = gpt2_folder(root, name)
    path = folder / "model.safetensors"
    path.write_bytes(cut(path.read_bytes()))
    return folder


def _drop(tensors: dict) -> None:
    tensors.pop(MLP_IN)


def _to_int(tensors: dict) -> None:
    tensors[MLP_IN] = (tensors[MLP_IN] * 100).to(torch.int32)


def _wrong_shape(tensors: dict) -> None:
    tensors[MLP_IN] = torch.zeros(12, 47)


def _extra(tensors: dict) -> None:
    tensors["transformer.h.0.mlp.c_extra.weight"] = torch.zeros(3, 3)


def _own_int_checkpoint(root: Path, name: str) -> Path:
    """One of our checkpoints (interp.save) whose weights file holds an int32 tensor, fingerprint intact."""
    from interp.models import GPTConfig, HookedGPT

    path = interp.save(HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=8, d_vocab=20, n_ctx=8, seed=0)), root / name)
    with safe_open(str(path), "pt") as handle:
        header = handle.metadata()
    tensors = load_file(str(path))
    tensors["blocks.0.attn.W_Q"] = tensors["blocks.0.attn.W_Q"].to(torch.int32)
    save_file(tensors, str(path), metadata=header)
    return root / name


def _nanogpt(root: Path, name: str, **changes) -> Path:
    from interp.models import GPTConfig, HookedGPT

    args = {"n_layer": 1, "n_head": 2, "n_embd": 8, "block_size": 8, "vocab_size": 20, "bias": True, **changes}
    model = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=8, d_vocab=20, n_ctx=8, seed=0))
    state = {"transformer.wte.weight": model.embed.W_E.detach().to(torch.int64)}  # an integer weight
    torch.save({"model_args": args, "model": state}, root / f"{name}.pt")
    return root / f"{name}.pt"


# (id, build(root, name) -> spec path, backend, regex the message must match); every case: CheckpointError, exit 2
CASES: list[tuple[str, Callable[[Path, str], Path], str, str]] = [
    # 4. sharded indexes: confined to the folder, malformed ones named
    ("index-absolute", lambda r, n: as_index(gpt2_folder(r, n), lambda ns: {k: "/etc/passwd" for k in ns}), "auto",
     r"model\.safetensors\.index\.json.*'/etc/passwd'.*outside the folder"),
    ("index-absolute-sdpa", lambda r, n: as_index(gpt2_folder(r, n), lambda ns: {k: "/etc/passwd" for k in ns}), "sdpa",
     r"'/etc/passwd'.*outside the folder"),
    ("index-absolute-bridge", lambda r, n: as_index(gpt2_folder(r, n), lambda ns: {k: "/etc/passwd" for k in ns}), "bridge",
     r"'/etc/passwd'.*outside the folder"),
    ("index-dotdot", _outside, "auto", r"'\.\./index-dotdot-other/model\.safetensors'.*outside the folder"),
    ("index-symlink", _symlinked_outside, "auto", r"'link\.safetensors'.*outside the folder"),
    ("index-no-weight-map", lambda r, n: as_index(gpt2_folder(r, n), None) and _no_weight_map(r / n), "auto",
     r"model\.safetensors\.index\.json has no 'weight_map'"),
    ("index-weight-map-list", lambda r, n: as_index(gpt2_folder(r, n), ["shard.safetensors"]), "auto",
     r"index\.json.*'weight_map' is a list.*expected an object"),
    ("index-weight-map-int", lambda r, n: as_index(gpt2_folder(r, n), lambda ns: {k: 3 for k in ns}), "auto",
     r"index\.json.*weight_map\['transformer\.\S+'\] is 3.*file name"),
    ("index-not-json", lambda r, n: _write(as_index(gpt2_folder(r, n), lambda ns: {}), "model.safetensors.index.json",
                                           b"{weight_map"), "auto", r"index\.json is not valid JSON"),
    ("index-missing-shard", lambda r, n: as_index(gpt2_folder(r, n), lambda ns: {k: "gone.safetensors" for k in ns}),
     "auto", r"lists shards \['gone\.safetensors'\] that are not in"),
    ("index-missing-shard-sdpa", lambda r, n: as_index(gpt2_folder(r, n), lambda ns: {k: "gone.safetensors" for k in ns}),
     "sdpa", r"lists shards \['gone\.safetensors'\] that are not in"),
    ("index-tensor-not-in-shard", _missing_from_shard, "auto", r"'transformer\.h\.7\.ln_1\.weight'.*not in shard\.safetensors"),
    # 5. a missing tensor is never initialised at random, on any route
    ("missing-native", lambda r, n: edit_tensors(gpt2_folder(r, n), _drop), "native", r"no tensor 'transformer\.h\.0\.mlp\.c_fc\.weight'"),
    ("missing-sdpa", lambda r, n: edit_tensors(gpt2_folder(r, n), _drop), "sdpa",
     r"missing-sdpa.*transformer\.h\.0\.mlp\.c_fc\.weight.*not in the file"),
    ("missing-bridge", lambda r, n: edit_tensors(gpt2_folder(r, n), _drop), "bridge",
     r"missing-bridge.*transformer\.h\.0\.mlp\.c_fc\.weight.*not in the file"),
    ("missing-bridge-fallback", lambda r, n: edit_tensors(gpt2_folder(r, n, scale_attn_by_inverse_layer_idx=True), _drop),
     "auto", r"transformer\.h\.0\.mlp\.c_fc\.weight.*not in the file"),
    ("extra-sdpa", lambda r, n: edit_tensors(gpt2_folder(r, n), _extra), "sdpa", r"c_extra\.weight.*has no such tensors"),
    # 6. config values checked at conversion; integer weights refused, not cast
    ("eps-negative", lambda r, n: edit_config(gpt2_folder(r, n), layer_norm_epsilon=-1), "auto",
     r"layer_norm_epsilon=-1.*positive finite number"),
    ("eps-zero-sdpa", lambda r, n: edit_config(gpt2_folder(r, n), layer_norm_epsilon=0), "sdpa", r"layer_norm_epsilon=0\b"),
    ("eps-nan", lambda r, n: edit_config(gpt2_folder(r, n), layer_norm_epsilon=float("nan")), "auto", r"layer_norm_epsilon=nan"),
    ("int-weight-native", lambda r, n: edit_tensors(gpt2_folder(r, n), _to_int), "auto",
     r"'transformer\.h\.0\.mlp\.c_fc\.weight' is torch\.int32.*floating"),
    ("int-weight-sdpa", lambda r, n: edit_tensors(gpt2_folder(r, n), _to_int), "sdpa",
     r"transformer\.h\.0\.mlp\.c_fc\.weight.*int32.*floating"),
    ("int-weight-bridge", lambda r, n: edit_tensors(gpt2_folder(r, n), _to_int), "bridge",
     r"transformer\.h\.0\.mlp\.c_fc\.weight.*int32.*floating"),
    ("int-weight-own-checkpoint", _own_int_checkpoint, "auto", r"int-weight-own-checkpoint\.safetensors.*blocks\.0\.attn\.W_Q.*int32"),
    ("int-weight-nanogpt", _nanogpt, "auto", r"int-weight-nanogpt\.pt.*transformer\.wte\.weight.*int64.*floating"),
    ("nanogpt-string-size", lambda r, n: _nanogpt(r, n, n_head="2"), "auto", r"n_head='2'.*integer"),
    # 12. unreadable files and bad config values: exit 2 naming the file or field, never 3
    ("truncated", lambda r, n: _bytes(r, n, lambda b: b[: len(b) // 2]), "auto", r"truncated/model\.safetensors is not a readable safetensors"),
    ("truncated-sdpa", lambda r, n: _bytes(r, n, lambda b: b[: len(b) // 2]), "sdpa", r"model\.safetensors is not a readable safetensors"),
    ("truncated-bridge", lambda r, n: _bytes(r, n, lambda b: b[: len(b) // 2]), "bridge", r"model\.safetensors is not a readable safetensors"),
    ("empty", lambda r, n: _bytes(r, n, lambda b: b""), "auto", r"empty/model\.safetensors is not a readable safetensors.*empty"),
    ("five-bytes", lambda r, n: _bytes(r, n, lambda b: b[:5]), "auto", r"model\.safetensors is not a readable safetensors"),
    ("bin-not-weights", lambda r, n: _bin(r, n, b"not a pickle"), "auto", r"pytorch_model\.bin cannot be read.*weights_only"),
    ("bin-not-weights-sdpa", lambda r, n: _bin(r, n, b"not a pickle"), "sdpa", r"pytorch_model\.bin cannot be read"),
    ("bin-a-list", lambda r, n: _bin(r, n, [1, 2]), "auto", r"pytorch_model\.bin holds a list, not a state dict"),
    ("nan-weight-sdpa", lambda r, n: edit_tensors(gpt2_folder(r, n), lambda t: t[MLP_IN].fill_(float("nan"))), "sdpa",
     r"nan-weight-sdpa: non-finite weights .*transformer\.h\.0\.mlp\.c_fc\.weight"),
    ("n-head-zero", lambda r, n: edit_config(gpt2_folder(r, n), n_head=0), "auto", r"n_head=0.*positive integer"),
    ("n-head-zero-sdpa", lambda r, n: edit_config(gpt2_folder(r, n), n_head=0), "sdpa", r"n_head=0.*positive integer"),
    ("n-positions-string", lambda r, n: edit_config(gpt2_folder(r, n), n_positions="32"), "auto",
     r"config\.json.*n_positions.*'32'"),
    ("n-layer-bool", lambda r, n: edit_config(gpt2_folder(r, n), n_layer=True), "auto", r"config\.json.*n_layer.*expected int, got bool"),
    ("wrong-shape-sdpa", lambda r, n: edit_tensors(gpt2_folder(r, n), _wrong_shape), "sdpa",
     r"transformer\.h\.0\.mlp\.c_fc\.weight.*\(12, 47\).*\(12, 48\)"),
    ("wrong-shape-bridge", lambda r, n: edit_tensors(gpt2_folder(r, n), _wrong_shape), "bridge",
     r"transformer\.h\.0\.mlp\.c_fc\.weight.*\(12, 47\).*\(12, 48\)"),
    # 17. the native reason comes first when the bridge fallback fails too
    ("weird-activation", lambda r, n: edit_config(gpt2_folder(r, n), activation_function="weird"), "auto",
     r"^(?:(?!KeyError).)*activation_function='weird'.*supported.*bridge fallback failed too"),
]


def _no_weight_map(folder: Path) -> Path:
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    return folder


def _write(folder: Path, name: str, content: bytes) -> Path:
    (folder / name).write_bytes(content)
    return folder


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("loaders")
    return {name: build(root, name) for name, build, _, _ in CASES}


@pytest.mark.parametrize("name, backend, match", [(c[0], c[2], c[3]) for c in CASES], ids=[c[0] for c in CASES])
def test_api_refuses_bad_model_files(name, backend, match, built):
    with pytest.raises(CheckpointError) as info:
        interp.load(built[name], backend=backend)
    assert re.search(match, str(info.value), re.S), str(info.value)
    assert exit_code_for(info.value) == 2


@pytest.mark.parametrize("name, backend, match", [(c[0], c[2], c[3].lstrip("^")) for c in CASES], ids=[c[0] for c in CASES])
def test_cli_refuses_bad_model_files_with_exit_2(name, backend, match, built, capsys):
    code = cli.main(["verify", str(built[name]), "--backend", backend, "-q"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert re.search(match.replace("(?:(?!KeyError).)*", ".*"), err, re.S), err
    assert "Traceback" not in err and "internal error" not in err


def test_heads_refuses_a_negative_epsilon_instead_of_reporting_undefined(built, capsys):
    assert cli.main(["heads", str(built["eps-negative"]), "-q"]) == 2
    assert "layer_norm_epsilon=-1" in capsys.readouterr().err


# ------------------------------------------------------------------ what must still load

def test_a_good_sharded_folder_loads_on_every_route(tmp_path):
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=12, n_layer=1, n_head=3))
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="10KB")
    tokens = torch.arange(8)[None]
    with torch.no_grad():
        expected = hf.eval()(tokens).logits
        for backend in ("native", "sdpa", "bridge"):
            model = interp.load(tmp_path / "sharded", backend=backend)
            got = model(tokens)
            got = getattr(got, "logits", got)
            assert (got - expected).abs().max() < 1e-4, backend


def test_a_tied_head_is_not_a_missing_tensor(tmp_path):
    folder = gpt2_folder(tmp_path)  # tie_word_embeddings: lm_head.weight is not stored
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        assert "lm_head.weight" not in set(handle.keys())
    for backend in ("sdpa", "bridge"):
        interp.load(folder, backend=backend)


def test_hugging_face_cache_snapshots_may_link_into_their_blobs(tmp_path):
    """The one link out of the folder that is allowed: snapshots/<rev>/x -> ../../blobs/<sha> (the hub's cache)."""
    source = gpt2_folder(tmp_path, "source")
    repo = tmp_path / "models--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    for file in source.iterdir():
        os.replace(file, repo / "blobs" / file.name)
        (snapshot / file.name).symlink_to(Path("../../blobs") / file.name)
    assert type(interp.load(snapshot)).__name__ == "HookedGPT"


def test_non_utf8_prompt_file_names_the_file(tmp_path):
    from interp.specs import SpecError, _read_lines

    path = tmp_path / "prompts.txt"
    path.write_bytes(b"the cat \xff\xfe sat\n")
    with pytest.raises(SpecError, match=re.escape(str(path)) + r".*UTF-8"):
        _read_lines(path)


# ------------------------------------------------------------------ fuzz: checkpoint and index files

FUZZ = settings(derandomize=True, max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Bytes of a good HF folder's weights and of one of our checkpoints (weights + JSON)."""
    from interp.models import GPTConfig, HookedGPT

    root = tmp_path_factory.mktemp("pristine")
    folder = gpt2_folder(root)
    interp.save(HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=8, d_vocab=20, n_ctx=8, seed=0)), root / "own")
    return {"folder": folder, "hf": (folder / "model.safetensors").read_bytes(), "config": (folder / "config.json").read_text(),
            "own": (root / "own.safetensors").read_bytes(), "own_json": (root / "own.json").read_bytes()}


def _mutate(data: bytes, cut: int | None, flips: list[int]) -> bytes:
    out = bytearray(data if cut is None else data[: cut % (len(data) + 1)])
    for bit in flips:
        if out:
            out[(bit // 8) % len(out)] ^= 1 << (bit % 8)
    return bytes(out)


def _loads_or_names(spec: Path, named: str, backend: str = "auto") -> None:
    """The documented outcome: a model, or a CheckpointError (exit 2) whose message names `named`."""
    try:
        interp.load(spec, backend=backend)
    except CheckpointError as error:
        assert named in str(error), str(error)
        assert exit_code_for(error) == 2


MUTATION = dict(cut=st.none() | st.integers(0, 20_000), flips=st.lists(st.integers(0, 8 * 20_000), max_size=3),
                header=st.booleans())


def _aim(flips: list[int], header: bool, data: bytes) -> list[int]:
    """Bit positions, half of the time inside the safetensors header (its first bytes), where flips matter most."""
    size = 8 + int.from_bytes(data[:8], "little") if header else len(data)
    return [bit % (8 * max(size, 1)) for bit in flips]


@FUZZ
@given(**MUTATION)
def test_fuzz_our_checkpoint_files(cut, flips, header, pristine, tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    (root / "own.safetensors").write_bytes(_mutate(pristine["own"], cut, _aim(flips, header, pristine["own"])))
    (root / "own.json").write_bytes(pristine["own_json"])
    _loads_or_names(root / "own", "own.")


@FUZZ
@given(**MUTATION, json_flips=st.lists(st.integers(0, 8 * 2000), max_size=2))
def test_fuzz_our_checkpoint_config(cut, flips, header, json_flips, pristine, tmp_path_factory):
    root = tmp_path_factory.mktemp("ownjson")
    (root / "own.safetensors").write_bytes(pristine["own"])
    (root / "own.json").write_bytes(_mutate(pristine["own_json"], None, json_flips))
    _loads_or_names(root / "own", "own.")


@FUZZ
@given(**MUTATION, backend=st.sampled_from(["auto", "sdpa"]))
def test_fuzz_hugging_face_weights(cut, flips, header, backend, pristine, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    (folder / "config.json").write_text(pristine["config"])
    (folder / "model.safetensors").write_bytes(_mutate(pristine["hf"], cut, _aim(flips, header, pristine["hf"])))
    _loads_or_names(folder, str(folder), backend)


DTYPES = st.sampled_from([torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int32, torch.int64, torch.bool,
                          torch.uint8])


@FUZZ
@given(dtype=DTYPES, which=st.integers(0, 100))
def test_fuzz_wrong_dtypes(dtype, which, pristine, tmp_path_factory):
    folder = tmp_path_factory.mktemp("dtype")
    (folder / "config.json").write_text(pristine["config"])
    (folder / "model.safetensors").write_bytes(pristine["hf"])

    def cast(tensors):
        name = sorted(tensors)[which % len(tensors)]
        tensors[name] = tensors[name].to(dtype)

    edit_tensors(folder, cast)
    try:
        model = interp.load(folder)
    except CheckpointError as error:
        assert str(folder) in str(error) and not dtype.is_floating_point, str(error)
    else:
        assert dtype.is_floating_point and type(model).__name__ == "HookedGPT"


SHARD_NAMES = st.sampled_from(["shard.safetensors", "/etc/passwd", "../x/model.safetensors", "sub/../shard.safetensors",
                               "./shard.safetensors", "", ".", "..", "shard.safetensors/..", "/", "gone.safetensors",
                               "config.json", "\x00", "link.safetensors"])
INDEX_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | SHARD_NAMES,
                            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                            max_leaves=6)


@FUZZ
@given(names=st.lists(SHARD_NAMES, min_size=1, max_size=4), weight_map=st.none() | INDEX_VALUES,
       shape=st.sampled_from(["per-tensor", "raw", "absent"]))
def test_fuzz_index_files(names, weight_map, shape, pristine, tmp_path_factory):
    folder = tmp_path_factory.mktemp("index")
    (folder / "config.json").write_text(pristine["config"])
    (folder / "shard.safetensors").write_bytes(pristine["hf"])
    (folder / "link.safetensors").symlink_to("/etc/passwd")
    tensors = sorted(load_file(str(folder / "shard.safetensors")))
    if shape == "per-tensor":  # every tensor mapped to one of the drawn names
        document = {"weight_map": {t: names[i % len(names)] for i, t in enumerate(tensors)}}
    else:
        document = {} if shape == "absent" else {"weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(document))
    _loads_or_names(folder, str(folder))
    if shape == "per-tensor" and all(n in ("shard.safetensors", "./shard.safetensors") for n in names):
        assert type(interp.load(folder)).__name__ == "HookedGPT"


def test_an_index_that_links_out_of_the_folder_is_refused(tmp_path):
    folder = as_index(gpt2_folder(tmp_path), lambda names: {n: "shard.safetensors" for n in names})
    os.replace(folder / "model.safetensors.index.json", tmp_path / "elsewhere.json")
    (folder / "model.safetensors.index.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(CheckpointError, match=r"^(?:(?!valid JSON).)*model\.safetensors\.index\.json, which resolves to "
                                              r".*elsewhere\.json, outside"):
        interp.load(folder)


def test_a_head_the_bridge_adds_may_be_random_but_a_base_tensor_may_not_be_missing(tmp_path):
    """A BertModel folder booted as BertForMaskedLM (MiniLM's case): the MLM head is random and noted
    (`head_is_random`); a tensor of the encoder itself missing from the file is refused."""
    config = transformers.BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, max_position_embeddings=16)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(tmp_path / "bert")
    bridge = interp.load(tmp_path / "bert", backend="bridge")
    assert bridge.head_is_random is True and "randomly initialised" in bridge.load_notes[0]
    edit_tensors(tmp_path / "bert", lambda tensors: tensors.pop("encoder.layer.0.attention.self.query.weight"))
    with pytest.raises(CheckpointError, match=r"needs \['bert\.encoder\.layer\.0\.attention\.self\.query\.weight'\], "
                                              r"which are not in the file"):
        interp.load(tmp_path / "bert", backend="bridge")
