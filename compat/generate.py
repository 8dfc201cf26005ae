"""Generate runnable copies of Accelerate's own distributed test scripts, one sub-test at a time.

    python compat/generate.py --impl x OUT_DIR           # imports renamed to x
    python compat/generate.py --impl accelerate OUT_DIR  # Accelerate's scripts as they are

Reads the scripts of the installed ``accelerate`` (``accelerate/test_utils/scripts/``); nothing is
copied into this repository by hand. Two rewrites, both on the syntax tree:

1. Every call of one of the script's own functions made as a statement in ``main()`` (or in the
   ``if __name__ == "__main__":`` block) becomes ``_compat_run(func, sources, *args)``, so each
   sub-test is recorded, watched by a timeout and skippable (``compat/harness.py``). Both
   implementations get this rewrite, so they are measured the same way.
2. With ``--impl x`` only: each name imported from ``accelerate`` or one of its modules is taken
   from ``x_runtime`` or, for the big-model names, ``x_bigmodel`` (``accelerate.commands.*``: from
   ``x_launch``) - the import rule the migration guide documents. A name x lacks becomes a ``Missing`` stand-in: the script still imports, and
   only the sub-tests that use the name fail, naming it. Accelerate's test helpers
   (``accelerate.test_utils``: ``RegressionModel``, ``are_the_same_tensors``...) are generated into
   ``x_compat_test_utils.py`` from Accelerate's own files with the same rename, so they too run on x.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import shutil
from pathlib import Path

SCRIPTS = (
    "test_script.py",
    "test_sync.py",
    "test_ops.py",
    "test_distributed_data_loop.py",
    "test_merge_weights.py",
    "test_notebook.py",
)
HELPERS = "x_compat_test_utils"
HARNESS = "x_compat_harness"
# Where x keeps Accelerate's names: the first of these modules that has the name. The commands of
# Accelerate's CLI (accelerate.commands.*) are x-launch's.
X_HOMES = ("x_runtime", "x_bigmodel")
COMMAND_HOMES = ("x_launch",)


def accelerate_dir() -> Path:
    spec = importlib.util.find_spec("accelerate")
    if spec is None or spec.origin is None:
        raise SystemExit("compat: accelerate is not installed here (pip install accelerate==1.15.0)")
    return Path(spec.origin).parent


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


class Renamer(ast.NodeTransformer):
    """Points imports from ``accelerate`` at x, and its test helpers at the generated module."""

    def __init__(self, package: str):
        self.package = package  # the module's own package, for relative imports
        self.homes = [importlib.import_module(m) for m in X_HOMES]
        self.command_homes = [importlib.import_module(m) for m in COMMAND_HOMES]
        self.helper_names: set[str] = set()
        self.missing: set[str] = set()

    def _home(self, module: str, name: str) -> str | None:
        homes = self.command_homes if module.startswith("accelerate.commands") else self.homes
        return next((m.__name__ for m in homes if hasattr(m, name)), None)

    def visit_Import(self, node: ast.Import) -> ast.AST | list[ast.stmt]:
        if not any(a.name.split(".")[0] == "accelerate" for a in node.names):
            return node
        kept = [a for a in node.names if a.name.split(".")[0] != "accelerate"]
        dropped = [a for a in node.names if a.name.split(".")[0] == "accelerate"]
        out: list[ast.stmt] = [ast.Import(names=kept)] if kept else []
        out += [_missing(a.asname or a.name, a.name) for a in dropped]
        self.missing.update(a.name for a in dropped)
        return out

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | list[ast.stmt]:
        module = _absolute(node, self.package)
        if module.split(".")[0] != "accelerate":
            return node
        out: list[ast.stmt] = []
        for alias in node.names:
            local = alias.asname or alias.name
            if module.startswith("accelerate.test_utils"):
                self.helper_names.add(alias.name)
                out.append(ast.ImportFrom(module=HELPERS, names=[alias], level=0))
            elif home := self._home(module, alias.name):
                out.append(ast.ImportFrom(module=home, names=[alias], level=0))
            else:
                self.missing.add(f"{module}.{alias.name}")
                out.append(_missing(local, f"{module}.{alias.name}"))
        return out


def _missing(local: str, qualified: str) -> ast.stmt:
    return ast.parse(f"{local} = _CompatMissing({qualified!r})").body[0]


class SubtestWrapper(ast.NodeTransformer):
    """Wraps each statement-call of the script's own functions inside ``main`` / ``__main__``."""

    def __init__(self, own: set[str]):
        self.own = own
        self.found: list[str] = []

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in self.own):
            return node
        self.found.append(call.func.id)
        sources = [ast.unparse(a) for a in call.args] + [ast.unparse(k.value) for k in call.keywords]
        wrapped = ast.Call(
            func=ast.Name("_compat_run", ast.Load()),
            args=[call.func, ast.Tuple([ast.Constant(s) for s in sources], ast.Load()), *call.args],
            keywords=call.keywords,
        )
        return ast.copy_location(ast.Expr(wrapped), node)

    # Sub-tests are only what main() runs: nested function bodies stay as written.
    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return node


