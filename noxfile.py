"""The test matrix. Run it with `scripts/test` (which finds Python >= 3.12 and installs nox and uv).

Sessions (`nox -l` lists them):
  tests-3.12, tests-3.13   the core alone, on every supported Python installed here
  faults                    the slow fault tests (process-group SIGTERM in a loop, ...), core alone
  package                   the built wheel installed alone: template apply, run, validate; then
                            scripts/install and scripts/demo from this clone (tests marked `install`)
  lint                      ruff (lint + format check) and import-linter (the layers, the plugin API)
  types                     mypy --strict on osmosis_core (each plugin session types its plugin)
  plugin(plugin='<name>')   the core plus one plugin from plugins/ (and the plugins/ folders it depends
                            on, e.g. osmosis-openai): its tests and mypy --strict
                            (osmosis-server's also against osmosis-ai 0.3.8, in a venv of its own)
  trainer-3.10, trainer-3.11, trainer-3.12, trainer-3.13
                            osmosis-trainer installed alone (no osmosis-core: checked), on every Python from
                            3.10 installed here: its tests (the client's against osmosis serve run by a
                            Python >= 3.12 of its own, as a trainer and its rollout server run), and
                            mypy --strict for Python 3.10
  train                     osmosis-trainer with TRL, torch and transformers on Python 3.11 (pip: the CPU build
                            of torch 2.13.0 lies on this disk for 3.11): the TRL adapter against TRL's real
                            GRPOTrainer, the live policy server, and the proof that a model learns (a tiny
                            model trained with GRPO through osmosis serve --traces, once with chat calls and
                            once token-in through its /inference/v1/generate, its figures printed)
  verl                      osmosis-trainer's verl adapter against verl itself (verl 0.9.1 on Python 3.11 with
                            torch's CPU build, by pip: its agent-loop worker's hydra instantiation and
                            post-processing, its TokenOutput through the token-in bridge, real rollouts of
                            osmosis serve)
  skyrl                     osmosis-trainer's SkyRL adapter against SkyRL itself (Python 3.11: SkyRL's published
                            package and what its `skyrl-train` extra installs but the CUDA-only packages, on
                            torch's CPU build): SkyRL's validate_generator_output, its trainer's generate and
                            postprocessing, real rollouts of osmosis serve
  plugins_all               every plugin installed together: pip check, no name clashes, and the tests that
                            need other plugins beside their own (marked `together`; the rest ran alone)
  images                    osmosis-harbor's task images (marked `images`): real buildah builds of task
                            Dockerfiles on bases made by mmdebstrap (root, buildah, mmdebstrap, Debian's
                            archive), trials on their overlays through osmosis run and Harbor's own CLI
  bench                     the benchmarks in bench/ (not run by default)

Coverage, per distribution: tests-3.12, each plugin session and trainer-3.12 run their tests under coverage
and print `coverage of <distribution>: N% of its lines (in-process)`.

Test dependencies come from the `test` dependency group of the core's pyproject.toml and of each
plugin's, by name; their versions from test-constraints.txt (UV_CONSTRAINT, for every install).
Every session compiles what it installs to bytecode, as pip does for users (uv does not by
default, and with PYTHONDONTWRITEBYTECODE set every process would compile its imports again).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nox
from packaging.requirements import Requirement

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = False
nox.options.reuse_venv = "yes"

os.environ["UV_COMPILE_BYTECODE"] = "1"
try:  # uv beside nox (scripts/test installs both): found even where a session's PATH has no uv (pip-made venvs)
    from uv import find_uv_bin

    UV = find_uv_bin()
except (ImportError, FileNotFoundError):
    UV = "uv"

ROOT = Path(__file__).parent
# the versions of every test tool, written once: the dependency groups name the tools without one
os.environ["UV_CONSTRAINT"] = str(ROOT / "test-constraints.txt")
SUPPORTED = ("3.12", "3.13")
TRAINER_SUPPORTED = ("3.10", "3.11", "3.12", "3.13")  # osmosis-trainer: what a trainer's image runs


def _installed(version: str) -> bool:
    exe = shutil.which(f"python{version}")
    if exe is None:
        return False
    return subprocess.run([exe, "-c", "pass"], capture_output=True).returncode == 0


PYTHONS = [v for v in SUPPORTED if _installed(v)] or [SUPPORTED[0]]
TRAINER_PYTHONS = [v for v in TRAINER_SUPPORTED if _installed(v)] or [SUPPORTED[0]]
TRAINER = "osmosis-trainer"
LOCAL = sorted(p.name for p in (ROOT / "plugins").glob("osmosis-*") if (p / "pyproject.toml").is_file())
"""Every distribution in plugins/ (installed from here: they are not on an index)."""
PLUGINS = [p for p in LOCAL if p != TRAINER]
"""The ones a `plugin` session runs with the core; osmosis-trainer runs without it, in `trainer`."""


def _group(name: str, project: Path = ROOT) -> list[str]:
    """A dependency group of a pyproject.toml (the core's, or a plugin folder's)."""
    return nox.project.dependency_groups(nox.project.load_toml(project / "pyproject.toml"), name)


def _package(plugin: str) -> str:
    return plugin.replace("-", "_")


def _local_deps(plugin: str) -> list[str]:
    """The plugins/ folders ``plugin`` depends on, directly or not (osmosis-strands: osmosis-openai):
    they are not on an index, so a session installs them from here, editable, beside the plugin."""
    found: list[str] = []
    todo = [plugin]
    while todo:
        requires = nox.project.load_toml(ROOT / "plugins" / todo.pop() / "pyproject.toml")["project"]["dependencies"]
        for requirement in requires:
            name = Requirement(requirement).name
            if name in LOCAL and name not in found:
                found.append(name)
                todo.append(name)
    return sorted(found)


def _compile_sources(session: nox.Session, *paths: str) -> None:
    """Bytecode for the editable sources too (their imports would otherwise compile in every process)."""
    session.run("python", "-m", "compileall", "-q", "-j", "0", *paths, silent=True)


def _pytest_with_coverage(session: nox.Session, package: str, *args: str) -> None:
    """``pytest *args``, measured by coverage (in this process; sys.monitoring where the Python has it), then
    one line with the share of ``package``'s lines the tests ran: the figure CI prints per distribution."""
    # (not session.create_tmp(): it points TMPDIR into the clone, where a sandboxed trial may not read)
    data = Path(session.virtualenv.location) / f".coverage.{package}"
    session.env["COVERAGE_FILE"] = str(data)
    session.env["COVERAGE_CORE"] = "sysmon"  # coverage >= 7.4 on Python >= 3.12: a fraction of the tracer's cost
    session.run("coverage", "run", f"--source={package}", "-m", "pytest", *args)
    total = session.run("coverage", "report", "--format=total", silent=True)
    session.log(f"coverage of {package.replace('_', '-')}: {str(total).strip()}% of its lines (in-process)")


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The core's tests on its own (no plugin installed); the slow fault tests run in `faults`.
    Coverage is measured on the first Python (``coverage of osmosis-core: N%``)."""
    session.install("-e", ".", *_group("test"))
    _compile_sources(session, "osmosis_core")
    args = ("tests", "-m", "not slow and not install", *session.posargs)
    if session.python == PYTHONS[0]:
        _pytest_with_coverage(session, "osmosis_core", *args)
    else:
        session.run("pytest", *args)


@nox.session(python=PYTHONS[0])
def faults(session: nox.Session) -> None:
    """The core's slow fault tests: real signals in a loop (they take a minute or more)."""
    session.install("-e", ".", *_group("test"))
    _compile_sources(session, "osmosis_core")
    session.run("pytest", "tests", "-m", "slow", "-s", *session.posargs)


