#!/usr/bin/env bash
# The Python tools the chart checks use, in a virtualenv of the project's own
# (target/venv): the real Helm v4 library (helm-python-sdk; there is no helm binary in
# these registries), the Kubernetes schemas (kubernetes-validate), jsonschema, pytest and
# yamllint. Idempotent: a venv that already has these versions is left alone.
#
#   ./scripts/install-python-tools.sh        prints the venv's python on stdout
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=target/venv
REQUIREMENTS=(
    "helm-python-sdk==0.2.2"
    "kubernetes-validate==1.37.0"
    "jsonschema==4.26.0"
    "pytest==9.2.0"
    "yamllint==1.38.0"
)
stamp="$VENV/.ambit-requirements"
want="$(printf '%s\n' "${REQUIREMENTS[@]}")"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    echo "$PWD/$VENV/bin/python"
    exit 0
fi
mkdir -p target
python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install --quiet --disable-pip-version-check "${REQUIREMENTS[@]}" >&2
printf '%s\n' "$want" > "$stamp"
echo "$PWD/$VENV/bin/python"
