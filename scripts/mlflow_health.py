"""The MLflow server's health probe in the compose stack: healthy only when it answers a
request that reads its backend store (MLflow's own ``/health`` answers while PostgreSQL
is away). Logs in as the admin the container's environment names (basic-auth app).

    python scripts/mlflow_health.py [URL, default http://127.0.0.1:5000]   # exit 0 or 1

The request waits ``FEDSIEVE_HEALTH_TIMEOUT`` seconds (default 5, the compose probe's own
timeout) before it counts as a failure.
"""

from __future__ import annotations

import base64
import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:5000"
    user = os.environ.get("MLFLOW_AUTH_ADMIN_USERNAME", "")
    password = os.environ.get("MLFLOW_AUTH_ADMIN_PASSWORD", "")
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/search?max_results=1")
    if user:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        timeout = float(os.environ.get("FEDSIEVE_HEALTH_TIMEOUT", "5"))
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, TimeoutError) as error:
        print(f"mlflow unhealthy: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
