"""An MLflow tracking server a test or benchmark can take away and bring back (tests/test_world.py,
benchmarks/tracking_outage.py)."""

from __future__ import annotations

import subprocess


class MlflowServer:
    """An MLflow tracking server on 127.0.0.1 that a test stops (SIGKILL, by its pid) and starts again on the
    same port and database: a tracking outage."""

    def __init__(self, folder):
        import socket

        self.folder, self.proc = folder, None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90) -> None:
        import os
        import sys
        import time
        import urllib.request

        log = open(self.folder / "server.log", "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                                      f"sqlite:///{self.folder}/server.db", "--artifacts-destination",
                                      str(self.folder / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port),
                                      "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.folder / "server.log").read_text()[-2000:]
            try:
                urllib.request.urlopen(self.uri + "/health", timeout=2).close()
                return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"mlflow server did not answer within {timeout} s")

    def kill(self) -> None:
        import os
        import signal

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its session: the server and its uvicorn worker
            self.proc.wait(timeout=30)
