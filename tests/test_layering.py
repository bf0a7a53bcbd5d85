"""Arrows one way between packages: the network (model/) imports nothing of ours but itself and no Lightning, and the
data (data/) nothing of the network; the monitor's figures and heatmaps (monitor.health, monitor.heatmap,
monitor.views) and checkpoint reading load no Lightning and no data module; inference reads checkpoints without
training/; every import points down model → data → training → monitor → inference → faces; reading a checkpoint
loads nothing of the network; no module imports one that imports it back. The imports run in fresh processes, the
network's first: what is loaded is read after each group."""

import ast
import json
import subprocess
import sys

import pytest

from conftest import ROOT

LIGHTNING = ("lightning", "pytorch_lightning", "lightning_fabric", "torchmetrics")
NETWORK = ("model", "model.attention", "model.long_attention", "model.kinds", "model.classifier", "model.config")
PACKAGES = ("model", "data", "training", "inference", "monitor", "bench")
FIGURES_AND_INFERENCE = ("monitor", "monitor.health", "monitor.heatmap", "monitor.views", "monitor.doctor",
                         "monitor.checks", "inference", "inference.diagnosis", "predict", "diagnose")


def loaded_after_each(*groups: tuple[str, ...]) -> list[set[str]]:
    """sys.modules of a fresh interpreter after importing each group of `modules` in turn (each set holds the
    groups before it too)."""
    code = (f"import sys, json\nfor group in {[list(g) for g in groups]!r}:\n"
            "    [__import__(m) for m in group]\n    print(json.dumps(sorted(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return [set(json.loads(line)) for line in result.stdout.splitlines()[-len(groups):]]


@pytest.fixture(scope="module")
def loaded() -> dict[str, set[str]]:
    network, figures_and_inference = loaded_after_each(NETWORK, FIGURES_AND_INFERENCE)
    return {"network": network, "figures and inference": figures_and_inference}


@pytest.mark.slow
def test_the_network_is_plain_pytorch(loaded):
    ours = {name.split(".")[0] for name in loaded["network"]} & {"data", "training", "inference", "monitor"}
    assert ours == set(), f"model/ imports {ours}"
    assert {name.split(".")[0] for name in loaded["network"]} & {*LIGHTNING, "matplotlib", "tokenizers"} == set()


def test_the_monitor_figures_and_inference_load_no_lightning_and_no_data_module(loaded):
    assert set(FIGURES_AND_INFERENCE) <= loaded["figures and inference"]  # the check sees the real imports
    assert {name.split(".")[0] for name in loaded["figures and inference"]} & set(LIGHTNING) == set()
    assert {"data.datamodule", "monitor.callback", "training"} & loaded["figures and inference"] == set()


def test_the_callback_is_still_found_where_configs_name_it():
    from monitor import AttentionMonitor
    from monitor.callback import AttentionMonitor as defined

    assert AttentionMonitor is defined


@pytest.mark.slow
def test_reading_a_checkpoint_loads_nothing_of_the_network_and_no_lightning():
    (loaded,) = loaded_after_each(("data.checkpoint",))
    assert "data.checkpoint" in loaded
    assert {name.split(".")[0] for name in loaded} & {"model", "training", *LIGHTNING} == set()


def our_imports() -> dict[str, set[str]]:
    """{module: the modules of ours it imports anywhere in its file (inside functions too)}, from the source."""
    files = {".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
             for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    files |= {path.stem: path for path in ROOT.glob("*.py")}  # train.py, predict.py, serve.py, export.py
    graph = {}
    for module, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in files else node.module
                            for alias in node.names}
        graph[module] = {target for target in targets if target in files and target != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while not component or member != module:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
            if len(component) > 1:
                found.append(component)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_data_import_nothing_of_the_network():
    """data/ measures texts and reports what it chose; the network's settings reach it through train.py's links."""
    graph = our_imports()
    assert graph["data.datamodule"]  # the graph sees its imports
    reached = {target for module, targets in graph.items() if module.split(".")[0] == "data" for target in targets}
    assert {target for target in reached if target.split(".")[0] == "model"} == set()


def test_nothing_of_the_product_imports_the_doctors_proof():
    """The planted bugs and their runner (bench/catalogue/) plant themselves from outside: only the benches import
    them (and the tests, and make docs, which are not in the graph)."""
    graph = our_imports()
    assert "bench.catalogue.bugs" in graph["bench.catalogue.proof"]  # the graph sees the catalogue's imports
    reaching = {module for module, targets in graph.items() if any(t.startswith("bench.catalogue") for t in targets)
                and not module.startswith(("bench.catalogue", "bench."))}
    assert reaching == set()


LAYERS = ("model", "data", "training", "monitor", "inference")  # each imports only the ones before it


def layer(module: str) -> int:
    """The module's place in LAYERS; the faces (train.py, ..., runtime.py) come after them, the benches last."""
    top = module.split(".")[0]
    return LAYERS.index(top) if top in LAYERS else len(LAYERS) + (top == "bench")


def back_arrows(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                  if layer(target) > layer(module))


def test_every_import_points_down_model_data_training_monitor_inference_faces():
    """Anywhere in a file, inside functions too: monitor and training do not import each other both ways."""
    graph = our_imports()
    assert "monitor.learning" in graph["monitor.layer_contract"]  # the graph sees an import inside a function
    assert back_arrows({"training.x": {"monitor.y"}, "monitor.y": {"training.x"}, "train": {"bench.z"}}) == [
        "train -> bench.z", "training.x -> monitor.y"]  # and the check sees an arrow up
    assert back_arrows(graph) == []


def test_no_import_circles():
    graph = our_imports()
    assert graph["training.module"] and graph["model.classifier"]  # the graph sees the imports
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [{"a", "b"}]  # and the search finds a circle
    assert circles(graph) == []


@pytest.mark.slow
def test_the_faces_share_code_through_inference_only_and_inference_has_no_circle():
    """serve.py loads no predict.py (nor the reverse); explain.py loads no classifier.py (classifier.py asks
    explain.py for explanations: one direction)."""
    names = ("inference.explain", "predict", "serve")
    (explain,), (predict,), (serve,) = (loaded_after_each((name,)) for name in names)
    assert "inference.classifier" not in explain and "inference.explain" in explain
    assert "serve" not in predict and "predict" not in serve and "inference.request" in serve


def test_the_limits_load_nothing_heavy():
    (limits,) = loaded_after_each(("inference.limits", "inference.texts"))
    assert {"torch", "tokenizers", "pydantic"} & {name.split(".")[0] for name in limits} == set()


def test_the_install_holds_every_face_and_every_folder_of_the_packages():
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    faces = sorted(path.stem for path in ROOT.glob("*.py"))
    assert sorted(setuptools["py-modules"]) == faces
    packages = setuptools["packages"]
    for package in [p for p in packages if "." not in p]:
        folders = {str(path.parent.relative_to(ROOT)).replace("/", ".") for path in (ROOT / package).rglob("*")
                   if path.is_file() and "__pycache__" not in path.parts}
        assert folders <= set(packages), folders - set(packages)
    assert "exported/" in (ROOT / ".gitignore").read_text().split()  # where the README exports to


def test_every_file_the_readme_names_exists():
    import re

    text = (ROOT / "README.md").read_text()
    named = set(re.findall(r"(?<![\w/.$-])((?:[\w-]+/)+[\w.-]+\.(?:py|yaml|md|png|sh))\b", text))
    examples = ("lightning_logs/", "runs/", "tests/test_x.py")  # what a run makes, a placeholder
    missing = [name for name in sorted(named) if not name.startswith(examples) and not (ROOT / name).exists()]
    assert "data/checkpoint.py" in named and missing == []
