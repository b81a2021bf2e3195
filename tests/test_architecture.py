"""The dependency rules of docs/architecture.md, enforced: cli -> stages -> library, stages as leaves, no cycles,
no UI in the library."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(exe).exists():
        pytest.fail("import-linter is a test dependency (pip install -e '.[test]'): lint-imports not found")
    done = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout and "4 kept" in done.stdout, done.stdout[-2000:]


def test_every_library_module_is_in_the_contracts() -> None:
    """A new top-level module must be placed in a layer and under the no-click/rich rule, not slip past them."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers, forbidden = contracts[0], contracts[1]
    assert layers["layers"][:3] == ["dab_pipeline.cli", "dab_pipeline.testing", "dab_pipeline.stages"]
    library = {m.strip() for m in layers["layers"][3].split(":")}
    top = {
        p.stem if p.is_file() else p.name
        for p in (REPO / "dab_pipeline").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    }
    expected = {f"dab_pipeline.{m}" for m in top - {"cli", "stages", "testing"}}
    assert library == expected, (sorted(expected - library), sorted(library - expected))
    assert set(forbidden["source_modules"]) == expected | {"dab_pipeline.stages", "dab_pipeline.testing"}


def test_the_root_is_packages_and_few_modules() -> None:
    """The package's root holds packages by concern and at most five modules (issue 25)."""
    modules = [p.name for p in (REPO / "dab_pipeline").glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= 5, modules


def test_every_test_the_docs_cite_exists() -> None:
    """The docs state promises by the tests that hold them (docs/reliability.md above all): each must exist."""
    import re

    repo = Path(__file__).resolve().parents[1]
    by_name = {p.name: p for p in (repo / "tests").rglob("test_*.py")}
    reliability = set(re.findall(r"`(test_\w+\.py)::(test_\w+)`", (repo / "docs" / "reliability.md").read_text()))
    assert len(reliability) >= 20
    cited = set(reliability)
    for page in [*(repo / "docs").glob("*.md"), repo / "README.md"]:
        for path, name in re.findall(r"(tests/[\w/]+\.py)(?:::(test_\w+))?", page.read_text()):
            assert (repo / path).is_file(), f"{page.name} cites {path}"
            if Path(path).name.startswith("test_"):
                cited.add((Path(path).name, name))
    for module, name in sorted(cited):
        assert module in by_name, f"{module} is cited but no such test file exists"
        if name:
            assert re.search(rf"^def {name}\(", by_name[module].read_text(), re.M), f"{module}::{name}"


def _project_imports(path: Path, tree: ast.Module | None = None) -> list[tuple[ast.stmt, str]]:
    """(import statement, the dab_pipeline module it names) for every import of the project in a file."""
    pkg = list(path.relative_to(REPO).parts[:-1])
    found = []
    for node in ast.walk(tree or ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = pkg[: len(pkg) - node.level + 1]
            found.append((node, ".".join(base + ([node.module] if node.module else []))))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dab_pipeline"):
            found.append((node, node.module))
        elif isinstance(node, ast.Import):
            found += [(node, a.name) for a in node.names if a.name.startswith("dab_pipeline")]
    return found


def _stage_of(module: str) -> str | None:
    """The stage a dotted module belongs to (``dab_pipeline.stages.train.trainer`` -> ``train``), or None."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["dab_pipeline", "stages"] and len(parts) > 2 else None


def test_every_stage_is_a_leaf_in_the_contracts() -> None:
    """Every stage is listed in the independence contract (a new one cannot slip past it), and only the sweep's
    imports of the train and evaluate packages themselves are exempt (issue 35)."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    leaves = next(c for c in contracts if c["type"] == "independence")
    stages = {
        p.stem if p.is_file() else p.name
        for p in (REPO / "dab_pipeline" / "stages").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert set(leaves["modules"]) == {f"dab_pipeline.stages.{s}" for s in stages}
    assert sorted(leaves.get("ignore_imports", [])) == [
        "dab_pipeline.stages.sweep.* -> dab_pipeline.stages.evaluate",
        "dab_pipeline.stages.sweep.* -> dab_pipeline.stages.train",
    ]


def stage_rule_breaks(path: Path, tree: ast.Module | None = None) -> list[str]:
    """The imports of one file that break the stage rules: a stage module importing another stage (the sweep may
    import the train and evaluate packages, not a module inside them), or any file importing a stage's
    underscore name (or underscore module) from outside that stage."""
    rel = path.relative_to(REPO)
    own = _stage_of(".".join(rel.with_suffix("").parts)) if rel.parts[0] == "dab_pipeline" else None
    broken = []
    for node, module in _project_imports(path, tree):
        names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
        targets = [f"{module}.{n}" for n in names] if module == "dab_pipeline.stages" else [module]
        for target in targets:
            stage = _stage_of(target)
            if stage is None or stage == own:
                continue
            inner = target.split(".")[3:]
            private = [n for n in inner + names if n.startswith("_") and not n.startswith("__")]
            if private:
                broken.append(f"{rel}:{node.lineno} imports {', '.join(private)} of the {stage} stage")
            if own is not None and not (own == "sweep" and stage in ("train", "evaluate") and not inner):
                broken.append(f"{rel}:{node.lineno} imports {target} into the {own} stage")
    return broken


def test_stages_are_leaves_and_keep_their_private_names() -> None:
    """No stage imports another (the sweep drives train and evaluate through their packages' public names), and
    no code, tests and benchmarks included, imports a stage's underscore names from outside it (issue 35). Tests
    may still monkeypatch such a name as a seam; importing it would make it an interface."""
    files = [p for d in ("dab_pipeline", "tests", "benchmarks") for p in (REPO / d).rglob("*.py")]
    broken = [line for path in files for line in stage_rule_breaks(path)]
    assert not broken, broken


def test_the_stage_rules_catch_a_bad_import(tmp_path: Path) -> None:
    """The rule above fails on what it forbids (a check that never fails proves nothing)."""
    cases = {
        "dab_pipeline/stages/serve/app.py": ("from ..search import SearchConfig", "into the serve stage"),
        "dab_pipeline/stages/evaluate/run.py": ("from ..train.config import TrainResult", "into the evaluate stage"),
        "dab_pipeline/stages/sweep/one.py": ("from ..train.trainer import Trainer", "into the sweep stage"),
        "dab_pipeline/cli/commands/training.py": (
            "from ...stages.distill.run import _inherited_line",
            "_inherited_line of the distill stage",
        ),
        "tests/stages/test_train.py": (
            "from dab_pipeline.stages.train.run import _run_train",
            "_run_train of the train stage",
        ),
    }
    for where, (line, expected) in cases.items():
        broken = stage_rule_breaks(REPO / where, ast.parse(line))
        assert any(expected in b for b in broken), (where, line, broken)
    fine = {
        "dab_pipeline/stages/sweep/one.py": "from ..train import TrainConfig, run_train",
        "dab_pipeline/stages/train/run.py": "from .trainer import Trainer",
        "dab_pipeline/cli/commands/training.py": "from ...stages.distill import run_distill",
    }
    for where, line in fine.items():
        assert not stage_rule_breaks(REPO / where, ast.parse(line)), (where, line)


_TEST_MODULE_IMPORT = re.compile(r"^\s*(?:from\s+[\w.]*\btest_\w*\s+import|import\s+[\w.]*\btest_\w*)", re.M)


def imports_of_test_modules(source: str, strings: bool = True) -> list[str]:
    """The imports of ``test_*`` modules in one file's source: import statements (relative or absolute, a test
    module imported from its package too) and, with ``strings``, lines of code a test hands to a subprocess."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            dotted = (node.module or "").split(".") + ([] if node.module else [a.name for a in node.names])
            if any(part.startswith("test_") for part in dotted):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {a.name}"
                for a in node.names
                if any(part.startswith("test_") for part in a.name.split("."))
            ]
        elif strings and isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [
                f"{node.lineno}: {m.group(0).strip()} (in a string)" for m in _TEST_MODULE_IMPORT.finditer(node.value)
            ]
    return found


def test_no_test_file_imports_another() -> None:
    """What several test files share lives in tests/helpers/ (or a conftest.py fixture); no file under tests/
    imports a test module, subprocess scripts included (issue 35). The rule fails on what it forbids, first."""
    bad = [
        "from .test_train import _cfg",
        "from tests.stages.test_train import x",
        "from . import test_train",
        "import tests.store.test_store",
        'CODE = "import sys\\nfrom tests.store.test_store import make_store"',
    ]
    for line in bad:
        assert imports_of_test_modules(line), line
    for line in [
        "from ..helpers.training import train_config",
        "from click.testing import CliRunner",
        "from dab_pipeline.testing import random_store",
        'CODE = "from tests.helpers.store_rows import F"',
    ]:
        assert not imports_of_test_modules(line), line
    found = [
        f"{path.relative_to(REPO)}:{hit}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        for hit in imports_of_test_modules(path.read_text(), strings=path != Path(__file__))
    ]  # ours: examples
    assert not found, found


def test_the_root_graph_is_acyclic_and_at_most_seven_floors() -> None:
    """Draw the root's packages and modules with their import arrows: no circle, and at most 7 floors (issue 25)."""
    root = REPO / "dab_pipeline"
    edges: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        src = path.relative_to(root).parts[0].removesuffix(".py")
        for node, module in _project_imports(path):
            parts = module.split(".")
            if len(parts) == 1:  # `from .. import x` at the root: x is the node
                parts += [node.names[0].name]
            if parts[1] not in (src, "__init__"):
                edges.setdefault(src, set()).add(parts[1])
    edges.pop("__init__", None)

    def floor(node: str, path: tuple[str, ...] = ()) -> int:
        assert node not in path, f"import circle: {' -> '.join(path + (node,))}"
        return 1 + max((floor(m, path + (node,)) for m in edges.get(node, ())), default=0)

    floors = {n: floor(n) for n in edges}
    assert max(floors.values()) <= 7, floors
    # docs/architecture.md states the graph's size: it must be the tree's, measured here
    nodes = set(edges) | {m for targets in edges.values() for m in targets}
    measured = (len(nodes), sum(len(t) for t in edges.values()), max(floors.values()))
    doc = (REPO / "docs" / "architecture.md").read_text()
    stated = re.search(r"the tree has (\d+)\s+nodes .*?, (\d+) arrows and (\d+) floors", doc, re.S)
    assert stated and tuple(map(int, stated.groups())) == measured, (stated and stated.groups(), measured)


def _deferred_imports(path: Path):
    """The in-function imports of the project's modules in one file (TYPE_CHECKING blocks aside)."""
    tree = ast.parse(path.read_text())
    top_level = {id(n) for n in tree.body}
    checking = [n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)]
    for node, module in _project_imports(path, tree):
        if id(node) in top_level or module.endswith("TYPE_CHECKING"):
            continue
        if not any(node in ast.walk(n) for n in checking):
            yield node, module


def test_in_function_imports_of_the_project_are_deferred_with_a_reason() -> None:
    """Imports of the project's own modules sit at the top of a file, except in the CLI, where each defers a
    heavy import for start-up time and says so: `dab --help` stays torch-free (issue 25)."""
    misplaced = []
    for path in (REPO / "dab_pipeline").rglob("*.py"):
        tree = ast.parse(path.read_text())
        lines = path.read_text().splitlines()
        top_level = {id(n) for n in tree.body}
        for node, module in _project_imports(path, tree):
            if id(node) in top_level or module.endswith("TYPE_CHECKING"):
                continue
            in_type_block = any(
                isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test) and node in ast.walk(n)
                for n in tree.body
            )
            if in_type_block:
                continue
            cli = path.relative_to(REPO).parts[1] == "cli"
            if not (cli and "# deferred:" in lines[node.lineno - 1]):
                misplaced.append(f"{path.relative_to(REPO)}:{node.lineno} {module}")
    assert not misplaced, misplaced
    deferred = sum(1 for path in (REPO / "dab_pipeline").rglob("*.py") for _ in _deferred_imports(path))
    stated = re.search(r"except (\d+) in `cli/`", (REPO / "docs" / "architecture.md").read_text())
    assert stated and int(stated.group(1)) == deferred, (stated and stated.group(1), deferred)
    code = "import sys, dab_pipeline.cli; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


def test_functions_fit_on_a_screen() -> None:
    """No function of the package is longer than 60 lines, def to last line, as the formatter writes it (issue 35:
    the formatter applied once must leave functions within a screen)."""
    long = []
    for path in sorted((REPO / "dab_pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})")
    assert not long, long


# ---- docs/architecture.md is the house as it is (issue 48)

ARCH = REPO / "docs" / "architecture.md"


def _tree_paths(doc: str) -> set[str]:
    """The paths the tree of docs/architecture.md names, relative to dab_pipeline/ (folders end with /)."""
    block = doc.split("## The tree", 1)[1].split("```", 2)[1]
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("dab_pipeline/"))
    stack: list[str] = []
    out: set[str] = set()
    for line in lines[start + 1 :]:
        col = len(line) - len(line.lstrip())
        if not line.strip() or col >= 26:  # a blank line, or a description's continuation
            continue
        names = []
        for tok in line.split():
            names.append(tok.rstrip(","))
            if not tok.endswith(","):
                break
        stack = stack[: col // 2 - 1]
        out |= {"/".join([*stack, n.rstrip("/")]) + ("/" if n.endswith("/") else "") for n in names}
        if names[-1].endswith("/"):
            stack.append(names[-1].rstrip("/"))
    return out


def test_the_tree_in_the_docs_is_the_package() -> None:
    """Every module and package of dab_pipeline/ has its line in the tree, and every line names one that exists."""
    root = REPO / "dab_pipeline"
    listed = _tree_paths(ARCH.read_text())
    modules = {p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.name != "__init__.py"}
    packages = {p.parent.relative_to(root).as_posix() + "/" for p in root.rglob("__init__.py") if p.parent != root}
    assert not sorted((modules | packages) - listed), "not in the tree"
    assert not sorted(p for p in listed if not (root / p.rstrip("/")).exists()), "in the tree, not in the package"
    # the parser reads what it should (a check that never fails proves nothing)
    assert {"training/loop.py", "scoring/kernels/cpu.py", "scoring/kernels/csrc/", "results/templates/"} <= listed


def _private_imports(path: Path) -> list[str]:
    """``from <another module> import _name`` in one file: a module's underscore names are its own."""
    return [
        f"{path.relative_to(REPO)}:{node.lineno} {module}.{alias.name}"
        for node, module in _project_imports(path)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def test_no_module_imports_another_modules_private_names() -> None:
    found = [hit for path in sorted((REPO / "dab_pipeline").rglob("*.py")) for hit in _private_imports(path)]
    assert not found, found
    probe = REPO / "dab_pipeline" / "scoring" / "probe_private.py"
    probe_tree = ast.parse("from .tiles import _memo\nfrom ..core.fsutil import fsync_dir")
    bad = [
        f"{module}.{a.name}"
        for node, module in _project_imports(probe, probe_tree)
        for a in getattr(node, "names", [])
        if a.name.startswith("_")
    ]
    assert bad == ["dab_pipeline.scoring.tiles._memo"], bad


# Third-party private names dab reaches because no public spelling does the job (issue 62): name -> whose, and why.
# Only names no module of dab defines can be listed here (a test holds it), so the list never excuses dab's own.
THIRD_PARTY_PRIVATES = {
    "_exit": "os._exit: a forked worker, or the CLI past h5py's hanging close, leaves without atexit handlers",
    "_utils": "torch._utils: the tensor rebuilders a TorchScript archive's pickle names (weights.py's unpickler)",
    "_rebuild_tensor_v2": "torch._utils' rebuilder of a tensor, as a TorchScript archive's pickle names it",
    "_rebuild_parameter": "torch._utils' rebuilder of a parameter, likewise",
    "_is_mkldnn_bf16_supported": "torch.ops.mkldnn: oneDNN's packed bf16 linears are private ops of torch only",
    "_reorder_linear_weight": "torch.ops.mkldnn: packing a weight for them",
    "_linear_pointwise": "torch.ops.mkldnn: the packed product, an add fused",
    "_modules": "nn.Module's own dicts: whether a module holds other objects than at the last walk, not re-walked",
    "_parameters": "nn.Module's own dicts, likewise",
    "_buffers": "nn.Module's own dicts, likewise",
    "_version": "a tensor's in-place version counter (no public API): whether a weight was written since",
    "_get_safe_alternatives": "open_clip's safetensors names of a weights file, to find them in the HF cache as it does",
    "_s3creator": "s3fs's session of an asynchronous filesystem, which s3fs never closes: closed by hand",
    "_s3": "s3fs's client of that session, dropped with it",
    "_strip_protocol": "fsspec's one spelling of a path, which every filesystem implements (no public twin)",
}
_ACCESSORS = ("getattr", "setattr", "hasattr", "delattr", "object.__setattr__")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _named_attribute(node: ast.AST) -> tuple[ast.expr, str] | None:
    """(object, attribute name) of ``x.name``, or of ``getattr(x, "name")`` and its kin; None for anything else."""
    if isinstance(node, ast.Attribute):
        return node.value, node.attr
    if isinstance(node, ast.Call) and ast.unparse(node.func) in _ACCESSORS and len(node.args) >= 2:
        name = node.args[1]
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            return node.args[0], name.value
    return None


def _defined_names(tree: ast.Module) -> set[str]:
    """What a module defines: its functions and classes, the names it assigns, and the attributes of ``self`` and
    ``cls`` it reads or writes (its classes' own)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (found := _named_attribute(node)) and _own(found[0]):
            names.add(found[1])
    return names


def _private_attribute_uses(tree: ast.Module) -> list[tuple[str, str]]:
    """(name, "line: code") of each ``x._name`` (read or written, or through getattr / setattr) where x is not self
    or cls and the module does not define ``_name``: another module's private attribute, reached from here."""
    defined = _defined_names(tree)
    found = [
        (node.lineno, node.col_offset, name, ast.unparse(node))
        for node in ast.walk(tree)
        if (hit := _named_attribute(node))
        for obj, name in [hit]
        if _private(name) and not _own(obj) and name not in defined
    ]
    return [(name, f"{line}: {code}") for line, _, name, code in sorted(found)]


def test_no_module_reaches_another_modules_private_attributes() -> None:
    """A module's underscore attributes are its own too: no ``other._name`` across modules, ``self.`` and ``cls.``
    exempt, third-party privates only where listed (THIRD_PARTY_PRIVATES, each with why)."""
    found, used, defined = [], set(), set()
    for path in sorted((REPO / "dab_pipeline").rglob("*.py")):
        tree = ast.parse(path.read_text())
        defined |= _defined_names(tree)
        for name, where in _private_attribute_uses(tree):
            used.add(name)
            if name not in THIRD_PARTY_PRIVATES:
                found.append(f"{path.relative_to(REPO)}:{where}")
    assert not found, found
    assert not sorted(set(THIRD_PARTY_PRIVATES) & defined), "dab defines these: not a third-party name"
    assert not sorted(set(THIRD_PARTY_PRIVATES) - used), "listed, no longer used"


def test_the_private_attribute_rule_catches_a_bad_access() -> None:
    """The check finds what it should (a check that never fails proves nothing), and lets the module's own be."""
    own = ast.parse(
        "class Store:\n"
        "    def __init__(self):\n"
        "        self._rows = 1\n"
        "def rows(store):\n"
        "    return store._rows\n"  # _rows is this module's: allowed
    )
    assert _private_attribute_uses(own) == []
    other = ast.parse(
        "import torch\n"
        "def peek(store, bundle):\n"
        "    store._rows = 2\n"
        "    object.__setattr__(bundle, '_known', None)\n"
        "    return getattr(store, '_offsets', None), torch._C, self._mine, store.__dict__\n"
    )
    assert [where for _, where in _private_attribute_uses(other)] == [
        "3: store._rows",
        "4: object.__setattr__(bundle, '_known', None)",
        "5: getattr(store, '_offsets', None)",
        "5: torch._C",
    ]


def _md_table(doc: str, heading: str) -> list[list[str]]:
    """The rows (cells) of the first table under ``heading`` in a markdown page."""
    section = doc.split(heading, 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    first = section.index(rows[0])
    rows = [r for r in section[first:].split("\n\n", 1)[0].splitlines() if r.startswith("|")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", r)[1:-1]] for r in rows[2:]]


def test_module_names_repeat_across_packages_only_where_listed() -> None:
    """Two modules share a name only where docs/architecture.md's Names table lists them, in the folders it says."""
    root = REPO / "dab_pipeline"
    where: dict[str, set[str]] = {}
    for p in root.rglob("*.py"):
        if p.name != "__init__.py":
            where.setdefault(p.name, set()).add(p.parent.relative_to(root).as_posix())
    repeated = {name: dirs for name, dirs in where.items() if len(dirs) > 1}
    listed = {}
    for name, folders, _why in _md_table(ARCH.read_text(), "## Names"):
        stages = re.search(r"the stages (.*)", folders)
        dirs = set(re.findall(r"`([\w/]+)/`", folders.split("the stages")[0]))
        if stages:
            dirs |= {f"stages/{s}" for s in re.findall(r"`(\w+)`", stages.group(1))}
        listed[name.strip("`")] = {d.rstrip("/") for d in dirs}
    assert repeated == listed, {"found": repeated, "listed": listed}


def _code_names() -> set[str]:
    """Every class, function, attribute, field and keyword name defined or used as a keyword in dab_pipeline/."""
    names: set[str] = set()
    for p in (REPO / "dab_pipeline").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                names |= (
                    {a.arg for a in node.args.args + node.args.kwonlyargs}
                    if not isinstance(node, ast.ClassDef)
                    else set()
                )
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
                    names |= {n.attr for n in ast.walk(t) if isinstance(n, ast.Attribute)}
    return names


def _cli_words() -> set[str]:
    """The commands (``dab train``) and option spellings (``--steps``, ``-k``) of the click tree."""
    from dab_pipeline.cli import cli, register_commands

    register_commands()
    words: set[str] = set()
    for name, command in cli.commands.items():
        words.add(f"dab {name}")
        for param in command.params:
            words |= set(param.opts) | set(param.secondary_opts)
    return words


def _held() -> dict[str, dict[str, set[str]]]:
    """Each class of dab_pipeline/ by name -> each name it holds -> how: "field" (annotated in its body), "self" (a
    ``self.`` attribute a method sets), "method" or "argument" (of one of its methods)."""
    held: dict[str, dict[str, set[str]]] = {}
    for p in (REPO / "dab_pipeline").rglob("*.py"):
        for cls in [n for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)]:
            names = held.setdefault(cls.name, {})
            for st in cls.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    names.setdefault(st.target.id, set()).add("field")
                if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.setdefault(st.name, set()).add("method")
                    for a in st.args.args + st.args.kwonlyargs:
                        names.setdefault(a.arg, set()).add("argument")
                    for node in ast.walk(st):
                        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                        for t in targets:
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                                names.setdefault(t.attr, set()).add("self")
    return held


def test_the_glossary_names_exist_and_retired_names_are_gone() -> None:
    rows = _md_table(ARCH.read_text(), "## Glossary")
    assert len(rows) >= 20
    code, cli, sources = _code_names(), _cli_words(), {}
    for p in (REPO / "dab_pipeline").rglob("*.py"):
        sources[p.relative_to(REPO).as_posix()] = p.read_text().splitlines()
    shim = re.compile(r"register_deprecations|one release|former")
    excused = set()  # retired names found on shim lines: the patterns do find them
    held = _held()
    for concept, in_code, on_cli, retired in rows:
        for name in re.findall(r"`([^`]+)`", in_code):
            if name.endswith(".py"):
                assert list((REPO / "dab_pipeline").rglob(name)), (concept, name)
            else:
                assert all(part in code for part in re.split(r"[.(),=\s]+", name) if part), (concept, name)
        for word in re.findall(r"`([^`]+)`", on_cli):
            word = word.split("=")[0].rstrip()
            assert word in cli or (word.startswith("--set ") and word.split()[1] not in ("",)), (concept, word)
        for old in re.findall(r"`([^`]+)`", retired):
            if old.endswith(".py"):  # a retired module path
                assert not [p for p in (REPO / "dab_pipeline").rglob("*.py") if p.as_posix().endswith("/" + old)], old
                continue
            member = re.fullmatch(r"([A-Z]\w*)\.(\w+)", old)
            if member:  # a class's member: by what the class holds (a token would find x.k of another class)
                cls, name = member.groups()
                assert name not in held.get(cls, {}), f"{concept}: {cls} still holds {name} ({held[cls][name]})"
                continue
            if re.fullmatch(r"[\w.]+=?", old):  # a name: an attribute or def of a dotted one, a keyword
                token = old.split(".")[-1]
                pre = r"(?<!from )(?:\.|def\s+)" if "." in old else r"(?<![\w-])"
                pattern = re.compile(pre + re.escape(token) + (r"" if token.endswith("=") else r"(?!\w)"))
            else:  # a spelling, as written
                pattern = re.compile(r"(?<![\w-])" + re.escape(old) + r"(?![\w-])")
            for path, lines in sources.items():
                for i, line in enumerate(lines):
                    window = " ".join(lines[max(0, i - 1) : i + 3])
                    if pattern.search(line) and not shim.search(window):
                        pytest.fail(f"{concept}: retired name {old!r} at {path}:{i + 1}: {line.strip()}")
                    elif pattern.search(line):
                        excused.add(old)
    assert {"--topk", '"confidence": margin'} <= excused, excused


def test_a_name_objects_hold_means_one_thing() -> None:
    """Issue 62, item 4: the classes that hold a name of docs/architecture.md's table (as a field or a ``self.``
    attribute) are the ones it lists, so ``k`` is the hits wherever an object holds it (and the pooling's keys),
    ``first_k`` calibrate's, ``shortlist`` the first stage's K."""
    held = _held()
    for name, _what, holders in _md_table(ARCH.read_text(), "Some names are held by objects"):
        name = name.strip("`")
        found = {cls for cls, names in held.items() if names.get(name, set()) & {"field", "self"}}
        assert found == set(re.findall(r"`(\w+)`", holders)), (name, found)


def test_a_feature_is_not_named_as_the_probability_made_of_it() -> None:
    """Issue 62, item 4: a calibration's features (softmax_first, ...) are not named as the calibrated probabilities
    a search answers with (p_first, p_first_k), nor the fields of its answer."""
    from dataclasses import fields

    from dab_pipeline.calibration import QueryUncertainty
    from dab_pipeline.calibration.features import feature_names

    answer = {f.name for f in fields(QueryUncertainty)}
    assert {"p_first", "p_first_k"} <= answer and not set(feature_names(5, True)) & answer


def test_every_deprecation_is_listed_with_why() -> None:
    """The files that keep a deprecated public name are the ones docs/architecture.md's deprecation table names."""
    marker = re.compile(r"former_spelling\(|DeprecationWarning,|#.*one release")
    root = REPO / "dab_pipeline"
    found = {
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if p.name != "deprecation.py" and any(marker.search(line) for line in p.read_text().splitlines())
    }
    listed = {row[0].strip("`") for row in _md_table(ARCH.read_text(), "Deprecated names, one table")}
    assert found == listed, {"in the code, not listed": found - listed, "listed, not in the code": listed - found}


def test_the_deprecations_are_one_table_of_names_the_code_still_keeps() -> None:
    """Issue 62: every old name in core/deprecation.py's DEPRECATIONS is still spelled by the code that keeps it
    (quoted, outside the table), and goes in a version after this one."""
    from dab_pipeline import __version__
    from dab_pipeline.core.deprecation import DEPRECATIONS

    def version(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split("."))

    code = "\n".join(p.read_text() for p in (REPO / "dab_pipeline").rglob("*.py") if p.name != "deprecation.py")
    assert DEPRECATIONS, "the table is empty: drop it, and this test"
    for old, d in DEPRECATIONS.items():
        assert f'"{old}"' in code, f"{old} is in DEPRECATIONS but no code keeps it: drop its entry"
        assert version(d.removed_in) > version(__version__), (old, d.removed_in)
