"""The architecture the code promises: layers point one way (CLI -> flows -> tasks ->
engine), and the engine (federated, aggregation, models) imports neither the shell nor
Prefect nor MLflow. The contracts live in pyproject.toml ([tool.importlinter])."""

import subprocess
import sys
from pathlib import Path

from tests.limits import limit

REPO = Path(__file__).resolve().parents[1]


def test_the_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")

    result = subprocess.run(
        [str(lint), "--no-cache", "--no-logo"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=limit(300),
    )

    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "3 kept, 0 broken" in result.stdout


LIBRARIES = ("torch", "prefect", "mlflow")
# the one module allowed private torch names, and why: its docstring and README
PRIVATE_ALLOWED = {REPO / "federated" / "foreach_sgd.py"}
PACKAGES = (
    "fedsieve", "flows", "tasks", "config", "federated", "aggregation", "models", "registry",
    "flowerapp",
    "benchmarks", "scripts",
)  # fmt: skip


def private_uses(path: Path) -> list[str]:
    """Imports or attributes of torch, Prefect or MLflow whose name starts with ``_``
    (dunders such as ``__version__`` are public)."""
    import ast

    def private(name: str) -> bool:
        return any(part.startswith("_") and not part.endswith("__") for part in name.split("."))

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(LIBRARIES):
            names = [node.module or "", *(alias.name for alias in node.names)]
            found += [f"{path}:{node.lineno}" for name in names if private(name)][:1]
        elif isinstance(node, ast.Import):
            found += [
                f"{path}:{node.lineno}"
                for alias in node.names
                if alias.name.startswith(LIBRARIES) and private(alias.name)
            ]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in LIBRARIES
            and private(node.attr)
        ):
            found.append(f"{path}:{node.lineno}")
    return found


def test_no_private_name_of_torch_prefect_or_mlflow_is_used_outside_its_one_module():
    sources = [
        path
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if not any(part.startswith(".venv") for part in path.parts) and path not in PRIVATE_ALLOWED
    ]

    used = [hit for path in sources for hit in private_uses(path)]

    assert not used, used


def test_the_one_module_with_private_names_uses_only_the_foreach_kernels():
    import ast

    from federated.foreach_sgd import FOREACH_KERNELS

    [module] = PRIVATE_ALLOWED
    used = {
        node.attr
        for node in ast.walk(ast.parse(module.read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
        and node.attr.startswith("_")
    }

    assert used and used <= set(FOREACH_KERNELS), used


ENGINE_AND_SHELL = ("federated", "aggregation", "models", "registry", "config", "tasks", "flows")


def private_project_imports(path: Path) -> list[str]:
    """``from <project package> import _name`` (or ``import x._y``): what a benchmark may
    not rely on, since only the public APIs are kept stable."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
            ENGINE_AND_SHELL
        ):
            names = [*(node.module or "").split("."), *(alias.name for alias in node.names)]
            if any(name.startswith("_") and not name.endswith("__") for name in names):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_benchmarks_use_only_the_public_engine_and_tasks_apis():
    sources = [p for p in (REPO / "benchmarks").rglob("*.py") if ".venv" not in str(p)]

    used = [hit for path in sources for hit in private_project_imports(path)]

    assert sources and not used, used


def test_ruff_keeps_the_code_clean_and_functions_within_their_size_limits():
    """ruff's lint rules (pyproject.toml), with pylint's PLR0913 / PLR0915 size limits."""
    ruff = Path(sys.executable).with_name("ruff")

    checked = subprocess.run(
        [str(ruff), "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True
    )
    formatted = subprocess.run(
        [str(ruff), "format", "--check", "--no-cache", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
    )

    assert checked.returncode == 0, checked.stdout[-4000:]
    assert formatted.returncode == 0, formatted.stdout[-4000:]


def test_the_round_keeps_its_order_of_events_and_hands_each_step_to_a_part():
    """Federation is the round's order of events (issue 45): its steps live in parts of
    their own (scorer, screen, defence, trail), so the module stays short and no method
    grows into a second round."""
    import ast

    server = REPO / "federated" / "server.py"
    tree = ast.parse(server.read_text())
    federation = next(
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Federation"
    )
    lengths = {
        node.name: node.end_lineno - node.lineno + 1
        for node in federation.body
        if isinstance(node, ast.FunctionDef)
    }

    assert len(server.read_text().splitlines()) <= 400
    assert max(lengths.values()) <= 40, lengths
