"""Every DVC stage lists the params it reads and depends on the code it runs, derived from
the code rather than from a list kept beside dvc.yaml.

Params: each stage's flow (``fedsieve <stage>`` runs ``flows/<stage>.py``'s
``<stage>_flow``) is read with ``ast``, and so is every project function it reaches (by
name, called or passed as a callback). In each of them, a parameter annotated ``Params``
(or a section model, ``DataParams``, ...) is a root, and every attribute chain from a root
is a read: ``params.partition.root_size`` reads ``partition.root_size``; a section read
whole (``params.partition.model_dump()``, a list or registry-entry section such as
``filters`` or ``aggregate``, a section passed somewhere that is not a function annotated
to take it) reads the whole section; a section method (``partitioner_params``) is followed
with ``self`` bound to the section. A whole ``Params`` dumped (``grid_cells``' copies)
reads everything, except in :data:`BOOKKEEPING`. The preflight check the CLI runs before
every stage is not a stage's read: it writes nothing and only stops a stage that cannot
run.

Why static rather than a recording proxy around a live ``Params``: a run reads only what
its branches take (``partition.root_size`` only under a rule that needs root data, the
privacy keys only with privacy on), so a recording would need every branch exercised and
would pass vacuously for a branch nobody ran; reading the code sees every branch, and
costs no training. Its limit is reads the analysis cannot see (``getattr`` with a computed
name, a ``Params`` kept in an unannotated attribute): those count as reading everything
when the root itself is handed over, and :func:`test_the_analysis_finds_every_kind_of_read`
holds the analysis to each kind of read it claims to see, so a broken analysis fails rather
than passes.

Deps: the project modules a stage's flow imports (at module level or inside a function,
and ``importlib.import_module(f"aggregation.{...}")``'s family), following imports
everywhere except out of ``config.params``: its imports of the registries serve the name
checks at the entry point (``config.assembly``, which builds the engine's parts, is
followed). ``config/environment.py`` is added: every stage's entry
configures the process with it (its numerics among others). A dep folder must hold only
modules the stage imports (otherwise its files are listed), and no stage depends on the
CLI (``fedsieve/``).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from config.params import Params

REPO = Path(__file__).resolve().parents[1]
PACKAGES = (
    "config",
    "federated",
    "aggregation",
    "models",
    "registry",
    "tasks",
    "flows",
    "fedsieve",
    "flowerapp",
)
PIPELINES = (
    "dvc.yaml",
    "experiments/compare/dvc.yaml",
    "experiments/fedstnn/dvc.yaml",
    "experiments/adrenalmnist3d/dvc.yaml",
)
FLOWS = {"run": "flows.pipeline:pipeline_flow"}  # a command whose flow is not its namesake

# Whole-Params dumps that are records of the run, not inputs to its outputs: the params
# hash (the checkpoint's key, run.json's and the MLflow run's tag) and MLflow's logged
# params. A stage re-run for a param it does not otherwise read would change neither.
BOOKKEEPING = {
    "config.params:params_hash": "the params hash keys the checkpoint and tags the run",
    "tasks.tracking:open_training_run": "every param logged to the MLflow run as a record",
    "flowerapp.hub:write_params": "the params handed to the hub's ServerApp, which "
    "builds its federation with the builders the simulated run uses (config.assembly)",
}
# Read, and deliberately not listed: where the data file is and whether it may be fetched.
# What is read from it is pinned by data.dataset and data.size (the file is md5-checked).
NOT_RESULTS = {
    "data.root": "where the md5-checked file lies (MEDMNIST_ROOT overrides it)",
    "data.download": "whether a missing file may be fetched; the file is md5-checked",
}


# --- the program: modules, names, functions ---------------------------------------------


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef] = field(
        default_factory=dict
    )
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted target


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class Program:
    """The project's modules parsed, with name resolution across their imports."""

    def __init__(self, sources: dict[str, tuple[Path, str]]) -> None:
        self.modules: dict[str, Module] = {}
        for name, (path, text) in sources.items():
            module = Module(name, path, ast.parse(text))
            for node in module.tree.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    module.defs[node.name] = node
            for node in module.tree.body:  # `name = task(...)(function)`: the function
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    wrapped = [
                        module.defs[n.id]
                        for n in ast.walk(node.value)
                        if isinstance(n, ast.Name) and n.id in module.defs
                    ]
                    for target in node.targets:
                        if wrapped and isinstance(target, ast.Name):
                            module.defs.setdefault(target.id, wrapped[0])
            for node in ast.walk(module.tree):
                module.imports |= self._bindings(module, node)
            self.modules[name] = module

    @classmethod
    def of_repository(cls, root: Path = REPO) -> Program:
        return cls(
            {
                module_name(path, root): (path, path.read_text())
                for package in PACKAGES
                for path in sorted((root / package).rglob("*.py"))
            }
        )

    def _bindings(self, module: Module, node: ast.AST) -> dict[str, str]:
        if isinstance(node, ast.Import):
            return {
                alias.asname or alias.name.split(".")[0]: alias.name
                if alias.asname
                else alias.name.split(".")[0]
                for alias in node.names
            }
        if isinstance(node, ast.ImportFrom):
            base = self._absolute(module, node)
            return {alias.asname or alias.name: f"{base}.{alias.name}" for alias in node.names}
        return {}

    @staticmethod
    def _absolute(module: Module, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = module.name.split(".")
        if module.path.name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        return ".".join([*package, *([node.module] if node.module else [])])

    def resolve(self, module: str, name: str, seen: frozenset[str] = frozenset()) -> str | None:
        """``"pkg.mod"`` (a module), ``"pkg.mod:name"`` (its top-level def) or None."""
        if (module, name) in seen or module not in self.modules:
            return None
        seen = seen | {(module, name)}
        here = self.modules[module]
        if name in here.defs:
            return f"{module}:{name}"
        target = here.imports.get(name)
        if target is None:
            return None
        if target in self.modules:
            return target
        owner, _, attr = target.rpartition(".")
        return self.resolve(owner, attr, seen) if owner in self.modules else None

    def resolve_expr(self, module: str, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.resolve(module, node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve_expr(module, node.value)
            if base is None:
                return None
            if ":" not in base:  # a module: a submodule or one of its names
                sub = f"{base}.{node.attr}"
                return sub if sub in self.modules else self.resolve(base, node.attr)
            owner, _, name = base.partition(":")
            node_def = self.modules[owner].defs.get(name)
            if isinstance(node_def, ast.ClassDef) and self.method(base, node.attr):
                return f"{base}.{node.attr}"
        return None

    def definition(self, qualname: str) -> ast.AST | None:
        """The def of ``"mod:func"``, ``"mod:Class"`` or ``"mod:Class.method"``."""
        module, _, name = qualname.partition(":")
        top, _, method = name.partition(".")
        node = self.modules[module].defs.get(top) if module in self.modules else None
        return self.method(f"{module}:{top}", method) if method else node

    def method(self, class_qualname: str, name: str) -> ast.FunctionDef | None:
        cls = self.definition(class_qualname)
        if not isinstance(cls, ast.ClassDef):
            return None
        for node in cls.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return node
        return None


# --- which params a stage reads -----------------------------------------------------------


@dataclass(frozen=True)
class Schema:
    """Params' sections: keyed (a model of fixed fields, read key by key) or whole."""

    keyed: dict[str, tuple[str, ...]]  # section -> its keys
    whole: tuple[str, ...]
    classes: dict[str, str]  # model class name -> section

    @classmethod
    def of(cls, params: type[BaseModel] = Params) -> Schema:
        keyed, whole, classes = {}, [], {}
        for name, info in params.model_fields.items():
            model = _model_in(info.annotation)
            if model is not None:
                classes[model.__name__] = name
            if model is not None and model.model_config.get("extra") == "forbid":
                keyed[name] = tuple(model.model_fields)
            else:
                whole.append(name)
        return cls(keyed, tuple(whole), classes | {params.__name__: ""})

    @property
    def sections(self) -> tuple[str, ...]:
        return (*self.keyed, *self.whole)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):  # list[FilterParams], X | None
        if (model := _model_in(arg)) is not None:
            return model
    return None


def _annotation_names(node: ast.expr | None) -> set[str]:
    """Class names an annotation mentions: ``Params``, ``"Params"``, ``Params | None``."""
    if node is None:
        return set()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _annotation_names(ast.parse(node.value, mode="eval").body)
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.BinOp):
        return _annotation_names(node.left) | _annotation_names(node.right)
    return set()


def _arguments(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    args = fn.args
    return [*args.posonlyargs, *args.args, *args.kwonlyargs]


@dataclass(frozen=True)
class Job:
    qualname: str
    roots: tuple[tuple[str, str], ...] = ()  # extra roots: ("self", "partition")


class Reads(ast.NodeVisitor):
    """The params one function reads: dotted paths, ``"*"`` for the whole of Params."""

    def __init__(self, program: Program, schema: Schema, module: str, fn: ast.AST, job: Job):
        self.program, self.schema, self.module = program, schema, module
        self.found: set[str] = set()
        self.reached: set[Job] = set()
        self.parents = {c: p for p in ast.walk(fn) for c in ast.iter_child_nodes(p)}
        self.roots = dict(job.roots)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in _arguments(fn):
                for name in _annotation_names(arg.annotation):
                    if name in schema.classes:
                        self.roots[arg.arg] = schema.classes[name]
        self._aliases(fn)

    def _aliases(self, fn: ast.AST) -> None:
        """``train = params.train``, ``a, b = params.x, params.y``: names for sections."""
        changed = True
        while changed:
            changed = False
            for node in ast.walk(fn):
                pairs = []
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value = node.targets[0], node.value
                    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                        pairs = list(zip(target.elts, value.elts, strict=False))
                    else:
                        pairs = [(target, value)]
                for target, value in pairs:
                    path = self._section_path(value)
                    named = isinstance(target, ast.Name) and path is not None
                    if named and self.roots.get(target.id) != path:
                        self.roots[target.id] = path
                        changed = True

    def _chain(self, node: ast.expr) -> tuple[str, list[str]] | None:
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.roots:
            path = [p for p in self.roots[node.id].split(".") if p]
            return node.id, path + attrs[::-1]
        return None

    def _section_path(self, node: ast.expr) -> str | None:
        """The dotted path of a chain that ends at Params itself or a keyed section."""
        chain = self._chain(node)
        if chain is None:
            return None
        tokens = chain[1]
        if not tokens or (len(tokens) == 1 and tokens[0] in self.schema.keyed):
            return ".".join(tokens)
        return None

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for child in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if child is not None:
                self.visit(child)
        for statement in node.body:  # annotations name types, not code that runs
            self.visit(statement)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if self._chain(node) is None:
            self._reference(node)
            self.generic_visit(node)
            return
        if isinstance(self.parents.get(node), ast.Attribute):
            return  # the outermost attribute of the chain speaks for it
        self._read(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.roots and not isinstance(self.parents.get(node), ast.Attribute):
            self._read(node)
        else:
            self._reference(node)

    def _reference(self, node: ast.expr) -> None:
        """A project function or class named here is reached (called or handed over)."""
        target = self.program.resolve_expr(self.module, node)
        if target is None or ":" not in target:
            return
        definition = self.program.definition(target)
        if target.startswith("config.params:") and isinstance(definition, ast.ClassDef):
            return  # a params model: its validators ran at the entry point
        if isinstance(definition, ast.ClassDef):
            for item in definition.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    self.reached.add(Job(f"{target}.{item.name}"))
        elif definition is not None:
            self.reached.add(Job(target))

    def _read(self, node: ast.expr) -> None:
        _, tokens = self._chain(node)  # type: ignore[misc]
        schema = self.schema
        if not tokens or (len(tokens) == 1 and tokens[0] in schema.keyed):
            if not self._handed_over(node, ".".join(tokens)):
                self.found.add(tokens[0] if tokens else "*")
            return
        section = tokens[0]
        if section not in schema.sections:  # a method of Params: a dump, or one of ours
            self._method_or_whole(section, "", "*")
        elif section in schema.whole:
            self.found.add(section)
        elif tokens[1] in schema.keyed[section]:
            self.found.add(f"{section}.{tokens[1]}")
        else:
            self._method_or_whole(tokens[1], section, section)

    def _method_or_whole(self, name: str, path: str, whole: str) -> None:
        model = next((c for c, s in self.schema.classes.items() if s == path), None)
        qualname = f"config.params:{model}"
        if model is not None and self.program.method(qualname, name) is not None:
            self.reached.add(Job(f"{qualname}.{name}", (("self", path),)))
        else:
            self.found.add(whole)

    def _handed_over(self, node: ast.expr, path: str) -> bool:
        """Passed to a project function annotated to take it (it reads for itself), or
        named (``train = params.train``): not a read here."""
        parent = self.parents.get(node)
        if isinstance(parent, ast.Assign | ast.Tuple) and self._assigned_to_name(node, parent):
            return True
        if isinstance(parent, ast.keyword):
            call, keyword = self.parents.get(parent), parent.arg
        else:
            call, keyword = parent, None
        if not isinstance(call, ast.Call) or node is call.func:
            return False
        target = self.program.resolve_expr(self.module, call.func)
        callee = self.program.definition(target) if target and ":" in target else None
        if not isinstance(callee, ast.FunctionDef | ast.AsyncFunctionDef):
            return False
        arguments = _arguments(callee)
        if keyword is not None:
            matching = [a for a in arguments if a.arg == keyword]
        else:
            position = call.args.index(node) if node in call.args else -1
            positional = [*callee.args.posonlyargs, *callee.args.args]
            matching = positional[position : position + 1] if position >= 0 else []
        expected = {c for c, s in self.schema.classes.items() if s == path}
        return bool(matching) and bool(_annotation_names(matching[0].annotation) & expected)

    def _assigned_to_name(self, node: ast.expr, parent: ast.AST) -> bool:
        if isinstance(parent, ast.Tuple):
            parent = self.parents.get(parent)
        return isinstance(parent, ast.Assign) and all(
            isinstance(t, ast.Name | ast.Tuple) for t in parent.targets
        )


def stage_reads(program: Program, entry: str, schema: Schema | None = None) -> set[str]:
    """Every params path the function ``entry`` (``"flows.train:train_flow"``) and what it
    reaches read; whole-Params dumps in :data:`BOOKKEEPING` left out."""
    schema = schema or Schema.of()
    todo, done, found = [Job(entry)], set(), set()
    while todo:
        job = todo.pop()
        if job in done:
            continue
        done.add(job)
        fn = program.definition(job.qualname)
        if fn is None:
            continue
        reads = Reads(program, schema, job.qualname.partition(":")[0], fn, job)
        reads.visit(fn)
        found |= reads.found - ({"*"} if job.qualname in BOOKKEEPING else set())
        todo.extend(reads.reached - done)
    return found


# --- which code a stage imports ---------------------------------------------------------


def _imported(program: Program, name: str) -> set[str]:
    module = program.modules[name]
    found: set[str] = set()
    for target in module.imports.values():
        parts = target.split(".")
        found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(program.modules)
    for node in ast.walk(module.tree):  # importlib.import_module(f"aggregation.{name}")
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.JoinedStr) and isinstance(first.values[0], ast.Constant):
                prefix = str(first.values[0].value)
                found |= {m for m in program.modules if m.startswith(prefix)}
    return found


def stage_modules(program: Program, flow_module: str) -> set[str]:
    """The project modules ``flow_module`` imports, transitively; config.params' imports
    out of config not followed; config.environment added (every stage's entry runs it)."""
    todo, seen = [flow_module, "config.environment"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        imported = _imported(program, name)
        if name == "config.params":
            imported = {m for m in imported if m.split(".")[0] == "config"}
        todo.extend(imported - seen)
    return seen


def trivial(module: Module) -> bool:
    """A package ``__init__`` with a docstring and ``__all__`` only: no code to depend on."""
    return module.path.name == "__init__.py" and all(
        (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        or isinstance(node, ast.Assign | ast.AnnAssign)
        or (isinstance(node, ast.ImportFrom) and node.module == "__future__")
        for node in module.tree.body
    )


# --- dvc.yaml -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    pipeline: str
    name: str
    command: str
    params: tuple[str, ...]
    deps: tuple[str, ...]  # relative to the repository, whatever the stage's wdir
    params_file: Path = REPO / "params.yaml"

    @property
    def flow(self) -> str:  # `fedsieve train --resume` -> flows.train:train_flow
        command = self.command.split()[1]
        return FLOWS.get(command, f"flows.{command}:{command}_flow")


def stages() -> Iterator[Stage]:
    for pipeline in PIPELINES:
        for name, stage in yaml.safe_load((REPO / pipeline).read_text())["stages"].items():
            stage = stage.get("do", stage)  # foreach: one template
            wdir = (REPO / pipeline).parent / stage.get("wdir", ".")
            params = []
            for item in stage.get("params", []):
                if isinstance(item, str):
                    params.append(item)
                elif "params.yaml" in item:  # `params.yaml:` alone: every param in it
                    params.extend(item["params.yaml"] or Schema.of().sections)
            deps = tuple(
                Path(os.path.relpath(os.path.normpath(wdir / dep), REPO)).as_posix()
                for dep in stage.get("deps", [])
            )
            yield Stage(pipeline, name, stage["cmd"], tuple(params), deps, wdir / "params.yaml")


PARAMS_STAGES = [s for s in stages() if s.params and "${" not in s.command]
ALL_STAGES = list(stages())


def unlisted(read: set[str], listed: set[str], schema: Schema) -> set[str]:
    """Reads no listed param covers (a section is covered by itself or all its keys)."""
    missing = set()
    for path in read:
        if path == "*":
            missing |= unlisted(set(schema.sections), listed, schema)
            continue
        section = path.split(".")[0]
        keys = {f"{section}.{k}" for k in schema.keyed.get(section, ())} - set(NOT_RESULTS)
        if path in NOT_RESULTS or path in listed or section in listed:
            continue
        if path == section and keys and keys <= listed:
            continue
        missing.add(path)
    return missing


def present_in(params_file: Path) -> set[str]:
    """The dotted paths params.yaml holds: its sections and their keys."""
    tree = yaml.safe_load(params_file.read_text()) or {}
    return set(tree) | {
        f"{name}.{key}" for name, value in tree.items() if isinstance(value, dict) for key in value
    }


def too_wide(read: set[str], listed: set[str], schema: Schema, present: set[str]) -> set[str]:
    """Sections listed whole that the stage reads only some keys of, all of them keys
    params.yaml holds (so they could be listed one by one)."""
    wide = set()
    for section in listed & set(schema.keyed):
        keys = {f"{section}.{k}" for k in schema.keyed[section]} - set(NOT_RESULTS)
        taken = {r for r in read if r.startswith(f"{section}.")}
        if section in read or "*" in read or keys <= taken:
            continue
        if taken <= present:
            wide.add(section)
    return wide


def unread(read: set[str], listed: set[str]) -> set[str]:
    """Listed params the stage never reads."""
    return {
        path
        for path in listed
        if not (
            path in read
            or "*" in read
            or path.split(".")[0] in read
            or any(r.startswith(f"{path}.") for r in read)
        )
    }


# --- the tests ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def program() -> Program:
    return Program.of_repository()


@pytest.mark.parametrize("stage", PARAMS_STAGES, ids=lambda s: f"{s.pipeline}:{s.name}")
def test_a_stage_lists_the_params_it_reads_and_no_other(program, stage):
    schema = Schema.of()
    present = present_in(stage.params_file)

    read = stage_reads(program, stage.flow, schema)

    assert program.definition(stage.flow) is not None, f"{stage.flow} not found"
    assert not unlisted(read, set(stage.params), schema), (
        f"{stage.pipeline}: stage {stage.name} reads, and does not list under params: "
        f"{sorted(unlisted(read, set(stage.params), schema))}"
    )
    assert not unread(read, set(stage.params)), (
        f"{stage.pipeline}: stage {stage.name} lists params it never reads: "
        f"{sorted(unread(read, set(stage.params)))}"
    )
    assert not too_wide(read, set(stage.params), schema, present), (
        f"{stage.pipeline}: stage {stage.name} lists whole sections it reads a few keys of "
        f"(list those keys): {sorted(too_wide(read, set(stage.params), schema, present))}"
    )
    assert set(stage.params) <= present, (
        f"{stage.pipeline}: stage {stage.name} lists params missing from params.yaml, which "
        f"DVC refuses (add them there): {sorted(set(stage.params) - present)}"
    )


@pytest.mark.parametrize("stage", ALL_STAGES, ids=lambda s: f"{s.pipeline}:{s.name}")
def test_a_stage_depends_on_the_code_it_runs_and_no_other(program, stage):
    flow_module = stage.flow.partition(":")[0]
    imported = stage_modules(program, flow_module)
    code = [d for d in stage.deps if d.split("/")[0] in PACKAGES]

    files = {
        program.modules[m].path.relative_to(REPO).as_posix()
        for m in imported
        if not trivial(program.modules[m])
    }
    uncovered = {f for f in files if not any(f == d or f.startswith(f"{d}/") for d in code)}
    foreign = {
        d: sorted(
            path.relative_to(REPO).as_posix()
            for path in ([REPO / d] if d.endswith(".py") else sorted((REPO / d).rglob("*.py")))
            if module_name(path, REPO) not in imported
            and not trivial(program.modules[module_name(path, REPO)])
        )
        for d in code
    }

    assert not [d for d in code if d.split("/")[0] == "fedsieve"], "the CLI is not a stage's code"
    assert not uncovered, f"{stage.pipeline}: stage {stage.name} runs {sorted(uncovered)}"
    assert not any(foreign.values()), (
        f"{stage.pipeline}: stage {stage.name} depends on code it never imports: "
        f"{ {d: f for d, f in foreign.items() if f} }"
    )


SYNTHETIC = {
    "config.params": """
class _Section: ...
class DataParams(_Section): ...
class PartitionParams(_Section):
    def partitioner_params(self):
        return self.model_dump()
class Params(_Section): ...
def params_hash(params: Params) -> str:
    return str(params.model_dump())
""",
    "tasks.work": """
from config.params import DataParams, Params, params_hash

def load(data: DataParams) -> None:
    return data.dataset

def keyed(params: Params) -> None:
    seed, train = params.seed, params.train
    return train.lr, load(params.data), params.partition.partitioner_params(), params_hash(params)

def whole_section(params: Params) -> None:
    return [f.name for f in params.filters], params.eval.model_dump()

def unknown(params: Params) -> None:
    return json.dumps(params.pretest), getattr(params, "tracking")

def callback(params: Params) -> None:
    return params.noniid.z

def _privacy(params: Params) -> None:
    return params.privacy.mode

wrapped = task(name="privacy")(_privacy)
""",
    "flows.work": """
from tasks import work
from tasks.work import keyed, whole_section

def flow(params: Params) -> None:
    keyed(params)
    whole_section(params)
    work.wrapped(params)
    return run(work.callback)

def other(params: Params) -> None:
    work.unknown(params)
""",
}


def test_the_analysis_finds_every_kind_of_read():
    from pydantic import ConfigDict

    class Section(BaseModel):
        model_config = ConfigDict(extra="forbid")

    class Train(Section):
        lr: float = 0.1
        momentum: float = 0.9

    class Tiny(Section):
        seed: int = 0
        data: str = "breastmnist"
        train: Train = Train()

    schema = Schema.of(Params)
    tiny = Schema.of(Tiny)
    program = Program(
        {name: (Path(f"/{name.replace('.', '/')}.py"), text) for name, text in SYNTHETIC.items()}
    )

    found = stage_reads(program, "flows.work:flow", schema)
    everything = stage_reads(program, "flows.work:other", schema)

    assert found == {
        "seed", "train.lr", "data.dataset", "partition", "filters", "eval", "noniid.z",
        "privacy.mode",
    }  # fmt: skip
    assert everything == {"pretest", "*"}  # a section and the root handed to the unknown
    assert tiny.keyed == {"train": ("lr", "momentum")} and tiny.whole == ("seed", "data")
    assert unlisted({"*"}, {"seed", "data", "train.lr"}, tiny) == {"train"}
    assert unread({"train.lr"}, {"train.lr", "train.momentum", "train"}) == {"train.momentum"}
    assert too_wide({"train.lr"}, {"train"}, tiny, {"train.lr"}) == {"train"}
    assert too_wide({"train.lr"}, {"train"}, tiny, set()) == set()  # lr is optional
