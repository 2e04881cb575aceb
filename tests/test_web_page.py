"""The chat page at `/` of `kvedge serve --http`, in a real headless Chromium (Debian's, driven
by Playwright): a token typed, a KB picked, a question streamed into an answer with its stats,
a follow-up that reuses the conversation's KV; a screenshot is saved. The daemon is the one
tests/test_openai_api.py starts (its module fixtures), over the tiny random model."""
import os
import shutil
from pathlib import Path

import pytest

from kvedge.edge import DEFAULT_STRATEGY

from test_openai_api import client, cloud, edge  # noqa: F401 - the module's daemons

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Chromium on a machine with no network: nothing it would reach for by itself
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def page(edge):  # noqa: F811
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/setup.sh installs it when "
                    "run as root: apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser.new_page(viewport={"width": 1000, "height": 700})
        browser.close()


def screenshot_path(tmp_path: Path) -> Path:
    """Under $KVEDGE_TEST_ARTIFACTS when set (CI keeps that folder), else the test's tmp."""
    folder = Path(os.environ.get("KVEDGE_TEST_ARTIFACTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "chat_page.png"


def test_the_page_streams_an_answer_with_its_stats_and_keeps_the_conversation(
        edge, page, tmp_path):  # noqa: F811
    page.goto(edge["url"].removesuffix("/v1") + "/")
    page.fill("[data-testid=token]", edge["token"])
    page.dispatch_event("[data-testid=token]", "change")
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    assert page.eval_on_selector("#model", "s => [...s.options].map(o => o.value)")[0] == \
        "default/reg"
    assert page.evaluate("localStorage.getItem('kvedge.token')") == edge["token"]

    page.fill("[data-testid=question]", "What is the alpha code?")
    page.click("[data-testid=send]")
    page.wait_for_selector("[data-testid=stats]", timeout=60_000)
    answer = page.inner_text(".assistant").split("\n")[0]
    stats = page.inner_text("[data-testid=stats]")
    assert DEFAULT_STRATEGY in stats and "TTFT" in stats and "segments:" in stats and "fp16" in stats
    assert ".md" in stats or ".txt" in stats  # the retrieved segments' files
    same = client(edge).chat.completions.create(  # the API's answer to the same conversation
        model="default/reg", messages=[{"role": "user", "content": "What is the alpha code?"}])
    assert answer.strip() == same.choices[0].message.content.strip()

    page.fill("[data-testid=question]", "And the beta code?")
    page.click("[data-testid=send]")
    page.wait_for_function("document.querySelectorAll('[data-testid=stats]').length == 2",
                           timeout=60_000)
    follow_up = page.locator("[data-testid=stats]").nth(1).inner_text()
    reused = int(follow_up.split("session reused ")[1].split()[0])
    assert reused > 0  # the first turn's prefix KV
    page.screenshot(path=str(screenshot_path(tmp_path)), full_page=True)
    assert screenshot_path(tmp_path).stat().st_size > 10_000
