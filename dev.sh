#!/usr/bin/env bash
# xp's developer entry point. Creates and reuses the virtual environment in .venv.
#   ./dev.sh run [OVERRIDES...]   run an experiment (default: LeNet on digits, CPU)
#   ./dev.sh test [PYTEST ARGS]   run the test suite
#   ./dev.sh setup                only create/update .venv
set -euo pipefail
cd "$(dirname "$0")"

VENV=.venv
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3 || true)}

ensure_venv() {
    local stamp=$VENV/.xp-installed want
    want=$(cat pyproject.toml constraints.txt dev.sh | sha256sum | cut -c1-16)
    if [[ -f $stamp && "$(cat "$stamp")" == "$want" && -x $VENV/bin/python ]]; then
        return
    fi
    if [[ ! -x $VENV/bin/python ]]; then
        if [[ -z "$PYTHON" ]]; then
            echo "dev.sh: no python3.11 found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
            exit 2
        fi
        local ver
        ver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        if [[ "$ver" != "3.11" ]]; then
            # mxnet 1.9.1 needs numpy<1.24, whose wheels stop at Python 3.11
            echo "dev.sh: Python 3.11 is required, $PYTHON is $ver; set PYTHON=/path/to/python3.11" >&2
            exit 2
        fi
        "$PYTHON" -m venv "$VENV" || {
            echo "dev.sh: could not create $VENV (on Debian: apt-get install python3.11-venv)" >&2
            exit 2
        }
    fi
    echo "dev.sh: installing xp and its pinned dependencies into $VENV (first time: a few minutes)" >&2
    "$VENV/bin/python" -m pip install -q --upgrade pip wheel setuptools
    "$VENV/bin/python" -m pip install -q -c constraints.txt -e '.[test,torch,ray,docs]'
    # the example of a package's own network and data set (docs/guides/own-code.md), which the tests train
    "$VENV/bin/python" -m pip install -q -c constraints.txt -e examples/xp-example
    install_horovod
    echo "$want" > "$stamp"
}

# Horovod must be compiled against the installed mxnet (no wheel on PyPI carries MXNet support):
# built once (a few minutes on 2 cores) into a cache of wheels and reused.
HOROVOD=horovod==0.28.1
WHEELS=${XP_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/xp/wheels}
install_horovod() {
    local py=$VENV/bin/python wheel
    wheel=$(ls "$WHEELS"/horovod-0.28.1-cp311-*.whl 2>/dev/null | head -n1 || true)
    if [[ -z "$wheel" ]]; then
        echo "dev.sh: building $HOROVOD against mxnet (once, about 2-6 minutes; cached in $WHEELS)" >&2
        command -v cmake >/dev/null && command -v g++ >/dev/null || {
            echo "dev.sh: building Horovod needs cmake and g++ (on Debian: apt-get install cmake g++)" >&2
            exit 2
        }
        mkdir -p "$WHEELS"
        HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITH_GLOO=1 \
            HOROVOD_WITHOUT_MPI=1 MAKEFLAGS=-j"$(nproc)" \
            "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS" "$HOROVOD" >&2
        wheel=$(ls "$WHEELS"/horovod-0.28.1-cp311-*.whl | head -n1)
    fi
    "$py" -m pip install -q -c constraints.txt "$wheel"
    "$py" -c "import horovod.mxnet" || { echo "dev.sh: $wheel has no MXNet support; delete it to rebuild" >&2; exit 2; }
}

# The tests start a throwaway PostgreSQL server (tests/pg.py), emulate hosts with network namespaces, each with
# its own sshd (tests/hosts.py), and a Slurm cluster on them (tests/slurm.py): Debian's packages provide them.
ensure_test_packages() {
    local missing=()
    command -v initdb >/dev/null || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
    [[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
    command -v ssh >/dev/null || missing+=(openssh-client)
    command -v ip >/dev/null || missing+=(iproute2)
    command -v nsenter >/dev/null || missing+=(util-linux)
    # the Slurm tests start a cluster on those hosts (tests/slurm.py): Debian's slurm-wlm daemons and munge
    [[ -x /usr/sbin/slurmctld ]] || missing+=(slurmctld)
    [[ -x /usr/sbin/slurmd ]] || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    [[ -x /usr/sbin/munged ]] || missing+=(munge)
    [[ ${#missing[@]} -eq 0 ]] && return
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        echo "dev.sh: installing what the tests need (apt-get install ${missing[*]})" >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
    else
        echo "dev.sh: the tests need ${missing[*]} (on Debian: sudo apt-get install ${missing[*]})" >&2
        exit 2
    fi
}

cmd=${1:-}
[[ $# -gt 0 ]] && shift
case "$cmd" in
    run)   ensure_venv; exec "$VENV/bin/python" -m xp "$@" ;;
    test)  ensure_venv; ensure_test_packages  # a process per core and one more (4 at most): many tests wait on
           # processes they started; tests grouped in tests/conftest.py
           exec "$VENV/bin/python" -m pytest -n "$(( $(nproc) < 3 ? $(nproc) + 1 : 4 ))" --dist loadscope "$@" ;;
    setup) ensure_venv ;;
    *)     sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
