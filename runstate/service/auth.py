"""Bearer tokens -> agent identities, hashed at rest.

The tokens file is JSON::

    {"tokens": [{"sha256": "<hex of sha256(token)>", "agent_id": "planner",
                 "role": "write", "runs": ["support-*"]}]}

``role`` is ``read`` (queries only) or ``write`` (also patches). ``runs`` (optional) are
glob patterns of the run ids the token may touch; absent, every run. ``erase`` (optional,
false) lets the token erase those runs (``DELETE /runs/{id}``): an operator's power, which
no agent's write token has by default. ``channel`` (optional) makes it an input channel's
token (``user``, ``operator``, ``approval``, ``system_of_record``): it writes only
``InputRecorded`` events of that origin, which by default only the agent id equal to the
origin may record on a run (the rule that keeps an agent from making its own guess an
authoritative input). ``policy`` (optional, false) lets the token start runs whose policy
weakens that rule (``input_authority: writers``, or ``input_recorders`` naming anyone but
the origin's channel): an operator's act, since an agent that may write it may then make
its own guess a user input. The token itself is shown once, by ``runstate token add``, and
never stored.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from runstate.schemas.errors import ContractError, RunstateError, describe_validation_error
from runstate.schemas.events import InputOrigin

Role = Literal["read", "write"]
#: Who a caller without a token is, on a server without a tokens file.
ANONYMOUS = "anonymous"


class AuthError(RunstateError):
    """A request without a valid token (401) or beyond what its token allows (403)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class TokenEntry(BaseModel):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    agent_id: str = Field(min_length=1)
    role: Role = "write"
    runs: list[str] | None = None
    erase: bool = False
    channel: InputOrigin | None = None
    policy: bool = False


class TokensFile(BaseModel):
    tokens: list[TokenEntry] = []


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request is. ``trusted`` (no tokens file: loopback only) may name any author."""

    agent_id: str
    role: Role
    runs: tuple[str, ...] | None = None
    trusted: bool = False
    erase: bool = False
    #: an input channel's token: it writes only inputs of this origin
    channel: str | None = None
    #: may start runs whose policy weakens input authority (an operator's token)
    policy: bool = False

    def may_read(self, run_id: str) -> None:
        if self.runs is not None and not any(fnmatch.fnmatchcase(run_id, pat) for pat in self.runs):
            raise AuthError(f"agent {self.agent_id!r} may not access run {run_id!r}", 403)

    def may_erase(self, run_id: str) -> None:
        if not (self.trusted or self.erase):
            raise AuthError(f"agent {self.agent_id!r}'s token may not erase runs (runstate token add --erase)", 403)
        self.may_read(run_id)

    def may_write(self, run_id: str) -> None:
        if self.role != "write":
            raise AuthError(f"agent {self.agent_id!r} has a read-only token", 403)
        self.may_read(run_id)

    def may_propose(self, events: list[Any]) -> None:
        """A channel's token writes only inputs of its origin; only an operator's token
        (``policy``) starts a run whose policy weakens input authority. Raises
        :class:`AuthError` (403)."""
        if not (self.trusted or self.policy):
            for e in events:
                why = weakened_authority(e.policy) if e.type == "RunStarted" else None
                if why is not None:
                    raise AuthError(
                        f"agent {self.agent_id!r}'s token may not start a run whose policy {why}: that "
                        "weakens who records authoritative inputs, an operator's act (runstate token "
                        "add NAME --policy)",
                        403,
                    )
        if self.channel is None:
            return
        for i, e in enumerate(events):
            if e.type != "InputRecorded" or e.input.origin != self.channel:
                raise AuthError(
                    f"agent {self.agent_id!r} holds the {self.channel} channel's token, which records only "
                    f"{self.channel} inputs (InputRecorded); event {i} is {e.type}",
                    403,
                )


def weakened_authority(policy: Any) -> str | None:
    """How a run policy weakens input authority (who may record an input of an
    authoritative origin), or None: ``input_authority: writers``, or ``input_recorders``
    naming anyone but the origin's own channel identity."""
    if policy.input_authority == "writers":
        return "sets input_authority to 'writers'"
    for r in policy.input_recorders:
        others = [a for a in r.agents if a != r.origin]
        if others:
            return f"names {others[0]!r} among the recorders of {r.origin} inputs"
    return None


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Tokens:
    """The identities of a tokens file, or the local trust of a server without one."""

    def __init__(self, entries: list[TokenEntry] | None, default_agent: str = "cli") -> None:
        self.entries = entries
        self.default_agent = default_agent

    @classmethod
    def load(cls, path: str | None, default_agent: str = "cli") -> Tokens:
        """Raises :class:`ContractError` naming the file and field."""
        if path is None:
            return cls(None, default_agent)
        try:
            return cls(TokensFile.model_validate_json(Path(path).read_bytes()).tokens, default_agent)
        except OSError as e:
            raise ContractError(f"cannot read tokens file: {e.strerror}", where=path) from e
        except ValidationError as e:
            field, msg = describe_validation_error(e)
            raise ContractError(f"invalid tokens file: {msg}", where=path, field=field) from e

    @property
    def enabled(self) -> bool:
        return self.entries is not None

    def identify(self, authorization: str | None) -> Identity:
        """The identity of an ``Authorization`` header. Raises :class:`AuthError` (401)."""
        if self.entries is None:
            return Identity(self.default_agent, "write", trusted=True)
        if not authorization or not authorization.lower().startswith("bearer "):
            raise AuthError("a bearer token is required (Authorization: Bearer <token>)", 401)
        digest = _digest(authorization[7:].strip())
        for e in self.entries:
            if hmac.compare_digest(e.sha256, digest):
                return Identity(
                    e.agent_id,
                    e.role,
                    None if e.runs is None else tuple(e.runs),
                    erase=e.erase,
                    channel=e.channel,
                    policy=e.policy,
                )
        raise AuthError("unknown token", 401)


def add_token(
    path: str,
    agent_id: str,
    role: Role = "write",
    runs: list[str] | None = None,
    erase: bool = False,
    channel: InputOrigin | None = None,
    policy: bool = False,
) -> str:
    """Create a token for ``agent_id``, store its hash in ``path`` (created 0600) and
    return the token (the only time it is seen)."""
    p = Path(path)
    current = TokensFile.model_validate_json(p.read_bytes()) if p.exists() else TokensFile()
    token = "rs_" + secrets.token_urlsafe(32)
    current.tokens.append(
        TokenEntry(
            sha256=_digest(token), agent_id=agent_id, role=role, runs=runs, erase=erase, channel=channel, policy=policy
        )
    )
    tmp = p.with_name(p.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(current.model_dump(exclude_none=True, exclude_defaults=False), indent=1) + "\n")
    os.replace(tmp, p)
    return token
