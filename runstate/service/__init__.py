"""``runstate serve``: the HTTP and MCP service over the projector (see ``http.py``)."""

from __future__ import annotations

import ipaddress
import logging
import errno
import os
import signal
import socket
import sys
from typing import Any

from runstate.schemas.errors import ContractError, ListenError
from runstate.settings import Settings

log = logging.getLogger("runstate.serve")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (``port`` 0: a free one), made before anything
    else starts so that a port in use is one clear error. Raises :class:`ListenError`."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ListenError(
                f"port {port} on {host} is in use (another runstate serve?): "
                "choose another with --port, or 0 for a free one"
            ) from e
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    sock.set_inheritable(True)
    return sock


def _check_group_free(settings: Settings) -> None:
    """The embedded log has one projector per group: another process holding it (another
    serve, ``runstate project``, an agent handle) is one line before anything is announced.
    Raises :class:`LogError`."""
    from runstate.app import open_settings_log
    from runstate.schemas.errors import LogError

    log = open_settings_log(settings)
    try:
        members = log.group_members(settings.group_id)
    finally:
        log.close()
    if members:
        raise LogError(
            f"{settings.log} is already projected by another process ({members[0].client_id}): the "
            "embedded log has one projector; stop it, or send requests to the serve that has it"
        )


def serve(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8750,
    *,
    advertise: str | None = None,
    snapshotter: bool = True,
    ssl_keyfile: str | None = None,
    ssl_certfile: str | None = None,
    log_level: str = "warning",
) -> None:
    """Run the service until SIGTERM/SIGINT (which store the batch in hand and leave the
    groups). Raises :class:`ContractError` for a tokens file that cannot be read, or a
    non-loopback ``host`` without one."""
    import uvicorn

    from runstate.service.auth import ANONYMOUS, Tokens
    from runstate.service.deadline import deadline_protocol
    from runstate.service.http import create_app
    from runstate.service.node import Node
    from runstate.service.routing import Router

    # Without a token a caller is "anonymous" unless the operator named the agent (RUNSTATE_AGENT_ID).
    anonymous = settings.agent_id if "agent_id" in settings.model_fields_set else ANONYMOUS
    tokens = Tokens.load(settings.tokens_file, anonymous)
    if not tokens.enabled:
        if not _loopback(host):
            raise ContractError(
                f"without a tokens file (--tokens-file / RUNSTATE_TOKENS_FILE) serve binds to "
                f"127.0.0.1 only, not {host!r}: anyone who reaches it could write any run"
            )
    if not settings.log.startswith("kafka://"):
        _check_group_free(settings)
    sock = bind(host, port)
    port = int(sock.getsockname()[1])
    scheme = "https" if ssl_certfile else "http"
    me = advertise or f"{scheme}://{host}:{port}"
    server_box: dict[str, Any] = {}

    def fatal(why: str) -> None:  # a dead projector: stop serving, let the supervisor restart us
        print(f"runstate serve: stopping: {why}", file=sys.stderr)
        srv = server_box.get("server")
        if srv is not None:
            srv.should_exit = True
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    node = Node(settings, me, snapshotter=snapshotter, on_fatal=fatal)
    kafka = settings.log.startswith("kafka://")
    router = Router(node.log, settings.group_id, me, settings.instance_keys()) if kafka else None
    app = create_app(node, tokens, router)
    slow = app.state.metrics.slow_clients.labels("headers")
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        ssl_keyfile=ssl_keyfile,
        ssl_certfile=ssl_certfile,
        timeout_graceful_shutdown=5,
        lifespan="on",
        http=deadline_protocol(settings.request_timeout_s, slow.inc),
    )
    server = uvicorn.Server(config)
    server_box["server"] = server
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal to the
    # handler it found: ours notes it, so that a clean shutdown exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    if not tokens.enabled:
        print(
            f"runstate serve: no tokens file: anyone on this machine may read and write; bound to {host} only",
            file=sys.stderr,
        )
    if kafka and settings.instance_secret is None:
        print(
            "runstate serve: RUNSTATE_INSTANCE_SECRET is not set: decisions on the decisions topic are not "
            "authenticated, and this instance neither forwards to other instances nor accepts their forwards "
            "(runs of partitions it does not own answer 503)",
            file=sys.stderr,
        )
    print(f"runstate serve: {me} ({node.log.describe()}, {node.partitions} partitions)", file=sys.stderr)
    print(
        f"runstate serve: audit pages {me}/ui, MCP {me}/mcp, API description {me}/openapi.json",
        file=sys.stderr,
        flush=True,
    )
    server.run(sockets=[sock])
    if node.health.failed:
        raise SystemExit(1)
