#!/usr/bin/env bash
# The Dockerfile cannot be built here (no container engine). What can be checked is that
# it refers to what exists: every path it COPYs from the build context is in the
# repository, and every binary it COPYs out of target/release is a [[bin]] the workspace
# builds (by name, in a package the build stage compiles).
#
#   ./scripts/check-dockerfile.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - <<'PY'
import pathlib, re, sys, tomllib

root = pathlib.Path(".")
dockerfile = (root / "Dockerfile").read_text()
bins = set()
for manifest in root.glob("*/Cargo.toml"):
    data = tomllib.loads(manifest.read_text())
    package = data.get("package", {}).get("name")
    for b in data.get("bin", []):
        bins.add((package, b["name"]))
built = set(re.findall(r"-p (\S+)", " ".join(l for l in dockerfile.splitlines() if "cargo build" in l)))
errors = []
for n, line in enumerate(dockerfile.splitlines(), 1):
    words = line.split()
    if not words or words[0] != "COPY":
        continue
    args = [w for w in words[1:] if not w.startswith("--")]
    sources, _dest = args[:-1], args[-1]
    if any(w.startswith("--from=") for w in words):
        for src in sources:
            m = re.fullmatch(r"/src/target/release/([^/]+)", src)
            if not m:
                errors.append(f"Dockerfile:{n}: {src} is not a release binary")
            elif not any(name == m.group(1) and pkg in built for pkg, name in bins):
                errors.append(f"Dockerfile:{n}: no package the build stage compiles has a binary {m.group(1)!r}")
    else:
        for src in sources:
            if not (root / src).exists():
                errors.append(f"Dockerfile:{n}: {src} does not exist in the repository")
if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
print(f"Dockerfile: every copied path exists; binaries {sorted(n for p, n in bins if p in built)} are built")
PY
