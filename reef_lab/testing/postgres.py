"""A real PostgreSQL server in a temporary folder on loopback, for tests and benchmarks.

Debian's server binaries (`/usr/lib/postgresql/<n>/bin`, or `pg_config --bindir`) are run as they are: `initdb`,
then `postgres` itself as a child through reef_lab.procs (it dies with the test process, `kill -9` included). The
server refuses to run as root, so as root both run as the `postgres` user (`runuser`), in a folder that user owns.
Start-up takes about a second; `kill()` and `start()` again on the same folder is a crash and a recovery.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from reef_lab import procs


def bindir() -> Path | None:
    """Where initdb and postgres are, or None on a machine without PostgreSQL's server."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    pg_config = shutil.which("pg_config")
    if pg_config:
        d = Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip())
        if (d / "postgres").exists():
            return d
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """One throwaway cluster: `url` is its database `reef` for user `reef` (trust auth on loopback)."""

    def __init__(self, folder: str | Path | None = None, port: int | None = None):
        bins = bindir()
        if bins is None:
            raise RuntimeError("PostgreSQL's server is not installed: apt-get install postgresql (Debian), or give "
                               "--state a running server's URL")
        self.bins = bins
        self._tmp = None if folder is not None else tempfile.mkdtemp(prefix="reef-pg-")
        self.folder = Path(folder or self._tmp)
        self.data = self.folder / "data"
        self.port = port or _free_port()
        self.url = f"postgresql://reef@127.0.0.1:{self.port}/reef"
        self.proc: procs.Popen | None = None
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if not (self.data / "PG_VERSION").exists():
            self._init()
        if self._tmp:  # a script that forgets close() leaves no cluster in /tmp (kill -9: the server dies anyway)
            atexit.register(self.close)

    def _init(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._as:
            shutil.chown(self.folder, "postgres", "postgres")
            os.chmod(self.folder, 0o700)
        subprocess.run([*self._as, str(self.bins / "initdb"), "-D", str(self.data), "-U", "reef", "-A", "trust",
                        "--no-sync", "-E", "UTF8", "--locale", "C"], check=True, capture_output=True)

    def start(self, timeout: float = 60) -> Postgres:
        args = [*self._as, str(self.bins / "postgres"), "-D", str(self.data), "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.folder}",
                "-c", "max_connections=200", "-c", "fsync=on", "-c", "synchronous_commit=on"]
        self.proc = procs.Popen(args, stdout=subprocess.DEVNULL, stderr=open(self.folder / "server.log", "ab"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited at start: {(self.folder / 'server.log').read_text()[-2000:]}")
            ok = subprocess.run([str(self.bins / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "reef"],
                                capture_output=True).returncode == 0
            if ok and self._create_db():
                return self
            time.sleep(0.1)
        raise TimeoutError(f"postgres did not accept connections within {timeout} s")

    def _create_db(self) -> bool:
        r = subprocess.run([str(self.bins / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "reef",
                            "-d", "postgres", "-tAc", "SELECT 1 FROM pg_database WHERE datname = 'reef'"],
                           capture_output=True, text=True)
        if r.returncode:
            return False
        if r.stdout.strip() != "1":
            subprocess.run([str(self.bins / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "reef",
                            "reef"], check=True, capture_output=True)
        return True

    def kill(self) -> None:
        """kill -9 of the server (all of its processes): a crash; start() again recovers from its WAL."""
        if self.proc is None:
            return
        tree = [self.proc.pid, *(pid for pid, _ in procs.below(self.proc.pid))]
        for pid in tree:  # every backend too: a live one keeps the shared memory a new postmaster refuses to share
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]
                  not in "ZX" for pid in tree if Path(f"/proc/{pid}").exists()) and time.monotonic() < deadline:
            time.sleep(0.02)
        # What is left are zombies (reparented to a PID 1 that may never reap them): postgres would take one for a
        # live postmaster by its pid in postmaster.pid, so the file goes, as the machine's own restart would clear it.
        (self.data / "postmaster.pid").unlink(missing_ok=True)
        for lock in self.folder.glob(f".s.PGSQL.{self.port}*"):  # the socket's lock names the dead pid too
            lock.unlink(missing_ok=True)
        self.proc = None

    def stop(self) -> None:
        """A fast shutdown (SIGINT: open transactions roll back, everything committed is flushed)."""
        if self.proc is not None:
            try:  # the postmaster itself (runuser, its parent as root, does not pass SIGINT on)
                os.kill(int((self.data / "postmaster.pid").read_text().split()[0]), signal.SIGINT)
            except (OSError, ValueError, IndexError):
                self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None

    def close(self) -> None:
        self.stop()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> Postgres:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
