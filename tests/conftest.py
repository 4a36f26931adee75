from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from eventlog.embedded import EmbeddedLog  # noqa: E402


@pytest.fixture
def embedded_log(tmp_path: Path) -> EmbeddedLog:
    log = EmbeddedLog(tmp_path / "log.db", partitions=4)
    yield log
    log.close()
