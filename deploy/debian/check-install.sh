#!/usr/bin/env bash
# Installs the Debian package as an operator would, and checks it (CI runs this as root):
# the unit passes `systemd-analyze verify`; mmkd runs the way the unit runs it (through
# systemd where systemd runs, else with the unit's ExecStart and folders); a non-root
# member of group mmk submits a job with a plain `mmkctl` (no MMK_SOCKET) and it runs
# under the kernel scheduler from /usr/lib/mmk; then the package is purged and nothing of
# it is left but what docs/install.md says stays (the group mmk, /var/lib/mmk), which
# this script then removes as it made them.
#
#   deploy/debian/check-install.sh target/debian/mmk_*.deb
set -euo pipefail
DEB=$1
USER_NAME=mmk-ci-user
MMKD_PID=
say() { echo "== $*"; }
fail() { echo "check-install: $*" >&2; exit 1; }

cleanup() {
    set +e
    [ -n "$MMKD_PID" ] && kill "$MMKD_PID" 2>/dev/null && wait "$MMKD_PID" 2>/dev/null
    userdel "$USER_NAME" 2>/dev/null
    dpkg --purge mmk >/dev/null 2>&1
    groupdel mmk 2>/dev/null
    rm -rf /run/mmk /var/lib/mmk /tmp/mmk-ci-job.yaml
}
trap cleanup EXIT
if getent group mmk >/dev/null || [ -e /var/lib/mmk ] || [ -e /run/mmk ]; then
    fail "this machine already has mmk's group or folders; run it on a clean machine"
fi

say "dpkg -i $DEB"
dpkg -i "$DEB"
for f in /usr/bin/mmkd /usr/bin/mmkctl /usr/lib/mmk/libmmk_interposer.so \
    /usr/lib/mmk/slurm/mmk-task-prolog.sh /etc/mmk/mmkd.yaml /usr/lib/systemd/system/mmkd.service; do
    [ -e "$f" ] || fail "$f is not installed"
done
getent group mmk >/dev/null || fail "the package made no group mmk"

say "systemd-analyze verify mmkd.service"
systemd-analyze verify /usr/lib/systemd/system/mmkd.service

if [ -d /run/systemd/system ]; then
    say "systemd runs: the package started mmkd.service"
    systemctl is-active --quiet mmkd || systemctl start mmkd
else
    say "no systemd here: mmkd started as the unit starts it"
    exec_start=$(sed -n 's/^ExecStart=//p' /usr/lib/systemd/system/mmkd.service)
    # RuntimeDirectory=mmk and StateDirectory=mmk, mode 0755, as systemd makes them.
    install -d -m 0755 /run/mmk /var/lib/mmk
    # shellcheck disable=SC2086 # the unit's command line, split as systemd splits it
    RUST_LOG=info $exec_start > /tmp/mmkd-ci.log 2>&1 &
    MMKD_PID=$!
fi
for _ in $(seq 150); do [ -S /run/mmk/mmkd.sock ] && break; sleep 0.2; done
[ -S /run/mmk/mmkd.sock ] || { cat /tmp/mmkd-ci.log 2>/dev/null; fail "mmkd did not listen"; }
[ "$(stat -c '%G %a' /run/mmk/mmkd.sock)" = "mmk 660" ] || fail "the socket is $(stat -c '%G %a' /run/mmk/mmkd.sock)"

say "a member of group mmk submits with a plain mmkctl"
useradd -M -N -s /bin/sh -G mmk "$USER_NAME"
printf 'name: ci-job\ngpu_memory: 1GiB\ncommand:\n  args: [/bin/sh, -c, "echo hello from $(id -un)"]\n  workdir: /\n' > /tmp/mmk-ci-job.yaml
chmod 644 /tmp/mmk-ci-job.yaml
as_user() { (cd / && env -u MMK_SOCKET runuser -u "$USER_NAME" -- "$@"); }
json() { python3 -c "import json, sys; print(json.load(sys.stdin)['$1'])"; }
id=$(as_user mmkctl --output json submit --offline /tmp/mmk-ci-job.yaml | json id)
[ -n "$id" ] || fail "the submit gave no job id"
state=
for _ in $(seq 150); do
    state=$(as_user mmkctl --output json jobs get "$id" | json state)
    [ "$state" = SUCCEEDED ] && break
    case "$state" in FAILED | CANCELLED) break ;; esac
    sleep 0.2
done
[ "$state" = SUCCEEDED ] || { as_user mmkctl jobs get "$id"; fail "job $id is $state"; }
out=$(as_user mmkctl jobs logs "$id")
[ "$out" = "hello from $USER_NAME" ] || fail "the job said: $out"
grep -q 'kernel scheduler interposer=/usr/lib/mmk/libmmk_interposer.so' /tmp/mmkd-ci.log 2>/dev/null \
    || journalctl -u mmkd 2>/dev/null | grep -q 'interposer=/usr/lib/mmk/libmmk_interposer.so' \
    || fail "mmkd does not run the packaged interposer"
say "job $id ran as $USER_NAME and said: $out"

say "dpkg --purge mmk"
if [ -n "$MMKD_PID" ]; then kill "$MMKD_PID"; wait "$MMKD_PID" || true; MMKD_PID=; fi
dpkg --purge mmk
for f in /usr/bin/mmkd /usr/bin/mmkctl /usr/lib/mmk /etc/mmk /usr/lib/systemd/system/mmkd.service; do
    [ ! -e "$f" ] || fail "$f is left after the purge"
done
say "purged; the group mmk and /var/lib/mmk stay, as documented"
