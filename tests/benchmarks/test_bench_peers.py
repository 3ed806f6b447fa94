"""`python -m benchmarks peers --dry-run` (benchmarks/bench_peers.py): our side of the side-by-side runs on one small
model and exports it for TransformerLens 2.x, without building or running the peer environment; the peer side's
edge names map onto ours."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from benchmarks import __main__ as bench_main
from benchmarks import bench_peers, peers_side


@pytest.mark.heavy
def test_dry_run_runs_our_side_and_never_the_peer(tmp_path, monkeypatch, capsys):
    def refuse():
        raise AssertionError("a dry run must not build the peer environment")

    monkeypatch.setattr(bench_peers, "ensure_peer_env", refuse)
    rows = bench_peers.main(["--dry-run", "--out", str(tmp_path)])
    assert [row["method"] for row in rows] == ["acdc", "eap", "eap-ig", "nodes"]
    assert {row["toolkit"] for row in rows} == {"interp"}
    for row in rows:
        assert 0 <= row["auroc"] <= 1 and row["cmd"].ci_low <= row["cmd"].mean <= row["cmd"].ci_high
        assert row["unmatched"] == 0
    assert rows[0]["random_cmd"] is not None  # the random baseline, once per model
    folder = tmp_path / "models" / "handbuilt-positional-sender"
    config = json.loads((folder / "config.json").read_text())
    assert config["task"] == "next-token" and config["tl_config"]["n_heads"] == 2
    assert (folder / "weights.safetensors").exists() and (folder / "data.safetensors").exists()
    out = capsys.readouterr().out
    assert "per-edge scores:" in out and "dry run" in out and "load average" in out


def test_the_peer_edge_names_map_onto_ours():
    def edge(src: str, dest: str):
        return SimpleNamespace(src=SimpleNamespace(name=src), dest=SimpleNamespace(name=dest))

    assert peers_side.our_label(edge("A0.1", "A1.0.K")) == "L0H1 -> L1H0 via k"
    assert peers_side.our_label(edge("Resid Start", "MLP 1")) == "embed -> MLP1"
    assert peers_side.our_label(edge("MLP 0", "Resid End")) == "MLP0 -> logits"
    assert peers_side.our_label(edge("A2.3", "A3.1.V")) == "L2H3 -> L3H1 via v"


def test_the_runner_leaves_peers_out_unless_named_and_passes_options(monkeypatch):
    called = []
    monkeypatch.setattr(bench_main, "discover", lambda: ["bench_peers", "bench_x"])
    monkeypatch.setattr(bench_main.importlib, "import_module",
                        lambda name: SimpleNamespace(main=lambda argv: called.append((name, argv))))
    assert bench_main.run([]) == 0 and called == [("benchmarks.bench_x", [])]
    called.clear()
    assert bench_main.run(["peers", "--dry-run", "--out", "/tmp/x"]) == 0
    assert called == [("benchmarks.bench_peers", ["--dry-run", "--out", "/tmp/x"])]
    assert bench_main.run(["peers", "x", "--dry-run"]) == 2  # options go to one named benchmark
    assert bench_main.run(["--dry-run"]) == 2
