"""The audit pages of `runstate serve` (/ui), driven in headless Chromium (Debian's package,
through Playwright) as a person would use them: against a real serve process, with real
patches, tokens and a dead letter."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, ev, fact, start, task, embedded_env
from servekit import ServeProcess

from runstate.client import Client

pytestmark = pytest.mark.slow

GOAL = "fix the login <script>window.pwned = 1</script> failure"
#: Where the test writes the screenshots the docs show (set RUNSTATE_SCREENSHOTS=docs/img to refresh them).
SHOTS = os.environ.get("RUNSTATE_SCREENSHOTS")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium from the system's package (run-tests.sh installs Debian's ``chromium``)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail(
                "the browser tests need Debian's chromium (apt-get install -y chromium); run-tests.sh installs it"
            )
        pytest.skip("no chromium on PATH (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=exe, args=["--no-sandbox", "--disable-background-networking", "--disable-component-update"]
        )
        yield b
        b.close()


def _submit(rs: Client, run_id: str, expected: int, *events: dict[str, Any]) -> Any:
    return rs.submit(run_id, {"expected_revision": expected, "events": list(events)})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, Client]]:
    work = tmp_path_factory.mktemp("ui")
    # Content sealed (a master key), as a deployment that must be able to erase runs runs.
    serve = ServeProcess(
        {
            **embedded_env(work),
            "RUNSTATE_CHECKPOINT_EVERY": "3",
            "RUNSTATE_MASTER_KEY": "ab" * 32,
        },
        work,
    )
    serve.wait_ready()
    rs = Client(serve.url)
    trust = {"external_evidence_schemes": ["artifact"]}
    assert _submit(rs, "run-ui", 0, {**start(GOAL), "policy": trust}).outcome == "accepted"
    assert _submit(rs, "run-ui", 1, task("t1")).outcome == "accepted"
    assert _submit(rs, "run-ui", 2, ev("TaskStarted", task_id="t1")).outcome == "accepted"
    rejected = _submit(rs, "run-ui", 3, fact("f1", evidence=None))
    assert rejected.reason == "invalid" and rejected.rule == "fact.evidence_required"
    assert _submit(rs, "run-ui", 3, fact("f1")).outcome == "accepted"
    for i in range(12):
        assert _submit(rs, f"other-{i:02d}", 0, start(f"other work {i}")).outcome == "accepted"
    _incident(rs)
    # An id with a slash, a space and a dot segment in it: one run, its own page.
    assert _submit(rs, "team/eu 1/../..", 0, start("the odd id's goal")).outcome == "accepted"
    try:
        yield serve, rs
    finally:
        rs.close()
        assert serve.stop() == 0, serve.log()


def _incident(rs: Client) -> None:
    """A run with most of what a Run State holds, for the docs' picture of a run page."""
    steps = [
        [
            {
                **start("restore checkout for EU customers", include=["services/checkout"]),
                "policy": {"external_evidence_schemes": ["artifact"], "observation_max_age_s": 600},
            }
        ],
        [ev("ConstraintSet", constraint={"key": "max_rollout", "value": "10%", "source": "operator"})],
        [
            ev("TaskCreated", task={"id": "t1", "title": "find why eu-1 payments time out"}),
            ev("TaskCreated", task={"id": "t2", "title": "roll back the TLS proxy in eu-1", "depends_on": ["t1"]}),
        ],
        [ev("TaskStarted", task_id="t1")],
        [ev("ToolCallStarted", call_id="c1", tool="read_logs")],
        [ev("ToolSucceeded", call_id="c1", result_ref="artifact://logs/eu-1")],
        [
            fact("f1", evidence="artifact://logs/eu-1")
            | {
                "fact": {
                    "id": "f1",
                    "evidence": "artifact://logs/eu-1",
                    "statement": "payments time out after 30 s in eu-1",
                }
            }
        ],
        [
            ev(
                "HypothesisProposed",
                hypothesis={
                    "id": "h1",
                    "statement": "the new TLS proxy drops idle connections",
                    "confidence": 0.6,
                    "falsifier": "timeouts continue with the proxy bypassed",
                },
            )
        ],
        [
            ev(
                "ObservationRecorded",
                observation={
                    "subject": "deploy/checkout",
                    "observed_state": "v2.3.1 on 40% of pods",
                    "observed_version": "rev-118",
                },
            )
        ],
        [ev("ConstraintSet", constraint={"key": "max_rollout", "value": "5%", "source": "operator"})],
        [
            ev(
                "EffectRecorded",
                effect={
                    "id": "e1",
                    "status": "started",
                    "kind": "rollback",
                    "target": "checkout eu-1",
                    "idempotency_key": "rb-118",
                },
            )
        ],
        [ev("QuestionOpened", question={"id": "q1", "text": "does eu-2 use the same proxy?"})],
    ]
    for i, events in enumerate(steps):
        assert _submit(rs, "incident-42", i, *events).outcome == "accepted", events
    assert _submit(rs, "incident-42", 5, fact("f2", evidence=None)).outcome == "rejected"


