#!/usr/bin/env bash
# Abseil built with ThreadSanitizer, for `make test-tsan`.
#
# Why: absl::Mutex is a futex-based lock that TSan sees only when Abseil itself is
# compiled with -fsanitize=thread (its annotations live in mutex.cc). Debian's
# libabsl is not, so every lock our code and gRPC take is invisible and TSan reports
# each guarded access as a race. This builds Debian's own source of the installed
# version (same patches, same inline namespace `debian3`, same SONAMEs) with TSan; the
# TSan build links with an RPATH to it, so the TSan binaries, and the Debian gRPC
# libraries they load, lock through the instrumented absl::Mutex.
#
#   deploy/tsan-abseil.sh --fetch BUILD_DIR   the source (network: part of `make deps`)
#   deploy/tsan-abseil.sh --build BUILD_DIR   the libraries (no network)
#
# Source and libraries go under BUILD_DIR/tsan-abseil. The system's apt configuration
# is not touched: the deb-src list and its index live there too.
set -euo pipefail
mode="${1:?usage: tsan-abseil.sh --fetch|--build BUILD_DIR}"
build="$(mkdir -p "${2:?BUILD_DIR}" && cd "$2" && pwd)"
top="$build/tsan-abseil"
version="$(dpkg-query -W -f '${Version}' libabsl20220623)"
upstream="${version%%-*}"
src="$top/abseil-$upstream"
stamp="$top/source-$version"

case "$mode" in
  --fetch)
    [[ -f "$stamp" ]] && exit 0
    rm -rf "$top" && mkdir -p "$top/lists/partial"
    printf '%s\n' 'Types: deb-src' 'URIs: http://deb.debian.org/debian' \
      'Suites: bookworm bookworm-updates' 'Components: main' \
      'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' > "$top/src.sources"
    apt=(apt-get -q -o "Dir::Etc::SourceList=$top/src.sources"
         -o Dir::Etc::SourceParts=/nonexistent -o "Dir::State::Lists=$top/lists"
         -o APT::Sandbox::User=root)
    "${apt[@]}" update > "$top/apt.log"
    (cd "$top" && "${apt[@]}" source "abseil=$version" >> "$top/apt.log")
    touch "$stamp"
    ;;
  --build)
    [[ -f "$stamp" ]] || { echo "tsan-abseil: no source; run make deps" >&2; exit 1; }
    [[ -f "$top/lib/.built" ]] && exit 0
    CC=clang CXX=clang++ cmake -S "$src" -B "$top/cmake" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
      -DABSL_PROPAGATE_CXX_STD=ON -DCMAKE_CXX_FLAGS=-fsanitize=thread \
      -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread > "$top/cmake.log"
    # absl::Mutex, CondVar, SpinLock and call_once, and the libraries that instantiate
    # call_once's template (a weak symbol: whichever copy loads first is used, so every
    # copy must be instrumented). Status, Cord and the rest stay Debian's: gRPC's core
    # (uninstrumented, its thread hand-offs invisible to TSan) passes them between its
    # threads, and instrumenting them would only report gRPC's own hand-offs.
    cmake --build "$top/cmake" -j "$(nproc)" --target synchronization \
      random_internal_pool_urbg >> "$top/cmake.log"
    mkdir -p "$top/lib"
    find "$top/cmake" -name 'libabsl_*.so.*' -exec cp -P {} "$top/lib/" \;
    touch "$top/lib/.built"
    ;;
  *)
    echo "usage: tsan-abseil.sh --fetch|--build BUILD_DIR" >&2
    exit 2
    ;;
esac
