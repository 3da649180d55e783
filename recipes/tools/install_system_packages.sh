#!/usr/bin/env bash
# Install the system packages corpus-io uses and a fresh machine lacks: espeak-ng and sox (the demo's
# and the tests' real speech), libsndfile (soundfile), and Debian's headless chromium + chromium-driver
# (the explorer's browser tests drive them with selenium; nothing is downloaded at test time). Called by
# `make install`, so `make demo` and `make test` set up a machine that has only Python. Root: apt-get;
# otherwise `sudo -n`; otherwise it prints the exact command and stops. A machine that has them all is
# left alone (no network used).
set -euo pipefail

packages=()
command -v espeak-ng >/dev/null 2>&1 || packages+=(espeak-ng)
command -v sox >/dev/null 2>&1 || packages+=(sox)
ldconfig_bin=$(command -v ldconfig || echo /sbin/ldconfig)
# The cache is read whole before grep: `ldconfig -p | grep -q` under pipefail fails at random (grep exits at the
# first match, ldconfig's next write gets SIGPIPE), which reinstalled libsndfile1 on a machine that had it.
library_cache=$("$ldconfig_bin" -p 2>/dev/null || true)
grep -q 'libsndfile\.so' <<<"$library_cache" || packages+=(libsndfile1)
have() {  # have PROGRAM: on PATH or in the system dirs (daemons live in sbin, which a user's PATH may lack;
          # the tests start the daemons and the browser by their system paths, whatever PATH says)
  command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ] || [ -x "/usr/bin/$1" ] || [ -x "/bin/$1" ]
}
{ have slurmctld && have slurmd && have sbatch; } || packages+=(slurm-wlm)
have munged || packages+=(munge)
have chromium || packages+=(chromium)
have chromedriver || packages+=(chromium-driver)
[ "${#packages[@]}" -eq 0 ] && exit 0

command_line="apt-get update && apt-get install -y ${packages[*]}"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: corpus-io needs the system packages ${packages[*]} (for real speech in the demo and the" \
       "tests, and audio decoding), and this machine has no apt-get. Install them with your package" \
       "manager (Debian/Ubuntu: $command_line), then run make again." >&2
  exit 1
fi
if [ "$(id -u)" = 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "error: corpus-io needs the system packages ${packages[*]} (for real speech in the demo and the" \
       "tests, and audio decoding). They are not installed, and this user can neither run apt-get nor" \
       "sudo without a password. Run as root: sudo sh -c '$command_line', then run make again." >&2
  exit 1
fi
echo "installing system packages: ${packages[*]} (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq "${packages[@]}" >/dev/null
