"""The seams ARCHITECTURE.md promises, checked over every package's source.

Three rules, read from the source with ``ast`` (nothing is imported, so a rule holds whatever is
installed):

- no import cycle between modules, counting imports inside functions (a function-local import is
  the usual way a cycle is hidden, not removed); imports under ``if TYPE_CHECKING:`` do not run and
  do not count;
- no module reaches into another folder's private parts: a ``_private`` module, a ``_private``
  name, or ``module._private`` on a module imported from elsewhere. A folder is the directory that
  holds the module; a parent and its child directories are different folders;
- no source file grows into a god object: one concept per module decides where code goes, and a
  module of 900 lines or more is a sign that several concepts share it;
- no two folders of a package import each other (counted at the package's first level of folders:
  ``x_runtime.process`` and everything below it is one folder here);
- the runtime reads its settings once: only ``ENVIRONMENT_READERS`` read ``os.environ`` (writing
  variables for libraries and child processes is not reading) or call a contract variable's
  ``read()``/``is_set()`` without a snapshot to read from;
- in a package with layers (``LAYERS``: x_runtime, x_bigmodel, x_launch, x_estimate), every module lives in a layer's
  folder and imports only from its own layer or the ones below it; the package's ``__init__`` and
  ``__main__`` sit above every layer and ``_version`` below.

The checker itself is tested on a small tree holding one of each fault, so a rule that silently
stopped finding anything would fail here too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p for p in (ROOT / "packages").iterdir() if (p / "src").is_dir())
# A guard against god objects, not a cap to cut modules by: one concept per module decides the size.
MAX_LINES = 900
# Bottom to top: a layer imports from itself and the layers before it, never after.
LAYERS: dict[str, tuple[str, ...]] = {
    "x_runtime": (
        "core",  # nested structures, unwrap, RNG state, configs: nothing of x_runtime below
        "io",  # atomic writes, free space, torch and safetensors files
        "process",
        "data",
        "precision",
        "optim",
        "memory",  # the memory guard: a step's measured peak beside x-estimate's plan
        "strategies",
        "checkpoint",
        "tracking",
        "accelerator",  # the facade and Accelerate's state views
        "launchers",
        "utils",  # Accelerate's accelerate.utils names, re-exported
        "provide",  # the served `accelerate` modules: tables naming the layers below (and x-bigmodel, x-launch)
        "integrations",  # callbacks for loops other libraries drive (transformers' Trainer)
    ),
    "x_bigmodel": ("devices", "planning", "files", "offload", "loading", "dispatch", "transformers"),
    "x_launch": (
        "migrate",  # x-launch migrate: Accelerate's imports and flags rewritten
        "config",  # launch settings: the config file, its schema, flags and the contract they become
        "stall",  # the stall watchdog and its report
        "engines",  # one class per way of starting ranks: python, torchrun, srun, xla
        "run",  # the job as it runs: the engine's child, rank output, failures, preemption
        "commands",  # config questionnaire, env, test, merge
        "cli",  # click commands and Accelerate's command names
    ),
    "x_estimate": (
        "model",  # what is estimated: the source, its skeleton on meta, its sizes and summary
        "cuda",  # the GPU's kernels and caching allocator, simulated
        "training",  # memory formulas of a training step, the peak
        "simulate",  # one step run on fake tensors under a ledger: rows, cache, error
        "report",  # the tables and texts printed
        "plan",  # --plan: the search over settings, its report and the config it writes
        "cli",  # the x-estimate command
    ),
}

# The modules of x_runtime that may read the environment, and why.
ENVIRONMENT_READERS = {
    "x_runtime.core.settings": "the snapshot: the one read of the launcher's settings",
    "x_runtime.core.environment": "Accelerate's patch_environment/clear_environment, which save and restore variables",
    "x_runtime.core.testing": "Accelerate's test helpers, which hand the environment to the processes they start",
}
# Calls on os.environ that only write (for libraries and child processes) or restore what was there.
_ENVIRON_WRITES = {"update", "pop", "clear", "setdefault", "__setitem__", "__delitem__"}


@dataclass(frozen=True)
class Import:
    importer: str  # module doing the import
    target: str  # module imported (a module of the scanned tree)
    names: tuple[str, ...] = ()  # names taken from it, for "from target import a, b"
    line: int = 0


@dataclass
class Tree:
    """Every module under some ``src`` folders: name -> file, and the imports between them."""

    files: dict[str, Path] = field(default_factory=dict)
    packages: set[str] = field(default_factory=set)  # module names that are packages (__init__.py)
    imports: list[Import] = field(default_factory=list)
    private_attributes: list[tuple[str, str, str, int]] = field(default_factory=list)

    def __repr__(self) -> str:  # pytest prints the fixture on failure: keep it to one line
        return f"Tree({len(self.files)} modules, {len(self.imports)} imports)"

    def folder(self, module: str) -> str:
        return module if module in self.packages else module.rpartition(".")[0]


def module_name(src: Path, path: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_nodes(body: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Every node that runs, skipping ``if TYPE_CHECKING:`` blocks (their ``else`` runs)."""
    for node in body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _runtime_nodes(node.orelse)
            continue
        yield node
        yield from _runtime_nodes(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def scan(srcs: Iterable[Path]) -> Tree:
    tree = Tree()
    for src in srcs:
        for path in sorted(src.rglob("*.py")):
            name = module_name(src, path)
            tree.files[name] = path
            if path.name == "__init__.py":
                tree.packages.add(name)
    for name, path in tree.files.items():
        _scan_module(tree, name, ast.parse(path.read_text(), filename=str(path)))
    return tree


def _scan_module(tree: Tree, name: str, module: ast.Module) -> None:
    bound: dict[str, str] = {}  # local name -> module of the tree it is bound to
    nodes = list(_runtime_nodes(module.body))
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in tree.files:
                    tree.imports.append(Import(name, alias.name, line=node.lineno))
                    if alias.asname:
                        bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(name, name in tree.packages, node)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in tree.files:
                    tree.imports.append(Import(name, submodule, line=node.lineno))
                    bound[alias.asname or alias.name] = submodule
                elif source in tree.files:
                    tree.imports.append(Import(name, source, (alias.name,), node.lineno))
    for node in nodes:
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and _is_private(node.attr)
        ):
            tree.private_attributes.append((name, bound[node.value.id], node.attr, node.lineno))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def cycles(tree: Tree) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself."""
    graph: dict[str, set[str]] = {m: set() for m in tree.files}
    for edge in tree.imports:
        graph[edge.importer].add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative Tarjan: a deep import chain must not hit Python's recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def private_reaches(tree: Tree) -> list[str]:
    """Each import of another folder's private module or name, as 'file:line: what'."""
    found = []
    for edge in tree.imports:
        if tree.folder(edge.importer) == tree.folder(edge.target):
            continue
        where = f"{edge.importer} (line {edge.line})"
        # A private package or module anywhere below the top-level package name.
        if any(_is_private(part) for part in edge.target.split(".")[1:]):
            found.append(f"{where} imports private module {edge.target}")
        found.extend(f"{where} imports private name {edge.target}.{n}" for n in edge.names if _is_private(n))
    for importer, target, attr, line in tree.private_attributes:
        if tree.folder(importer) != tree.folder(target):
            found.append(f"{importer} (line {line}) uses private {target}.{attr}")
    return found


