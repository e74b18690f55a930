"""The README and the noxfile docstring name the nox sessions that exist, and every plugin folder."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent


def _sessions() -> set[str]:
    """The session names `nox -l` prints, read from noxfile.py without importing nox."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    supported: dict[str, tuple[str, ...]] = {}  # PYTHONS: from SUPPORTED; TRAINER_PYTHONS: TRAINER_SUPPORTED
    for node in tree.body:
        for target in node.targets if isinstance(node, ast.Assign) else ():
            if isinstance(target, ast.Name) and target.id in ("SUPPORTED", "TRAINER_SUPPORTED"):
                supported[target.id.replace("SUPPORTED", "PYTHONS")] = ast.literal_eval(node.value)
    names: set[str] = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            if not (isinstance(deco, ast.Call) and ast.unparse(deco.func) == "nox.session"):
                continue
            python = next((k.value for k in deco.keywords if k.arg == "python"), None)
            if python is not None and ast.unparse(python) in supported:
                names.update(f"{node.name}-{v}" for v in supported[ast.unparse(python)])
            elif node.name == "plugin":
                names.add("plugin(plugin='osmosis-<name>')")
            else:
                names.add(node.name)
    return names


def test_the_readme_and_the_noxfile_name_every_session() -> None:
    sessions = _sessions()
    assert {"tests-3.12", "tests-3.13", "lint", "types", "plugins_all", "trainer-3.10", "trainer-3.13"} <= sessions
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"`([^`\s]+)`", readme))
    assert sessions - named == set(), "README.md does not name these nox sessions"
    doc = ast.get_docstring(ast.parse((ROOT / "noxfile.py").read_text())) or ""
    missing = {s for s in sessions if s.replace("osmosis-<name>", "<name>") not in doc}
    assert missing == set(), "the noxfile docstring does not list these sessions"


def test_the_readme_names_every_plugin() -> None:
    readme = (ROOT / "README.md").read_text()
    plugins = sorted(p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file())
    assert plugins, "no plugin folder found"
    assert [p for p in plugins if p not in readme] == []


def test_one_example_backend_in_the_readme_the_docstring_and_the_contract_suite():
    """The README's backend plugin and ``osmosis_core.backend``'s docstring are the code the contract
    suite runs (``osmosis_core/testing/example_backend.py``), word for word."""
    import osmosis_core.backend
    import osmosis_core.plugin

    source = (ROOT / "osmosis_core" / "testing" / "example_backend.py").read_text()
    code = source[source.index("import anyio") :]
    assert code in (ROOT / "README.md").read_text()
    docstring = osmosis_core.backend.__doc__ or ""
    indented = "".join(f"    {line}" if line.strip() else line for line in code.splitlines(True))
    assert indented.rstrip() in docstring
    assert "EchoBackend" not in (ROOT / "README.md").read_text() + docstring + (osmosis_core.plugin.__doc__ or "")
