"""Build tests/data/nanogpt-induction.safetensors + .json: a nanoGPT-style model (tests/own_models.py `NanoStyleGPT`)
trained as a user would train it, on varied-length repeats (`own_models.train_nanogpt_induction`), so the tests have
a user's own model with a real induction head without training one each run.

Run from the repository root: `PYTHONPATH=.:tests OMP_NUM_THREADS=1 python tests/data/make_nanogpt_induction.py`.
The JSON records the model_args, the recipe, the wall time and thread count, and the induction score of each
layer-1 head on held-out repeats (prefix length 7, never trained on).
"""
from __future__ import annotations

import platform
import time

import torch
from own_models import (
    INDUCTION_BATCH,
    INDUCTION_LR,
    INDUCTION_STEPS,
    INDUCTION_WEIGHTS,
    save_nanogpt_induction,
    train_nanogpt_induction,
)

import interp
from interp.analyses.induction import scores_per_prompt


def main() -> None:
    start = time.perf_counter()
    model = train_nanogpt_induction()
    seconds = time.perf_counter() - start
    prompts = interp.repeated_tokens(64, 7, model.config.vocab_size, seed=123)
    scores = scores_per_prompt(interp.load(model), prompts)["induction"].mean(0)  # (layer, head)
    save_nanogpt_induction(
        model,
        recipe={"task": "own_models.induction_task()", "steps": INDUCTION_STEPS, "lr": INDUCTION_LR,
                "batch_size": INDUCTION_BATCH, "seed": 0, "init": "N(0, 0.02) (nanoGPT's)"},
        trained={"seconds": round(seconds, 1), "threads": torch.get_num_threads(), "torch": torch.__version__,
                 "machine": platform.machine()},
        induction_head=[1, int(scores[1].argmax())],
        induction_score_prefix7={f"L{l}H{h}": round(float(scores[l, h]), 4) for l in range(scores.shape[0])
                                 for h in range(scores.shape[1])},
    )
    print(f"wrote {INDUCTION_WEIGHTS} after {seconds:.0f} s; induction scores (prefix 7): {scores.numpy().round(3)}")


if __name__ == "__main__":
    main()
