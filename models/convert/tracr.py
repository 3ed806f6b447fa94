"""Compiled Tracr programs (Lindner et al. 2023) as HookedGPTs: circuits whose every edge is known.

Tracr compiles a RASP program into transformer weights (Haiku parameters: `token_embed`, `pos_embed`,
`transformer/layer_{l}/attn/{query,key,value,linear}`, `transformer/layer_{l}/mlp/{linear_1,linear_2}`) with no
LayerNorm, ReLU MLPs, attention scaled by 1/sqrt(key_size) and an unembedding that reads the program's output
rows of the residual stream. `convert_tracr(params, document)` builds the same network as a `HookedGPT`: each
Tracr layer (attention then MLP) is a block; heads are unfused from the fused projections; the unembedding
`W_U` is one-hot on the output rows, so logit j is the compiled model's output j (a number for a numerical
program, the score of `document["output_values"][j]` for a categorical one, whose argmax Tracr decodes).
Equal to the compiled model's own forward to 1e-5 (`tests/models/convert/test_tracr.py`).

`document` is what `interp.models.convert.tracr_compile.describe_compiled` writes beside the parameters (input
encoding, residual labels, output rows, shapes, reference outputs); `from_assembled(model, program)` takes a
compiled `AssembledTransformerModel` straight away (needs Tracr). `true_edges(model)` reads the circuit off
the weights (see there). The shipped programs: `python -m interp.models.convert.tracr DIR --out DIR`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Mapping

import einops
import numpy as np
import torch

from interp.models.config import GPTConfig
from interp.models.files import write_atomic
from interp.models.gpt import HookedGPT

TOLERANCE = 1e-5  # max |logit - compiled output| the conversion must meet on the reference inputs


class TracrError(ValueError):
    """Parameters or a description that are not a compiled Tracr model's."""


def _tensor(params: Mapping[str, Any], name: str) -> torch.Tensor:
    if name not in params:
        raise TracrError(f"Tracr parameter {name!r} missing; found {sorted(params)[:6]} ... (expected the Haiku names "
                         "of a compiled model, as tracr_compile writes them).")
    return torch.tensor(np.array(params[name], dtype=np.float32))  # a copy: jax arrays are read-only


def config_of(document: Mapping[str, Any]) -> GPTConfig:
    """The HookedGPT shape of a compiled program (d_vocab: the input tokens, or the outputs if more)."""
    if document.get("layer_norm"):
        raise TracrError("this Tracr model was compiled with layer_norm=True; the converter handles Tracr's default "
                         "(no LayerNorm), which its compiler always produces.")
    n_out = len(document["output_rows"])
    return GPTConfig(
        n_layers=int(document["num_layers"]), n_heads=int(document["num_heads"]),
        d_model=len(document["residual_labels"]), d_head=int(document["key_size"]),
        n_ctx=int(document["max_seq_len"]) + 1, d_vocab=max(len(document["input_encoding"]), n_out),
        d_mlp=max(int(document["mlp_hidden_size"]), 1), act_fn="relu", normalization_type=None,
        attn_only=False, seed=0, model_name=f"tracr-{document['name']}")


