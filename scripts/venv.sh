#!/usr/bin/env bash
# make venv: .venv/ from requirements.txt, and byteps_thc importable from it (used in place: make
# ext builds byteps_thc._C in this directory). The Docker image runs the same script (an input of
# its layer on its own, so that an edit to the Makefile does not rebuild the image's .venv).
#
#   scripts/venv.sh [--without TAG[,TAG]]           make or update .venv/
#   scripts/venv.sh --print [--without TAG[,TAG]]   print the requirements it would install
# --without leaves out the pins tagged "# [TAG]" in requirements.txt (the image: dev, and tf unless
# it has TensorFlow). PYTHON: the interpreter .venv is made with (default python3).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

print=0 without=""
while [ $# -gt 0 ]; do
  case "$1" in
    --print) print=1 ;;
    --without) without="$2"; shift ;;
    *) echo "usage: scripts/venv.sh [--print] [--without TAG[,TAG]]" >&2; exit 2 ;;
  esac
  shift
done
[[ "$without" =~ ^([a-z]+(,[a-z]+)*)?$ ]] ||
  { echo "scripts/venv.sh: --without takes tags: TAG[,TAG], is '$without'" >&2; exit 2; }

# requirements.txt less the lines tagged with one of $without
requirements() {
  awk -v tags=",$without," '{
    if (match($0, /#[[:space:]]*\[[a-z]+\][[:space:]]*$/)) {
      t = substr($0, RSTART, RLENGTH); gsub(/[^a-z]/, "", t)
      if (index(tags, "," t ",")) next
    }
    print }' requirements.txt
}
if [ "$print" = 1 ]; then requirements; exit 0; fi

[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
req="$(mktemp)"
trap 'rm -f "$req"' EXIT
requirements > "$req"
echo ".venv/bin/pip install -q -r requirements.txt${without:+ (without [${without//,/], [}])}"
.venv/bin/pip install -q --disable-pip-version-check -r "$req"
.venv/bin/python -c 'import site, os
open(os.path.join(site.getsitepackages()[0], "byteps_thc.pth"), "w").write(os.getcwd() + "\n")'
touch .venv/.stamp
