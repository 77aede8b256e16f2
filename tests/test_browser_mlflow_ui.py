"""End to end: a tiny ranking's MLflow runs as a user sees them, in headless Chromium.

Ranks a tiny pool into a temporary store (:func:`pipelines.rank_pool.run`), serves it with
:func:`mdboost.tracking.ui.running_server`, then checks three pages: the experiment's runs table
(the parent expanded, its nested runs listed best first under their short point names), the
parent run's page (its description: the recommendation and the ranking's top points), and the
Compare view of the two best points (the parallel-coordinates plot starts from
``predicted_speedup``, not from whatever metric happened to be logged first); and the ranking's
own ``ranking.html`` at a 1600 px window. Uses the system Chromium and chromedriver only (never
downloads a browser). Set ``MDBOOST_DOCS_SCREENSHOT=1`` to also write ``docs/img/mlflow_runs.png``,
``mlflow_ranking_run.png``, ``mlflow_compare.png`` and ``ranking_report.png``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from mdboost.tracking.ui import running_server

pytestmark = pytest.mark.browser

CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
RANK = {
    "name": "tiny-ui", "pool": {"target": "tiny", "drafters": ["int8", "tuned:2", "ngram:2"], "pairs": "target",
                                "device": "cpu"},
    "data": {"source": "humaneval", "split": "cache", "limit": 2, "max_tokens": 32},
    "cache": {"k": 16, "full_logits": True, "shard_size": 2, "cost_repeats": 1, "cost_context": 8},
    "md": {"divergences": ["kl"], "budgets": [0.0, 0.2], "temperatures": [0.7],
           "rules": [{"rule": "mentored", "drafting": "sampled"}]},  # MD's rows: the names below are MD's
    "speed": {"gamma_min": 1, "gamma_max": 4}, "boosting": {"n_estimators": 2, "orders": ["target_first"]},
    "ranking": {"top": 4}, "progress": False,
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The ranking's store behind a running MLflow server: (url, experiment id, parent run id, ranking summary)."""
    from mlflow.tracking import MlflowClient

    from pipelines import rank_pool
    from pipelines.config import RankConfig
    from pipelines.loader import from_dict

    tmp = tmp_path_factory.mktemp("ui")
    uri = f"sqlite:///{tmp}/mlflow.db"
    cfg = from_dict(RankConfig, {**RANK, "output_dir": str(tmp / "rank"),
                                 "cache": {**RANK["cache"], "dir": str(tmp / "cache")},
                                 "tracking": {"tracking_uri": uri, "artifact_root": str(tmp / "art"),
                                              "experiment": "mdboost-rank-tiny"}})
    summary = rank_pool.run(cfg)
    eid = MlflowClient(uri).get_run(summary["run_id"]).info.experiment_id
    with running_server(uri, artifact_root=str(tmp / "art"), timeout=180) as url:
        yield url, eid, summary["run_id"], summary


def _child_names(summary: dict) -> list[str]:
    from mdboost.tracking.runs import point_name

    return [point_name(r["drafter"], r["divergence"], r["max_divergence"], r["gamma"], r["temperature"])
            for r in summary["rows"] if r["is_best_gamma"]]


@pytest.fixture
def driver(tmp_path):
    if CHROMIUM is None or not CHROMEDRIVER.exists():
        pytest.skip("Chromium or /usr/bin/chromedriver not installed "
                    "(apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium not installed")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1600,1400",
                f"--user-data-dir={tmp_path / 'chrome-profile'}"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    drv = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    yield drv
    drv.quit()


def _wait(driver):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 90)


def _row(wait, name):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    return wait.until(EC.presence_of_element_located(
        (By.XPATH, f"//div[@role='row'][.//span[normalize-space()='{name}']]")))


def _close_side_panel(driver):
    """Close MLflow's assistant panel if this version shows one (cosmetic, for the screenshots)."""
    from selenium.webdriver.common.by import By

    for button in driver.find_elements(By.CSS_SELECTOR, "[data-component-id='mlflow.assistant.chat_panel.close']"):
        if button.is_displayed():
            button.click()


def _shot(driver, tmp_path: Path, name: str) -> Path:
    """A screenshot into ``tmp_path`` (and ``docs/img`` with ``MDBOOST_DOCS_SCREENSHOT=1``, atomically)."""
    _close_side_panel(driver)
    path = tmp_path / name
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    if os.environ.get("MDBOOST_DOCS_SCREENSHOT") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        tmp = DOCS_IMG / f".{name}.tmp"
        shutil.copyfile(path, tmp)
        os.replace(tmp, DOCS_IMG / name)
    return path


def _open_runs(driver, url, eid, parent_name):
    """The experiment's runs table with the parent expanded; returns the nested runs' names, top to bottom."""
    from selenium.webdriver.common.by import By

    wait = _wait(driver)
    driver.get(f"{url}/#/experiments/{eid}/runs?workflowType=machine_learning")
    parent = _row(wait, parent_name)  # nested runs start collapsed under their parent
    parent.find_element(By.CSS_SELECTOR, "button[data-component-id*='runnamecellrenderer']").click()
    name_links = "div.ag-pinned-left-cols-container div[role='row'] a[href*='/runs/'] span"
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, name_links)) > 1)
    rows = driver.find_elements(By.CSS_SELECTOR, "div.ag-pinned-left-cols-container div[role='row']")
    by_index = sorted(rows, key=lambda r: int(r.get_attribute("row-index")))  # ag-grid's DOM order is not the view's
    # the span holds the whole name (the cell cuts it with an ellipsis)
    return [r.find_element(By.CSS_SELECTOR, "a[href*='/runs/'] span").get_attribute("textContent").strip()
            for r in by_index if r.find_elements(By.CSS_SELECTOR, "a[href*='/runs/'] span")]


