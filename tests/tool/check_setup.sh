#!/usr/bin/env bash
# scripts/setup.sh run as a user that is not root and cannot use sudo, on a machine that
# lacks ninja: it must say what is missing and the command that installs it, and exit 1
# without trying to install. Needs root (to act as another user); skipped otherwise.
set -uo pipefail
setup=$(cd "$(dirname "$0")/../../scripts" && pwd)/setup.sh
if [ "$(id -u)" -ne 0 ] || ! id nobody >/dev/null 2>&1; then
  echo "SKIP: acting as another user needs root and the user nobody"
  exit 77
fi
bin=$(mktemp -d)
chmod 755 "$bin"
for tool in cmake gcc clang python3 pkg-config readelf apt-get apt-cache ldconfig grep cut id sudo; do
  path=$(PATH=/usr/bin:/bin:/usr/sbin:/sbin command -v "$tool") && ln -s "$path" "$bin/$tool"
done
# A copy of the script where nobody can read it (the checkout may sit in a private folder).
cp "$setup" "$bin/setup.sh"
chmod 755 "$bin/setup.sh"
# Everything but ninja (and the compilers' tools, which these find themselves).
output=$(su nobody -s /bin/bash -c "PATH=$bin; export PATH; $(command -v bash) $bin/setup.sh" 2>&1 </dev/null)
status=$?
rm -rf "$bin"
echo "$output"
if [ "$status" -ne 1 ]; then echo "FAIL: exit $status, expected 1"; exit 1; fi
case "$output" in
  *"missing ninja-build"*"apt-get install -y ninja-build"*) echo "ok: names what is missing and how to install it" ;;
  *) echo "FAIL: the message does not name ninja-build and the command"; exit 1 ;;
esac
