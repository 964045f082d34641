#!/usr/bin/env bash
# scripts/images.sh builds the Dockerfile's prebuilt path (tests/tests/images.rs runs the
# images); the from-source path needs a registry for its bases, so what is checked of it is
# that it refers to what exists and copies what the build needs: every path it COPYs from
# the build context is in the repository; the build stage copies every workspace member,
# every path dependency and every [patch] source the root Cargo.toml names (cargo reads
# them all before it builds anything: a missing one fails `cargo build --locked`); and every
# binary an image copies from /out/bin is a [[bin]] the build stage compiles and that both
# the build stage and images.sh put there.
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
# What the build stage copies from the context (the lines before the first later FROM).
stages = re.split(r"(?m)^FROM ", dockerfile)
build_stage = stages[1] if len(stages) > 1 else ""
copied = []
for line in build_stage.splitlines():
    words = line.split()
    if words and words[0] == "COPY" and not any(w.startswith("--from=") for w in words):
        args = [w for w in words[1:] if not w.startswith("--")]
        copied += [pathlib.PurePosixPath(a) for a in args[:-1]]
workspace = tomllib.loads((root / "Cargo.toml").read_text())
needed = {pathlib.PurePosixPath(m) for m in workspace["workspace"]["members"]}
for deps in [workspace["workspace"].get("dependencies", {})] + list(workspace.get("patch", {}).values()):
    for name, dep in deps.items():
        if isinstance(dep, dict) and "path" in dep:
            needed.add(pathlib.PurePosixPath(dep["path"]))
for path in sorted(needed):
    if not any(path == c or c in path.parents for c in copied):
        errors.append(f"Dockerfile: the build stage does not copy {path}/, which Cargo.toml needs (a workspace member, a path dependency or a [patch]): add `COPY {path} {path}`")
# The binaries put in /out/bin: by the build stage (from source) and by images.sh (prebuilt).
def stripped(text):
    m = re.search(r"for b in ([^;]+); do", text)
    return set(m.group(1).split()) if m else set()
staged = stripped(build_stage)
prebuilt = stripped((root / "scripts/images.sh").read_text())
for n, line in enumerate(dockerfile.splitlines(), 1):
    words = line.split()
    if not words or words[0] != "COPY":
        continue
    args = [w for w in words[1:] if not w.startswith("--")]
    sources, _dest = args[:-1], args[-1]
    if any(w.startswith("--from=") for w in words):
        for src in sources:
            m = re.fullmatch(r"/out/bin/([^/]+)", src)
            if src == "/out/nft/":
                continue
            if not m:
                errors.append(f"Dockerfile:{n}: {src} is not a binary of /out/bin or /out/nft/")
                continue
            if not any(name == m.group(1) and pkg in built for pkg, name in bins):
                errors.append(f"Dockerfile:{n}: no package the build stage compiles has a binary {m.group(1)!r}")
            for where, listed in (("the build stage", staged), ("scripts/images.sh", prebuilt)):
                if m.group(1) not in listed:
                    errors.append(f"Dockerfile:{n}: {where} does not put {m.group(1)} in /out/bin (its `for b in ...` loop)")
    else:
        for src in sources:
            # ${PREBUILT}: the folder scripts/images.sh lays out (the prebuilt stage).
            if not src.startswith("${") and not (root / src).exists():
                errors.append(f"Dockerfile:{n}: {src} does not exist in the repository")
if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
print(f"Dockerfile: every copied path exists; binaries {sorted(n for p, n in bins if p in built)} are built")
PY
