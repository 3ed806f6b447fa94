"""Compile the shipped Tracr programs and dump what `interp.models.convert.tracr` converts (run it in a Tracr environment).

    python3 -m venv /tmp/tracr-venv
    /tmp/tracr-venv/bin/pip install jax==0.4.30 jaxlib==0.4.30 dm-haiku==0.0.12 chex==0.1.86 numpy==1.26.4 tracr-pypi==1.0.0
    /tmp/tracr-venv/bin/python models/convert/tracr_compile.py --out build/tracr
    .venv/bin/python -m interp.models.convert.tracr build/tracr --out models/checkpoints

This file imports nothing of the toolkit (and no torch): it runs where Tracr runs. For each program of
`PROGRAMS` it writes `NAME.npz` (the compiled parameters, by their Haiku names) and `NAME.json` (the program's
RASP text, vocabulary, encoders, residual-stream labels, the rows the unembedding reads, and the compiled
model's own outputs on `REFERENCE_INPUTS`). Every program is compiled with `causal=True` and reads only
earlier positions, so the causal model computes what the program says (checked below against RASP's own
evaluation).
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

import numpy as np

if __name__ == "__main__":  # run as a script, this folder comes first on sys.path, and its tracr.py (the converter)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]  # hides Tracr

MAX_SEQ_LEN = 8  # tokens after BOS
BOS = "BOS"
MLP_EXACTNESS = 100


def frac_prevs():
    """The fraction of the tokens so far that are "x" (Tracr's `make_frac_prevs`): numerical."""
    from tracr.compiler import lib
    from tracr.rasp import rasp

    return lib.make_frac_prevs(rasp.tokens == "x"), {"a", "b", "x"}


def prev_token():
    """The previous token (Tracr's `shift_by(1, tokens)`): categorical; none at the first token."""
    from tracr.compiler import lib
    from tracr.rasp import rasp

    return lib.shift_by(1, rasp.tokens).named("prev_token"), {"a", "b", "c"}


def pair_frac():
    """The fraction of the positions so far whose token equals the previous token: the previous token (an
    attention layer), compared with the token (an MLP), made a number (an MLP), averaged over the prefix (an
    attention layer)."""
    from tracr.compiler import lib
    from tracr.rasp import rasp

    previous = lib.shift_by(1, rasp.tokens).named("previous")
    # Tracr compiles a SequenceMap to categorical outputs only: the 0 / 1 is made numerical by a Map (another MLP)
    equal = rasp.SequenceMap(lambda a, b: 1 if a == b else 0, rasp.tokens, previous).named("equal")
    same = rasp.numerical(rasp.Map(lambda x: x, equal)).named("same")
    prefix = rasp.Select(rasp.indices, rasp.indices, rasp.Comparison.LEQ).named("prefix")
    return rasp.numerical(rasp.Aggregate(prefix, same, default=0)).named("pair_frac"), {"a", "b", "c"}


PROGRAMS = {"frac-prevs": frac_prevs, "prev-token": prev_token, "pair-frac": pair_frac}
REFERENCE_INPUTS = {  # a few inputs per program (BOS first), different lengths
    "frac-prevs": [["a", "x", "b", "x"], ["x", "x", "a", "b", "b", "x", "a", "x"], ["b"], ["a", "a", "x", "a", "x", "x"]],
    "prev-token": [["a", "b", "c", "a"], ["c", "c", "b", "a", "b", "c", "a", "a"], ["b"], ["a", "c", "b", "b", "a", "c"]],
    "pair-frac": [["a", "a", "b", "b"], ["c", "c", "c", "a", "b", "b", "a", "a"], ["b"], ["a", "b", "a", "b", "b", "c"]],
}


def compile_one(name: str) -> tuple[dict, dict]:
    """Compile one shipped program (causal) and describe it with its reference outputs."""
    from tracr.compiler import compiling

    program, vocab = PROGRAMS[name]()
    model = compiling.compile_rasp_to_model(program, vocab=vocab, max_seq_len=MAX_SEQ_LEN, causal=True,
                                            compiler_bos=BOS, mlp_exactness=MLP_EXACTNESS)
    params, document = describe_compiled(model, program, name, REFERENCE_INPUTS[name])
    document["program"] = inspect.getsource(PROGRAMS[name])
    return params, document


def describe_compiled(model, program, name: str, references: list[list[str]]) -> tuple[dict, dict]:
    """The parameters (by Haiku name) and description of a compiled `AssembledTransformerModel` of `program`,
    with its own outputs on each of `references` (token lists without BOS)."""
    from tracr.rasp import rasp

    labels = list(model.residual_labels)
    out_rows = [i for i, label in enumerate(labels) if label == program.label or label.startswith(program.label + ":")]
    categorical = rasp.is_categorical(program)
    encoding = dict(model.input_encoder.encoding_map)
    bos, pad = model.input_encoder.bos_token or BOS, model.input_encoder.pad_token
    params = {f"{module}/{key}": np.asarray(value) for module, values in model.params.items()
              for key, value in values.items()}
    cfg = model.model_config
    output_values = (sorted(model.output_encoder.encoding_map, key=model.output_encoder.encoding_map.get)
                     if categorical else None)
    document = {
        "name": name, "program": repr(program), "program_label": program.label,
        "vocab": sorted(str(t) for t in encoding if t not in (bos, pad)), "bos": bos, "pad": pad,
        "max_seq_len": int(params["pos_embed/embeddings"].shape[0]) - 1, "causal": bool(cfg.causal),
        "input_encoding": encoding, "output": "categorical" if categorical else "numerical",
        "output_values": output_values, "residual_labels": labels, "output_rows": out_rows,
        "num_heads": int(cfg.num_heads), "num_layers": int(cfg.num_layers), "key_size": int(cfg.key_size),
        "mlp_hidden_size": int(cfg.mlp_hidden_size), "layer_norm": bool(cfg.layer_norm), "activation": "relu",
        "references": [_reference(model, program, [bos] + tokens, out_rows, categorical) for tokens in references],
        "compiled_with": _versions(),
    }
    return params, document


def _reference(model, program, tokens: list[str], out_rows: list[int], categorical: bool) -> dict:
    """The compiled model's outputs on `tokens` (BOS first), and whether they agree with RASP's evaluation."""
    from tracr.rasp import rasp

    result = model.apply(tokens)
    final = np.asarray(result.transformer_output)[0]  # (pos, d_model): the residual stream the unembedding reads
    outputs = final[:, out_rows]  # (pos, n_out)
    if categorical and not (outputs[1:].argmax(-1) == np.asarray(result.unembedded)[0][1:]).all():
        raise RuntimeError(f"the residual rows {out_rows} are not what the compiled unembedding reads.")
    try:
        evaluated = rasp.evaluate(program, tokens[1:])
    except ValueError:  # RASP's evaluator refuses a mean over a None (pair-frac's first position); Tracr's model not
        evaluated = None
    decoded = list(result.decoded[1:])
    agree = None if evaluated is None else [
        a == b or (isinstance(a, float) and abs(a - b) < 1e-3)
        for a, b in zip(decoded, evaluated) if b is not None]  # None (no previous token): the model says its default
    return {"tokens": tokens, "ids": model.input_encoder.encode(tokens), "outputs": outputs.tolist(),
            "decoded": decoded, "rasp": evaluated, "agrees_with_rasp": None if agree is None else all(agree)}


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("tracr-pypi", "jax", "jaxlib", "dm-haiku", "chex", "numpy")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for NAME.npz + NAME.json")
    parser.add_argument("names", nargs="*", default=sorted(PROGRAMS), help=f"programs (default: all of {sorted(PROGRAMS)})")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        params, document = compile_one(name)
        np.savez(args.out / f"{name}.npz", **params)
        (args.out / f"{name}.json").write_text(json.dumps(document, indent=1, default=str) + "\n")
        ok = [r["agrees_with_rasp"] for r in document["references"]]
        print(f"{name}: {len(params)} tensors, d_model {len(document['residual_labels'])}, layers "
              f"{document['num_layers']}, agrees with RASP: {ok}")


if __name__ == "__main__":
    main()
