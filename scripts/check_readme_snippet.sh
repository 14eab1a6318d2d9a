#!/usr/bin/env bash
# Builds (and runs) README.md's "Using one crate" example exactly as written: the fenced
# blocks after the `<!-- using-one-crate:Cargo.toml -->`, `build.rs` and `main.rs` markers
# become a scratch project outside the workspace, with each git dependency on this
# repository turned into a path to this clone (the README shows that form too).
#
#   scripts/check_readme_snippet.sh [check|build|run]    (default: run)
#
# tch needs a libtorch: LIBTORCH or LIBTORCH_USE_PYTORCH as exported, else the LIBTORCH
# that `cargo xtask setup` wrote into .cargo/libtorch.toml (the scratch project is outside
# the workspace, so cargo does not read that file for it). CARGO_TARGET_DIR is honoured;
# by default the project and its target folder live in a fresh temporary folder.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-run}
case $mode in check | build | run) ;; *) echo "usage: $0 [check|build|run]" >&2; exit 2 ;; esac

dir=$(mktemp -d "${TMPDIR:-/tmp}/tchtrain-readme-XXXXXX")
extract() {
    awk -v marker="<!-- using-one-crate:$1 -->" '
        $0 == marker { found = 1; next }
        found == 1 && /^```/ { found = 2; next }
        found == 2 && /^```/ { exit }
        found == 2 { print }' "$repo/README.md"
}
folder_of() { # crate name -> folder in this clone
    case $1 in
        tchtrain-build) echo build-support ;;
        tchtrain-distributed | tchtrain-deepspeed | tchtrain-fsdp) echo "integrations/${1#tchtrain-}" ;;
        tchtrain) echo tchtrain ;;
        *) echo "${1#tchtrain-}" ;;
    esac
}

mkdir -p "$dir/src"
extract build.rs >"$dir/build.rs"
extract main.rs >"$dir/src/main.rs"
while IFS= read -r line; do
    if [[ $line =~ ^(tchtrain[a-z-]*)\ =\ \{\ git\ =\ \"https://github.com/tchtrain/tchtrain\"\ \}$ ]]; then
        name=${BASH_REMATCH[1]}
        line="$name = { path = \"$repo/$(folder_of "$name")\" }"
    fi
    printf '%s\n' "$line"
done < <(extract Cargo.toml) >"$dir/Cargo.toml"
for f in Cargo.toml build.rs src/main.rs; do
    [[ -s $dir/$f ]] || { echo "README.md has no using-one-crate:${f#src/} block" >&2; exit 1; }
done
grep -q 'path = ' "$dir/Cargo.toml" || { echo "no tchtrain dependency found in the README's Cargo.toml" >&2; exit 1; }
# The workspace's lock file: the same dependency versions, no registry look-up needed.
cp "$repo/Cargo.lock" "$dir/Cargo.lock"

if [[ -z ${LIBTORCH:-} && -z ${LIBTORCH_USE_PYTORCH:-} && -f $repo/.cargo/libtorch.toml ]]; then
    LIBTORCH=$(sed -n 's/^LIBTORCH = "\(.*\)"$/\1/p' "$repo/.cargo/libtorch.toml")
    export LIBTORCH
fi
echo "scratch project: $dir" >&2
cd "$dir"
cargo "$mode"
