"""The report's circuit section on a user's own model hooked by interception: no edge can be patched there, so it
gives each head's write patched into each later layer's attention input, the same numbers as
`attention_input_patch`, in HTML, summary.md and report.json."""
import json

from own_models import direct_sdpa, rotary_gpt_trained

import interp
from interp.analyses.circuits import attention_input_patch
from interp.analyses.report.circuit import report_circuit
from interp.analyses.report.html import circuit_html, circuit_markdown


def test_an_intercepted_model_gets_its_head_to_layer_patches():
    model = interp.load(rotary_gpt_trained())
    prompts = interp.data.repeated_tokens(12, 8, 256, bos=0, seed=1)
    section = report_circuit(model, prompts, seed=0)
    assert section.summary is None and "split q/k/v inputs" in section.note
    frame = section.layer_patches
    assert list(frame["edge"]) == [f"L0H{h} -> L1 (attention input)" for h in range(4)]
    alone = attention_input_patch(model, prompts, sender="L0H2", layer=1, seed=0).iloc[0]
    assert frame.iloc[2]["effect"] == alone["effect"] and frame["ci_low"].max() > 1.0  # the previous-token heads
    html = circuit_html(section, {})
    assert "L0H2 -&gt; L1 (attention input)" in html and "What this model allows instead" in html
    lines = circuit_markdown(section)
    assert any(line.startswith("- L0H2 -> L1 (attention input): ") for line in lines)
    document = json.loads(json.dumps(section.to_json()))
    assert document["skipped"] == section.note and len(document["layer_patches"]) == 4


def test_a_model_that_allows_no_patch_has_none():
    section = report_circuit(interp.load(direct_sdpa()), interp.data.repeated_tokens(8, 4, 37), seed=0)
    assert section.layer_patches is None and "layer_patches" not in section.to_json()
    assert "What this model allows instead" not in circuit_html(section, {})
