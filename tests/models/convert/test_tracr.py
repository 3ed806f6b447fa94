"""Compiled Tracr programs as HookedGPTs (`interp.models.convert.tracr`): the shipped checkpoints reproduce the
compiled models' own outputs (stored with them), their true edges are what the weights say and exactly what
path patching finds; with jax and Tracr installed (marker `tracr`), a fresh compile converts exactly."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import interp
from interp.analyses.circuits import edge_effects
from interp.behaviour import output_squared_error
from interp.errors import BadInput
from interp.models.convert import tracr
from interp.paths import graph
from interp.specnames import TRACR_PROGRAMS

NAMES = [f"tracr-{name}" for name in TRACR_PROGRAMS]


@pytest.fixture(scope="module", params=NAMES)
def shipped(request):
    return interp.load(request.param)


def run_of(model, n: int = 16, seed: int = 1) -> interp.Run:
    prompts = interp.PromptSet(tracr.random_inputs(model, n, seed=seed))
    return interp.Run(model, prompts, behaviour=output_squared_error(model.metadata["output_columns"]))


def test_the_checkpoints_reproduce_the_compiled_models_outputs(shipped):
    references = shipped.metadata["references"]
    assert len(references) >= 3 and len({len(r["ids"]) for r in references}) >= 3  # several lengths
    assert tracr.check_references(shipped, references) <= tracr.TOLERANCE
    for reference in references:
        if shipped.metadata["output"] == "categorical":  # Tracr decodes the argmax of the output columns
            logits = shipped(torch.tensor([reference["ids"]]))[0, 1:, :len(shipped.metadata["output_columns"])]
            values = shipped.metadata["output_values"]
            assert [values[i] for i in logits.argmax(-1).tolist()] == reference["decoded"]
        if reference["agrees_with_rasp"] is not None:
            assert reference["agrees_with_rasp"]


def test_a_changed_weight_fails_the_reference_check(shipped):
    model = tracr.convert_tracr(*_params_and_document(shipped))
    assert tracr.check_references(model, shipped.metadata["references"]) < 1e-12
    with torch.no_grad():
        model.unembed.W_U.mul_(1.001)
    with pytest.raises(tracr.TracrError, match="differs from the compiled one"):
        tracr.check_references(model, shipped.metadata["references"])


def _params_and_document(model):
    """Back from a converted model to Tracr's parameter names (the inverse of convert_tracr), for round trips."""
    import einops

    cfg, state = model.cfg, {k: v.numpy() for k, v in model.state_dict().items()}
    params = {"token_embed/embeddings": state["embed.W_E"][: len(model.metadata["input_encoding"])],
              "pos_embed/embeddings": state["pos_embed.W_pos"]}
    for layer in range(cfg.n_layers):
        attn, to = f"transformer/layer_{layer}/attn", f"blocks.{layer}"
        for ours, theirs in (("Q", "query"), ("K", "key"), ("V", "value")):
            params[f"{attn}/{theirs}/w"] = einops.rearrange(state[f"{to}.attn.W_{ours}"], "h d k -> d (h k)")
            params[f"{attn}/{theirs}/b"] = einops.rearrange(state[f"{to}.attn.b_{ours}"], "h k -> (h k)")
        params[f"{attn}/linear/w"] = einops.rearrange(state[f"{to}.attn.W_O"], "h k d -> (h k) d")
        params[f"{attn}/linear/b"] = state[f"{to}.attn.b_O"]
        mlp = f"transformer/layer_{layer}/mlp"
        params[f"{mlp}/linear_1/w"], params[f"{mlp}/linear_1/b"] = state[f"{to}.mlp.W_in"], state[f"{to}.mlp.b_in"]
        params[f"{mlp}/linear_2/w"], params[f"{mlp}/linear_2/b"] = state[f"{to}.mlp.W_out"], state[f"{to}.mlp.b_out"]
    m = model.metadata
    document = {"name": cfg.model_name.removeprefix("tracr-"), "program": m["program"], "program_label": m["program_label"],
                "vocab": m["vocab"], "bos": "BOS", "max_seq_len": m["max_seq_len"], "input_encoding": m["input_encoding"],
                "output": m["output"], "output_values": m["output_values"], "residual_labels": m["residual_labels"],
                "output_rows": [int(np.flatnonzero(state["unembed.W_U"][:, c])[0]) for c in m["output_columns"]],
                "num_heads": cfg.n_heads, "num_layers": cfg.n_layers, "key_size": cfg.d_head,
                "mlp_hidden_size": cfg.d_mlp, "layer_norm": False, "references": m["references"]}
    return params, document


