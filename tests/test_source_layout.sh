#!/usr/bin/env bash
# The source tree keeps the shape docs/architecture.md describes: no C++ line is over the 120
# columns of .clang-format, and no layer includes a header of a layer above it (each layer may
# include its own headers and those of the layers it links, as CMakeLists.txt lists them).
set -euo pipefail
cd "$1"
fail() { echo "test_source_layout: $*" >&2; exit 1; }

mapfile -t sources < <(find amp autodiff core data dist examples fuzz models nn ops optim testing tests tools \
  -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort)
[[ ${#sources[@]} -gt 100 ]] || fail "found only ${#sources[@]} sources under $1"
long=$(awk 'length > 120 { printf "%s:%d: %d columns\n", FILENAME, FNR, length }' "${sources[@]}")
[[ -z $long ]] || fail "lines over 120 columns (clang-format them):"$'\n'"$long"

# The layers below each layer (what it may include besides itself and the standard libraries).
declare -A below=(
  [core]=""
  [ops]="core"
  [autodiff]="ops core"
  [nn]="autodiff ops core"
  [optim]="autodiff ops core"
  [testing]="autodiff ops core"
  [data]="core"
  [amp]="optim nn autodiff ops core"
  [models]="amp data optim nn autodiff ops core"
  [dist]="amp optim nn autodiff ops core"
)
for layer in "${!below[@]}"; do
  allowed="$layer ${below[$layer]}"
  while IFS=: read -r file _ line; do
    included=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
    [[ " $allowed " == *" $included "* ]] ||
      fail "$file includes a header of $included/, a layer above $layer/ (or beside it): $line"
  done < <(grep -rn --include='*.h' --include='*.cpp' --include='*.cu' '^#include "[a-z_]*/' "$layer" || true)
done
echo "source layout: ${#sources[@]} files within 120 columns; every layer includes only itself and the layers below it"
