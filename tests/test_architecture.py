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
    assert "5 kept, 0 broken" in result.stdout


def test_the_readmes_one_file_command_imports_our_benchmarks_not_dvcs():
    """dvc ships a top-level ``benchmarks`` package; `.venv/bin/pytest tests/PATH` (the
    README's one-file command) must still import the checkout's."""
    one_file = "tests/benchmarks/test_preregistration.py"

    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("pytest")),
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            one_file,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=limit(120),
    )

    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert f"{one_file}::" in result.stdout


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


def project_modules() -> dict[str, Path]:
    """Every module of the project's packages (the top-level folders with an
    ``__init__.py``) by dotted name; a package by its own name (its ``__init__``)."""
    packages = [p.parent for p in REPO.glob("*/__init__.py")]
    modules = {}
    for package in packages:
        for path in package.rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports, anywhere in it (inside a function too):
    ``import a.b``, ``from a import b`` (module ``a.b`` where it is one, else ``a``) and
    relative imports, resolved against the module's package."""
    import ast

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def nearest(dotted: str) -> str | None:  # the module itself, or the package holding it
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {nearest(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found.add(
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else nearest(base)
                )
    return found - {None, name}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted: modules that import each other, directly or not."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = lowest[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = lowest[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    lowest[node] = min(lowest[node], index[child])
                continue
            work.pop()
            if work:
                lowest[work[-1][0]] = min(lowest[work[-1][0]], lowest[node])
            if lowest[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, as the modules it passes
    (first and last the same): what a failure names."""
    start = component[0]
    came_from = {start: start}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            if start in graph[node]:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            for child in sorted(graph[node] & set(component)):
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    return component


def test_no_module_imports_one_that_imports_it_back():
    """No import circle, direct or through others, counting imports inside functions: a
    lazy import that only dodges a circle hides a dependency that points both ways (the
    types both sides share then belong in a module of their own)."""
    modules = project_modules()
    graph = {name: imported_modules(name, path, set(modules)) for name, path in modules.items()}

    cycles = [a_cycle(graph, component) for component in import_cycles(graph)]

    assert cycles == [], "import circles: " + "; ".join(" -> ".join(c) for c in cycles)