def _page(browser: Any) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("dialog", lambda d: pytest.fail(f"the page opened a {d.type} dialog: {d.message}"))
    page.on("pageerror", lambda e: pytest.fail(f"a script error on the page: {e}"))
    return page


def _shot(page: Any, name: str, tmp: Path) -> None:
    page.screenshot(path=str(tmp / name), full_page=False)
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp / name, Path(SHOTS) / name)


def test_the_runs_list_shows_runs_searches_and_pages(
    browser: Any, served: tuple[ServeProcess, Client], tmp_path: Path
) -> None:
    serve, _ = served
    page = _page(browser)
    page.goto(serve.url)  # the address serve prints: the runs list, not an error
    page.wait_for_selector("#runs tbody tr")
    assert page.url == serve.url + "/ui"
    assert page.locator("#count").inner_text() == "15 runs"
    assert page.locator("#runs a", has_text="run-ui").count() == 1
    # The run that changed last first (the fixture wrote the odd id's run last), then by
    # run id when asked.
    assert page.locator("#runs tbody tr td:first-child").first.inner_text() == "team/eu 1/../.."
    page.select_option("#order", "id")
    page.click("button[type=submit]")
    page.wait_for_url("**order=id**")
    page.wait_for_selector("#runs tbody tr")
    assert page.locator("#runs tbody tr td:first-child").first.inner_text() == "incident-42"
    page.goto(serve.url + "/ui")
    page.wait_for_selector("#runs tbody tr")
    # Each run beside what it is for; 15 runs fit one page: no "Next page" on it.
    assert (
        "restore checkout for EU customers"
        in page.locator("#runs tr:has(a:text-is('incident-42')) td.goal").inner_text()
    )
    assert page.locator("a[rel=next]").count() == 0
    _shot(page, "ui-runs.png", tmp_path)
    page.fill("#q", "other-1")
    page.click("button[type=submit]")
    page.wait_for_selector("#count:has-text('2 runs')")
    assert sorted(page.locator("#runs tbody a").all_inner_texts()) == ["other-10", "other-11"]
    page.select_option("#status", "completed")
    page.fill("#q", "")
    page.click("button[type=submit]")
    page.wait_for_selector("#count:has-text('0 runs')")
    page.close()


