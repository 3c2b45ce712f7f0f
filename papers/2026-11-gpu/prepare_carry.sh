#!/usr/bin/env bash
# Run HERE (the development machine), from the repo root, before calling the device tool:
# fills .gpu_carry/ (git-ignored through .git/info/exclude) with what the device machine lacks:
#   - wheels for its Python 3.12: islpy and platformdirs (not in its image), and llvmlite 0.50
#     (LLVM 22, as the PTX was validated with here) when the working tree stays under the tool's
#     64 MiB with it (the wheel is 57 MiB); otherwise the image's own llvmlite is used;
#   - the public corpus (../shared/tc_corpus/public.json does not travel);
#   - the commit and local changes the run measures.
# Then: run(command="bash papers/2026-11-gpu/gpu_session.sh", carry=[".gpu_carry"], timeout_s=600).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu_carry/' "$exclude" 2>/dev/null || echo '/.gpu_carry/' >> "$exclude"
rm -rf .gpu_carry && mkdir -p .gpu_carry
PY=${PY:-.venv/bin/python}
ver() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$1" "$2"
}
download .gpu_carry "islpy==$(ver islpy)"
download .gpu_carry "platformdirs==$(ver platformdirs)"
cp ../shared/tc_corpus/public.json .gpu_carry/public.json
git rev-parse HEAD > .gpu_carry/commit.txt
git status --short > .gpu_carry/status.txt
tree_bytes() {  # what the device tool sends: tracked + untracked-not-ignored files + the carry
  { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null \
    | awk '{s += $1} END {print s + 0}'
}
base=$(( $(tree_bytes) + $(du -sb .gpu_carry | cut -f1) ))
mkdir -p /tmp/tl-llvmlite-wheel
download /tmp/tl-llvmlite-wheel "llvmlite==$(ver llvmlite)"
wheel=$(ls /tmp/tl-llvmlite-wheel/llvmlite-*.whl | head -1)
limit=$(( 64 * 1024 * 1024 - 512 * 1024 ))  # half a MiB of slack
if (( base + $(stat -c %s "$wheel") < limit )); then
  cp "$wheel" .gpu_carry/
  echo "llvmlite wheel carried"
else
  echo "llvmlite wheel NOT carried (tree $base bytes + wheel > 64 MiB): the device's own llvmlite is used"
fi
echo "carry: $(du -sh .gpu_carry | cut -f1); tree + carry: $(( $(tree_bytes) + $(du -sb .gpu_carry | cut -f1) )) bytes"
ls -la .gpu_carry
