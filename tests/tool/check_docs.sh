#!/usr/bin/env bash
# What a newcomer reads first: the docs and the public header name the two Buffer APIs
# devbuf implements (morok-device's `Buffer`, nuvec-gpu's `Buffer`), never by an in-house
# word ("seed"/"seeds"); the MIT licence is at the root and declared in pyproject.toml
# (where the wheel's metadata comes from).
# usage: check_docs.sh SOURCE_DIR
set -uo pipefail
cd "$1" || exit 1
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

if hits=$(grep -nwiE "seeds?('s?)?" README.md docs/*.md include/*.h python/devbuf/*.py 2>/dev/null); then
  fail "say morok-device's or nuvec-gpu's \`Buffer\` instead of seed:"$'\n'"$hits"
fi
grep -q "morok-device's and nuvec-gpu's \`Buffer\`" docs/architecture.md ||
  fail "docs/architecture.md does not name morok-device's and nuvec-gpu's \`Buffer\`"

[ -f LICENSE ] && head -1 LICENSE | grep -qx "MIT License" || fail "LICENSE at the root is not the MIT licence"
grep -qE '^license = \{ text = "MIT" \}$' pyproject.toml || fail "pyproject.toml does not declare license MIT"
grep -qF '"License :: OSI Approved :: MIT License"' pyproject.toml || fail "pyproject.toml lacks the MIT classifier"
grep -qE '^wheel\.license-files = \["LICENSE"\]$' pyproject.toml || fail "pyproject.toml does not put LICENSE in the wheel"
grep -qF '[LICENSE](LICENSE)' README.md || fail "README.md does not link LICENSE"

[ "$failures" -eq 0 ] && echo "docs: no 'seed' for the Buffer APIs; LICENSE (MIT) at the root and in pyproject.toml"
[ "$failures" -eq 0 ]
