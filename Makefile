# attnserve: the commands. `make test` is what CI runs (.ci/run).
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
VENV := $(abspath $(BUILD_DIR))/venv
# LangChain's Cohere rerank class, for the rerank test (its cohere pin differs from VENV's).
RAG_VENV := $(abspath $(BUILD_DIR))/rag-venv
CMAKE_ARGS ?=
SANITIZE_DIR := $(BUILD_DIR)/asan
TSAN_DIR := $(BUILD_DIR)/tsan
# Seconds each fuzzer runs in `make test` (`make fuzz` runs longer).
FUZZ_SECONDS ?= 40

.PHONY: all deps client deps-build configure build install test test-release test-asan asan-build test-tsan tsan-build fuzz overload soak image run bench-core bench-server bench-doors bench-encoder bench-servers bench-memory bench-grid format clean

all: build

# Everything `make test` needs, the only step that uses the network: Debian packages for
# compiling and testing, the PyPI tools in $(VENV), the Docker engine, the locally made
# base image and the image's package layers. Tests afterwards never download anything.
deps:
	deploy/install-deps.sh --build --test --venv $(VENV) --rag $(RAG_VENV)
	deploy/docker-prepare.sh --all $(BUILD_DIR)
	deploy/tsan-abseil.sh --fetch $(BUILD_DIR)

# Calling a running server as the README does: the project virtualenv build/venv with
# attnserve's Python client, tritonclient, openai and buf; curl; PyTorch for exporting a
# module. No Docker, no build.
client:
	deploy/install-deps.sh --client --venv $(VENV)

# Compiling only (what the image's build stage runs).
deps-build:
	deploy/install-deps.sh --build

configure: deps-build
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DATTNSERVE_VENV=$(VENV) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Installs dependencies, builds Release, runs every test through CTest, then the
# sanitizer builds' tests and fuzzers (test-asan, test-tsan).
# The sanitizer stages after it skip `deps` (DEPS is what they depend on).
DEPS ?= deps
test: deps build
	$(MAKE) test-release
	$(MAKE) test-asan DEPS=
	$(MAKE) test-tsan DEPS=

# Every test of the Release build (what `make test` runs first), on a built tree.
test-release:
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# clang build of every target with AddressSanitizer + UndefinedBehaviorSanitizer (any
# report fails the test that triggered it) and libFuzzer coverage; runs the C++ and
# end-to-end tests against it, then each fuzzer for FUZZ_SECONDS from its seed corpus
# and replays every past crash (tests/fuzz/regressions).
test-asan: asan-build
	cd $(SANITIZE_DIR) && ctest --output-on-failure -j $(JOBS) -LE 'lint|deploy|docker'

