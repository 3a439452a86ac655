#!/usr/bin/env bash
# Regenerates src/bindings.rs from include/nccl/*.h with bindgen and fails if the committed file
# differs (the headers and the bindings must be changed together).
set -euo pipefail

cd "$(dirname "$0")/.."

# libclang itself (libclang.so, libclang-14.so.1, ...), not libclang-cpp, which llvm-*-dev ships
# without it and bindgen cannot load.
have_libclang() {
    local dirs=()
    command -v llvm-config >/dev/null 2>&1 && dirs+=("$(llvm-config --libdir)")
    [ -n "${LIBCLANG_PATH:-}" ] && dirs+=("$LIBCLANG_PATH")
    for d in "${dirs[@]}"; do
        compgen -G "$d/libclang.so*" >/dev/null && return 0
        compgen -G "$d/libclang-[0-9]*.so*" >/dev/null && return 0
    done
    ldconfig -p 2>/dev/null | grep -qE 'libclang(-[0-9.]+)?\.so'
}

if ! have_libclang; then
    echo "check-bindings: libclang not found; installing libclang-dev" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libclang-dev >/dev/null
fi

generated=(src/bindings.rs)

cargo build --quiet --features bindgen

if ! git diff --exit-code -- "${generated[@]}"; then
    echo >&2
    echo "check-bindings: ${generated[*]} is out of date with include/nccl/*.h." >&2
    echo "check-bindings: run 'cargo build --features bindgen' and commit the result." >&2
    exit 1
fi
untracked=$(git ls-files --others --exclude-standard -- "${generated[@]}")
if [ -n "$untracked" ]; then
    echo "check-bindings: generated file not committed: $untracked" >&2
    exit 1
fi
echo "check-bindings: ${generated[*]} matches include/nccl/*.h"
