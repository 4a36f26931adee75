"""The ``runstate`` command. Thin: each command calls one function of :mod:`runstate.app`
(the demo: :mod:`runstate.demo`) and prints its result; :func:`handle_errors` is the one place errors become messages.

Exit codes: 0 success; 1 an operation failed (run not found, verify mismatch, log/store
error); 2 bad input (a patch file that is not JSON or not a patch, bad options); 3 a
published patch was rejected (with ``--wait``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, get_args

import click
import orjson
import pydantic
import pydantic_settings

import runstate
from runstate import app
from runstate.eventlog.base import LIBRDKAFKA_LOGGER
from runstate.progress import Progress
from runstate.projector.store.statedir import check_state_dir
from runstate.projector.core.reducer import REDUCER_VERSION
from runstate.projector.runtime.loop import ProjectorStats
from runstate.schemas.errors import ContractError, RunstateError, describe_validation_error
from runstate.schemas.state import CURRENT_SCHEMA_VERSION, RunStatus
from runstate.eventlog.keystore import MasterKey
from runstate.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])


def _dump(obj: Any) -> str:
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode()


def handle_errors(fn: F) -> F:
    """The CLI's one error translator: bad input (a patch, a setting) is a usage error
    (exit 2) naming the file or setting and the field; any other runstate error is a
    one-line message (exit 1). No tracebacks for either."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ContractError as e:
            raise click.UsageError(str(e)) from e
        except pydantic.ValidationError as e:  # settings (flags and RUNSTATE_* variables)
            field, message = describe_validation_error(e)
            raise click.UsageError(f"bad setting {message} (RUNSTATE_{field.upper()})") from e
        except pydantic_settings.SettingsError as e:  # a RUNSTATE_* variable that is not JSON where JSON is due
            m = re.search(r'field "(\w+)"', str(e))
            name = f"RUNSTATE_{m[1].upper()}" if m else "a RUNSTATE_* variable"
            raise click.UsageError(f"bad setting {name}: not valid JSON ({e.__cause__ or e})") from e
        except RunstateError as e:
            raise click.ClickException(str(e)) from e

    return wrapper  # type: ignore[return-value]


@click.group()
@click.option(
    "--log", "log_url", envvar="RUNSTATE_LOG", help="kafka://HOST:PORT or embedded log file [.runstate/log.db]"
)
@click.option("--state-dir", envvar="RUNSTATE_STATE_DIR", help="projection directory [.runstate/state]")
@click.option("--partitions", type=int, envvar="RUNSTATE_PARTITIONS", help="partitions when creating the log [4]")
@click.option("-v", "--verbose", is_flag=True, help="log what the projector does")
@click.version_option(
    runstate.__version__,
    prog_name="runstate",
    message=f"%(prog)s %(version)s (state schema {CURRENT_SCHEMA_VERSION}, reducer {REDUCER_VERSION})",
)
@click.pass_context
@handle_errors
def main(ctx: click.Context, log_url: str | None, state_dir: str | None, partitions: int | None, verbose: bool) -> None:
    """runstate: where is each agent run now? Patches on a log, a projector, queries."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    # The Kafka client's own log is for -v: without it, runstate's one-line errors say what failed.
    logging.getLogger(LIBRDKAFKA_LOGGER).setLevel(logging.DEBUG if verbose else logging.CRITICAL)
    overrides = {
        k: v for k, v in {"log": log_url, "state_dir": state_dir, "partitions": partitions}.items() if v is not None
    }
    ctx.obj = Settings(**overrides)
    check_state_dir(ctx.obj.state_dir)


def _count(n: int, noun: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _settings(ctx: click.Context, **overrides: Any) -> Settings:
    """The global settings with a command's own flags applied (validated like the rest)."""
    base: Settings = ctx.obj
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return Settings(**{**base.model_dump(), **overrides}) if overrides else base


