"""Imports run one way, in pipeline order, with no cycle, whether written at module level or inside a
function: a function-local import is for load time (torch, egglog, the simulator), never to hide a
cycle. docs/ARCHITECTURE.md draws the layers."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = {"emmy": ROOT / "emmy", "emmy.rules": ROOT / "rules", "emmy.extract": ROOT / "extract",
            "emmy.cuda_templates": ROOT / "cuda_templates"}

# Lowest first: a module imports only from its own layer or lower ones.
LAYERS = (
    ("core", ("emmy.errors", "emmy.config", "emmy.dtypes", "emmy.affine", "emmy.extract", "emmy.checking",
              "emmy.cuda_templates", "emmy.measure_db")),
    ("tensor_ir", ("emmy.tensor_ir",)),
    ("capture", ("emmy.capture", "emmy.decompose")),
    ("loop_ir", ("emmy.loop_ir",)),
    ("schedule", ("emmy.schedule", "emmy.rules.schedules", "emmy.rules")),
    ("egraph", ("emmy.egraph", "emmy.rules.algebra", "emmy.rules.reductions", "emmy.rules.fusion",
                "emmy.rules.twist")),
    ("tile_ir", ("emmy.tile_ir",)),
    ("kernel_ir", ("emmy.kernel_ir",)),
    ("back ends", ("emmy.plan", "emmy.sim", "emmy.nvcc", "emmy.batch_build", "emmy.gpu", "emmy.module_gpu",
                   "emmy.runtime", "emmy.measure")),
    ("api", ("emmy.explain", "emmy.calling", "emmy.saved", "emmy.program", "emmy.api", "emmy.dynamo",
             "emmy.testing", "emmy.workloads", "emmy.suite", "emmy.tune", "emmy.tune_workers", "emmy.calibrate",
             "emmy.bench",
             "emmy.cli", "emmy.__main__", "emmy")),
)


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def imports(known: dict[str, pathlib.Path]) -> list[tuple[str, str, int]]:
    """(importer, imported emmy module, line) for every import statement, module-level or local."""
    edges = []
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for target in targets:
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in known and target != name:
                    edges.append((name, target, node.lineno))
    return edges


def layer_of(module: str) -> int:
    best, index = "", None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, index = prefix, i
    assert index is not None, f"{module} is in no layer"
    return index


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)


def test_no_import_runs_back_up_the_pipeline():
    known = modules()
    upward = [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]}) at line {line}"
              for a, b, line in imports(known) if layer_of(b) > layer_of(a)]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for a, b, _ in imports(known):
        if not a.startswith(b + "."):  # a submodule importing its own package's __init__ is Python's order
            graph[a].add(b)
    state, cycles = {}, []
    for start in graph:  # iterative depth-first search: grey on the stack, black done
        if start in state:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        state[start], path = "grey", [start]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = "black"
                stack.pop()
                path.pop()
            elif state.get(child) == "grey":
                cycles.append(" -> ".join(path[path.index(child):] + [child]))
            elif child not in state:
                state[child] = "grey"
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    assert not cycles, "\n".join(cycles)
