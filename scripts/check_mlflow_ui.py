"""Check that the MLflow UI lists the project's experiment and its runs, in a real browser.

Starts ``mlflow server`` on a free loopback port against the project's store (default:
``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``), asks its REST API (the one the UI
calls) for the experiment and its runs, then renders the experiment's "Training runs" page
in headless Chromium (``--dump-dom`` after a virtual-time budget, so the React app has
fetched and drawn the runs) and saves a screenshot. The check passes when the rendered page
shows the experiment's name, every expected run name and the matching-runs count.

    python scripts/check_mlflow_ui.py [--backend-store-uri URI] [--experiment fedsieve]
                                      [--out DIR] [--runs N]

Exit codes: 0 verified, 1 the page did not show what the store holds, 2 bad input (no
Chromium, no store, no such experiment). The server is stopped (by PID) on the way out.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,900",
]
TELEMETRY_OFF = {"DO_NOT_TRACK": "true", "MLFLOW_DISABLE_TELEMETRY": "true"}


class CheckError(Exception):
    """Bad input (exit code 2)."""


@dataclass
class Report:
    url: str
    experiment: str
    expected_runs: list[str]
    total_runs: int
    screenshot: Path
    dom: Path
    shown: dict[str, bool] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.shown) and all(self.shown.values())

    def lines(self) -> list[str]:
        rows = [f"MLflow UI at {self.url}"]
        rows += [f"  {'ok  ' if seen else 'MISS'} {what}" for what, seen in self.shown.items()]
        rows += [f"  screenshot: {self.screenshot}", f"  rendered DOM: {self.dom}"]
        return rows


def find_chromium(explicit: str | None = None) -> str | None:
    for candidate in (explicit, "chromium", "chromium-browser", "google-chrome", "chrome"):
        if candidate and (path := shutil.which(candidate)):
            return path
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def start_server(store: str, port: int, artifacts: Path, log: Path) -> subprocess.Popen[bytes]:
    mlflow = Path(sys.executable).parent / "mlflow"
    command = [str(mlflow) if mlflow.exists() else "mlflow", "server"]
    command += ["--backend-store-uri", store, "--artifacts-destination", str(artifacts)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    with log.open("wb") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **TELEMETRY_OFF},
            start_new_session=True,  # its workers are stopped with it, as one group
        )


def stop_server(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlflow server exited:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"mlflow server at {url} not ready after {timeout:.0f} s")


def page_text(dom: str) -> str:
    """The visible text of a rendered page: scripts and styles dropped, tags removed."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


def render(chromium: str, url: str, screenshot: Path, profile: Path, budget_ms: int) -> str:
    command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    command += [f"--virtual-time-budget={budget_ms}", f"--screenshot={screenshot}", "--dump-dom"]
    done = subprocess.run(
        [*command, url], capture_output=True, text=True, timeout=budget_ms / 1000 + 120
    )
    if done.returncode != 0:
        raise RuntimeError(f"chromium failed ({done.returncode}): {done.stderr[-1500:]}")
    return done.stdout


def check(
    store: str,
    experiment: str,
    out: Path,
    *,
    chromium: str,
    runs: int = 10,
    timeout: float = 180,
    budget_ms: int = 15000,
) -> Report:
    if store.startswith("sqlite:///") and not Path(store.removeprefix("sqlite:///")).exists():
        raise CheckError(f"no MLflow store at {store.removeprefix('sqlite:///')}")
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="mlflow-ui-check-") as scratch:
        log = out / "mlflow-server.log"
        server = start_server(store, port, Path(scratch) / "artifacts", log)
        try:
            wait_ready(url, server, timeout, log)
            # What the UI will be asked for: the REST API under /ajax-api.
            api = f"{url}/ajax-api/2.0/mlflow"
            found = _post(
                f"{api}/experiments/search",
                {"max_results": 1000, "filter": f"name = '{experiment}'"},
            ).get("experiments", [])
            if not found:
                raise CheckError(f"no experiment named {experiment!r} in {store}")
            experiment_id = found[0]["experiment_id"]
            listed = _post(
                f"{api}/runs/search", {"experiment_ids": [experiment_id], "max_results": 1000}
            ).get("runs", [])
            names = [run["info"].get("run_name", "") for run in listed]
            expected = sorted({name for name in names[:runs] if name})
            page = f"{url}/#/experiments/{experiment_id}/runs"
            screenshot, dom_file = out / "mlflow-ui.png", out / "mlflow-ui.html"
            dom = render(chromium, page, screenshot, Path(scratch) / "profile", budget_ms)
            dom_file.write_text(dom)
        finally:
            stop_server(server)
    text = page_text(dom)
    report = Report(page, experiment, expected, len(listed), screenshot, dom_file)
    report.shown[f"experiment {experiment!r} shown"] = experiment in text
    for name in expected:
        report.shown[f"run {name!r} listed"] = (
            re.search(rf"(?<!\S){re.escape(name)}(?!\S)", text) is not None
        )
    report.shown[f"run count ({len(listed)} matching) shown"] = (
        f"{len(listed)} matching run" in text
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backend-store-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db",
        help="the store to serve (default: MLFLOW_TRACKING_URI or sqlite:///mlflow.db)",
    )
    parser.add_argument("--experiment", default="fedsieve")
    parser.add_argument("--out", type=Path, default=Path("reports/ui-check"))
    parser.add_argument("--runs", type=int, default=10, help="check the N newest runs' names")
    parser.add_argument("--chromium", help="browser binary (default: chromium on PATH)")
    args = parser.parse_args(argv)
    chromium = find_chromium(args.chromium)
    try:
        if chromium is None:
            raise CheckError("no chromium binary found (apt-get install -y chromium)")
        report = check(
            args.backend_store_uri, args.experiment, args.out, chromium=chromium, runs=args.runs
        )
    except CheckError as error:
        print(f"check_mlflow_ui: error: {error}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    print("verified" if report.ok else "NOT verified: the UI did not show what the store holds")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