@main.command()
@click.argument("run_id")
@click.argument("file", default="-")
@click.option("--wait", is_flag=True, help="wait for the projector's decision and print it as JSON")
@click.option("--timeout", default=10.0, show_default=True, help="seconds to wait for the decision")
@click.option("--rebase", is_flag=True, default=None, help="ask for a rebase if the revision moved on")
@click.option("--agent-id", envvar="RUNSTATE_AGENT_ID", help="author of the patch [cli]")
@click.option("--agent-version", envvar="RUNSTATE_AGENT_VERSION", help="agent version of the author [unknown]")
@click.pass_context
@handle_errors
def publish(
    ctx: click.Context,
    run_id: str,
    file: str,
    wait: bool,
    timeout: float,
    rebase: bool | None,
    agent_id: str | None,
    agent_version: str | None,
) -> None:
    """Append the patch in FILE (JSON; - for stdin) to RUN_ID."""
    settings = _settings(ctx, agent_id=agent_id, agent_version=agent_version)
    data = app.read_patch_file(file, sys.stdin)
    receipt, decision = app.publish(
        settings, run_id, data, where="<stdin>" if file == "-" else file, wait=wait, timeout_s=timeout, rebase=rebase
    )
    if decision is None:
        click.echo(
            json.dumps(
                {
                    "patch_id": receipt.patch_id,
                    "run_id": run_id,
                    "partition": receipt.partition,
                    "offset": receipt.offset,
                }
            )
        )
        return
    click.echo(_dump(decision))
    if decision.outcome != "accepted":
        ctx.exit(3)


def _loop_progress(label: str, quiet: bool) -> tuple[Callable[[ProjectorStats, int], None], Progress]:
    """Progress of a consume loop (records read, + lag = where the log ends now)."""
    bar = Progress(label, quiet=quiet)

    def show(stats: ProjectorStats, lag: int) -> None:
        bar.update(
            stats.records,
            stats.records + lag,
            f"{stats.accepted:,} accepted, {stats.rejected:,} rejected, "
            f"{stats.dead_letters:,} dead letters, lag {lag:,}",
            force=lag == 0,
        )

    return show, bar


def _restore_progress(quiet: bool) -> Callable[[int, int, int], None]:
    bars: dict[int, Progress] = {}

    def show(partition: int, done: int, total: int) -> None:
        bar = bars.setdefault(partition, Progress(f"restoring p{partition} from checkpoints", quiet=quiet))
        bar.update(done, total, force=done == total)
        if done == total:
            bar.finish()

    return show


@main.command()
@click.option("--until-caught-up", is_flag=True, help="exit when the log is drained")
@click.option("--batch-size", type=int, help="records per poll batch [2000]")
@click.option("--quiet", is_flag=True, help="no progress lines")
@click.pass_context
@handle_errors
def project(ctx: click.Context, until_caught_up: bool, batch_size: int | None, quiet: bool) -> None:
    """Run the projector: consume the log into the projection stores."""
    show, bar = _loop_progress("projector", quiet)
    interrupted: app.Interrupted | None = None
    try:
        stats = app.project(
            _settings(ctx, batch_size=batch_size),
            until_caught_up=until_caught_up,
            on_progress=show,
            on_restore_progress=_restore_progress(quiet),
        )
    except app.Interrupted as e:
        interrupted, stats = e, e.stats
    bar.finish()
    click.echo(
        json.dumps(
            {
                "records": stats.records,
                "accepted": stats.accepted,
                "rejected": stats.rejected,
                "duplicates": stats.duplicates,
                "dead_letters": stats.dead_letters,
                "events": stats.events,
            }
        )
    )
    if interrupted is not None:
        # Not caught up: `project --until-caught-up && next` must not go on (128 + the signal, as a shell says).
        click.echo(f"runstate project: {interrupted}", err=True)
        ctx.exit(128 + interrupted.signum)