asan-build: $(DEPS)
	CC=clang CXX=clang++ cmake -S . -B $(SANITIZE_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DATTNSERVE_VENV=$(VENV) -DATTNSERVE_SANITIZE=address,undefined,fuzzer-no-link \
	  -DATTNSERVE_BUILD_BENCHMARKS=off \
	  -DATTNSERVE_FUZZ_SECONDS=$(FUZZ_SECONDS) -DATTNSERVE_CUDA=off
	cmake --build $(SANITIZE_DIR) -j $(JOBS)

# clang build with ThreadSanitizer of the server, the clients and their tests, against
# Abseil built with TSan from Debian's source (deploy/tsan-abseil.sh); runs the server
# and client tests and the server-process tests. Any report fails the process that made
# it (halt_on_error); tests/sanitizers/tsan.supp lists what is suppressed and why.
TSAN_TARGETS := attnserve attnctl attnbench npy_test server_process_test batch_scheduler_test \
  batcher_test \
  host_resources_test attention_batcher_test attention_service_test batching_test \
  kserve_http_test kserve_service_test model_registry_test model_control_test metrics_test \
  request_pipeline_test status_page_test tracing_test tsan_handoff_probe
test-tsan: tsan-build
	cd $(TSAN_DIR) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 \
	  ignore_noninstrumented_modules=1 suppressions=$(abspath tests/sanitizers/tsan.supp)" \
	  ctest --output-on-failure -j $(JOBS) -L 'server|client|e2e' -LE lint \
	  -E '^(readme_test|perf_analyzer_test|tritonclient_test|prometheus_scrape_test|export_test|python_package_test|text_test)$$'

tsan-build: $(DEPS)
	deploy/tsan-abseil.sh --build $(BUILD_DIR)
	CC=clang CXX=clang++ cmake -S . -B $(TSAN_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DATTNSERVE_VENV=$(VENV) -DATTNSERVE_SANITIZE=thread -DATTNSERVE_CUDA=off \
	  -DATTNSERVE_TSAN_ABSEIL=$(abspath $(BUILD_DIR))/tsan-abseil/lib
	cmake --build $(TSAN_DIR) -j $(JOBS) --target $(TSAN_TARGETS)

# The fuzzers alone, longer: make fuzz FUZZ_SECONDS=3600
fuzz: FUZZ_SECONDS = 600
fuzz: asan-build
	cd $(SANITIZE_DIR) && ctest --output-on-failure -j $(JOBS) -L fuzz

# Load and faults on loopback (tests/load/reliability.py), bounded in time; not part of
# `make test`. overload: 2x capacity against a short queue. soak: SOAK_SECONDS at 80%.
SOAK_SECONDS ?= 300
overload: build
	$(VENV)/bin/python tests/load/reliability.py $(BUILD_DIR) overload
soak: build
	$(VENV)/bin/python tests/load/reliability.py $(BUILD_DIR) soak $(SOAK_SECONDS)

# The Docker image attnserve:0.1.0 from the top-level Dockerfile.
image: deps
	DOCKER_BUILDKIT=0 /usr/bin/docker build --network host -t attnserve:0.1.0 .

# Serves the built-in model (mha-base) on :50051 in the foreground; Ctrl-C drains and
# exits. Extra flags: make run ARGS="--port=50052 --max_queue_delay=5ms". Builds the
# server and attnctl (what the README's quick start calls next), and configures only a
# build folder that has never been configured.
RUN_TARGETS := attnserve attnctl
run:
	@test -f $(BUILD_DIR)/CMakeCache.txt || $(MAKE) configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target $(RUN_TARGETS)
	$(BUILD_DIR)/server/attnserve $(ARGS)

# attnserve, attnctl, attnbench and the C++ client (headers, static libraries, CMake
# package: find_package(attnserve) -> attnserve::client) under PREFIX.
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# Core speed: Google Benchmark over the (B, L, d, h) grid, interleaved with the peers
# (Debian's PyTorch 1.13 + OpenBLAS; the peers venv's PyTorch 2.x MHA and SDPA and ONNX
# Runtime), printed as one table with targets. Not part of `make test`.
PEERS_VENV ?= $(BUILD_DIR)/peers-venv
bench-core: build
	deploy/install-deps.sh --test --bench --venv $(VENV) --peers $(PEERS_VENV)
	/usr/bin/python3 tests/bench/compare_core.py --core-bench $(BUILD_DIR)/tests/bench/core_bench \
	  --peers-python $(PEERS_VENV)/bin/python

# Server speed: attnbench against attnserve, the core, a Python grpcio peer (the fastest
# here of PyTorch 1.13, PyTorch 2.x and ONNX Runtime),
# batching on/off, the latency floor and 8 MiB messages. Not part of `make test`.
bench-server: build
	deploy/install-deps.sh --test --bench --venv $(VENV) --peers $(PEERS_VENV)
	/usr/bin/python3 tests/bench/server_bench.py $(BUILD_DIR) . \
	  --peers-python=$(PEERS_VENV)/bin/python

# The KServe doors side by side: gRPC and HTTP binary through Triton's perf_analyzer,
# one server, one run. BENCH_ARGS="--baseline=OTHER/attnserve" adds another build's gRPC
# figures (no-regression check). Not part of `make test`.
bench-doors: build
	deploy/install-deps.sh --test --venv $(VENV)
	/usr/bin/python3 tests/bench/doors_bench.py $(BUILD_DIR) . $(BENCH_ARGS)

# The encoder (all-MiniLM-L6-v2) beside ONNX Runtime and sentence-transformers on PyPI's
# PyTorch 2.x (a peers venv of several GB, build/peers-venv), core and server, fp32 and
# bf16, one table with targets; then a MiniLM-shaped cross-encoder's rerank (one query x
# 32 documents) beside CrossEncoder.predict and ONNX Runtime. Not part of `make test`.
bench-encoder: build
	deploy/install-deps.sh --test --venv $(VENV) --peers $(PEERS_VENV)
	cmake --build $(BUILD_DIR) -j $(JOBS) --target encoder_bench tokenizer_bench
	$(PEERS_VENV)/bin/python tests/bench/encoder_bench.py $(BUILD_DIR) . $(BENCH_ARGS)
	$(PEERS_VENV)/bin/python tests/bench/rerank_bench.py $(BUILD_DIR) .

# attnserve beside the embedding servers users deploy instead (infinity-emb on PyTorch 2.x
# and on ONNX Runtime, PyTriton around ONNX Runtime; in build/servers-venv, several GB):
# all-MiniLM-L6-v2 over HTTP and KServe gRPC, one closed-loop load generator,
# sentences/s and p50/p99 with targets, and the core alone at the batches attnserve
# formed. Not part of `make test`.
SERVERS_VENV ?= $(BUILD_DIR)/servers-venv
bench-servers: build
	deploy/install-deps.sh --test --venv $(VENV) --servers $(SERVERS_VENV)
	$(SERVERS_VENV)/bin/python tests/bench/servers_bench.py $(BUILD_DIR) . $(BENCH_ARGS)

# Peak memory loading and serving a big-vocabulary encoder (an XLM-R checkpoint of
# multilingual-e5-small's shape, 250,002 x 384 table), fp32 and bf16, with its target.
# Not part of `make test`.
bench-memory: build
	deploy/install-deps.sh --test --venv $(VENV)
	$(VENV)/bin/python tests/bench/load_memory_bench.py $(BUILD_DIR) .

# Instances x intra-op threads on the whole machine (how the defaults were chosen).
bench-grid: build
	/usr/bin/python3 tests/bench/server_bench.py $(BUILD_DIR) . --grid

format:
	clang-format -i $$(git ls-files '*.h' '*.cc' '*.proto')

clean:
	rm -rf $(BUILD_DIR)