def convert_tracr(params: Mapping[str, Any], document: Mapping[str, Any]) -> HookedGPT:
    """A HookedGPT computing exactly what the compiled Tracr model computes (see the module)."""
    cfg = config_of(document)
    model = HookedGPT(cfg)
    state = {name: torch.zeros_like(value) for name, value in model.state_dict().items()}
    tokens = _tensor(params, "token_embed/embeddings")  # (input vocab, d_model)
    state["embed.W_E"][: tokens.shape[0]] = tokens
    state["pos_embed.W_pos"] = _tensor(params, "pos_embed/embeddings")[: cfg.n_ctx]  # (n_ctx, d_model)
    heads = {"h": cfg.n_heads}
    for layer in range(cfg.n_layers):
        attn, mlp, to = f"transformer/layer_{layer}/attn", f"transformer/layer_{layer}/mlp", f"blocks.{layer}"
        for ours, theirs in (("Q", "query"), ("K", "key"), ("V", "value")):
            state[f"{to}.attn.W_{ours}"] = einops.rearrange(_tensor(params, f"{attn}/{theirs}/w"),
                                                           "d (h k) -> h d k", **heads)
            state[f"{to}.attn.b_{ours}"] = einops.rearrange(_tensor(params, f"{attn}/{theirs}/b"), "(h k) -> h k", **heads)
        state[f"{to}.attn.W_O"] = einops.rearrange(_tensor(params, f"{attn}/linear/w"), "(h k) d -> h k d", **heads)
        state[f"{to}.attn.b_O"] = _tensor(params, f"{attn}/linear/b")
        hidden = _tensor(params, f"{mlp}/linear_1/w").shape[1]
        state[f"{to}.mlp.W_in"][:, :hidden] = _tensor(params, f"{mlp}/linear_1/w")  # (d_model, d_mlp)
        state[f"{to}.mlp.b_in"][:hidden] = _tensor(params, f"{mlp}/linear_1/b")
        state[f"{to}.mlp.W_out"][:hidden] = _tensor(params, f"{mlp}/linear_2/w")  # (d_mlp, d_model)
        state[f"{to}.mlp.b_out"] = _tensor(params, f"{mlp}/linear_2/b")
    for column, row in enumerate(document["output_rows"]):
        state["unembed.W_U"][row, column] = 1.0  # logit `column` reads the output's residual row
    model.load_state_dict(state)
    model.metadata = metadata_of(document)
    return model.eval()


