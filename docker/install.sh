#!/bin/sh
# The one install recipe: the Dockerfile runs it, and CI runs it in a fresh virtual environment
# (.ci/container-smoke), so what CI starts is what the image contains.
#   docker/install.sh VENV_DIR SOURCE_DIR
set -eu
venv="$1"
src="$2"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --no-cache-dir --quiet --upgrade pip
"$venv/bin/python" -m pip install --no-cache-dir --quiet "$src[fast]"   # runtime deps only, never [test]
