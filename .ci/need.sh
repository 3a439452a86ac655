# Sourced by the CI scripts: `need <command> <Debian package> <what goes unchecked without it>`
# installs the package with apt when the command is missing, and exits non-zero, saying what
# was not checked, when it cannot.
need() {
  command -v "$1" >/dev/null && return 0
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q "$2" >/dev/null 2>&1 \
    || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q "$2" >/dev/null; } \
    || { echo "FAILED: cannot install $2 (apt-get install $2); $3"; exit 1; }
}
