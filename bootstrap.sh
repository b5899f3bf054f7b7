#!/usr/bin/env bash
# Sets up nncomm on a fresh machine: finds a Python that nnabla 1.39 has
# wheels for (3.8 to 3.10, 3.10 preferred), creates .venv with it, installs
# the pinned requirements from PyPI (MPI included: the mpich wheel) and
# builds nncomm into the venv.
#
#   ./bootstrap.sh                 # find the interpreter
#   ./bootstrap.sh /path/python3   # or PYTHON=/path/python3 ./bootstrap.sh
set -euo pipefail
cd "$(dirname "$0")"

supported() {  # prints the interpreter's path if nnabla 1.39 has wheels for it
  "$1" -c 'import sys; assert (3, 8) <= sys.version_info[:2] <= (3, 10)' \
    2>/dev/null && command -v "$1"
}

find_python() {
  local candidates=()
  local pyenv_root
  pyenv_root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  candidates+=(python3.10)
  candidates+=($(ls -d "$pyenv_root"/versions/3.10*/bin/python 2>/dev/null | sort -rV))
  candidates+=(/usr/bin/python3.10 /usr/local/bin/python3.10)
  candidates+=(python3.9 python3.8)
  candidates+=($(ls -d "$pyenv_root"/versions/3.{9,8}*/bin/python 2>/dev/null | sort -rV))
  for c in "${candidates[@]}"; do
    supported "$c" && return 0
  done
  return 1
}

requested=${1:-${PYTHON:-}}
if [ -n "$requested" ]; then
  python=$(supported "$requested") || {
    echo "bootstrap: $requested is not a Python 3.8-3.10 (nnabla 1.39 has no wheels for others)" >&2
    exit 1
  }
else
  python=$(find_python) || {
    echo "bootstrap: no Python 3.8-3.10 found; install one (e.g. 'pyenv install 3.10') or pass its path" >&2
    exit 1
  }
fi

if [ -x .venv/bin/python ] &&
   [ "$(.venv/bin/python -c 'import sys; print(sys.version_info[:2])')" != \
     "$("$python" -c 'import sys; print(sys.version_info[:2])')" ]; then
  rm -rf .venv   # made by another interpreter
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
echo "bootstrap: $(.venv/bin/python --version) in .venv"
.venv/bin/python -m pip install --quiet --upgrade pip==26.3
.venv/bin/python -m pip install --quiet -r requirements.txt
.venv/bin/python -m pip install --quiet --no-build-isolation .
.venv/bin/python -c 'import nncomm; print("bootstrap: nncomm", nncomm.__version__, "built")'