@main.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="the full Run State document")
@click.option("--revision", type=int, help="the state at this past revision (replayed from the log)")
@click.pass_context
@handle_errors
def state(ctx: click.Context, run_id: str, as_json: bool, revision: int | None) -> None:
    """Print where RUN_ID is now (or was at --revision)."""
    st = app.get_state(ctx.obj, run_id, revision)
    if as_json:
        click.echo(_dump(st))
        return
    tasks: dict[str, int] = {}
    for t in st.tasks:
        tasks[t.status] = tasks.get(t.status, 0) + 1
    click.echo(f"run {st.run_id} revision {st.revision} status {st.status} phase {st.phase or '-'}")
    click.echo(f"goal: {st.goal.statement}")
    by_status = ", ".join(f"{n} {status}" for status, n in tasks.items()) or "none"
    click.echo(f"active task: {st.active_task_id or '-'}; tasks: {by_status}")
    click.echo(
        f"facts {len(st.confirmed_facts)}, hypotheses {len(st.hypotheses)}, open questions {len(st.open_questions)}, "
        f"observations {len(st.environment_observations)}, tool calls in flight {len(st.pending_tool_calls)}"
    )
    b = st.budgets
    if b.tokens_remaining is not None or b.tokens_used or b.deadline:
        flag = " (EXHAUSTED)" if b.tokens_remaining is not None and b.tokens_remaining <= 0 else ""
        click.echo(
            f"budget: tokens remaining {'-' if b.tokens_remaining is None else b.tokens_remaining}{flag}, "
            f"used {b.tokens_used}, deadline {b.deadline.isoformat() if b.deadline else '-'}"
        )
    if st.waiting:
        click.echo(f"waiting for {st.waiting.kind}: {st.waiting.reason}")


@main.command()
@click.argument("run_id")
@click.option(
    "--max-tokens",
    type=click.IntRange(50),
    help="bound the text (tokens as characters / 4); what is left out is counted in it",
)
@click.pass_context
@handle_errors
def context(ctx: click.Context, run_id: str, max_tokens: int | None) -> None:
    """Print RUN_ID's compact context for an LLM prompt."""
    click.echo(app.get_context(ctx.obj, run_id, max_tokens=max_tokens), nl=False)


@main.command()
@click.option("--status", type=click.Choice(get_args(RunStatus)))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handle_errors
def runs(ctx: click.Context, status: str | None, as_json: bool) -> None:
    """List runs (optionally of one status)."""
    headers = app.list_runs(ctx.obj, status)
    if as_json:
        click.echo(
            _dump(
                [
                    {
                        "run_id": h.run_id,
                        "revision": h.revision,
                        "status": h.status,
                        "phase": h.phase,
                        "agent_version": h.agent_version,
                        "updated_at": h.updated_at.isoformat(),
                    }
                    for h in headers
                ]
            )
        )
        return
    for h in headers:
        click.echo(f"{h.run_id}\t{h.status}\trevision {h.revision}\tphase {h.phase or '-'}\t{h.goal.statement}")


