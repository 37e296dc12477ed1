"""Screenshots for the docs, taken from a real study in a real headless browser (Debian's chromium):

    .venv/bin/python docs/screenshots.py          # writes docs/images/*.png (about two minutes on a CPU)

Runs a 6-trial `sweep=lr_batch` study (its best 2 confirmed with 2 other seeds) into a temporary MLflow store and
Optuna storage and its report, serves them with `mlflow ui` and `optuna-dashboard` on free loopback ports, and
photographs MLflow's comparison of the study's trials (the view its printed UI link opens), the parent run's page
(which names the best trial), the report in MLflow's artifact view, and the dashboard's page of the study.
Nothing here is drawn by hand."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(argv: list[str], url: str, log: Path) -> subprocess.Popen:
    """A server started in its own process group, once `url` answers (within two minutes)."""
    proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    stop(proc)
    raise SystemExit(f"{argv[0]} did not answer at {url}: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the workers it started: this script's
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def shoot(url: str, path: Path, size: str = "1400,900", budget_ms: int = 25000) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("screenshots need Debian's chromium (apt-get install chromium)")
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={size}", f"--virtual-time-budget={budget_ms}", f"--screenshot={path}", url],
                   check=True, capture_output=True, timeout=180)
    print(f"{path.relative_to(ROOT)} ({path.stat().st_size // 1024} KB) from {url}")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="xp-shots-"))
    store, storage = f"sqlite:///{work}/mlflow.db", f"sqlite:///{work}/optuna.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": store, "XP_OPTUNA_STORAGE": storage}
    servers: list[subprocess.Popen] = []
    try:
        subprocess.run([sys.executable, "-m", "xp", "-m", "sweep=lr_batch", "sweep.n_trials=6", "epochs=3",
                        "sweep.confirm=2", "sweep.confirm_top=2", f"hydra.sweep.dir={work}/sweep"], cwd=ROOT, env=env,
                       check=True, timeout=900)
        from xp.tracking.stores import open_client

        client = open_client(store)
        exp = client.get_experiment_by_name("xp")
        parent = client.search_runs([exp.experiment_id], "tags.`xp.sweep` = 'true'")[0].info.run_id
        subprocess.run([sys.executable, "-m", "xp.report", "--parent", parent, "--out", str(work / "report")],
                       cwd=ROOT, env=env, check=True, timeout=600)
        ui, dash = free_port(), free_port()
        servers.append(serve([str(BIN / "mlflow"), "ui", "--backend-store-uri", store, "--host", "127.0.0.1",
                              "--port", str(ui)], f"http://127.0.0.1:{ui}/", work / "ui.log"))
        servers.append(serve([str(BIN / "optuna-dashboard"), storage, "--host", "127.0.0.1", "--port", str(dash)],
                             f"http://127.0.0.1:{dash}/", work / "dashboard.log"))
        IMAGES.mkdir(exist_ok=True)
        from xp.readback import view

        # the link the study printed: its trials, lr, batch and momentum against val_accuracy (xp.readback.view)
        shoot(f"http://127.0.0.1:{ui}/{view.page(exp.experiment_id, f'xp-{parent}')}", IMAGES / "mlflow-compare.png",
              "1900,1100", budget_ms=60000)
        run = f"http://127.0.0.1:{ui}/#/experiments/{exp.experiment_id}/runs/{parent}"
        shoot(f"{run}?workflowType=machine_learning", IMAGES / "mlflow-parent.png", "1600,1500",
              budget_ms=40000)  # (the page the study's last line links) its description: the best trial
        shoot(f"{run}/artifacts/report/report.html?workflowType=machine_learning", IMAGES / "mlflow-report.png",
              "1600,1800", budget_ms=40000)
        shoot(f"http://127.0.0.1:{dash}/dashboard/studies/1", IMAGES / "optuna-dashboard.png", "1400,1000")
    finally:
        for proc in servers:
            stop(proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
