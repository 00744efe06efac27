"""What ships and what only tests: the product never imports the test bed, and holds none of it.

The product is the `smoothscale` package (operator/smoothscale): the image, the wheel. The test
bed is the `devstack` package (devstack/): the local control plane, the embedded Kafka, the
demo and the scenario harness. The test bed may import the product, never the reverse.
"""

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ROOT / "operator" / "smoothscale"
TEST_BED = "devstack"
# A string that names a test-bed module: `importlib.import_module("devstack.stack")`,
# an entry point `"devstack.cli:register"`, `python -m devstack.demo`.
MODULE_PATH = re.compile(rf"{TEST_BED}(\.\w+)*(:\w+)?")


def _names_test_bed(module: str) -> bool:
    return module == TEST_BED or module.startswith(f"{TEST_BED}.")


def references_to_test_bed(source: str) -> list[str]:
    """`line: module` for every import of the test bed in `source`, at any depth (inside
    functions too), and every string that names one of its modules."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            modules = [node.value] if MODULE_PATH.fullmatch(node.value) else []
        else:
            continue
        found += [(node.lineno, module) for module in modules if _names_test_bed(module)]
    return [f"{line}: {module}" for line, module in sorted(found)]


def test_no_product_module_imports_the_test_bed() -> None:
    modules = sorted(PRODUCT.rglob("*.py"))
    offenders = {
        str(path.relative_to(ROOT)): references
        for path in modules
        if (references := references_to_test_bed(path.read_text()))
    }

    assert len(modules) > 40, "the product's sources were not found"
    assert offenders == {}, "the product must not import the test bed (devstack)"


def test_the_check_sees_every_way_of_importing_the_test_bed() -> None:
    source = """
import devstack
import json, devstack.stack as stack
from devstack.kafka.embedded import EmbeddedKafka

def later():
    from devstack import demo
    importlib.import_module("devstack.kafka.front")
    return ["python", "-m", "devstack.cli"], "devstack.cli:register"

import devstackish
from smoothscale.devstack_like import x
NOTE = "devstack is the test bed"
"""

    assert references_to_test_bed(source) == [
        "2: devstack",
        "3: devstack.stack",
        "4: devstack.kafka.embedded",
        "7: devstack",
        "8: devstack.kafka.front",
        "9: devstack.cli",
        "9: devstack.cli:register",
    ]


def _test_bed_paths(root: Path) -> list[str]:
    return [
        str(path.relative_to(ROOT))
        for path in root.rglob(f"{TEST_BED}*")
        if path.name in (TEST_BED, f"{TEST_BED}.py")
    ]


def test_the_product_distribution_holds_no_test_bed_module() -> None:
    # The product's wheel (and so the image) is built from the package roots pyproject.toml
    # names: they hold the smoothscale package, and nothing of the test bed.
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = [ROOT / where for where in settings["packages"]["find"]["where"]]
    top_level = {
        path.name
        for root in roots
        for path in root.iterdir()
        if path.name != "__pycache__" and not path.name.endswith(".egg-info")
    }

    assert top_level == {"smoothscale"}
    assert [path for root in roots for path in _test_bed_paths(root)] == []


def test_the_image_build_context_holds_no_test_bed() -> None:
    allowed = [
        line.strip()[1:]
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip().startswith("!")
    ]
    test_bed = ROOT / TEST_BED
    folders = [ROOT / a for a in allowed if (ROOT / a).is_dir()]

    assert "operator" in allowed
    assert [a for a in allowed if (ROOT / a).resolve().is_relative_to(test_bed)] == []
    assert [path for folder in folders for path in _test_bed_paths(folder)] == []
