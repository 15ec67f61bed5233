"""The web page end to end in a real headless browser: Debian's Chromium driven by Playwright."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from live_server import gradfuse_serve

from gradfuse.server import API_KEY_ENV

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("GRADFUSE_ARTIFACTS", Path(__file__).resolve().parents[1] / "artifacts"))
# Without these, Chromium spends its start reaching Google's hosts, which this machine's closed network refuses.
QUIET_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync"]

if not Path(CHROMIUM).is_file():
    if os.environ.get("GRADFUSE_REQUIRE_BROWSER"):
        raise RuntimeError(f"GRADFUSE_REQUIRE_BROWSER is set but there is no Chromium at {CHROMIUM} "
                           "(apt-get install chromium)")
    pytest.skip("no Chromium on this machine (make test installs Debian's chromium where it can)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=QUIET_FLAGS)
        yield browser
        browser.close()


@pytest.mark.slow
def test_ask_on_the_page_then_open_the_cited_passage(workspace, browser):
    from playwright.sync_api import expect

    with gradfuse_serve(workspace.root, env={API_KEY_ENV: ""}) as url:
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        outside: list[str] = []
        page.on("request", lambda request: None if request.url.startswith(url) else outside.append(request.url))
        page.goto(url)
        expect(page.locator("input[name=source]")).to_have_count(2)  # /sources listed both
        expect(page.locator("#method")).to_have_value("select")  # the server's default, as the API and CLI have it
        for option in ("scorer", "n", "pool", "target", "estimator"):  # select reads none of them
            expect(page.locator(f"label[data-option={option}]")).to_be_hidden()
        page.select_option("#method", "gro")
        expect(page.locator("#scorer")).to_have_value("upr")
        expect(page.locator("label[data-option=n]")).to_be_visible()
        expect(page.locator("label[data-option=target]")).to_be_hidden()  # UPR has no target
        page.select_option("#scorer", "gradient")
        expect(page.locator("label[data-option=target]")).to_be_visible()
        expect(page.locator("label[data-option=estimator]")).to_be_visible()
        page.select_option("#scorer", "upr")

        page.fill("#question", "What is the default TCP port of a PostgreSQL server?")
        page.click("#ask")
        expect(page.locator("#answer.not-found")).to_contain_text("Not found in these sources", timeout=240_000)
        expect(page.locator("#citation-note")).to_contain_text("too weak to answer from")

        page.fill("#question", "Which planet has the moons Phobos and Deimos?")
        page.fill("#k", "3")
        page.click("#ask")

        citation = page.locator("#answer a.citation").first
        expect(citation).to_be_visible(timeout=240_000)
        expect(page.locator("#stage1 tbody tr.chosen")).not_to_have_count(0)
        expect(page.locator("#score-chart rect.bar[data-series='prior']")).not_to_have_count(0)
        expect(page.locator("#score-chart rect.bar[data-series='rerank:upr']")).not_to_have_count(0)  # gro's default
        expect(page.locator("#timings")).to_contain_text("scoring-LM pass")
        expect(page.locator("#timings")).to_contain_text("evidence sentences")  # every step of the wait
        expect(page.locator("#timings")).to_contain_text("generation")
        expect(page.locator("#citation-note")).to_contain_text("SmolLM2-135M")  # who wrote it, and its size

        number = int(citation.get_attribute("data-n"))
        citation.click()
        dialog = page.locator("#passage-view")
        expect(dialog).to_be_visible()
        cited_text = page.locator(f"#passage-{number}").inner_text()
        shown = page.locator("#passage-view-text").inner_text()
        assert shown[:40] in cited_text  # the dialog shows the passage the citation points at
        expect(page.locator("#passage-view-provenance")).to_contain_text("rank")

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "page-cited-passage.png"), full_page=True)
        page.keyboard.press("Escape")

        # The answer's best evidence sentence is marked inside its passage, exactly where it stands.
        quoted = page.evaluate("() => { const e = shown.evidence[0]; openPassage(e.passage); return e.text; }")
        expect(page.locator("#passage-view-text mark.evidence").first).to_have_text(quoted)
        page.screenshot(path=str(ARTIFACTS / "page-evidence.png"), full_page=True)
        page.keyboard.press("Escape")
        page.screenshot(path=str(ARTIFACTS / "page-answer.png"), full_page=True)

        page.goto(url + "/docs")  # the API docs render from files this server serves
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("gradfuse", timeout=30_000)
        assert outside == []


@pytest.mark.slow
def test_a_passage_read_from_a_pdf_is_named_by_file_page_and_section(tmp_path, browser):
    from playwright.sync_api import expect
    from test_readers import write_pdf

    from gradfuse import SourceSpec, Workspace
    from gradfuse.config import Config

    folder = tmp_path / "reports"
    folder.mkdir()
    write_pdf(folder / "report.pdf", [("1 Introduction", "This annual report covers the harbour authority."),
                                      ("3.2 Results", "Cargo volume grew by 7.5 percent to 41 million tonnes.")])
    ws = Workspace(Config(workspace=tmp_path / "ws"))
    ws.index(SourceSpec("reports", "files", str(folder)))
    with gradfuse_serve(ws.root, env={API_KEY_ENV: ""}) as url:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(url)
        page.fill("#question", "How much did cargo volume grow?")
        page.select_option("#method", "rrf")
        page.fill("#k", "1")
        page.click("#ask")
        expect(page.locator("#passages li .location").first).to_have_text("report.pdf · p. 2 · 3.2 Results",
                                                                           timeout=240_000)
        page.locator("#answer a.citation").first.click()
        expect(page.locator("#passage-view-title")).to_contain_text("report.pdf · p. 2 · 3.2 Results")
        page.screenshot(path=str(ARTIFACTS / "page-pdf-passage.png"), full_page=True)
