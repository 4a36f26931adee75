"""The context a prompt gets against the conversation it replaces, in tokens.

    .venv/bin/python bench/bench_context.py            # a run of 2,000 events
    .venv/bin/python bench/bench_context.py --events 500 --quick

A generated run (tool calls and their results, facts, some retracted, observations of the
same subjects again and again, constraints corrected, tasks, hypotheses) is folded by the
projector's core. The conversation log is the same events as an agent's transcript would
carry them: one message per event, its JSON. Tokens are characters / 4 (a stated
approximation: no tokenizer whose vocabulary ships inside a package is a dependency).
Printed: the conversation's size, the whole context's and a bounded one's
(``--max-tokens``), their ratios (goal: ≥ 20× smaller at 2,000 events), and what the
bounded context left out.
"""

from __future__ import annotations

import argparse
import json
import random
from datetime import UTC, datetime, timedelta

from runstate.projector.core.runbook import RunBook
from runstate.projector.read.context import approx_tokens, render_context
from runstate.schemas.patch import Author, Patch

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
AUTHOR = Author(agent_id="support-agent", agent_version="2026.11")


def events(n: int, seed: int = 7) -> list[dict]:
    """About ``n`` events of a support agent's run, in the order it would record them."""
    rnd = random.Random(seed)
    out: list[dict] = [
        {
            "type": "RunStarted",
            "goal": {
                "statement": "Find why EU customers' checkouts fail since the last deploy and restore them",
                "scope": {"include": ["services/checkout"]},
            },
            "policy": {"external_evidence_schemes": ["artifact", "log"]},
        }
    ]
    tasks = 0
    facts: list[str] = []
    i = 0
    while len(out) < n:
        i += 1
        kind = rnd.random()
        if kind < 0.35:  # a tool call and its result, and what it showed
            call = f"call-{i}"
            out.append(
                {
                    "type": "ToolCallStarted",
                    "call_id": call,
                    "tool": rnd.choice(["grep_logs", "query_db", "http_get"]),
                    "input_ref": f"artifact://args/{i}",
                }
            )
            out.append({"type": "ToolSucceeded", "call_id": call, "result_ref": f"artifact://result/{i}"})
            fid = f"f{i}"
            facts.append(fid)
            out.append(
                {
                    "type": "FactConfirmed",
                    "fact": {
                        "id": fid,
                        "statement": f"checkout error rate on node eu-{i % 7} was {rnd.randint(1, 40)}% between "
                        f"{9 + i % 8}:00 and {10 + i % 8}:00 UTC",
                        "evidence": f"artifact://result/{i}",
                    },
                }
            )
        elif kind < 0.55:  # the same few subjects observed again (each supersedes the last)
            subject = f"service/checkout-eu-{i % 5}"
            out.append(
                {
                    "type": "ObservationRecorded",
                    "observation": {
                        "subject": subject,
                        "observed_state": rnd.choice(["healthy", "degraded", "failing"])
                        + f", p99 {rnd.randint(80, 900)} ms",
                        "observed_version": f"v{i}",
                        "evidence": f"log://checkout/{i}",
                    },
                }
            )
        elif kind < 0.62 and facts:  # a fact found wrong
            out.append(
                {
                    "type": "FactRetracted",
                    "fact_id": facts.pop(rnd.randrange(len(facts))),
                    "reason": "the log window was wrong",
                }
            )
        elif kind < 0.70:  # a correction: one current value per key
            out.append(
                {
                    "type": "ConstraintSet",
                    "constraint": {
                        "key": rnd.choice(["rollout_batch", "timeout_s", "retries"]),
                        "value": str(rnd.randint(1, 60)),
                    },
                }
            )
        elif kind < 0.80:
            tasks += 1
            out.append(
                {
                    "type": "TaskCreated",
                    "task": {
                        "id": f"t{tasks}",
                        "title": f"check dependency {tasks} of checkout",
                        "scope": ["services/checkout"],
                    },
                }
            )
        elif kind < 0.88 and tasks:
            t = f"t{rnd.randint(1, tasks)}"
            out.append({"type": "TaskStarted", "task_id": t})
            out.append({"type": "TaskCompleted", "task_id": t, "evidence": f"artifact://result/{i}"})
        elif kind < 0.95:
            out.append(
                {
                    "type": "HypothesisProposed",
                    "hypothesis": {
                        "id": f"h{i}",
                        "statement": f"the deploy changed the EU payment provider's timeout ({i})",
                        "confidence": round(rnd.random(), 2),
                        "falsifier": "compare provider latency before and after",
                    },
                }
            )
        else:
            out.append({"type": "BudgetConsumed", "tokens": rnd.randint(500, 4000)})
    return out[:n]


def fold(evs: list[dict]) -> tuple[RunBook, int]:
    """One patch per event; patches a rule rejects are skipped, as an agent would retry."""
    book = RunBook()
    revision = 0
    accepted = 0
    for k, e in enumerate(evs):
        p = Patch.model_validate(
            {
                "patch_id": f"p{k}",
                "run_id": "checkout-incident",
                "expected_revision": revision,
                "events": [e],
                "author": AUTHOR,
                "created_at": T0 + timedelta(seconds=30 * k),
            }
        )
        got = book.apply(p, 0, k)
        if got.decision is not None and got.decision.outcome == "accepted":
            revision = got.decision.revision
            accepted += 1
    return book, accepted


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=2000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 300 if args.quick else args.events
    evs = events(n)
    book, accepted = fold(evs)
    doc = book.docs["checkout-incident"]
    assert doc is not None
    state = doc.to_state()
    now = T0 + timedelta(seconds=30 * n)
    conversation = "\n".join(f"assistant: {json.dumps(e)}" for e in evs)
    whole = render_context(state, now=now)
    bounded = render_context(state, now=now, max_tokens=args.max_tokens)
    conv_t, whole_t, bound_t = approx_tokens(conversation), approx_tokens(whole), approx_tokens(bounded)
    print(
        f"RESULT run of {n} events ({accepted} accepted patches): conversation {conv_t:,} tokens; "
        f"context {whole_t:,} tokens ({conv_t / whole_t:.1f}x smaller); "
        f"context --max-tokens {args.max_tokens}: {bound_t:,} tokens ({conv_t / bound_t:.1f}x smaller; goal >= 20x)"
    )
    print("RESULT bounded context's last line: " + bounded.rstrip().splitlines()[-1])


if __name__ == "__main__":
    main()
