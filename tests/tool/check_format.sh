#!/usr/bin/env bash
# The layout of every C file of the repository against .clang-format (column limit 100),
# with clang-format 14, the version the tree is formatted with (others lay out differently).
# Exits 77 (skipped) without it. Fix a failure with: clang-format-14 -i FILE...
# usage: check_format.sh SOURCE_DIR | check_format.sh --self-test (shows it refusing a long line)
set -uo pipefail
format=$(command -v clang-format-14 || true)
if [ -z "$format" ]; then
  echo "SKIP: clang-format-14 is not installed (apt-get install clang-format-14)"
  exit 77
fi
if [ "${1:-}" = --self-test ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  cp "$(dirname "$0")/../../.clang-format" "$scratch/"
  printf 'int f(void) {\n  return %s;\n}\n' "$(printf '1 + %.0s' $(seq 40))1" >"$scratch/long.c"
  if "$format" --style=file --dry-run --Werror "$scratch/long.c" 2>/dev/null; then
    echo "FAIL: a 170-column line passed the check"
    exit 1
  fi
  echo "self-test: a line over 100 columns is refused"
  exit 0
fi
cd "$1" || exit 1
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu')
else
  mapfile -t files < <(find src include tests bench tools fuzz python -name '*.c' -o -name '*.h' -o -name '*.cu')
fi
if ! "$format" --style=file --dry-run --Werror "${files[@]}" 2>"${TMPDIR:-/tmp}/check_format.$$"; then
  grep -E '^[^ ].*(warning|error):' "${TMPDIR:-/tmp}/check_format.$$" | head -20
  rm -f "${TMPDIR:-/tmp}/check_format.$$"
  echo "FAIL: files above are not laid out as .clang-format says (clang-format-14 -i FILE...)"
  exit 1
fi
rm -f "${TMPDIR:-/tmp}/check_format.$$"
echo "format: ${#files[@]} C files laid out as .clang-format says"
