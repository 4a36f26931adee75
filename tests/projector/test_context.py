"""The bounded context: what a prompt gets when its size is given (tokens as characters / 4)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from bench_context import T0, events, fold

from runstate.projector.read.context import approx_tokens, render_context


@pytest.fixture(scope="module")
def state():  # type: ignore[no-untyped-def]
    book, _ = fold(events(600))
    doc = book.docs["checkout-incident"]
    assert doc is not None
    return doc.to_state()


@pytest.mark.parametrize("budget", [300, 800, 2000, 5000])
def test_a_bounded_context_fits_and_counts_what_it_left_out(state, budget: int) -> None:  # type: ignore[no-untyped-def]
    whole = render_context(state, now=T0)
    text = render_context(state, now=T0, max_tokens=budget)
    assert approx_tokens(text) <= budget
    assert approx_tokens(text) >= budget * 0.8 or text.count("\n") >= whole.count("\n")  # the budget is used
    last = text.rstrip().splitlines()[-1]
    assert last.startswith("CONTEXT: about")
    # Every line kept is a line of the whole context; each group's count adds up.
    kept = [ln for ln in text.splitlines()[:-1] if " left out" not in ln]
    assert set(kept) <= set(whole.splitlines())
    shown_facts = sum(1 for ln in kept if ln.startswith("  - [f"))
    plural = {
        "fact": "facts",
        "hypothesis": "hypotheses",
        "pending task": "pending tasks",
        "observation": "observations",
    }
    left = {
        plural.get(g, g): int(n)
        for n, g in re.findall(
            r"(\d+) (facts|fact|hypotheses|hypothesis|pending tasks|pending task|observations|observation)\b", last
        )
    }
    assert shown_facts + left.get("facts", 0) == len(state.confirmed_facts)
    assert sum(int(n) for n in re.findall(r"\.\.\. (\d+) more facts? left out", text)) == left.get("facts", 0)
    assert not re.search(r"\b1 (facts|hypotheses|pending tasks|observations)\b", text)  # one is singular


def test_every_budget_holds_for_the_whole_text_the_last_line_counted_in_it(state) -> None:  # type: ignore[no-untyped-def]
    lengths = []
    for budget in range(60, 1500, 10):
        text = render_context(state, now=T0, max_tokens=budget)
        required_only = "OVER the budget" in text
        assert required_only or approx_tokens(text) <= budget, (budget, approx_tokens(text))
        said = int(re.search(r"CONTEXT: about (\d+) of", text)[1])  # type: ignore[index]
        assert said == approx_tokens(text), (budget, said, approx_tokens(text))  # the whole text, this line included
        lengths.append((budget, len(text), required_only))
    fitting = [(b, n) for b, n, over in lengths if not over]
    assert all(n <= b * 4 for b, n in fitting)


def test_what_is_kept_first(state) -> None:  # type: ignore[no-untyped-def]
    text = render_context(state, now=T0, max_tokens=300)
    assert text.startswith("RUN checkout-incident") and "GOAL: Find why EU customers" in text
    for c in state.goal.constraints:
        assert f"constraint {c.key} = {c.value}" in text
    for t in state.tasks:
        if t.status in ("running", "blocked"):
            assert f"[{t.id}]" in text
    # The newest facts come before older ones when only some fit.
    text = render_context(state, now=T0, max_tokens=1200)
    shown = re.findall(r"  - \[(f\d+)\]", text)
    assert shown and shown == [f.id for f in state.confirmed_facts][-len(shown) :]


def test_over_budget_keeps_the_essentials_and_says_so(state) -> None:  # type: ignore[no-untyped-def]
    text = render_context(state, now=T0, max_tokens=50)
    assert "GOAL:" in text and "OVER the budget" in text.splitlines()[-1]


def test_cli_context_max_tokens(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from helpers import fact, start

    from runstate import app
    from runstate.cli import main
    from runstate.settings import Settings

    s = Settings(log=str(tmp_path / "log.db"), state_dir=str(tmp_path / "state"))
    app.publish(s, "r", {"expected_revision": 0, "events": [start("fix login")]}, where="t")
    for i in range(60):
        app.publish(s, "r", {"expected_revision": i + 1, "events": [fact(f"f{i}", statement="x" * 80)]}, where="t")
    app.project(s, until_caught_up=True)
    env = {"RUNSTATE_LOG": s.log, "RUNSTATE_STATE_DIR": s.state_dir}
    r = CliRunner().invoke(main, ["context", "r", "--max-tokens", "400"], env=env)
    assert r.exit_code == 0 and approx_tokens(r.output) <= 400 and "more facts left out" in r.output
    r = CliRunner().invoke(main, ["context", "r", "--max-tokens", "10"], env=env)
    assert r.exit_code == 2


def _list_collections() -> list[str]:
    """The state's collections: every field of ``RunState`` that holds a list."""
    from typing import get_origin

    from runstate.schemas.state import RunState

    return [name for name, f in RunState.model_fields.items() if get_origin(f.annotation) is list]


#: Collections the prompt context leaves out, and why; every other one must change the text.
NOT_IN_CONTEXT = {
    "graph_checkpoints": "LangGraph's serialized checkpoints: the graph's own state, which the saver reads",
    "graph_values": "the channel values of those checkpoints",
}


def _rich_states() -> list[Any]:
    """The golden corpus's states after each accepted patch: together they fill every collection."""
    from test_reducer_golden import corpus

    from runstate.projector.core.runbook import RunBook

    book = RunBook()
    states = []
    for offset, p in enumerate(corpus()):
        d = book.apply(p, 0, offset).decision
        if d is not None and d.outcome == "accepted":
            states.append(book.docs[p.run_id].to_state())
    return states


def test_every_collection_of_the_state_is_in_the_context() -> None:
    """Each list of the state changes the context when it holds an item (or is declared out,
    with the reason): a collection added to the state is not silently missing from prompts."""
    states = _rich_states()
    for name in _list_collections():
        holding = [s for s in states if getattr(s, name)]
        assert holding, f"the golden corpus never fills {name}: add a patch that does"
        if name in NOT_IN_CONTEXT:
            continue
        s = holding[-1]
        emptied = s.model_copy(update={name: []})
        assert render_context(s, now=T0) != render_context(emptied, now=T0), f"{name} is not in the context"


#: Fields of the state the audit page does not show, and why.
NOT_ON_THE_PAGE = {
    "schema_version": "bookkeeping",
    "run_id": "the page's title",
    "agent_version": "in each timeline row",
    "created_at": "the timeline's first row",
    "created_by": "the timeline's first row",
    "updated_at": "the timeline's last row",
    "last_control_revision": "bookkeeping",
    "erasure": "an erased run's page shows the erasure record its run_erased answer carries",
}


def test_every_field_of_the_state_is_on_the_audit_page() -> None:
    """The run page's script names each field of the state it shows (``s.field`` or a
    ``"field"`` section): a field added to the state is shown or declared out, with why."""
    from runstate.schemas.state import RunState

    script = (ROOT / "runstate" / "service" / "static" / "app.js").read_text()
    missing = [
        name
        for name in RunState.model_fields
        if name not in NOT_ON_THE_PAGE and not any(f in script for f in (f"s.{name}", f"state.{name}", f'["{name}"'))
    ]
    assert not missing, f"the run page does not show {missing}"