@main.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handle_errors
def history(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Every patch of RUN_ID: author, agent version, decision and reason."""
    decisions = app.history(ctx.obj, run_id)
    erasure = app.erasure_of(ctx.obj, run_id)
    if erasure is not None and not as_json:
        click.echo(
            f"erased at {erasure['at']} by {erasure['by']}: {erasure['reason']} "
            "(its content is gone; what follows is what remains)"
        )
    if as_json:
        click.echo(_dump([d.model_dump(mode="json") for d in decisions]))
        return
    for d in decisions:
        why = "" if d.outcome == "accepted" else f" {d.reason}" + (f" [{d.rule}]" if d.rule else "") + f": {d.message}"
        click.echo(
            f"@{d.offset}\tr{d.expected_revision}->r{d.revision}\t{d.outcome}{' (rebased)' if d.rebased else ''}{why}"
            f"\t{d.agent_id}@{d.agent_version}\t{','.join(d.event_types)}"
        )


@main.command()
@click.argument("run_id")
@click.option("--reason", required=True, help="why (kept, readable, with who and when)")
@click.option("--by", help="who erases [$USER]")
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=10.0,
    show_default=True,
    help="seconds to wait for the projector to take the erasure (0: do not wait)",
)
@click.pass_context
@handle_errors
def erase(ctx: click.Context, run_id: str, reason: str, by: str | None, wait_s: float) -> None:
    """Erase RUN_ID everywhere: its keys are destroyed (every copy of its content on the log
    becomes unreadable) and the projector and snapshotter drop it from their stores and
    checkpoints. What remains: who, when and why. Needs a master key (RUNSTATE_MASTER_KEY)."""
    who = by or os.environ.get("USER") or "operator"
    done = app.erase(ctx.obj, run_id, reason, who, wait_s=wait_s)
    e = done.erasure
    if not done.first:
        click.echo(f"run {run_id} was already erased at {e['at']} by {e['by']}: {e['reason']} (that record stands)")
        return
    click.echo(f"erased run {run_id}: its keys are destroyed")
    if done.decision is not None:
        click.echo(f"the projector dropped its state (decision at offset {done.decision.offset})")
    elif wait_s > 0:
        click.echo(
            f"no projector took the erasure within {wait_s:g} s: the run's state leaves the projections when "
            "`runstate project` (or `serve`) reaches it; `runstate status` lists erasures not finished"
        )


@main.group()
def keys() -> None:
    """The master key that seals runs' content (needed to erase runs)."""


@keys.command("generate")
def keys_generate() -> None:
    """Print a new key (64 hex digits): a master key for RUNSTATE_MASTER_KEY or a key file, or an instance
    secret for RUNSTATE_INSTANCE_SECRET."""
    click.echo(app.generate_master_key())


@keys.command("rotate")
@click.option(
    "--new-key-file",
    required=True,
    type=click.Path(dir_okay=False),
    help="file holding the new master key; the configured one must open the store",
)
@click.pass_context
@handle_errors
def keys_rotate(ctx: click.Context, new_key_file: str) -> None:
    """Wrap every run key with a new master key, or change nothing and say which keys do not
    open. Cut short, run it again with the same new key to finish."""
    done = app.rotate_master_key(ctx.obj, MasterKey.from_file(new_key_file))
    verb = "rotation resumed and finished" if done.resumed else "rotated"
    click.echo(
        f"{verb}: {_count(done.rewrapped, 'run key')} wrapped with the new master key"
        + (f" ({done.already} already were)" if done.already else "")
    )
    click.echo(
        "configure it now in every process (RUNSTATE_MASTER_KEY or RUNSTATE_MASTER_KEY_FILE); the old "
        "key opens nothing new from here on"
    )


@keys.command("status")
@click.pass_context
@handle_errors
def keys_status(ctx: click.Context) -> None:
    """Where the key store stands: its master key, a rotation under way, keys by master."""
    r = app.key_status(ctx.obj)
    click.echo(f"master key: {r.master or '(none)'}  state: {r.state}  epoch: {r.epoch}")
    if r.retired:
        click.echo(f"retired: {', '.join(r.retired)}")
    if r.state == "rotating":
        click.echo(
            "a rotation is under way: run `runstate keys rotate` again with the same new key to finish it"
            + (f" (partitions without its record yet: {r.partitions_behind})" if r.partitions_behind else "")
        )
    for m, n in sorted(r.keys_by_master.items()):
        click.echo(f"  {_count(n, 'run key')} wrapped by {m}")
    if r.stale:
        click.echo(f"  {_count(r.stale, 'stale key')} (written by a retired master after a rotation; never used)")
    click.echo(f"  {_count(r.erased_runs, 'erased run')}")
    for p in r.problems:
        click.echo(f"problem: {p}", err=True)
    if r.problems:
        ctx.exit(1)


@keys.command("repair")
@click.pass_context
@handle_errors
def keys_repair(ctx: click.Context) -> None:
    """Write the master check record again (lost or damaged) for the configured key, once
    that key is shown to open the run keys that name it."""
    rec = app.repair_master_record(ctx.obj)
    click.echo(f"master check record written for master key {rec.master}")


@main.command()
@click.argument("run_id")
@click.argument("path")
@click.pass_context
@handle_errors
def explain(ctx: click.Context, run_id: str, path: str) -> None:
    """Why PATH of RUN_ID's state has its value: every patch that changed it.

    PATH is dotted; list items are addressed by id, e.g. goal.constraints.session_timeout.value,
    tasks.task_3.status, budgets.tokens_remaining, status.
    """
    changes = app.explain_field(ctx.obj, run_id, path)
    for c in changes:
        click.echo(
            f"r{c.revision} @{c.offset}\t{json.dumps(c.before, ensure_ascii=False)} -> "
            f"{json.dumps(c.after, ensure_ascii=False)}\t{c.agent_id}@{c.agent_version}\t{','.join(c.event_types)}"
        )


@main.command()
@click.option("--deep", is_flag=True, help="also check the log's storage and every checkpoint")
@click.option("--quiet", is_flag=True, help="no progress line")
@click.pass_context
@handle_errors
def verify(ctx: click.Context, deep: bool, quiet: bool) -> None:
    """Replay the log into a scratch store and compare every run with the projection."""
    bar = Progress("verify: replayed", quiet=quiet)
    report = app.run_verify(
        ctx.obj, on_progress=lambda done, total: bar.update(done, total, force=done == total), deep=deep
    )
    bar.finish()
    for p, off in report.damaged:
        click.echo(f"DAMAGED record p{p}@{off}: its checksum does not match (dead-lettered, reason checksum)")
    for problem in report.problems:
        click.echo(f"PROBLEM {problem}")
    for p, (at, end) in report.undecided.items():
        click.echo(
            f"UNDECIDED p{p}: records {at}..{end - 1} are not decided yet (the projector is behind, or "
            "stopped on one: see its log), so they are not verified"
        )
    for m in report.mismatches:
        click.echo(
            f"MISMATCH run {m.run_id}: projection revision {m.projection_revision}, replay revision "
            f"{m.replay_revision}, first differing offset {m.first_differing_offset} ({m.detail})"
        )
    if report.ok:
        verdict = "projection equals replay"
    else:
        verdict = ", ".join(
            f"{n} {what}"
            for n, what in (
                (len(report.mismatches), "mismatches"),
                (len(report.damaged), "damaged records"),
                (len(report.problems), "problems"),
                (len(report.undecided), "partitions not decided to the end"),
            )
            if n
        )
    click.echo(f"verified {_count(report.runs, 'run')} over {_count(report.records, 'record')}: {verdict}")
    if not report.ok:
        ctx.exit(1)


@main.command()
@click.option("--until-caught-up", is_flag=True, help="exit when the log is drained")
@click.option("--every", type=click.IntRange(1), help="checkpoint every K revisions per run [50]")
@click.option("--quiet", is_flag=True, help="no progress lines")
@click.pass_context
@handle_errors
def snapshot(ctx: click.Context, until_caught_up: bool, every: int | None, quiet: bool) -> None:
    """Run the snapshotter: checkpoints every K revisions and at safe boundaries."""
    show, bar = _loop_progress("snapshotter", quiet)
    stats, written = app.snapshot(ctx.obj, until_caught_up=until_caught_up, every=every, on_progress=show)
    bar.finish()
    click.echo(json.dumps({"records": stats.records, "accepted": stats.accepted, "checkpoints": written}))


@main.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handle_errors
def checkpoints(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """List RUN_ID's checkpoints: revision, log position, trigger, verdict."""
    cps = app.checkpoints(ctx.obj, run_id)
    if not cps:
        raise click.ClickException(f"no checkpoints for run {run_id!r} (is `runstate snapshot` running?)")
    if as_json:
        click.echo(_dump([{k: v for k, v in cp.model_dump(mode="json").items() if k != "state"} for cp in cps]))
        return
    click.echo("revision\tcovers\ttriggers\tverdict")
    for cp in cps:
        click.echo(f"{cp.revision}\tp{cp.partition}@{cp.covers_offset}\t{','.join(cp.triggers)}\t{cp.verdict}")


@main.command()
@click.argument("run_id")
@click.pass_context
@handle_errors
def resume(ctx: click.Context, run_id: str) -> None:
    """Is it safe to resume RUN_ID from its latest checkpoint, and how."""
    plan = app.resume_plan(ctx.obj, run_id)
    cp = plan.checkpoint
    click.echo(
        f"run {run_id}: latest checkpoint at revision {cp.revision} (p{cp.partition}@{cp.covers_offset}, "
        f"triggers {', '.join(cp.triggers)}, agent {cp.agent_version})"
    )
    click.echo(f"verdict: {cp.verdict.upper()}")
    steps = [f"load the state at revision {cp.revision} (state digest {cp.state_digest[:16]}…)"]
    if plan.tail:
        steps.append(
            f"replay {len(plan.tail)} patches since (to revision {plan.tail[-1].revision}): "
            + ", ".join(f"r{d.revision} @{d.offset} {'+'.join(d.event_types)}" for d in plan.tail)
        )
    else:
        steps.append("no patches since: the checkpoint is the current state")
    projected = plan.current_revision
    newest = plan.tail[-1].revision if plan.tail else cp.revision
    if projected is None:
        click.echo("projection: not built yet here (the plan above is read from the log)")
    elif projected < newest:
        click.echo(f"projection: at revision {projected}, behind the log (revision {newest}): it is catching up")
    for e in cp.reconcile.effects:
        steps.append(
            f"reconcile effect {e.id}: {e.kind or 'effect'} on {e.target or '?'} started, outcome unknown"
            + (f" (idempotency key {e.idempotency_key})" if e.idempotency_key else "")
        )
    for c in cp.reconcile.tool_calls:
        steps.append(f"reconcile tool call {c.call_id} ({c.tool}) in flight since r{c.started_at_revision}")
    for o in cp.reconcile.observations:
        steps.append(
            f"re-read {o.subject} before a risky write (seen {o.observed_state!r}"
            + (f" @ {o.observed_version}" if o.observed_version else "")
            + f" at {o.observed_at.isoformat()})"
        )
    if cp.workspace_ref:
        ws = cp.workspace_ref
        steps.append(
            f"verify workspace {ws.workspace_id}: base {ws.base_commit or '?'}, current {ws.current_commit or '?'}"
            + (f", uncommitted {ws.uncommitted_changes}" if ws.uncommitted_changes else "")
        )
    for i, step in enumerate(steps, start=1):
        click.echo(f"{i}. {step}")


@main.group()
def topics() -> None:
    """Create or check the events, checkpoints (compacted) and dead-letter topics."""


@topics.command("create")
@click.option("--partitions", type=click.IntRange(1, 1024), help="partitions (the scale-out unit) [settings]")
@click.option("--replication", type=click.IntRange(1, 16), help="replication factor [1]")
@click.pass_context
@handle_errors
def topics_create(ctx: click.Context, partitions: int | None, replication: int | None) -> None:
    """Create the topics that are missing (existing ones are checked, not changed)."""
    created = app.create_topics(ctx.obj, partitions, replication)
    names = ctx.obj.topics().all()
    for name in names:
        click.echo(f"{name}: {'created' if name in created else 'exists'}")


@topics.command("check")
@click.pass_context
@handle_errors
def topics_check(ctx: click.Context) -> None:
    """Check that the topics exist with compatible settings (exit 1 naming what is wrong)."""
    where, partitions = app.check_topics(ctx.obj)
    click.echo(f"topics ok on {where}: {partitions} partitions")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handle_errors
def status(ctx: click.Context, as_json: bool) -> None:
    """Consumer lag per partition (log end vs projected position)."""
    rows = app.status(ctx.obj)
    if as_json:
        click.echo(_dump([r.__dict__ for r in rows]))
        return
    click.echo("partition\tend\tprojected\tcommitted\tlag")
    for r in rows:
        dash = "-"
        click.echo(
            f"{r.partition}\t{r.end_offset}\t{dash if r.projected is None else r.projected}\t"
            f"{dash if r.committed is None else r.committed}\t{r.lag}"
        )
    total = sum(r.lag for r in rows)
    click.echo(f"total lag {total}")
    pending = app.erasures_pending(ctx.obj)
    if pending:
        click.echo(f"erasures not finished: {', '.join(pending)} (the next `runstate project` finishes them)")


@main.command()
@click.pass_context
@handle_errors
def deadletters(ctx: click.Context) -> None:
    """Records the projector could not decode, with the reason."""
    for d in app.dead_letters(ctx.obj):
        click.echo(f"p{d.partition}@{d.offset}\t{d.reason}\t{d.detail}\tkey={d.key}\t{d.size} bytes")


@main.command()
@click.option("--runs", "n_runs", default=3, show_default=True, type=click.IntRange(1, 3), help="simulated agent runs")
@click.option("--dir", "workdir", default=".runstate/demo", show_default=True, help="where the demo's log and state go")
@click.option("--quiet", is_flag=True, help="no projector progress lines")
@handle_errors
def demo(n_runs: int, workdir: str, quiet: bool) -> None:
    """Simulated agent workers append patches while the projector runs; then each run's context."""
    from runstate.demo import run_demo

    sys.exit(
        run_demo(
            workdir,
            n_runs=n_runs,
            echo=click.echo,
            progress=Progress("projector", quiet=quiet, inline=False, every_s=2.0, unit="patches"),
        )
    )


@main.command()
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="address to bind (non-loopback needs --tokens-file)"
)
@click.option("--port", default=8750, show_default=True, type=click.IntRange(0, 65535))
@click.option("--advertise", help="URL other instances forward to [http://HOST:PORT]")
@click.option("--tokens-file", envvar="RUNSTATE_TOKENS_FILE", help="bearer tokens -> agents (runstate token add)")
@click.option(
    "--snapshotter/--no-snapshotter", default=True, show_default=True, help="run the snapshotter in this process too"
)
@click.option("--ssl-keyfile", help="TLS key (uvicorn)")
@click.option("--ssl-certfile", help="TLS certificate (uvicorn)")
@click.pass_context
@handle_errors
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    advertise: str | None,
    tokens_file: str | None,
    snapshotter: bool,
    ssl_keyfile: str | None,
    ssl_certfile: str | None,
) -> None:
    """HTTP (OpenAPI at /openapi.json) and MCP (/mcp) over the projector, which runs in this
    process (a member of its group on Kafka: any instance answers for any run)."""
    from runstate.service import serve as run_serve

    run_serve(
        _settings(ctx, tokens_file=tokens_file),
        host,
        port,
        advertise=advertise,
        snapshotter=snapshotter,
        ssl_keyfile=ssl_keyfile,
        ssl_certfile=ssl_certfile,
    )


