"""The README's and the docs' examples are executed as written, and the docs build as a
site with ``mkdocs build --strict`` (STYLE: examples run in tests)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import DOC_PAGES, doc_blocks
from helpers import readme_blocks as blocks

ROOT = Path(__file__).resolve().parents[1]


def test_quick_tour_and_python_api_run_as_written(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNSTATE_")}
    [tour] = blocks("console")
    outputs: dict[str, str] = {}

    def walk(cwd: Path) -> None:
        for line in tour.splitlines():
            assert line.startswith("$ runstate "), line
            args = shlex.split(line[2:])
            out = subprocess.run(
                [sys.executable, "-m", "runstate.cli", *args[1:]],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert out.returncode == 0, f"{line}\n{out.stdout}\n{out.stderr}"
            outputs[line[2:]] = out.stdout

    walk(tmp_path)
    history = outputs["runstate history run_128"]
    assert "invalid [fact.evidence_required]" in history and "coder-2.1" in history
    assert "[fact_13]" in outputs["runstate context run_128"]
    assert "projection equals replay" in outputs["runstate verify"]
    assert '"revision": 1' in outputs["runstate state run_128 --json --revision 1"]
    assert '"running" -> "completed"' in outputs["runstate explain run_128 tasks.task_3.status"]
    assert "run_started" in outputs["runstate checkpoints run_128"]
    assert "verdict: SAFE" in outputs["runstate resume run_128"]
    # The tour again on what it left, as a reader trying it twice does: every step works (the
    # patches sent again are decided, and rejected as stale, not an error).
    shutil.copytree(tmp_path, tmp_path.parent / f"{tmp_path.name}-again")
    walk(tmp_path.parent / f"{tmp_path.name}-again")
    assert "revision_conflict" in outputs["runstate history run_128"]
    assert "projection equals replay" in outputs["runstate verify"]

    # Each Python example of the README and the docs, from a copy of the tour's end state.
    # The README's agent handle, on the tour's log (the projector runs in its process).
    [agent] = [b for b in doc_blocks("python") if "runstate.agent" in b]
    shutil.copytree(tmp_path, tmp_path.parent / f"{tmp_path.name}-agent")
    script = agent + (
        "\nassert decision.outcome == 'accepted', decision\n"
        "assert any(f.evidence == output for f in state.confirmed_facts)\n"
        "assert state.pending_tool_calls == []\n"
    )
    for _second in (False, True):  # run again, as a reader trying it twice does: it works again
        _python(script, tmp_path.parent / f"{tmp_path.name}-agent", env)
    examples = [b for b in doc_blocks("python") if "RunProducer" in b]
    assert len(examples) == 1, "docs/python.md's"
    for i, api in enumerate(examples):
        shutil.copytree(tmp_path, tmp_path.parent / f"{tmp_path.name}-{i}")
        # Twice: the second time its patch names a revision the first moved past, and is
        # answered with a rejection saying so (the example reads it), not an error.
        for expect in ("d.outcome == 'accepted'", "d.reason == 'revision_conflict'"):
            # A projector must be running for submit() to get its decision, as the example says.
            script = (
                "import threading\nfrom runstate import Projector, open_log\n"
                "stop = threading.Event()\nt = threading.Thread(target=Projector(open_log('.runstate/log.db'), "
                "'.runstate/state').run, kwargs={'stop': stop, 'poll_timeout_s': 0.02})\nt.start()\ntry:\n"
                + "".join(f"    {line}\n" for line in api.splitlines())
                + f"    d = decision\n    assert {expect}, decision\n    assert state.phase == 'fix'\n"
                "    assert data == state.model_dump(mode='json')\n"
                "finally:\n    stop.set()\n    t.join()\n"
            )
            _python(script, tmp_path.parent / f"{tmp_path.name}-{i}", env)


def _python(script: str, cwd: Path, env: dict[str, str]) -> None:
    """Run ``script`` in a fresh interpreter in ``cwd``; it must exit 0 (else its stderr is the failure)."""
    out = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_every_example_in_the_readme_and_the_docs_is_run_by_a_test() -> None:
    """A new example on a page fails here until a test runs it: the console tour, the
    ``runstate.agent`` and ``RunProducer`` examples (above), the ``runstate.client`` example
    (tests/service/test_serve.py), the LangGraph saver's (tests/integrations/test_langgraph.py), the TypeScript
    one (tests/clients/test_typescript.py)."""
    python = doc_blocks("python")
    assert len(python) == 4 and sum("RunProducer" in b for b in python) == 1
    assert sum("runstate.agent" in b for b in python) == 1
    assert sum("runstate.client" in b for b in python) == 1
    assert sum("runstate.integrations.langgraph" in b for b in python) == 1  # tests/integrations/test_langgraph.py
    assert len(doc_blocks("console")) == 1 and len(blocks("console")) == 1
    assert len(blocks("ts")) == 1  # tests/clients/test_typescript.py
    assert "README.md" in DOC_PAGES and "docs/index.md" in DOC_PAGES


def test_the_docs_build_as_a_site_in_strict_mode(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "site" / "rules" / "index.html").exists()


def test_the_readme_is_a_first_page_and_no_page_carries_the_lab_notebook() -> None:
    """At most about 300 lines; no commit hashes or session dates in the README's or the
    docs' prose (measurements with their dates live in bench/HISTORY.md)."""
    import re

    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
    for page in DOC_PAGES:
        text = (ROOT / page).read_text()
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), page
        assert not re.search(r"\b(at|commit|since|before|after) [0-9a-f]{7}\b", text), page


def test_every_event_type_is_in_the_event_catalogue() -> None:
    """docs/events.md names every event type of the contract (LeaseReleased was missing)."""
    from runstate.schemas.events import EVENT_TYPE_NAMES

    page = (ROOT / "docs" / "events.md").read_text()
    missing = [name for name in EVENT_TYPE_NAMES if f"`{name}`" not in page]
    assert not missing, missing