def environment_reads(tree: Tree, package: str = "x_runtime") -> list[str]:
    """Each read of the environment outside ``ENVIRONMENT_READERS``, as 'module (line n): what'."""
    found = []
    for name, path in sorted(tree.files.items()):
        if name.split(".")[0] != package or name in ENVIRONMENT_READERS:
            continue
        module = ast.parse(path.read_text(), filename=str(path))
        parents = {child: node for node in ast.walk(module) for child in ast.iter_child_nodes(node)}
        reads = sorted((node.lineno, what) for node in ast.walk(module) if (what := _environment_read(node, parents)))
        found.extend(f"{name} (line {line}): {what}" for line, what in reads)
    return found


def _is_os_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr in ("environ", "environb", "getenv")
        and (isinstance(node.value, ast.Name) and node.value.id == "os")
    )


def _environment_read(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str | None:
    if _is_os_environ(node):
        parent = parents.get(node)
        if isinstance(parent, ast.Subscript) and isinstance(parent.ctx, (ast.Store, ast.Del)):
            return None
        if isinstance(parent, ast.Attribute) and parent.attr in _ENVIRON_WRITES:
            return None
        return f"reads os.{node.attr}"  # type: ignore[attr-defined]
    # env.NAME.read() / env.NAME.is_set() with no mapping: EnvVar falls back to os.environ.
    if (
        isinstance(node, ast.Call)
        and not node.args
        and not node.keywords
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("read", "is_set")
        and isinstance(node.func.value, ast.Attribute)
        and isinstance(node.func.value.value, ast.Name)
        and node.func.value.value.id == "env"
    ):
        return f"reads env.{node.func.value.attr} from os.environ"
    return None


def top_folder(module: str) -> str | None:
    """The package's first-level folder holding ``module`` (``x_runtime.process.state`` -> ``process``).

    ``None`` for the package itself and its top-level modules.
    """
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else None


def _level(module: str, layers: tuple[str, ...], tree: Tree) -> int | None:
    """Where ``module`` sits: its layer's index; the package above all, ``_version`` below all."""
    _, _, rest = module.partition(".")
    if rest in ("", "__main__"):
        return len(layers)  # the package's __init__ (the public names) and `python -m`: above every layer
    if rest == "_version":
        return -1
    folder = top_folder(module) or (rest if module in tree.packages else None)
    return layers.index(folder) if folder in layers else None


def layer_faults(tree: Tree, layers: dict[str, tuple[str, ...]] = LAYERS) -> list[str]:
    """Each module outside a layer, and each import reaching up a layer, as one line."""
    found = []
    for module in sorted(tree.files):
        order = layers.get(module.split(".")[0])
        if order is not None and _level(module, order, tree) is None:
            found.append(f"{module} is in no layer: move it into one of {', '.join(order)}")
    for edge in tree.imports:
        top = edge.importer.split(".")[0]
        order = layers.get(top)
        if order is None or edge.target.split(".")[0] != top:
            continue
        low, high = _level(edge.importer, order, tree), _level(edge.target, order, tree)
        if low is not None and high is not None and high > low:
            names = f" ({', '.join(edge.names)})" if edge.names else ""
            found.append(f"{edge.importer} (line {edge.line}) imports {edge.target}{names}, a layer above it")
    return found


def mutual_folders(tree: Tree) -> list[str]:
    """Each pair of first-level folders of one package that import each other, with one import each way."""
    seen: dict[tuple[str, str], Import] = {}
    for edge in tree.imports:
        a, b = top_folder(edge.importer), top_folder(edge.target)
        same_package = edge.importer.split(".")[0] == edge.target.split(".")[0]
        if a and b and a != b and same_package:
            seen.setdefault((edge.importer.split(".")[0] + "." + a, edge.target.split(".")[0] + "." + b), edge)
    found = []
    for (a, b), edge in sorted(seen.items()):
        back = seen.get((b, a))
        if back is not None and a < b:
            found.append(
                f"{a} <-> {b}: {edge.importer} (line {edge.line}) imports {edge.target}; "
                f"{back.importer} (line {back.line}) imports {back.target}"
            )
    return found


def long_files(tree: Tree, root: Path = ROOT) -> list[str]:
    lengths = {name: len(path.read_text().splitlines()) for name, path in tree.files.items()}
    return [f"{tree.files[n].relative_to(root)}: {k} lines" for n, k in sorted(lengths.items()) if k >= MAX_LINES]


@pytest.fixture(scope="module")
def everything() -> Tree:
    return scan(p / "src" for p in PACKAGES)


def test_every_package_is_scanned(everything: Tree) -> None:
    tops = {name.split(".")[0] for name in everything.files}
    assert tops == {"x_common", "x_launch", "x_runtime", "x_bigmodel", "x_estimate"}
    # Imports between the scanned modules are found (x_runtime uses x_common, for one).
    assert any(e.importer.startswith("x_runtime") and e.target.startswith("x_common") for e in everything.imports)


def test_no_import_cycles(everything: Tree) -> None:
    found = cycles(everything)
    assert not found, "import cycles (modules that import each other, directly or round a loop):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


@pytest.mark.parametrize("package", [p.name for p in PACKAGES])
def test_no_private_imports_across_folders(everything: Tree, package: str) -> None:
    top = package.replace("-", "_")
    found = [line for line in private_reaches(everything) if line.split(".")[0] == top]
    assert not found, "make the name public in its folder, or move the code next to it:\n" + "\n".join(found)


def test_no_two_folders_import_each_other(everything: Tree) -> None:
    found = mutual_folders(everything)
    assert not found, "move what both need into a folder below both:\n" + "\n".join(found)


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_layers_import_only_downwards(everything: Tree, package: str) -> None:
    order = LAYERS[package]
    folders = {top_folder(m) for m in everything.files if m.startswith(f"{package}.")} - {None}
    folders |= {m.split(".")[1] for m in everything.packages if m.count(".") == 1 and m.startswith(f"{package}.")}
    assert folders == set(order), f"{package}'s folders and its layers differ: {sorted(folders ^ set(order))}"
    found = [line for line in layer_faults(everything) if line.startswith(package)]
    assert not found, f"{package} imports only downwards ({' < '.join(order)}):\n" + "\n".join(found)


@pytest.mark.parametrize("package", [p.name for p in PACKAGES])
def test_source_files_stay_small(everything: Tree, package: str) -> None:
    top = package.replace("-", "_")
    found = [line for line in long_files(everything) if f"/{top}/" in line]
    assert not found, f"one concept per module: split what holds several (under {MAX_LINES} lines):\n" + "\n".join(
        found
    )


def test_the_runtime_reads_its_settings_once(everything: Tree) -> None:
    found = environment_reads(everything)
    assert not found, (
        "take launch settings from the snapshot handed down (x_runtime.core.settings), not the environment:\n"
        + "\n".join(found)
    )


def _write(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checker_finds_each_fault(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.sub import b\n",
            # The cycle closes inside a function, as a hidden cycle would.
            "pkg/sub/__init__.py": "",
            "pkg/sub/b.py": "def f():\n    from pkg import a\n",
            "pkg/sub/_hidden.py": "_secret = 1\n",
            "pkg/sub/public.py": "_inner = 2\n",
            "pkg/c.py": (
                "from typing import TYPE_CHECKING\n"
                "from pkg.sub._hidden import _secret\n"
                "from pkg.sub import public\n"
                "x = public._inner\n"
                "if TYPE_CHECKING:\n    from pkg import d\n"
            ),
            # d -> c only under TYPE_CHECKING from c's side: not a cycle.
            "pkg/d.py": "from pkg import c\n",
            "pkg/sub/e.py": "from pkg.sub._hidden import _secret\n" + "x = 1\n" * MAX_LINES,
            # Reads of the environment; writes for child processes are not reads.
            "pkg/f.py": (
                "import os\nrank = os.environ.get('RANK')\nos.environ['X'] = '1'\nenv.RANK.read()\n"
                "os.getenv('HOME')\nos.environ.update(A='1')\nenv.RANK.read({})\ndel os.environ['X']\n"
            ),
        },
    )
    tree = scan([src])
    assert cycles(tree) == [["pkg.a", "pkg.sub.b"]]
    assert private_reaches(tree) == [
        "pkg.c (line 2) imports private module pkg.sub._hidden",
        "pkg.c (line 2) imports private name pkg.sub._hidden._secret",
        "pkg.c (line 4) uses private pkg.sub.public._inner",
    ]
    assert environment_reads(tree, "pkg") == [
        "pkg.f (line 2): reads os.environ",
        "pkg.f (line 4): reads env.RANK from os.environ",
        "pkg.f (line 5): reads os.getenv",
    ]
    # Within one folder private parts are shared freely; only the length rule catches e.py.
    assert long_files(tree, tmp_path) == [f"pkg/sub/e.py: {MAX_LINES + 1} lines"]


def test_checker_finds_upward_and_mutual_imports(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "lay/__init__.py": "from lay.top import t\n",
            "lay/_version.py": "",
            "lay/low/__init__.py": "",
            "lay/low/a.py": "from lay import _version\n",
            # Up a layer, from inside a function (a hidden dependency is still one).
            "lay/low/b.py": "def f():\n    from lay.top.t import x\n",
            "lay/top/__init__.py": "",
            "lay/top/t.py": "from lay.low import a\nx = 1\n",
            "lay/loose.py": "",
        },
    )
    tree = scan([src])
    assert layer_faults(tree, {"lay": ("low", "top")}) == [
        "lay.loose is in no layer: move it into one of low, top",
        "lay.low.b (line 2) imports lay.top.t (x), a layer above it",
    ]
    assert mutual_folders(tree) == [
        "lay.low <-> lay.top: lay.low.b (line 2) imports lay.top.t; lay.top.t (line 1) imports lay.low.a"
    ]