def test_the_true_edges_are_read_off_the_weights_and_are_what_path_patching_finds(shipped):
    assert shipped.metadata["edges"] == tracr.true_edges(shipped)
    run = run_of(shipped, 32)
    edges = graph(shipped)
    effects = {edge.label: effect.mean for edge, effect in zip(edges, edge_effects(run, edges))}
    found = {label for label, mean in effects.items() if abs(mean) > 1e-6}
    assert found == set(shipped.metadata["edges"])
    assert min(effects[label] for label in found) > 0.01
    assert max(abs(mean) for label, mean in effects.items() if label not in found) < 1e-9


def test_output_squared_error_is_zero_clean_and_the_squared_output_change():
    model = interp.load("tracr-frac-prevs")
    run = run_of(model, 8)
    assert run.clean().abs().max() == 0
    # zeroing the averaging head leaves its output at 0 (its bias is 0): the error is the mean squared answer
    tokens = run.prompts.tokens
    answers = model(tokens)[:, 1:, 0].double()  # (prompt, pos - 1)
    zeroed = run.effect(interp.HeadAblation("L1H0", "zero"))
    torch.testing.assert_close(zeroed.values, answers.pow(2).mean(-1))
    behaviour = output_squared_error([0])
    assert behaviour.unit == "squared output" and "positions after the first" in behaviour.description
    with pytest.raises(BadInput, match="distinct"):
        output_squared_error([0, 0])
    with pytest.raises(BadInput, match="beyond"):
        interp.Run(model, run.prompts, behaviour=output_squared_error([40])).clean()


def test_random_inputs_and_bad_documents():
    model = interp.load("tracr-prev-token")
    tokens = tracr.random_inputs(model, 5, 3, seed=2)
    assert tokens.shape == (5, 4) and (tokens[:, 0] == model.metadata["bos_token"]).all()
    assert set(tokens[:, 1:].flatten().tolist()) <= {model.metadata["input_encoding"][t] for t in model.metadata["vocab"]}
    assert torch.equal(tokens, tracr.random_inputs(model, 5, 3, seed=2))
    with pytest.raises(tracr.TracrError, match="1 to 8 tokens"):
        tracr.random_inputs(model, 5, 9)
    params, document = _params_and_document(model)
    with pytest.raises(tracr.TracrError, match="missing"):
        tracr.convert_tracr({k: v for k, v in params.items() if "query" not in k}, document)
    with pytest.raises(tracr.TracrError, match="layer_norm"):
        tracr.convert_tracr(params, {**document, "layer_norm": True})


def test_the_cards_name_the_edges_and_the_program():
    from pathlib import Path

    folder = Path(interp.loading.CHECKPOINT_DIR)
    for name in NAMES:
        card = (folder / f"{name}.md").read_text()
        document = json.loads((folder / f"{name}.json").read_text())
        assert all(f"`{edge}`" in card for edge in document["metadata"]["edges"])
        assert document["metadata"]["program"].splitlines()[0] in card


@pytest.mark.tracr
def test_a_fresh_compile_converts_exactly():
    """With jax, dm-haiku, chex and tracr-pypi installed: compile a program, convert it in memory, and compare the
    converted model's output columns with the compiled model's own forward on random inputs of every length."""
    pytest.importorskip("jax")
    pytest.importorskip("tracr")
    from tracr.compiler import compiling

    from interp.models.convert import tracr_compile

    for name in TRACR_PROGRAMS:
        program, vocab = tracr_compile.PROGRAMS[name]()
        compiled = compiling.compile_rasp_to_model(program, vocab=vocab, max_seq_len=tracr_compile.MAX_SEQ_LEN,
                                                   causal=True, compiler_bos=tracr_compile.BOS,
                                                   mlp_exactness=tracr_compile.MLP_EXACTNESS)
        model = tracr.from_assembled(compiled, program, name)
        rows = model.metadata.get("output_columns")
        generator = np.random.default_rng(0)
        for length in range(1, tracr_compile.MAX_SEQ_LEN + 1):
            tokens = ["BOS"] + list(generator.choice(sorted(vocab), length))
            result = compiled.apply(tokens)
            expected = np.asarray(result.transformer_output)[0][:, tracr_compile_rows(compiled, program)]
            with torch.no_grad():
                ours = model(torch.tensor([compiled.input_encoder.encode(tokens)]))[0, :, : len(rows)].double().numpy()
            assert np.abs(ours - expected).max() <= tracr.TOLERANCE
        shipped = interp.load(f"tracr-{name}")
        assert tracr.true_edges(model) == shipped.metadata["edges"]
        for ours_param, theirs in zip(model.state_dict().values(), shipped.state_dict().values()):
            torch.testing.assert_close(ours_param, theirs, rtol=0, atol=0)  # the shipped weights are this compile's


def tracr_compile_rows(compiled, program) -> list[int]:
    labels = list(compiled.residual_labels)
    return [i for i, label in enumerate(labels) if label == program.label or label.startswith(program.label + ":")]