def test_a_run_page_shows_the_timeline_the_state_then_and_why(
    browser: Any, served: tuple[ServeProcess, Client], tmp_path: Path
) -> None:
    serve, rs = served
    page = _page(browser)
    page.goto(serve.url + "/ui/runs/run-ui")
    page.wait_for_selector("#goal")
    # A goal holding HTML is shown as its text, and its script never ran.
    assert page.locator("#goal").inner_text().count("<script>window.pwned = 1</script>") == 1
    assert page.evaluate("window.pwned") is None
    patches = page.locator("#timeline button.patch")
    assert patches.count() == 5
    rejected = page.locator("#timeline button.patch.rejected")
    assert rejected.count() == 1 and "fact.evidence_required" in rejected.inner_text()
    assert "REJECTED" in rejected.inner_text() and page.locator("#timeline button.patch.accepted").count() == 4
    assert "running" in page.locator("#tasks").inner_text()

    # An earlier revision: the state then, and what changed against the one before.
    page.click("#timeline button.patch[data-revision='2']")
    page.wait_for_selector("#state h2:has-text('State at revision 2')")
    assert "pending" in page.locator("#tasks").inner_text()
    assert "tasks.t1" in page.locator("#changes").inner_text()
    # What a person calls the change (the new task), not what every patch changes.
    listed = page.locator("#changes").inner_text().split(": ", 1)[1].split(", ")
    assert "tasks.t1" in listed and not any(
        p in ("revision", "updated_at", "tasks") or "provenance" in p or p.startswith("last_transition") for p in listed
    ), listed
    assert "revision=2" in page.url

    # Keyboard: the timeline is walked with the arrow keys.
    patches.nth(0).focus()
    page.keyboard.press("ArrowDown")
    assert page.evaluate("document.activeElement.dataset.offset") == patches.nth(1).get_attribute("data-offset")
    page.keyboard.press("Enter")
    page.wait_for_selector("#state h2:has-text('State at revision 2')")

    # Explain a field: every patch that changed it.
    page.click("#timeline button.patch[data-revision='4']")
    page.wait_for_selector("#state h2:has-text('State at revision 4')")
    page.click("[data-path='tasks.t1.status']")
    page.wait_for_selector("#explain-list li")
    changes = page.locator("#explain-list li").all_inner_texts()
    assert len(changes) == 2 and '"pending"' in changes[0] and '"running"' in changes[1], changes
    page.keyboard.press("Escape")

    # Checkpoints and the resume plan.
    page.wait_for_selector("#checkpoints tbody tr")
    assert "safe" in page.locator("#resume").inner_text()

    # Live: a new patch appears without reloading.
    page.wait_for_selector("#live:not([hidden])")
    assert _submit(rs, "run-ui", 4, ev("PhaseChanged", phase="verify")).outcome == "accepted"
    page.wait_for_selector("#timeline button.patch[data-revision='5']", timeout=10_000)
    page.wait_for_selector("#summary:has-text('phase verify')")
    workspace = {"workspace_id": "ws-1", "base_commit": "a1", "current_commit": "b2"}
    assert _submit(rs, "run-ui", 5, ev("WorkspaceUpdated", workspace_ref=workspace)).outcome == "accepted"
    page.click("#timeline button.patch[data-revision='6']", timeout=10_000)
    page.wait_for_selector("#workspace:has-text('current b2')")
    page.goto(serve.url + "/ui/runs/incident-42")
    page.wait_for_selector("#effect_ledger")
    assert "STALE" not in page.locator("#environment_observations").inner_text()
    assert "(was 10% at r2)" in page.locator("#goal").inner_text()
    _shot(page, "ui-run.png", tmp_path)
    page.close()