@nox.session(python=PYTHONS[0])
def package(session: nox.Session) -> None:
    """The built wheel, installed alone as a user would: apply the template, run it, check the guides."""
    tmp = Path(session.create_tmp())
    dist = tmp / "dist"
    session.install("build", "uv")
    session.run("python", "-m", "build", "--wheel", "--installer", "uv", "--outdir", str(dist), str(ROOT))
    [wheel] = sorted(dist.glob("osmosis_core-*.whl"))[-1:]
    session.install(str(wheel))
    workspace = tmp / "workspace"
    shutil.rmtree(workspace, ignore_errors=True)
    session.run("osmosis", "template", "apply", "multiply-plain", str(workspace))
    session.chdir(workspace)
    session.run("osmosis", "run", "configs/eval/multiply-plain.toml", "--stub-policy", "--limit", "5")
    session.run("osmosis", "validate", "configs/training/multiply-plain.toml")
    # installing from the clone: scripts/install against an index that offers an impostor, and
    # scripts/demo's second run (tests/test_install.py: virtualenvs of their own, uv's and pip's caches)
    session.chdir(ROOT)
    session.install(*_group("test"))
    session.run("pytest", "tests/test_install.py", "-m", "install", *session.posargs)


@nox.session(python=PYTHONS[0])
def lint(session: nox.Session) -> None:
    """ruff (lint rules, formatting) and import-linter: the core never imports a plugin, the CLI sits
    above the runner above the author API, and plugins use only the public plugin API."""
    session.install(*_group("lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # import-linter reads the sources; the packages need to be findable, not their dependencies
    session.install("--no-deps", "-e", ".", *[arg for p in LOCAL for arg in ("-e", f"plugins/{p}")])
    session.run("lint-imports")


@nox.session(python=PYTHONS[0])
def types(session: nox.Session) -> None:
    """mypy --strict on the core."""
    session.install("-e", ".", *_group("types"))
    session.run("mypy", "osmosis_core")


@nox.session(python=PYTHONS[0])
@nox.parametrize("plugin", PLUGINS or [None])
def plugin(session: nox.Session, plugin: str | None) -> None:
    """The core with one plugin installed alone: discovery, that plugin's tests, mypy --strict on it."""
    if plugin is None:
        session.skip("no plugins in plugins/ yet")
    folder = ROOT / "plugins" / plugin
    local = [f"plugins/{dep}" for dep in _local_deps(plugin)]
    tests = [*_group("test"), *_group("test", folder), "mypy"]
    session.install("-e", ".", *[arg for path in local for arg in ("-e", path)], "-e", f"plugins/{plugin}", *tests)
    _compile_sources(session, "osmosis_core", *local, f"plugins/{plugin}")
    _pip_check(session)
    session.run("osmosis", "plugins", "--json", silent=True)
    session.run("mypy", "--strict", f"plugins/{plugin}/{_package(plugin)}")
    if plugin == "osmosis-server":
        _reference_sdk(session)
    # the tests marked `together` need other plugins beside this one (plugins_all runs them); `images`: its own session
    tests_of = (f"plugins/{plugin}/tests", "-m", "not together and not images", *session.posargs)
    _pytest_with_coverage(session, _package(plugin), *tests_of)


@nox.session(python=PYTHONS[0])
def images(session: nox.Session) -> None:
    """osmosis-harbor's task images: each test task's Dockerfile built by buildah (on a base mmdebstrap makes from
    Debian's archive, once for the session), its trials on overlays of the image (minutes: a session of its own)."""
    plugin = "osmosis-harbor"
    local = [f"plugins/{dep}" for dep in _local_deps(plugin)]
    tests = [*_group("test"), *_group("test", ROOT / "plugins" / plugin)]
    session.install("-e", ".", *[arg for path in local for arg in ("-e", path)], "-e", f"plugins/{plugin}", *tests)
    _compile_sources(session, "osmosis_core", *local, f"plugins/{plugin}")
    session.run("pytest", f"plugins/{plugin}/tests", "-m", "images", "--durations=5", *session.posargs)


@nox.session(python=TRAINER_PYTHONS)
def trainer(session: nox.Session) -> None:
    """osmosis-trainer alone, as a trainer's image installs it (Python 3.10+, no osmosis-core): its tests.
    Its client's tests drive a real ``osmosis serve --traces``, run by a Python >= 3.12 in a virtualenv of
    its own (osmosis-server, osmosis-gateway and their plugins/ dependencies), shared by every Python."""
    folder = ROOT / "plugins" / TRAINER
    session.install("-e", f"plugins/{TRAINER}", *_group("test", folder))
    _compile_sources(session, f"plugins/{TRAINER}")
    _pip_check(session)
    serve_python = _serve_python(session)
    session.chdir(folder)  # not the clone's root, where `python -c` would find osmosis_core in the folder
    session.run("python", "-c", _WITHOUT_CORE)
    if session.python == TRAINER_PYTHONS[0]:  # the oldest: what 3.10 lacks (StrEnum, asyncio.timeout) is an error
        session.install("mypy")
        session.run("mypy", "--strict", "--python-version", "3.10", "osmosis_trainer")  # (the oldest supported)
    session.env["OSMOSIS_TRAINER_ALONE"] = "1"
    session.env["OSMOSIS_SERVE_PYTHON"] = serve_python
    if session.python == "3.12":
        _pytest_with_coverage(session, "osmosis_trainer", "tests", "-m", "not together and not torch", *session.posargs)
    else:
        session.run("pytest", "tests", "-m", "not together and not torch", *session.posargs)


TORCH_PYTHON = "3.11"
"""The Python of the sessions with torch (train, skyrl): a CPU build of torch lies on this disk for it,
and pip takes it (uv does not look there; from the index, torch on 3.12 is a CUDA build of several GB)."""
TORCH_CPU = next(
    line.strip() for line in (ROOT / "test-constraints.txt").read_text().splitlines() if line.startswith("torch==")
)
"""torch's pin (test-constraints.txt: the CPU build on this disk), which SkyRL's install must not replace."""


@nox.session(python=TORCH_PYTHON, venv_backend="venv")
def train(session: nox.Session) -> None:
    """osmosis-trainer with torch, transformers and TRL (the tests marked ``torch``): the TRL adapter
    against TRL's real GRPOTrainer, the live policy server, and a tiny model that learns through
    ``osmosis serve --traces`` (run by a Python >= 3.12 of its own, as in a deployment). pip, not uv,
    installs it: see TORCH_PYTHON."""
    folder = ROOT / "plugins" / TRAINER
    constraints = ["-c", str(ROOT / "test-constraints.txt")]
    session.install(*constraints, "-e", f"plugins/{TRAINER}", *_group("test", folder), *_group("train", folder))
    _compile_sources(session, f"plugins/{TRAINER}")
    session.run("python", "-m", "pip", "check", silent=True)
    serve_python = _serve_python(session)
    session.chdir(folder)
    session.env["OSMOSIS_SERVE_PYTHON"] = serve_python
    session.run("pytest", "tests", "-m", "torch", *session.posargs)


_WITHOUT_CORE = """
import importlib.util, sys
assert importlib.util.find_spec("osmosis_core") is None, "osmosis-core is installed beside osmosis-trainer"
import osmosis_trainer
print("osmosis-trainer", osmosis_trainer.__version__, "alone on Python", sys.version.split()[0])
"""


def _serve_python(session: nox.Session) -> str:
    """The Python of a virtualenv beside the sessions' with osmosis serve in it (made once, then reused)."""
    venv = Path(session.virtualenv.location).parent / "trainer-serve"
    python = venv / "bin" / "python"
    serve = ["osmosis-server", "osmosis-gateway"]
    local = sorted({*serve, *(dep for p in serve for dep in _local_deps(p))})
    if not python.exists():
        found = shutil.which(f"python{PYTHONS[0]}")
        session.run(UV, "venv", "-q", "--python", found or PYTHONS[0], str(venv), external=True)
    extras = {"osmosis-gateway": "[token-in]"}  # (the token-in training test renders in osmosis serve)
    editable = [arg for path in (".", *(f"plugins/{p}{extras.get(p, '')}" for p in local)) for arg in ("-e", path)]
    session.run(UV, "pip", "install", "-q", "--python", str(python), *editable, external=True)
    return str(python)


SKYRL = "skyrl==0.4.0"
SKYRL_CUDA_ONLY = frozenset({"flash-attn", "nixl", "vllm-router"})
"""What SkyRL's `skyrl-train` extra installs that is built for CUDA (or serves vLLM engines): left out."""


@nox.session(python=TORCH_PYTHON)
def skyrl(session: nox.Session) -> None:
    """osmosis-trainer's SkyRL adapter against SkyRL itself: SkyRL's validation, trainer and step-wise merge
    on its output, with rollouts of a real ``osmosis serve --traces`` (the trainer session's serve Python).

    SkyRL 0.4.0 declares Python >= 3.12, and 0.2 and 0.3 (which declare 3.11) do not import on it (pydantic refuses a
    ``typing.TypedDict`` in ``skyrl.tinker.types``); its code runs on 3.11 once that one name is
    ``typing_extensions.TypedDict``, which tests/test_skyrl.py sets before importing SkyRL. So: torch's CPU
    build by pip (uv does not look on this disk), SkyRL by pip without its metadata's Python check and
    without dependencies, then the dependencies its metadata declares for ``skyrl[skyrl-train]`` (SkyRL's
    own pins: ray, hydra-core, peft, transformers) but :data:`SKYRL_CUDA_ONLY`."""
    folder = ROOT / "plugins" / TRAINER
    session.install("pip", "-e", f"plugins/{TRAINER}", *_group("test", folder))
    session.run("python", "-m", "pip", "install", "-q", TORCH_CPU)
    session.run("python", "-m", "pip", "install", "-q", "--no-deps", "--ignore-requires-python", SKYRL)
    declared = session.run("python", "-c", _SKYRL_REQUIRES, silent=True)
    requirements = []
    for line in str(declared).splitlines():
        requirement = Requirement(line)
        if requirement.name in SKYRL_CUDA_ONLY:
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": "skyrl-train"}):
            requirement.marker = None
            requirements.append(str(requirement))
    session.install("-c", str(_torch_pin(session)), *requirements)  # nothing may replace the CPU build
    session.run("python", "-c", _TORCH_CPU_CHECK)
    _trainer_tests(session, "tests/test_skyrl.py", "tests/test_skyrl_convert.py")


def _trainer_tests(session: nox.Session, *tests: str) -> None:
    """osmosis-trainer compiled, then ``pytest tests`` in its folder, against an ``osmosis serve`` run by the
    serve Python (:func:`_serve_python`)."""
    _compile_sources(session, f"plugins/{TRAINER}")
    serve_python = _serve_python(session)
    session.chdir(ROOT / "plugins" / TRAINER)
    session.env["OSMOSIS_SERVE_PYTHON"] = serve_python
    session.run("pytest", *tests, *session.posargs)


def _torch_pin(session: nox.Session) -> Path:
    """A constraints file that holds torch at its CPU build (:data:`TORCH_CPU`)."""
    pin = Path(session.create_tmp()) / "torch-cpu.txt"
    pin.write_text(TORCH_CPU + "\n")
    return pin


_SKYRL_REQUIRES = "import importlib.metadata as m; print('\\n'.join(m.requires('skyrl') or []))"
_TORCH_CPU_CHECK = """
import importlib.metadata, torch
assert torch.__version__.endswith("+cpu"), f"torch {torch.__version__} is not the CPU build"
print("skyrl", importlib.metadata.version("skyrl"), "on torch", torch.__version__)
"""


VERL = "verl==0.9.1"
VERL_UNDECLARED = ("cachetools", "fastapi", "uvicorn")
"""What verl 0.9.1's agent-loop modules import without declaring it (its ``[vllm]``/``[sglang]`` extras bring them)."""


@nox.session(python=TORCH_PYTHON)
def verl(session: nox.Session) -> None:
    """osmosis-trainer's verl agent loop against verl itself: verl's ``AgentLoopWorker`` builds it from an
    ``agent_loop_config_path`` entry (hydra) and post-processes and batches its outputs; its bridge in front of
    a server manager answering verl's ``TokenOutput``; rollouts of a real ``osmosis serve --traces``.

    verl 0.9.1 pins ``transformers<5.11`` (test-constraints.txt pins the train session's 5.25), so pip installs it
    and torch's CPU build (on this disk for 3.11) with only torch pinned; no vLLM or SGLang (verl's agent loops
    import on the CPU without them)."""
    folder = ROOT / "plugins" / TRAINER
    session.install("pip", "-e", f"plugins/{TRAINER}", *_group("test", folder))
    pin = str(_torch_pin(session))
    session.run("python", "-m", "pip", "install", "-q", "-c", pin, TORCH_CPU, VERL, *VERL_UNDECLARED)
    session.run("python", "-c", _VERL_CHECK)
    _trainer_tests(session, "tests/test_verl.py", "tests/test_verl_convert.py")


_VERL_CHECK = """
import importlib.metadata, torch
from verl.experimental.agent_loop.agent_loop import AgentLoopBase
assert torch.__version__.endswith("+cpu"), f"torch {torch.__version__} is not the CPU build"
print("verl", importlib.metadata.version("verl"), "on torch", torch.__version__)
"""


REFERENCE_SDK = "osmosis-ai[server]==0.3.8"


def _reference_sdk(session: nox.Session) -> None:
    """osmosis-ai 0.3.8 (the reference SDK) in a virtualenv of its own: the server's interoperability
    tests run its server against our client and its client against our server."""
    venv = Path(session.virtualenv.location).parent / "osmosis-ai-0.3.8"
    python = venv / "bin" / "python"
    if not python.exists():
        session.run(UV, "venv", "-q", "--python", str(Path(session.bin) / "python"), str(venv), external=True)
        session.run(UV, "pip", "install", "-q", "--python", str(python), REFERENCE_SDK, external=True)
    session.env["OSMOSIS_AI_PYTHON"] = str(python)


@nox.session(python=PYTHONS[0])
def plugins_all(session: nox.Session) -> None:
    """Every plugin installed together: one resolvable environment, no name clashes, and the tests that
    need several plugins (marked ``together``, skipped in the one-plugin sessions). Every other plugin
    test already ran in its plugin's own session; running it again here doubled the matrix's time."""
    if not PLUGINS:
        session.skip("no plugins in plugins/ yet")
    tests = [dep for p in LOCAL for dep in _group("test", ROOT / "plugins" / p)]
    session.install("-e", ".", *[arg for p in LOCAL for arg in ("-e", f"plugins/{p}")], *_group("test"), *tests)
    _compile_sources(session, "osmosis_core", "plugins")
    _pip_check(session)
    session.run("python", "-c", _NO_CONFLICTS)
    session.run("pytest", "-m", "together", *(f"plugins/{p}/tests" for p in LOCAL), *session.posargs)


def _pip_check(session: nox.Session) -> None:
    """The installed set is consistent (uv's equivalent of pip check)."""
    session.run(UV, "pip", "check", "--python", str(Path(session.bin) / "python"), external=True)


_NO_CONFLICTS = """
from osmosis_core._engine.registry import PluginRegistry
registry = PluginRegistry()
failed = [p for p in registry.plugins if p.status != "active"]
assert not failed, failed
assert not registry.conflicts(), registry.conflicts()
print("plugins:", ", ".join(f"{p.name} ({p.provider})" for p in registry.plugins))
"""


@nox.session(python=PYTHONS[0], default=False)
def bench(session: nox.Session) -> None:
    """The benchmarks, with every plugin installed: overhead and throughput ratios (printed, not asserted)."""
    # pebble: bench/graders.py measures the CAS pool against pebble's ProcessPool (bench/_pebble_cas.py)
    plugins = [f"plugins/{p}[token-in]" if p == "osmosis-gateway" else f"plugins/{p}" for p in LOCAL]
    session.install("-e", ".", *[arg for p in plugins for arg in ("-e", p)], "httpx", "pebble")
    _compile_sources(session, "osmosis_core", "plugins")
    for script in sorted((ROOT / "bench").glob("[!_]*.py")):  # _name.py: a module the scripts import
        session.run("python", str(script), *session.posargs)
