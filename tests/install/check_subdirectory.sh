#!/usr/bin/env bash
# devbuf inside another project (add_subdirectory): its warnings stay on its own targets,
# never the parent's, and -Werror comes only with DEVBUF_WERROR=ON (devbuf's own test
# builds), so a user's compiler that warns more cannot break their build.
# Reads the compile commands of a configure; builds nothing.
# usage: check_subdirectory.sh SOURCE_DIR C_COMPILER [GENERATOR]
set -uo pipefail
source_dir=$1 cc=$2 generator=${3:-Ninja}
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0

# flags_of BUILD FILE_SUFFIX: the compile command of the one source ending in FILE_SUFFIX.
flags_of() {
  python3 - "$1/compile_commands.json" "$2" <<'PY'
import json, sys
commands = [c["command"] for c in json.load(open(sys.argv[1])) if c["file"].endswith(sys.argv[2])]
print(commands[0] if len(commands) == 1 else "NOT FOUND")
PY
}

# expect NAME COMMAND WANT_WALL WANT_WERROR
expect() {
  local name=$1 command=$2 wall=$3 werror=$4 has_wall=no has_werror=no
  [[ " $command " == *" -Wall "* ]] && has_wall=yes
  [[ " $command " == *" -Werror "* ]] && has_werror=yes
  if [ "$command" = "NOT FOUND" ] || [ "$has_wall" != "$wall" ] || [ "$has_werror" != "$werror" ]; then
    echo "FAIL $name: -Wall $has_wall (want $wall), -Werror $has_werror (want $werror): $command"
    failures=$((failures + 1))
  else
    echo "ok   $name: -Wall $has_wall, -Werror $has_werror"
  fi
}

for werror in default ON OFF; do
  build=$scratch/$werror
  option=()
  [ "$werror" != default ] && option=(-DDEVBUF_WERROR="$werror")
  if ! cmake -S "$here/subdirectory" -B "$build" -G "$generator" -DCMAKE_C_COMPILER="$cc" \
      -DDEVBUF_SOURCE="$source_dir" -DDEVBUF_BUILD_TESTS=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
      "${option[@]}" >"$scratch/configure-$werror.log" 2>&1; then
    tail -20 "$scratch/configure-$werror.log"
    echo "FAIL: the consumer does not configure with DEVBUF_WERROR $werror"
    exit 1
  fi
  want_werror=no
  [ "$werror" = ON ] && want_werror=yes
  expect "devbuf's src/core/buffer.c, DEVBUF_WERROR $werror" "$(flags_of "$build" /src/core/buffer.c)" yes $want_werror
  expect "devbuf's tools/devbuf.c, DEVBUF_WERROR $werror" "$(flags_of "$build" /tools/devbuf.c)" yes $want_werror
  expect "the parent's consumer.c, DEVBUF_WERROR $werror" "$(flags_of "$build" /install/consumer.c)" no no
done
echo "$failures failures"
[ "$failures" -eq 0 ]