def _widen_name_column(driver, pixels: int = 90):
    """Drag the run-name column wider, as a reader would (cosmetic, for the screenshot: the
    column's default width cuts nested names after about 18 characters)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    handles = driver.find_elements(By.CSS_SELECTOR, "div.ag-header-cell[col-id='attributes.`Run Name`'] "
                                                    ".ag-header-cell-resize")
    if handles:
        ActionChains(driver).click_and_hold(handles[0]).move_by_offset(pixels, 0).release().perform()


def test_nested_runs_are_listed_best_first_under_short_names(served, driver, tmp_path):
    url, eid, _, summary = served
    expected = _child_names(summary)
    try:
        shown = _open_runs(driver, url, eid, "rank:tiny-ui")
    finally:
        (tmp_path / "runs.html").write_text(driver.page_source)
    assert shown == ["rank:tiny-ui", *expected], shown
    _widen_name_column(driver)
    _shot(driver, tmp_path, "mlflow_runs.png")


def test_parent_run_description_shows_the_recommendation_and_top_points(served, driver, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    url, eid, run_id, summary = served
    wait = _wait(driver)
    driver.get(f"{url}/#/experiments/{eid}/runs/{run_id}")
    try:
        wait.until(EC.visibility_of_element_located((By.XPATH, f"//strong[normalize-space()='{summary['verdict']}']")))
        # the description starts folded
        wait.until(EC.element_to_be_clickable((By.XPATH, "//button[normalize-space()='Show more']"))).click()
        wait.until(EC.visibility_of_element_located((By.XPATH, "//h3[normalize-space()='Ranking']")))
    finally:
        (tmp_path / "run.html").write_text(driver.page_source)
    cells = [td.text for td in driver.find_elements(By.XPATH, "//h3[normalize-space()='Ranking']/following::table[1]//tr/td[2]")]
    assert cells == _child_names(summary)[:RANK["ranking"]["top"]]
    _shot(driver, tmp_path, "mlflow_ranking_run.png")


def test_compare_view_starts_from_the_predicted_speedup(served, driver, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    url, eid, _, summary = served
    wait = _wait(driver)
    best = _child_names(summary)[:2]
    _open_runs(driver, url, eid, "rank:tiny-ui")
    for name in best:
        _row(wait, name).find_element(By.CSS_SELECTOR, ".ag-selection-checkbox").click()
    wait.until(EC.element_to_be_clickable((By.XPATH, "//button[normalize-space()='Compare']"))).click()
    wait.until(EC.url_contains("compare-runs"))
    try:
        wait.until(EC.visibility_of_element_located((By.CSS_SELECTOR, ".js-plotly-plot svg")))
        axes = wait.until(lambda d: [t.text for t in d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .axis-title")
                                     if t.text] or None)
    finally:
        (tmp_path / "compare.html").write_text(driver.page_source)
    text = driver.find_element(By.TAG_NAME, "body").text
    assert "Comparing 2 Runs" in text and "Parallel Coordinates Plot" in text
    assert all(name in text for name in best)
    assert axes[-1] == "predicted_speedup" and "n_positions" not in axes, axes
    _shot(driver, tmp_path, "mlflow_compare.png")


def test_the_ranking_report_reads_at_1600px(served, driver, tmp_path):
    """``ranking.html`` opens with the verdict and why, then the call and the speedup plot; at a
    1600 px window nothing scrolls sideways, every plot loads, and the top table's headers carry
    their glossary (``docs/img/ranking_report.png`` with ``MDBOOST_DOCS_SCREENSHOT=1``)."""
    from selenium.webdriver.common.by import By

    *_, summary = served
    page = Path(summary["paths"]["html"]).resolve()
    driver.get(page.as_uri())
    body = driver.find_element(By.TAG_NAME, "body").text
    assert body.index(summary["recommendation"]["drafter"]) < body.index("Run it")
    verdict = driver.find_element(By.CSS_SELECTOR, ".verdict .answer").text
    assert verdict.startswith(("recommended", "no drafter is reliably faster", "plain decoding is reliably fastest"))
    assert "Why:" in driver.find_element(By.CSS_SELECTOR, ".verdict").text
    scroll, inner = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert scroll <= inner, (scroll, inner)
    images = driver.find_elements(By.TAG_NAME, "img")
    assert len(images) >= 3 and all(driver.execute_script("return arguments[0].naturalWidth", i) > 0 for i in images)
    assert images[0].get_attribute("alt").startswith("Predicted speedup per drafter")
    headers = driver.find_elements(By.CSS_SELECTOR, "table.points th")
    assert len(headers) == 12 and all(h.get_attribute("title") for h in headers)
    driver.set_window_size(1600, 1000)
    _shot(driver, tmp_path, "ranking_report.png")