def test_unknown_runs_dead_letters_and_a_page_that_needs_a_token(
    browser: Any, served: tuple[ServeProcess, Client], tmp_path: Path
) -> None:
    from runstate.eventlog.embedded import EmbeddedLog
    from runstate.service.auth import add_token

    serve, _ = served
    page = _page(browser)
    page.goto(serve.url + "/ui/runs/no-such-run")
    page.wait_for_selector("h1:has-text('not found')")
    page.click("text=Back to the runs")
    page.wait_for_selector("#runs")

    # An erased run's page says who erased it, when and why, and nothing else.
    erased = served[1].erase("other-11", "the customer asked")
    assert erased["first"]
    page.goto(serve.url + "/ui/runs/other-11")
    page.wait_for_selector("h1:has-text('erased')")
    shown = page.locator("main").inner_text()
    assert "the customer asked" in shown and "other work 11" not in shown
    # In the runs list (first: the erasure is its latest change), no goal and no agent
    # version: the erasure's patch was the operator's, not an agent's version.
    page.goto(serve.url + "/ui")
    row = page.locator("#runs tbody tr").first
    row.wait_for()
    assert row.locator("td").first.inner_text() == "other-11"
    assert row.locator("td.goal").inner_text() == "" and row.locator("td.agent-version").inner_text() == ""
    assert "erased" in row.inner_text()

    log = EmbeddedLog(Path(serve.stderr_path).parent / "log.db", create=False)
    log.producer().append(log.topics.events, "run-garbage", b"\x00not a patch")
    log.close()
    page.goto(serve.url + "/ui/deadletters")
    page.wait_for_selector("#deadletters tbody tr")
    assert "run-garbage" in page.locator("#deadletters").inner_text()
    page.close()

    # A serve with tokens: the page asks for one; a token limited to some runs sees those.
    tokens = str(tmp_path / "tokens.json")
    reader = add_token(tokens, "auditor", role="read", runs=["team-a-*"])
    work = tmp_path / "w"
    work.mkdir()
    guarded = ServeProcess(
        {
            **embedded_env(work),
            "RUNSTATE_TOKENS_FILE": tokens,
        },
        work,
    )
    writer = add_token(tokens, "agent")
    try:
        guarded.wait_ready()
        with Client(guarded.url, writer) as rs:
            for run in ("team-a-1", "team-b-1"):
                assert rs.submit(run, {"expected_revision": 0, "events": [start("work")]}).outcome == "accepted"
        page = _page(browser)
        page.goto(guarded.url + "/ui")
        page.wait_for_selector("h1:has-text('needs a token')")
        assert "runstate token add" in page.inner_text("main")  # says how to get one
        page.fill("#token", reader)
        page.click("button[type=submit]")
        page.wait_for_selector("#runs tbody tr")
        assert page.locator("#runs tbody a").all_inner_texts() == ["team-a-1"]
        page.goto(guarded.url + "/ui/runs/team-b-1")
        page.wait_for_selector(".error")
        assert "may not access run 'team-b-1'" in page.locator(".error").inner_text()
        page.close()
    finally:
        assert guarded.stop() == 0, guarded.log()


def test_the_pages_colours_are_readable() -> None:
    """WCAG AA: every text colour of the stylesheet against each background it is used on
    holds a contrast ratio of at least 4.5:1 (computed as WCAG defines it)."""
    import re

    css = (ROOT / "runstate" / "service" / "static" / "app.css").read_text()
    var = dict(re.findall(r"--([a-z-]+):\s*(#[0-9a-f]{6})", css))

    def luminance(hex_: str) -> float:
        def channel(c: float) -> float:
            return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

        r, g, b = (int(hex_[i : i + 2], 16) / 255 for i in (1, 3, 5))
        return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)

    def ratio(a: str, b: str) -> float:
        hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
        return (hi + 0.05) / (lo + 0.05)

    changed = re.search(r"\.changed \{ background: (#[0-9a-f]{6})", css)
    assert changed is not None
    backgrounds = [var["bg"], var["soft"], var["bad-bg"], changed[1]]
    for text in ("fg", "muted", "ok", "bad", "link"):
        for bg in backgrounds:
            assert ratio(var[text], bg) >= 4.5, (text, bg, ratio(var[text], bg))


def test_a_run_whose_id_is_not_url_safe_has_its_own_page(browser: Any, served: tuple[ServeProcess, Client]) -> None:
    serve, _ = served
    page = _page(browser)
    page.goto(serve.url + "/ui")
    page.wait_for_selector("#runs tbody tr")
    page.click("#runs a:text-is('team/eu 1/../..')")
    page.wait_for_selector("#goal")
    assert "the odd id's goal" in page.locator("#goal").inner_text()
    assert page.locator("#timeline button.patch").count() == 1
    page.close()