def metadata_of(document: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint metadata of a converted program: what it computes, how to feed it, and its outputs."""
    return {
        "tracr": True, "task": f"the RASP program {document['program_label']} (compiled by Tracr, causal)",
        "program": document["program"], "program_label": document["program_label"], "vocab": document["vocab"],
        "input_encoding": document["input_encoding"], "bos_token": int(document["input_encoding"][document["bos"]]),
        "output": document["output"], "output_values": document["output_values"],
        "output_columns": list(range(len(document["output_rows"]))), "residual_labels": document["residual_labels"],
        "max_seq_len": document["max_seq_len"], "references": document["references"],
        "compiled_with": document.get("compiled_with", {}),
        "behaviour": "interp.behaviour.output_squared_error(columns=metadata['output_columns'])",
    }


def from_assembled(assembled: Any, program: Any, name: str = "program") -> HookedGPT:
    """Convert a compiled `tracr.compiler.assemble.AssembledTransformerModel` of `program` (needs Tracr)."""
    from interp.models.convert.tracr_compile import describe_compiled

    params, document = describe_compiled(assembled, program, name, references=[])
    return convert_tracr(params, document)


@torch.no_grad()
def check_references(model: HookedGPT, references: list[dict[str, Any]]) -> float:
    """The largest |logit - compiled output| over the reference inputs (every position); raises above TOLERANCE."""
    n_out = len(model.metadata["output_columns"])
    worst = 0.0
    for reference in references:
        tokens = torch.tensor([reference["ids"]])
        logits = model(tokens)[0, :, :n_out].double()  # (pos, n_out)
        expected = torch.tensor(reference["outputs"], dtype=torch.float64)
        worst = max(worst, float((logits - expected).abs().max()))
    if worst > TOLERANCE:
        raise TracrError(f"the converted model differs from the compiled one by {worst:.2e} (> {TOLERANCE:g}).")
    return worst


def random_inputs(model: HookedGPT, n: int, length: int | None = None, seed: int = 0) -> torch.Tensor:
    """(n, length + 1) token ids: BOS, then `length` (default: the longest the program takes) tokens drawn
    uniformly from the program's vocabulary, seeded. Wrap them in `interp.PromptSet` to analyse."""
    metadata = model.metadata
    length = int(metadata["max_seq_len"]) if length is None else int(length)
    if not 1 <= length <= int(metadata["max_seq_len"]):
        raise TracrError(f"length={length}: a compiled program takes 1 to {metadata['max_seq_len']} tokens after BOS.")
    vocab = torch.tensor([metadata["input_encoding"][token] for token in metadata["vocab"]])
    picks = torch.randint(0, len(vocab), (n, length), generator=torch.Generator().manual_seed(seed))
    return torch.cat([torch.full((n, 1), int(metadata["bos_token"])), vocab[picks]], dim=1)


# -- the circuit, read off the weights


def _writes(model: HookedGPT, real_ids: list[int]) -> dict[str, torch.Tensor]:
    """Each sender's write rows (k, d_model): what varies of the embeddings over the input tokens (positions and
    the constant `one` are the same on every prompt of a length), a head's OV rows, an MLP's output rows."""
    W_E = model.embed.W_E.detach().double()[real_ids]  # (token, d_model)
    out = {"embed": W_E - W_E.mean(0)}
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        for head in range(model.cfg.n_heads):
            out[f"L{layer}H{head}"] = (attn.W_V[head] @ attn.W_O[head]).detach().double()  # (d_model, d_model)
        out[f"MLP{layer}"] = block.mlp.W_out.detach().double()  # (d_mlp, d_model)
    return out


def _reads(model: HookedGPT) -> dict[tuple[str, str], torch.Tensor]:
    """Each receiver input's read map (d_model, k): (receiver, via) -> W_Q[h] / W_K[h] / W_V[h] / W_in / W_U."""
    out = {}
    for layer, block in enumerate(model.blocks):
        for head in range(model.cfg.n_heads):
            for via, W in (("q", block.attn.W_Q), ("k", block.attn.W_K), ("v", block.attn.W_V)):
                out[(f"L{layer}H{head}", via)] = W[head].detach().double()
        out[(f"MLP{layer}", "in")] = block.mlp.W_in.detach().double()
    out[("logits", "direct")] = model.unembed.W_U.detach().double()[:, model.metadata["output_columns"]]
    return out


def _order(label: str) -> tuple[int, int]:
    """Forward order of a node label: embed, then each layer's heads before its MLP, logits last."""
    if label == "embed":
        return (-1, 0)
    if label == "logits":
        return (10**9, 0)
    if label.startswith("MLP"):
        return (int(label[3:]), 1)
    layer, _ = label[1:].split("H")
    return (int(layer), 0)


def true_edges(model: HookedGPT, eps: float = 1e-6) -> list[str]:
    """The edges (`interp.paths` labels) that carry the program, read off the weights: S -> R via x when S's
    write can vary between prompts, R's input x reads what S writes (||write_S read_x|| > eps relative), and R
    reaches the logits through such edges. Positions and constants (Tracr's `one`, biases, BOS at position 0)
    are the same on every prompt of a length, so edges carrying only them are left out, as
    `interp.models.constructed` leaves out its positional heads' position reads."""
    encoding = model.metadata["input_encoding"]
    specials = {model.metadata.get("bos_token")} | {index for token, index in encoding.items() if token == "compiler_pad"}
    writes = _writes(model, sorted(index for index in encoding.values() if index not in specials))
    reads = _reads(model)
    scale = max(float(w.abs().max()) for w in writes.values()) * max(float(r.abs().max()) for r in reads.values())
    senders = sorted(writes, key=_order)
    touches = {(s, r, via) for s in senders for (r, via) in reads  # r runs after s and reads what s writes
               if _order(s) < _order(r) and float((writes[s] @ reads[(r, via)]).abs().max()) > eps * scale}
    live = {"embed"}
    for node in senders:  # forward: a node's write varies when an input of it does
        if any(s in live and r == node for s, r, _ in touches):
            live.add(node)
    useful = {"logits"}
    for node in sorted(writes, key=_order, reverse=True):  # backward: a node matters when a useful reader reads it
        if node in live and any(s == node and r in useful for s, r, _ in touches):
            useful.add(node)
    edges = [(s, r, via) for s, r, via in touches if s in live and r in useful]
    return [f"{s} -> {r}" + (f" via {via}" if via in ("q", "k", "v") else "")
            for s, r, via in sorted(edges, key=lambda e: (_order(e[1]), "qkv".find(e[2]), _order(e[0])))]


# -- the shipped checkpoints


def convert_tracr_folder(folder: Path, out: Path, names: list[str] | None = None) -> list[Path]:
    """Convert every NAME.npz + NAME.json that `tracr_compile` wrote in `folder` into checkpoints `out/tracr-NAME`
    (weights checked against the compiled model's outputs, the true edges in `metadata["edges"]`)."""
    from interp.models.io import save_checkpoint

    written = []
    for description in sorted(folder.glob("*.json")):
        if names and description.stem not in names:
            continue
        document = json.loads(description.read_text())
        with np.load(description.with_suffix(".npz")) as arrays:
            model = convert_tracr(dict(arrays), document)
        worst = check_references(model, document["references"])
        model.metadata["edges"] = true_edges(model)
        model.metadata["max_abs_difference"] = worst
        written.append(save_checkpoint(model, out / f"tracr-{document['name']}", model.metadata))
        write_atomic(out / f"tracr-{document['name']}.md", card(model))
        print(f"tracr-{document['name']}: max |difference| {worst:.1e}, {len(model.metadata['edges'])} true edges: "
              f"{model.metadata['edges']}")
    return written


def card(model: HookedGPT) -> str:
    """The checkpoint's card (Markdown) from its metadata: the program, its shape, its true edges, its outputs."""
    m, cfg = model.metadata, model.cfg
    rows = "\n".join(f"| {' '.join(r['tokens'])} | {r['decoded']} | {r['agrees_with_rasp']} |" for r in m["references"])
    versions = ", ".join(f"{k} {v}" for k, v in m.get("compiled_with", {}).items())
    return (f"# {cfg.model_name}\n\nA Tracr-compiled RASP program (causal) converted into a HookedGPT by "
            f"`interp.models.convert.tracr`: {cfg.n_layers} blocks of {cfg.n_heads} head(s) (d_head {cfg.d_head}) "
            f"and a ReLU MLP (d_mlp {cfg.d_mlp}), d_model {cfg.d_model} (one residual dimension per RASP value: "
            f"`metadata.residual_labels`), no LayerNorm, context {cfg.n_ctx} (BOS and up to {m['max_seq_len']} "
            f"tokens of {m['vocab']}). Output: {m['output']}, logit columns {m['output_columns']}"
            + (f" = {m['output_values']}" if m["output_values"] else "") + ". Behaviour: "
            f"`{m['behaviour']}`.\n\n## Program\n\n```python\n{m['program'].rstrip()}\n```\n\n"
            f"## True edges (read off the weights; equal to the edges exact path patching finds)\n\n"
            + "\n".join(f"- `{edge}`" for edge in m["edges"]) +
            f"\n\n## The compiled model's outputs (the converted model equals them to "
            f"{m['max_abs_difference']:.1e})\n\n| input | output | agrees with RASP |\n|---|---|---|\n{rows}\n\n"
            f"Compiled with {versions}. Rebuild: `python models/convert/tracr_compile.py --out build/tracr` in a "
            "Tracr environment, then `python -m interp.models.convert.tracr build/tracr --out models/checkpoints`.\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert the programs tracr_compile.py wrote into checkpoints.")
    parser.add_argument("folder", type=Path, help="tracr_compile.py's --out folder (NAME.npz + NAME.json)")
    parser.add_argument("--out", type=Path, required=True, help="where to write tracr-NAME.safetensors + .json")
    parser.add_argument("names", nargs="*", help="programs to convert (default: all in the folder)")
    args = parser.parse_args(argv)
    convert_tracr_folder(args.folder, args.out, args.names or None)


if __name__ == "__main__":
    main()