@main.group()
def token() -> None:
    """Bearer tokens of `runstate serve` (stored hashed)."""


@token.command("add")
@click.argument("agent_id")
@click.option("--tokens-file", envvar="RUNSTATE_TOKENS_FILE", required=True)
@click.option("--read-only", is_flag=True, help="queries only, no patches")
@click.option("--runs", "runs", multiple=True, help="glob of run ids the token may touch (repeatable) [all]")
@click.option("--erase", is_flag=True, help="the token may also erase those runs (an operator's, not an agent's)")
@click.option(
    "--channel",
    type=click.Choice(["user", "operator", "approval", "system_of_record"]),
    help="an input channel's token: it records only inputs of this origin (by default only the agent id "
    "equal to the origin may, e.g. `token add user --channel user`)",
)
@click.option(
    "--policy",
    is_flag=True,
    help="the token may start runs whose policy weakens input authority "
    "(input_authority: writers, other input_recorders): an operator's",
)
@handle_errors
def token_add(
    agent_id: str,
    tokens_file: str,
    read_only: bool,
    runs: tuple[str, ...],
    erase: bool,
    channel: str | None,
    policy: bool,
) -> None:
    """Create a token for AGENT_ID; prints it once (only its hash is stored)."""
    from runstate.service.auth import add_token

    click.echo(
        add_token(tokens_file, agent_id, "read" if read_only else "write", list(runs) or None, erase, channel, policy)
    )  # type: ignore[arg-type]  # click.Choice checked it


if __name__ == "__main__":
    main()
