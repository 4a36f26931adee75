"""LangGraph's queries on a partition store: a thread's checkpoints by namespace, id and
order, with the channel values each keeps once per version."""

from __future__ import annotations

from typing import Any

import orjson

from runstate.projector.store import keys
from runstate.projector.store.rocks import RocksStore
from runstate.schemas.state import graph_key, graph_value_key


def _saved(item: bytes) -> bool:
    """Whether a stored graph checkpoint item holds its checkpoint (not only writes that came first)."""
    return orjson.loads(item[8:])["checkpoint"] is not None


class GraphReads(RocksStore):
    """LangGraph's part of a partition store (``runstate.integrations.langgraph``, serve's ``/graph/checkpoints``)."""

    def graph_checkpoints(
        self,
        run_id: str,
        ns: str | None,
        *,
        checkpoint_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[bytes]:
        """The run's LangGraph checkpoints (each its stored JSON, a ``GraphCheckpoint``),
        newest first: of namespace ``ns`` (None: every namespace), only ``checkpoint_id``
        when given, only those older than ``before``, at most ``limit``. One namespace is one
        range of keys in id order, read backwards from where the answer starts."""
        base = keys.items_prefix(run_id, "graph_checkpoints")
        if checkpoint_id is not None and ns is not None:
            raw = self._get(base + graph_key(ns, checkpoint_id).encode())
            return self._with_values(run_id, [raw[8:]]) if raw is not None and _saved(raw) else []
        if ns is None:
            found = [(orjson.loads(v[8:]), v[8:]) for _, v in self._prefix(base)]
            found = [
                f
                for f in found
                if f[0]["checkpoint"] is not None
                and (checkpoint_id is None or f[0]["id"] == checkpoint_id)
                and (before is None or f[0]["id"] < before)
            ]
            found.sort(key=lambda f: str(f[0]["id"]), reverse=True)
            return self._with_values(run_id, [v for _, v in found[:limit]])
        prefix = base + graph_key(ns).encode()
        start = prefix + (before.encode() if before is not None else b"\xff")
        out: list[bytes] = []
        for k, v in self._prefix_reversed(prefix, start):
            if (before is not None and k == start) or not _saved(v):
                continue
            if limit is not None and len(out) >= limit:
                break
            out.append(v[8:])
        return self._with_values(run_id, out)

    def _with_values(self, run_id: str, docs: list[bytes]) -> list[bytes]:
        """Each checkpoint that keeps its values once per version (``versions``) with the
        values of its versions that the run holds (``values``, as ``GraphCheckpointRead``),
        read in one MultiGet; the others as they are stored."""
        base = keys.items_prefix(run_id, "graph_values")
        wanted: list[tuple[int, bytes]] = []
        for i, raw in enumerate(docs):
            if b'"versions":[' not in raw:  # a top-level key: a string's quotes are escaped
                continue
            doc = orjson.loads(raw)
            ns = doc.get("ns", "")
            wanted += [(i, base + graph_value_key(ns, cv["channel"], cv["version"]).encode()) for cv in doc["versions"]]
        if not wanted:
            return docs
        values: dict[int, list[Any]] = {}
        for (i, _), got in zip(wanted, self._multi_get([k for _, k in wanted])):
            if got is not None:
                item = orjson.loads(got[8:])
                values.setdefault(i, []).append(
                    {"channel": item["channel"], "version": item["version"], "value": item["value"]}
                )
        return [
            raw[:-1] + b',"values":' + orjson.dumps(values.get(i, [])) + b"}" if b'"versions":[' in raw else raw
            for i, raw in enumerate(docs)
        ]