def _is_main_block(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'


def _insert_header(tree: ast.Module) -> None:
    header = ast.parse(f"from {HARNESS} import Missing as _CompatMissing, run as _compat_run").body
    at = 0
    for at, node in enumerate(tree.body):  # noqa: B007 - the index after docstring and __future__ is wanted
        is_doc = (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        )
        is_future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if not (is_doc or is_future):
            break
    tree.body[at:at] = header


def transform_script(source: str, *, rename: Renamer | None) -> tuple[str, list[str]]:
    """The generated text of one script, and the functions it runs as sub-tests."""
    tree = ast.parse(source)
    own = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} - {"main"}
    wrapper = SubtestWrapper(own)
    for node in tree.body:
        if (isinstance(node, ast.FunctionDef) and node.name == "main") or _is_main_block(node):
            wrapper.generic_visit(node)  # its own body; nested definitions stay as written
    if rename is not None:
        tree = rename.visit(tree)
    _insert_header(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n", wrapper.found


def helpers_module(names: set[str], test_utils: Path, rename: Renamer) -> str:
    """Accelerate's test helpers that the scripts import, renamed to x, as one module."""
    training = ast.parse((test_utils / "training.py").read_text())
    testing = ast.parse((test_utils / "testing.py").read_text())
    body: list[ast.stmt] = [s for s in testing.body if isinstance(s, ast.Import | ast.ImportFrom)]
    body += training.body
    defined = {n.name for n in training.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    values = importlib.import_module("accelerate.test_utils.testing")
    for name in sorted(names - defined):
        node = next((n for n in testing.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name), None)
        if node is not None:
            body.append(node)
            continue
        # A module-level value such as torch_device: taken as Accelerate computes it on this machine.
        value = getattr(values, name)
        if ast.literal_eval(repr(value)) != value:
            raise SystemExit(f"compat: cannot carry accelerate.test_utils.{name} ({value!r}) over to x")
        body.append(ast.parse(f"{name} = {value!r}").body[0])
    module = ast.Module(body=body, type_ignores=[])
    rename.package = "accelerate.test_utils"
    module = rename.visit(module)
    _insert_header(module)
    return ast.unparse(ast.fix_missing_locations(module)) + "\n"


def generate(impl: str, out: Path) -> dict[str, list[str]]:
    """Write the scripts (and, for x, the helpers module and the harness) into ``out``."""
    source_dir = accelerate_dir() / "test_utils" / "scripts"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(__file__).with_name("harness.py"), out / f"{HARNESS}.py")
    rename = Renamer("accelerate.test_utils.scripts") if impl == "x" else None
    subtests = {}
    for script in SCRIPTS:
        text, subtests[script] = transform_script((source_dir / script).read_text(), rename=rename)
        (out / script).write_text(text)
    if rename is not None:
        # What the scripts themselves import and x lacks (the helpers' own imports are not listed).
        (out / "MISSING.txt").write_text("".join(f"{name}\n" for name in sorted(rename.missing)))
        (out / f"{HELPERS}.py").write_text(helpers_module(rename.helper_names, source_dir.parent, rename))
    return subtests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=("x", "accelerate"), required=True)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    for script, functions in generate(args.impl, args.out).items():
        print(f"{script}: {len(functions)} sub-test calls")


if __name__ == "__main__":
    main()
