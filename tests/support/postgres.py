"""A throwaway PostgreSQL server for tests and benchmarks: ``initdb`` in a temporary directory and
``postgres`` on a free loopback port, stopped (and started again) at will; and a database of a test's own
on a server that a test process shares (:class:`PostgresDatabase`, the ``postgres`` fixture).

Debian's ``postgresql`` package puts the server binaries in ``/usr/lib/postgresql/<version>/bin``
(requirement ``postgresql``). ``initdb`` refuses to run as root, so as root the cluster belongs to the
``postgres`` user (``runuser -u postgres --``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support.ports import free_port
from tests.support.requirements import Missing, postgres_bindir
from tests.support.waiting import wait_until


class PostgresServer:
    """One cluster in a temporary directory; :attr:`url` reaches its database ``icos`` (user ``icos``,
    password ``PASSWORD``, scram-sha-256 over TCP)."""

    USER = "icos"
    PASSWORD = "pg-test-secret-5f1d"
    DB = "icos"

    def __init__(self, bindir: Path, fsync: bool = False) -> None:
        """``fsync=False`` (tests) trades durability against an OS crash for speed; benchmarks keep it on."""
        self.bindir = bindir
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="icos-pg-"))
        self.data = self.root / "data"
        self.sock = self.root / "sock"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.as_postgres = os.geteuid() == 0
        self.log = self.root / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgresql://{self.USER}:{self.PASSWORD}@127.0.0.1:{self.port}/{self.DB}"

    def _cmd(self, *args: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *args] if self.as_postgres else list(args)

    def init(self) -> PostgresServer:
        self.sock.mkdir(parents=True)
        pwfile = self.root / "pw"
        pwfile.write_text(self.PASSWORD + "\n")
        if self.as_postgres:
            for path in (self.root, self.sock, pwfile):
                shutil.chown(path, "postgres")
        initdb = [str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.USER, "--pwfile", str(pwfile)]
        initdb += ["--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync"]
        subprocess.run(self._cmd(*initdb), check=True, capture_output=True, timeout=120)
        self.start()
        createdb = [str(self.bindir / "createdb"), "-h", str(self.sock), "-p", str(self.port), "-U", self.USER, self.DB]
        subprocess.run(self._cmd(*createdb), check=True, capture_output=True, timeout=60)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _client(self, program: str, *args: str) -> None:
        """Run a client program (``createdb``, ``dropdb``) as the cluster's owner over its socket."""
        cmd = [str(self.bindir / program), "-h", str(self.sock), "-p", str(self.port), "-U", self.USER, *args]
        subprocess.run(self._cmd(*cmd), check=True, capture_output=True, timeout=60)

    def database(self, name: str) -> PostgresDatabase:
        """A new, empty database ``name`` (owned by :attr:`USER`) on this server."""
        self._client("createdb", name)
        return PostgresDatabase(self, name)

    def drop_database(self, name: str) -> None:
        """Drop ``name``, disconnecting whoever is still connected to it."""
        self._client("dropdb", "--force", name)

    def _ready(self) -> bool:
        probe = [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)]
        if subprocess.run(probe, capture_output=True, timeout=30, check=False).returncode == 0:
            return True
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"postgres exited: {self.log.read_text(errors='replace')[-2000:]}")
        return False

    def start(self, timeout: float = 60.0) -> None:
        """Start the server (again) on the same port and wait until it accepts connections."""
        cmd = [str(self.bindir / "postgres"), "-D", str(self.data), "-k", str(self.sock), "-p", str(self.port)]
        cmd += ["-c", "listen_addresses=127.0.0.1", "-c", f"fsync={'on' if self.fsync else 'off'}"]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self._cmd(*cmd), stdout=log, stderr=subprocess.STDOUT)
        if not wait_until(self._ready, timeout, 0.1):
            raise RuntimeError(f"postgres did not start: {self.log.read_text(errors='replace')[-2000:]}")

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the server (fast shutdown: clients are disconnected). The signal goes to the postmaster
        itself (``postmaster.pid``): ``runuser`` does not pass it on."""
        if self.proc is not None and self.proc.poll() is None:
            pidfile = self.data / "postmaster.pid"
            with contextlib.suppress(OSError, ValueError, IndexError):
                os.kill(int(pidfile.read_text().splitlines()[0]), signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class PostgresDatabase:
    """A database of a test's own on a server shared by the tests of one process: the test sees an empty
    database and leaves nothing behind for the next. :meth:`stop` and :meth:`start` stop and start the
    whole server (a process runs one test at a time; the ``postgres`` fixture starts it again after a
    test that left it down)."""

    USER = PostgresServer.USER
    PASSWORD = PostgresServer.PASSWORD

    def __init__(self, server: PostgresServer, name: str) -> None:
        self.server = server
        self.name = name

    @property
    def url(self) -> str:
        return f"postgresql://{self.USER}:{self.PASSWORD}@127.0.0.1:{self.server.port}/{self.name}"

    def stop(self, timeout: float = 60.0) -> None:
        self.server.stop(timeout)

    def start(self, timeout: float = 60.0) -> None:
        self.server.start(timeout)


@contextlib.contextmanager
def fresh_database(server: PostgresServer, name: str) -> Iterator[PostgresDatabase]:
    """A new database ``name`` on ``server`` for the block; afterwards the server runs again (if the block
    stopped it) and the database is dropped."""
    db = server.database(name)
    try:
        yield db
    finally:
        if not server.running:
            server.start()
        server.drop_database(name)


@contextlib.contextmanager
def running_postgres(fsync: bool = False) -> Iterator[PostgresServer]:
    """A fresh server for the duration of the block (RuntimeError without the server binaries:
    ``apt-get install postgresql``)."""
    try:
        bindir = postgres_bindir()
    except Missing as exc:
        raise RuntimeError(f"PostgreSQL server binaries not found ({exc}; apt-get install postgresql)") from None
    server = PostgresServer(bindir, fsync=fsync)
    try:
        yield server.init()
    finally:
        server.close()
