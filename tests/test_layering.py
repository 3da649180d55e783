"""The package layering: a module imports only from its own unit or from units in lower layers.

The order is written down in docs/DEVELOPING.md ("Layers"); this test is the copy that runs. A unit is
a top-level module of corpus_io (``corpus_io.keys``), a package (a wing as ``corpus_io.storage``, or
``corpus_io.shards``), or ``cli``.
Imports are read with ``ast`` (function-level imports included), so a lazy import cannot hide a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

# Lowest first. Units in one layer are siblings: they may not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("corpus_io", "corpus_io.errors", "corpus_io.extras"),
    ("corpus_io.storage", "corpus_io.config", "corpus_io.keys"),
    ("corpus_io.audio", "corpus_io.jobs"),
    ("corpus_io.tables",),
    ("corpus_io.tokenizer", "corpus_io.shards"),
    ("corpus_io.loader",),
    ("corpus_io.stats", "corpus_io.decoding"),
    ("corpus_io.model",),
    ("corpus_io.train", "corpus_io.infer"),
    ("corpus_io.explore",),
    ("corpus_io.commands",),
    ("corpus_io.api",),
    ("cli",),
]
#: the package __init__ is the lazy face of the API: its __getattr__ (only) imports corpus_io.api on first use
FACADE = ("corpus_io", "corpus_io.api")
LAYER_OF = {unit: depth for depth, layer in enumerate(LAYERS) for unit in layer}
SUBPACKAGES = tuple(sorted(p.parent.name for p in (REPO / "corpus_io").glob("*/__init__.py")))


def unit_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "cli":
        return "cli"
    return ".".join(parts[:2])


def imported_modules(tree: ast.AST) -> list[tuple[str, int]]:
    """(module, line) for every absolute import of corpus_io or cli anywhere in the file."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            package_like = node.module in ("corpus_io", "cli") or (
                node.module.startswith("corpus_io.") and node.module.split(".")[1] in SUBPACKAGES
                and node.module.count(".") == 1)
            if package_like:  # `from corpus_io import audio` imports corpus_io.audio.io
                found += [(node.module if alias.name.startswith("_") else f"{node.module}.{alias.name}", node.lineno)
                          for alias in node.names]
            else:
                found.append((node.module, node.lineno))
    return [(name, line) for name, line in found if name.split(".")[0] in ("corpus_io", "cli")]


def source_modules() -> list[tuple[str, Path]]:
    files = sorted((REPO / "corpus_io").rglob("*.py")) + sorted((REPO / "cli").rglob("*.py"))
    return [(".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"), path)
            for path in files]


def test_every_module_has_a_layer():
    unplaced = sorted({unit_of(module) for module, _ in source_modules()} - set(LAYER_OF))
    assert not unplaced, f"add these units to LAYERS (and to docs/DEVELOPING.md): {unplaced}"


def test_no_module_imports_from_its_own_layer_or_above():
    violations = []
    for module, path in source_modules():
        mine = unit_of(module)
        for target, line in imported_modules(ast.parse(path.read_text(), str(path))):
            theirs = unit_of(target)
            if theirs == mine or theirs == "corpus_io" or (module, theirs) == FACADE:
                continue
            if LAYER_OF.get(theirs, len(LAYERS)) >= LAYER_OF[mine]:
                violations.append(f"{path.relative_to(REPO)}:{line}: {mine} imports {theirs}")
    assert not violations, "imports against the layer order:\n" + "\n".join(violations)


def test_layering_check_catches_a_lower_module_importing_a_higher_one():
    tree = ast.parse("def f():\n    from corpus_io.loader import stages\nfrom corpus_io.storage import files\n")
    targets = {unit_of(name) for name, _ in imported_modules(tree)}
    assert targets == {"corpus_io.loader", "corpus_io.storage"}
    assert LAYER_OF["corpus_io.storage"] < LAYER_OF["corpus_io.shards"] < LAYER_OF["corpus_io.loader"] < LAYER_OF["cli"]


def test_the_documented_layers_match_the_checked_ones():
    text = (REPO / "docs" / "DEVELOPING.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    documented = [line for line in section.splitlines() if line.startswith(tuple("0123456789"))]
    assert len(documented) == len(LAYERS), section
    for line, layer in zip(documented, LAYERS):
        for unit in layer:
            short = unit.removeprefix("corpus_io.") if unit != "corpus_io" else "corpus_io/__init__"
            assert f"`{short}`" in line, f"{unit} missing from the documented layer: {line}"


def _module_graph() -> dict[str, set[str]]:
    modules = dict(source_modules())
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for target, _ in imported_modules(ast.parse(path.read_text(), str(path))):
            while target and target not in modules:  # `from corpus_io.x import name` -> corpus_io.x
                target = target.rpartition(".")[0]
            if target and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def test_no_import_circle_between_modules_even_through_function_level_imports():
    """Within a unit too (cli/main <-> cli/_app was one): a circle means two modules are one concept."""
    graph, state, path, circles = _module_graph(), {}, [], []

    def visit(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_module_map_in_developing_md_has_one_line_per_module():
    text = (REPO / "docs" / "DEVELOPING.md").read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    mapped = [line.split("`", 2)[1] for line in section.splitlines() if line.startswith("- `")]
    modules = sorted(str(path.relative_to(REPO)) for _, path in source_modules())
    assert sorted(mapped) == modules, (sorted(set(modules) - set(mapped)), sorted(set(mapped) - set(modules)))


def test_the_package_reaches_the_api_only_lazily_inside_getattr():
    tree = ast.parse((REPO / "corpus_io" / "__init__.py").read_text())
    top_level = [name for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                 for name, _ in imported_modules(node)]
    getattr_fn = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "__getattr__")
    assert not top_level, top_level
    assert [name for name, _ in imported_modules(getattr_fn)] == ["corpus_io.api"]


def test_the_wings_follow_the_data_flow():
    """storage, then audio and jobs, tables, shards, the loader, train: each wing a layer above the last, and the
    command line the thin top (nothing in corpus_io imports cli; the command table is corpus_io.commands)."""
    flow = [LAYER_OF[f"corpus_io.{wing}"] for wing in ("storage", "audio", "tables", "shards", "loader", "train")]
    assert flow == sorted(set(flow)), flow
    assert LAYER_OF["corpus_io.storage"] < LAYER_OF["corpus_io.jobs"] < LAYER_OF["corpus_io.tables"]
    assert LAYER_OF["corpus_io.commands"] < LAYER_OF["corpus_io.api"] < LAYER_OF["cli"] == len(LAYERS) - 1


def test_at_most_eight_modules_stay_at_the_top_of_the_package():
    top = sorted(p.name for p in (REPO / "corpus_io").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 8, f"{top}: move what belongs to a wing into it (docs/DEVELOPING.md, Wings)"


def test_the_trainer_holds_the_loop_in_at_most_550_lines():
    """trainer.py keeps the loop, the epoch and the step; output_dir claiming, the resume's model mismatch, the log
    lines and the key records live in their own modules (output_dir, init_param, metrics, trained_keys)."""
    lines = (REPO / "corpus_io" / "train" / "trainer.py").read_text().count("\n")
    assert lines <= 550, f"corpus_io/train/trainer.py has {lines} lines: move a concern out, not the loop"
