"""Check that the MLflow UI shows the project's experiment, its runs, and a run's data and
per-site table, in a real browser.

Starts ``mlflow server`` on a free loopback port against the project's store (default:
``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``), asks its REST API (the one the UI
calls) for the experiment and its runs, then renders pages in headless Chromium
(``--dump-dom`` after a virtual-time budget, so the React app has fetched and drawn them)
and saves screenshots:
- the experiment's "Training runs" page: its name, every expected run name and the
  matching-runs count;
- the newest run with dataset inputs (or ``--run NAME``): every dataset input's name and
  digest on the run's page, and, when the run logged the per-site table ``sites.json``,
  its header and every site on the artifact view.

    python scripts/check_mlflow_ui.py [--backend-store-uri URI] [--experiment fedsieve]
                                      [--out DIR] [--runs N] [--run NAME]

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,900",
]
# telemetry off, and no job runner (MLflow's GenAI jobs, which the UI check does not need)
SERVER_ENV = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
}


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


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def _post(url: str, body: dict[str, object]) -> dict[str, Any]:
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
            env={**os.environ, **SERVER_ENV},
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
    run_name: str | None = None,
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
            run = chosen_run(listed, run_name)
            run_shown = (
                check_run(
                    url,
                    experiment_id,
                    run,
                    out,
                    lambda page, shot: render(
                        chromium, page, shot, Path(scratch) / "profile", budget_ms
                    ),
                )
                if run is not None
                else {}
            )
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
    report.shown |= run_shown
    return report


def chosen_run(listed: list[dict[str, Any]], name: str | None) -> dict[str, Any] | None:
    """The run named ``name`` (bad input if absent), else the newest with dataset inputs."""
    if name is not None:
        named = [run for run in listed if run["info"].get("run_name") == name]
        if not named:
            raise CheckError(f"no run named {name!r} in the experiment")
        return named[0]
    return next((run for run in listed if run.get("inputs", {}).get("dataset_inputs")), None)


def check_run(
    url: str,
    experiment_id: str,
    run: dict[str, Any],
    out: Path,
    render_page: Callable[[str, Path], str],
) -> dict[str, bool]:
    """What the run's page and its per-site table's artifact view show."""
    run_id, name = run["info"]["run_id"], run["info"].get("run_name", "")
    runs_page = f"{url}/#/experiments/{experiment_id}/runs"
    shown: dict[str, bool] = {}
    text = page_text(render_page(f"{runs_page}/{run_id}", out / "mlflow-run.png"))
    # the run page shows one dataset input as "name (digest) context" and the rest as "+N"
    labels = [
        f"{item['dataset']['name']} ({item['dataset']['digest'][:8]}"
        for item in run.get("inputs", {}).get("dataset_inputs", [])
    ]
    if labels:
        more = f" +{len(labels) - 1}" if len(labels) > 1 else ""
        shown[f"run {name!r}: its {len(labels)} dataset inputs shown"] = any(
            re.search(rf"{re.escape(label)}[^)]*\) \S+{re.escape(more)}", text) for label in labels
        )
    artifacts = _get(f"{url}/ajax-api/2.0/mlflow/artifacts/list?run_id={run_id}")
    if any(entry["path"] == "sites.json" for entry in artifacts.get("files", [])):
        table = _get(f"{url}/get-artifact?path=sites.json&run_uuid={run_id}")
        text = page_text(
            render_page(f"{runs_page}/{run_id}/artifacts/sites.json", out / "mlflow-sites.png")
        )
        header = " ".join(table["columns"])
        shown[f"run {name!r}: per-site table header ({header}) shown"] = header in text
        body = text.split(header, 1)[-1]
        shown[f"run {name!r}: all {len(table['data'])} sites in the table"] = all(
            f" {row[0]} {row[1]} " in f" {body} "
            for row in table["data"]  # site, images
        )
    return shown


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
    parser.add_argument(
        "--run", help="check this run's page (default: the newest run with dataset inputs)"
    )
    parser.add_argument("--chromium", help="browser binary (default: chromium on PATH)")
    args = parser.parse_args(argv)
    chromium = find_chromium(args.chromium)
    try:
        if chromium is None:
            raise CheckError("no chromium binary found (apt-get install -y chromium)")
        report = check(
            args.backend_store_uri,
            args.experiment,
            args.out,
            chromium=chromium,
            runs=args.runs,
            run_name=args.run,
        )
    except CheckError as error:
        print(f"check_mlflow_ui: error: {error}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    print("verified" if report.ok else "NOT verified: the UI did not show what the store holds")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
