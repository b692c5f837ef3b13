"""Print structure metrics of the mxprof package, read from its source with ``ast``.

    python tools/structure_metrics.py [--verbose] [PACKAGE_DIR]

Nothing is imported: the numbers come from the import statements alone.

- lib/ffi importers: modules besides ``mxprof/_native.py`` that import ``lib``
  or ``ffi`` from ``_native`` (or reach ``_native.lib`` / ``_native.ffi``).
- check() calls outside _native: calls of ``_native.check`` elsewhere.
- private imports: a name with one leading underscore taken from another
  mxprof module (``from .x import _y``, or ``x._y`` where ``x`` is an mxprof
  module bound by an import).  "cross-package" counts those whose two modules
  sit in different packages (``mxprof`` vs ``mxprof.cuda``); "cross-module"
  counts every one.  A private module's own name (``from . import _native``)
  is not a private import: only names inside modules are.
- private attributes reached: ``obj._x`` (obj not ``self``/``cls``) where
  ``_x`` is defined (``self._x =``, ``__slots__``, a class body) only in
  modules of other packages; a heuristic, as names are matched without types.
- import circles: strongly connected components of the graph of module-level
  imports (imports under ``if TYPE_CHECKING:`` and inside functions left out).
- function-level imports: imports of mxprof modules inside a function body,
  listed with where they are.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import Any


def module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(root: Path, mod: str) -> bool:
    return (root.parent / mod.replace(".", "/") / "__init__.py").exists()


def package_of(root: Path, mod: str) -> str:
    return mod if is_package(root, mod) else mod.rpartition(".")[0]


def resolve(root: Path, importer: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names."""
    if node.level == 0:
        return node.module or ""
    base = package_of(root, importer).split(".")
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def exists(root: Path, mod: str) -> bool:
    p = root.parent / mod.replace(".", "/")
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


class Walker(ast.NodeVisitor):
    """Collects one module's imports, split into module level and function level."""

    def __init__(self, root: Path, mod: str, path: Path) -> None:
        self.root, self.mod, self.path = root, mod, path
        self.depth = 0  # function nesting
        self.type_checking = 0
        self.edges: set[str] = set()  # module-level imports of mxprof modules
        self.lazy: list[tuple[int, str]] = []  # (line, module) inside functions
        self.private: list[tuple[int, str, str]] = []  # (line, module, name)
        self.bound: dict[str, str] = {}  # local name -> mxprof module it is bound to
        self.lib_import = False
        self.check_names: set[str] = set()
        self.check_calls: list[int] = []
        self.defined: set[str] = set()  # private names this module defines
        self.reached: list[tuple[int, str]] = []  # (line, name) of obj._name, obj not self/cls

    def _record(self, line: int, target: str) -> None:
        if not target.startswith("mxprof") or target == self.mod:
            return
        if self.depth:
            self.lazy.append((line, target))
        elif not self.type_checking:
            self.edges.add(target)

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        tc = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )
        if tc:
            self.type_checking += 1
            for n in node.body:
                self.visit(n)
            self.type_checking -= 1
            for n in node.orelse:
                self.visit(n)
        else:
            self.generic_visit(node)

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._record(node.lineno, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        target = resolve(self.root, self.mod, node)
        if not target.startswith("mxprof"):
            return
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            if exists(self.root, sub):  # a submodule
                self._record(node.lineno, sub)
                if not self.depth:
                    self.bound[alias.asname or alias.name] = sub
                continue
            self._record(node.lineno, target)
            if private(alias.name) and target != self.mod:
                self.private.append((node.lineno, target, alias.name))
            if target == "mxprof._native":
                if alias.name in ("lib", "ffi"):
                    self.lib_import = True
                if alias.name == "check":
                    self.check_names.add(alias.asname or "check")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        v = node.value
        if isinstance(v, ast.Name) and v.id in self.bound:
            target = self.bound[v.id]
            if private(node.attr):
                self.private.append((node.lineno, target, node.attr))
            if target == "mxprof._native" and node.attr in ("lib", "ffi"):
                self.lib_import = True
        elif private(node.attr):
            if isinstance(node.ctx, ast.Store) and isinstance(v, ast.Name) and v.id == "self":
                self.defined.add(node.attr)
            elif not (isinstance(v, ast.Name) and v.id in ("self", "cls")):
                self.reached.append((node.lineno, node.attr))
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.defined.add(node.name)
        for n in node.body:
            if isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in n.targets
            ):
                for c in ast.walk(n.value):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                        self.defined.add(c.value)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.defined.add(n.name)
            elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    if isinstance(t, ast.Name):
                        self.defined.add(t.id)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr == "check"
            and isinstance(f.value, ast.Name)
            and self.bound.get(f.value.id) == "mxprof._native"
        ) or (isinstance(f, ast.Name) and f.id in self.check_names):
            self.check_calls.append(node.lineno)
        self.generic_visit(node)


def sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def measure(package: str | Path) -> dict[str, Any]:
    """Every metric of the package at path, as lists of findings.

    Keys: ``lib_users`` (paths), ``check_calls`` ("path:line"), ``private``
    and ``cross_package_private`` ("path:line module.name"), ``reached``
    ("path:line ._name"), ``circles`` (lists of modules), ``lazy``
    ("path:line module").
    """
    root = Path(package).resolve()
    walkers = []
    for path in sorted(root.rglob("*.py")):
        mod = module_name(root, path)
        w = Walker(root, mod, path)
        w.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        walkers.append(w)

    def rel(w: Walker) -> str:
        return str(w.path.relative_to(root.parent))

    privates = [(w, line, t, n) for w in walkers for line, t, n in w.private]
    # obj._name where _name is defined in another package and in none of this
    # module's own: another package's private attribute, reached through an object.
    owners: dict[str, set[str]] = {}
    for w in walkers:
        for name in w.defined:
            owners.setdefault(name, set()).add(w.mod)
    return {
        "lib_users": [rel(w) for w in walkers if w.lib_import and w.mod != "mxprof._native"],
        "check_calls": [
            f"{rel(w)}:{line}"
            for w in walkers
            if w.mod != "mxprof._native"
            for line in w.check_calls
        ],
        "private": [f"{rel(w)}:{line} {t}.{n}" for w, line, t, n in privates],
        "cross_package_private": [
            f"{rel(w)}:{line} {t}.{n}"
            for w, line, t, n in privates
            if package_of(root, w.mod) != package_of(root, t)
        ],
        "reached": [
            f"{rel(w)}:{line} .{name} (defined in {', '.join(sorted(owners[name]))})"
            for w in walkers
            for line, name in w.reached
            if name in owners
            and not any(package_of(root, o) == package_of(root, w.mod) for o in owners[name])
        ],
        "circles": sccs({w.mod: w.edges for w in walkers}),
        "lazy": [f"{rel(w)}:{line} {t}" for w in walkers for line, t in w.lazy],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("package", nargs="?", default=str(Path(__file__).parent.parent / "mxprof"))
    ap.add_argument("--verbose", "-v", action="store_true", help="list every finding")
    args = ap.parse_args()
    m = measure(args.package)
    rows = [
        ("modules importing lib/ffi besides _native", "lib_users"),
        ("_native.check() calls outside _native", "check_calls"),
        ("private names imported across packages", "cross_package_private"),
        ("private names imported across modules (any package)", "private"),
        ("private attributes of another module's objects reached (obj._x)", "reached"),
        ("import circles (module-level)", "circles"),
        ("function-level imports of mxprof modules", "lazy"),
    ]
    for title, key in rows:
        print(f"{title}: {len(m[key])}")
        if args.verbose or key == "circles":
            for item in m[key]:
                print(f"    {' <-> '.join(item) if key == 'circles' else item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
