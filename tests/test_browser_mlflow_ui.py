"""End to end: the MLflow UI shows validation pair runs side by side in headless Chromium.

Builds a temporary store (a parent run and nested "pair" runs with drafter/target params and
acceptance metrics), serves it with :func:`mdboost.tracking.ui.running_server`, opens the experiment's
runs table, expands the parent, ticks the pair runs, presses Compare and checks the compare
page. Uses the system Chromium and chromedriver only (never downloads a browser).
Set ``MDBOOST_DOCS_SCREENSHOT=1`` to also write ``docs/img/mlflow_compare.png``.
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
PAIRS = [  # (drafter, target, md_acceptance, sd_acceptance)
    ("tiny-exit1", "tiny-target", 0.71, 0.62),
    ("ngram", "tiny-target", 0.55, 0.41),
    ("tiny-int8", "tiny-target", 0.83, 0.8),
]
COMPARED = PAIRS[:2]
DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img" / "mlflow_compare.png"


def _pair_name(drafter: str, target: str) -> str:
    return f"{drafter}->{target}"


def _seed_store(tmp_path: Path) -> tuple[str, str]:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    eid = client.create_experiment("mdboost-validate", artifact_location=(tmp_path / "art").as_uri(),
                                   tags={"mlflow.experimentKind": "custom_model_development"})
    parent = client.create_run(eid, run_name="validate-tiny")
    for drafter, target, md, sd in PAIRS:
        run = client.create_run(eid, run_name=_pair_name(drafter, target),
                                tags={"mlflow.parentRunId": parent.info.run_id})
        client.log_param(run.info.run_id, "drafter", drafter)
        client.log_param(run.info.run_id, "target", target)
        client.log_metric(run.info.run_id, "md_acceptance", md)
        client.log_metric(run.info.run_id, "sd_acceptance", sd)
        client.set_terminated(run.info.run_id)
    client.set_terminated(parent.info.run_id)
    return uri, eid


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
                "--disable-component-update", "--disable-sync", "--window-size=1600,2000",
                f"--user-data-dir={tmp_path / 'chrome-profile'}"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    drv = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    yield drv
    drv.quit()


def _row(wait, name):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    return wait.until(EC.presence_of_element_located(
        (By.XPATH, f"//div[@role='row'][.//span[normalize-space()='{name}']]")))


def _select_pairs_and_compare(driver, wait):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    parent = _row(wait, "validate-tiny")  # nested runs start collapsed under their parent
    parent.find_element(By.CSS_SELECTOR, "button[data-component-id*='runnamecellrenderer']").click()
    for drafter, target, _, _ in COMPARED:
        _row(wait, _pair_name(drafter, target)).find_element(By.CSS_SELECTOR, ".ag-selection-checkbox").click()
    compare = wait.until(EC.element_to_be_clickable(
        (By.XPATH, "//button[normalize-space()='Compare']")))
    compare.click()
    wait.until(EC.url_contains("compare-runs"))
    wait.until(EC.visibility_of_element_located(
        (By.XPATH, "//a[@title='Plot chart'][normalize-space()='sd_acceptance']")))
    wait.until(EC.visibility_of_element_located((By.CSS_SELECTOR, ".js-plotly-plot svg")))


def _close_side_panel(driver):
    """Close MLflow's assistant panel if this version shows one (cosmetic, for the screenshot)."""
    from selenium.webdriver.common.by import By

    for button in driver.find_elements(By.CSS_SELECTOR, "[data-component-id='mlflow.assistant.chat_panel.close']"):
        if button.is_displayed():
            button.click()


def test_compare_pair_runs_in_the_mlflow_ui(driver, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    uri, eid = _seed_store(tmp_path)
    wait = WebDriverWait(driver, 90)
    with running_server(uri, artifact_root=str(tmp_path / "art"), timeout=180) as url:
        driver.get(f"{url}/#/experiments/{eid}/runs?workflowType=machine_learning")
        try:
            _select_pairs_and_compare(driver, wait)
        finally:
            (tmp_path / "page.html").write_text(driver.page_source)
            driver.save_screenshot(str(tmp_path / "mlflow_compare.png"))
        text = driver.find_element(By.TAG_NAME, "body").text
        _close_side_panel(driver)
        driver.save_screenshot(str(tmp_path / "mlflow_compare.png"))

    assert "Comparing 2 Runs" in text and "Parallel Coordinates Plot" in text
    for drafter, target, md, sd in COMPARED:
        assert _pair_name(drafter, target) in text
        assert str(md) in text and str(sd) in text
    assert "md_acceptance" in text and "sd_acceptance" in text
    excluded = PAIRS[2]
    assert _pair_name(excluded[0], excluded[1]) not in text
    assert (tmp_path / "mlflow_compare.png").stat().st_size > 10_000
    if os.environ.get("MDBOOST_DOCS_SCREENSHOT") == "1":
        DOCS_IMG.parent.mkdir(parents=True, exist_ok=True)
        tmp = DOCS_IMG.with_suffix(".png.tmp")
        shutil.copyfile(tmp_path / "mlflow_compare.png", tmp)
        os.replace(tmp, DOCS_IMG)
