#!/usr/bin/env bash
# Wheels for a GPU machine with no network (benchmarks/gpu_session.py's docstring says how they are
# used): emmy itself, and egglog with the packages it imports at start that such a machine's image
# lacks, for its Python (default 3.12). Written to .whl/ (git-ignored).
#
#     bash benchmarks/gpu_wheels.sh [PYTHON_VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-3.12}"
pip="${PIP:-.venv/bin/pip}"
rm -rf .whl && mkdir -p .whl
"$pip" wheel -q --no-deps --no-build-isolation -w .whl .
# egglog imports black, graphviz and opentelemetry at start; black imports platformdirs and pytokens
for package in egglog==13.2.0 black==26.10.1 graphviz==0.21 opentelemetry-api==1.45.2 platformdirs==4.14.9 \
               pytokens==0.4.1; do
  "$pip" download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl "$package"
done
ls -l .whl
