# Shared by scripts/demo, scripts/test and scripts/install: find a Python >= 3.12 and set up .venv.
# It names no path of any machine: it looks for python3.13/python3.12/python3/python on PATH, and
# where pyenv is installed but no 3.12+ is active, it activates every installed 3.12+ version.
# A second run installs nothing that is already there: uv and nox are checked for (a few ms), and
# the editable osmosis-core is installed again only when pyproject.toml or the version changed.

is_py312() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }

# Sets FOUND_PYTHON (and, with pyenv, exports PYENV_VERSION) in the calling shell.
find_python() {
  local c
  for c in python3.13 python3.12 python3 python; do
    if command -v "$c" >/dev/null 2>&1 && is_py312 "$c"; then FOUND_PYTHON="$c"; pyenv_trainer_pythons; return 0; fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    local versions
    versions=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9]|[2-9][0-9])\.[0-9]+$' | sort -t. -k2,2nr -k3,3nr | paste -sd: -)
    if [ -n "$versions" ]; then
      export PYENV_VERSION="$versions"
      for c in python3.13 python3.12 python3; do
        if command -v "$c" >/dev/null 2>&1 && is_py312 "$c"; then FOUND_PYTHON="$c"; pyenv_trainer_pythons; return 0; fi
      done
    fi
  fi
  echo "error: osmosis needs Python >= 3.12 and none was found on PATH (tried python3.13, python3.12, python3, python and pyenv)." >&2
  echo "Install one (e.g. apt-get install python3.12, or pyenv install 3.12) and run this again." >&2
  return 1
}

# With pyenv, the installed 3.10 and 3.11 are made visible too (python3.10, python3.11), after what
# PYENV_VERSION already names (so python3 and every name that worked still mean the same Python): the
# nox `trainer` session runs osmosis-trainer on each Python from 3.10. Without pyenv: nothing to do.
pyenv_trainer_pythons() {
  command -v pyenv >/dev/null 2>&1 || return 0
  local current v
  current=${PYENV_VERSION:-$(pyenv version-name 2>/dev/null)}
  for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.1[01]\.[0-9]+$' | sort -t. -k2,2nr -k3,3nr); do
    case ":$current:" in *":$v:"*) ;; *) current="${current:+$current:}$v" ;; esac
  done
  [ -n "$current" ] && export PYENV_VERSION="$current"
  return 0
}

# Usage: make_venv -> exports ROOT (the clone) and PY (the python of $ROOT/.venv, made with a
# Python >= 3.12 when it is missing or not one)
make_venv() {
  local root py
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  find_python || exit 1  # every time: with pyenv it also exports the PYENV_VERSION nox finds 3.12 and 3.13 with
  py="$FOUND_PYTHON"
  if [ ! -x "$root/.venv/bin/python" ] || ! is_py312 "$root/.venv/bin/python"; then
    echo "creating $root/.venv with $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    rm -rf "$root/.venv"
    "$py" -m venv "$root/.venv"
  fi
  PY="$root/.venv/bin/python"
  export PY ROOT="$root"
}

# Usage: setup_venv -> make_venv, with uv and nox installed in .venv (once: when both are there,
# nothing is asked of pip)
setup_venv() {
  make_venv
  if ! "$PY" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("uv") and u.find_spec("nox")))' 2>/dev/null; then
    "$PY" -m pip install --quiet --disable-pip-version-check --upgrade uv nox
  fi
}

# Usage: install_core -> osmosis-core from this clone, editable, in .venv (after setup_venv). Skipped
# when the stamp in .venv says it was installed from this folder with this pyproject.toml and this
# version (an editable install sees every other change of the sources at once); the stamp is
# removed before an install and written after it succeeds, so a failed one is tried again.
install_core() {
  local stamp="$ROOT/.venv/.osmosis-core-installed" key
  key=$({ echo "$ROOT"; cat "$ROOT/pyproject.toml" "$ROOT/osmosis_core/__init__.py"; } | cksum)
  if [ -x "$ROOT/.venv/bin/osmosis" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$key" ]; then
    return 0
  fi
  rm -f "$stamp"
  "$PY" -m uv pip install --quiet --python "$PY" -e "$ROOT"
  echo "$key" >"$stamp"
}
