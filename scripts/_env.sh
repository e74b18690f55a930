# Shared by scripts/demo and scripts/test: find a Python >= 3.12 and set up .venv with uv and nox.
# It names no path of any machine: it looks for python3.13/python3.12/python3/python on PATH, and
# where pyenv is installed but no 3.12+ is active, it activates every installed 3.12+ version.

is_py312() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }

# Sets FOUND_PYTHON (and, with pyenv, exports PYENV_VERSION) in the calling shell.
find_python() {
  local c
  for c in python3.13 python3.12 python3 python; do
    if command -v "$c" >/dev/null 2>&1 && is_py312 "$c"; then FOUND_PYTHON="$c"; return 0; fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    local versions
    versions=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9]|[2-9][0-9])\.[0-9]+$' | sort -t. -k2,2nr -k3,3nr | paste -sd: -)
    if [ -n "$versions" ]; then
      export PYENV_VERSION="$versions"
      for c in python3.13 python3.12 python3; do
        if command -v "$c" >/dev/null 2>&1 && is_py312 "$c"; then FOUND_PYTHON="$c"; return 0; fi
      done
    fi
  fi
  echo "error: osmosis needs Python >= 3.12 and none was found on PATH (tried python3.13, python3.12, python3, python and pyenv)." >&2
  echo "Install one (e.g. apt-get install python3.12, or pyenv install 3.12) and run this again." >&2
  return 1
}

# Usage: setup_venv -> exports PY (the venv's python) with uv and nox installed in .venv
setup_venv() {
  local root py
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  find_python || exit 1
  py="$FOUND_PYTHON"
  if [ ! -x "$root/.venv/bin/python" ] || ! is_py312 "$root/.venv/bin/python"; then
    echo "creating $root/.venv with $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    rm -rf "$root/.venv"
    "$py" -m venv "$root/.venv"
  fi
  PY="$root/.venv/bin/python"
  "$PY" -m pip install --quiet --disable-pip-version-check --upgrade uv nox
  export PY ROOT="$root"
}
