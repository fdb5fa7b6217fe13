"""The web page at / in a real headless Chromium (Debian's `chromium` and `chromium-driver`, installed by
scripts/setup.sh --dev): pick a real photo, restore it, and the image the page shows is the endpoint's result.
The screenshot stays in the test's tmp folder."""

from __future__ import annotations

import base64
import io
import os
import shutil

import httpx
import numpy as np
import pytest
from model_configs import SMALLEST
from PIL import Image
from serve_helpers import photo_files, server_thread

from gpen_tune.load import load_model
from gpen_tune.pipeline.settings import EnhanceSettings

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is installed by scripts/setup.sh --dev")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="chromium / chromium-driver not installed "
                                 "(scripts/setup.sh --dev installs them)")]

# the page's <img id="after"> drawn onto a canvas and read back as PNG (the decoded pixels the page shows)
SHOWN_PIXELS = """
const img = document.getElementById("after");
const c = document.createElement("canvas");
c.width = img.naturalWidth; c.height = img.naturalHeight;
c.getContext("2d").drawImage(img, 0, 0);
return c.toDataURL("image/png").split(",")[1];
"""


@pytest.fixture
def browser(tmp_path_factory):
    home = tmp_path_factory.mktemp("chromium")        # its profile and the lock folders it leaves in $TMPDIR
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,1000",
                "--force-color-profile=srgb", f"--user-data-dir={home / 'profile'}"):
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=DRIVER, env={**os.environ, "TMPDIR": str(home)})
    driver = webdriver.Chrome(service=service, options=options)
    yield driver
    driver.quit()


def test_page_restores_a_photo_and_shows_the_endpoint_result(browser, tmp_path):
    photo = photo_files(tmp_path / "photos")[0]                 # astronaut.png
    model = load_model("synthetic", model=SMALLEST, device="cpu")
    settings = EnhanceSettings(weights="synthetic", detector="mtcnn", device="cpu")
    with server_thread(settings=settings, model=model, spool=tmp_path / "spool") as url:
        browser.get(f"{url}/")
        assert browser.find_element(By.ID, "restore").get_attribute("disabled") is not None
        browser.find_element(By.ID, "file").send_keys(str(photo))
        browser.execute_script("const s = document.getElementById('strength'); s.value = '0.7';"
                               "s.dispatchEvent(new Event('input'));")
        assert browser.find_element(By.ID, "strength-value").text == "0.70"
        browser.find_element(By.ID, "restore").click()
        status = browser.find_element(By.ID, "status")
        WebDriverWait(browser, 180).until(lambda d: status.get_attribute("data-state") in ("done", "error"))
        assert status.get_attribute("data-state") == "done", status.text
        assert "1 face" in status.text
        shown_png = base64.b64decode(browser.execute_script(SHOWN_PIXELS))
        shown = np.asarray(Image.open(io.BytesIO(shown_png)).convert("RGB"))
        direct = httpx.post(f"{url}/v1/enhance", params={"strength": 0.7}, content=photo.read_bytes(),
                            headers={"Content-Type": "image/png"}, timeout=120)
        expected = np.asarray(Image.open(io.BytesIO(direct.content)).convert("RGB"))
        original = np.asarray(Image.open(photo).convert("RGB"))
        assert shown.shape == expected.shape
        assert np.array_equal(shown, expected)                  # the restored image, pixel for pixel
        assert not np.array_equal(shown, original)
        download = browser.find_element(By.ID, "download")
        assert download.is_displayed() and download.get_attribute("download") == "astronaut_restored.png"
        assert browser.find_element(By.ID, "compare").is_displayed()
        browser.save_screenshot(str(tmp_path / "page.png"))
    assert (tmp_path / "page.png").stat().st_size > 10_000
