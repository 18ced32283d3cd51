# make run   install dependencies, build, run the main job
# make test  install dependencies, build, run every test (unit, conformance,
#            fuzz smoke run, AddressSanitizer+UBSan run of the core suites)
# make sanitize  every test binary under AddressSanitizer+UBSan
# make tsan  the concurrent suites under ThreadSanitizer
# make fuzz  fuzz every parser of untrusted input FUZZ_RUNS times each
#            (wire-format decoder, tensorpipe descriptor, grpc frames and reassembly,
#            S3 HTTP head, SigV4, S3 XML, TOML job file, tensor codecs)

BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc)
FUZZ_RUNS  ?= 200000
CTEST_JOBS ?= 2
# Fuzzers with a seed corpus in fuzz/seeds/<name without fuzz_> and, for
# some, a dictionary in fuzz/dicts/<name without fuzz_>.dict.
PARSER_FUZZERS = fuzz_compress fuzz_grpc_reassembly fuzz_grpc_wire fuzz_s3_chunked fuzz_s3_http fuzz_s3_sigv4 fuzz_s3_xml \
  fuzz_toml_config

.PHONY: all deps run-deps configure build run test unit asan sanitize tsan fuzz fuzz-build format clean

all: build

# deps: everything `make test` needs; run-deps: only what `make run` needs
# (scripts/install-deps.sh run|test).
deps:
	./scripts/install-deps.sh test

run-deps:
	./scripts/install-deps.sh run

# The options are given each time, since `make run` and `make test` share
# $(BUILD): run configures without the tests, benchmarks and Python module
# (and so without their packages), test with them.
ALL_PARTS = -DXSILO_BUILD_TESTS=ON -DXSILO_BUILD_BENCH=ON -DXSILO_BUILD_PYTHON=ON
RUN_PARTS = -DXSILO_BUILD_TESTS=OFF -DXSILO_BUILD_BENCH=OFF -DXSILO_BUILD_PYTHON=OFF

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(ALL_PARTS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job needs the xsilo binary alone (and the libraries it links),
# not the tests, benchmarks or the Python module.
run: run-deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(RUN_PARTS)
	cmake --build $(BUILD) -j $(JOBS) --target xsilo
	./$(BUILD)/tools/xsilo/xsilo fl run --transport grpc+s3 --tier medium --clients 7 --rounds 3

# XSILO_REQUIRE_ALL=1: a test whose prerequisite is missing fails (and a
# skipped one fails the run); the closing line counts the skipped tests.
unit: build
	./scripts/run-ctest.sh $(BUILD) $(CTEST_JOBS)

# AddressSanitizer + UBSan (docs/reliability.md, "Sanitizers"). `make asan`,
# part of `make test`, runs ASAN_SUITES: core and compression, the
# transports and grpc, s3, the store, the endpoint and the hybrid.
# `make sanitize` builds and runs every test binary so (too long for CI).
# `make tsan` runs the concurrent suites under ThreadSanitizer. Cases that
# move several GiB or measure RSS are left to the optimized run
# (scripts/run-sanitized.sh).
ASAN_SUITES = core_test transport_test grpc_transport_test s3_test store_test endpoint_test \
  endpoint_peer_test hybrid_test grpc_s3_test
TSAN_SUITES = hybrid_test grpc_transport_test endpoint_peer_test proxy_test
SANITIZE_CMAKE = CC=clang CXX=clang++ cmake -S . -DCMAKE_BUILD_TYPE=Debug -DXSILO_BUILD_BENCH=ON

asan: deps
	$(SANITIZE_CMAKE) -B $(ASAN_BUILD) -DXSILO_SANITIZE=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target $(ASAN_SUITES)
	./scripts/run-sanitized.sh $(ASAN_BUILD) $(CTEST_JOBS) $(ASAN_SUITES)

sanitize: deps
	$(SANITIZE_CMAKE) -B $(ASAN_BUILD) -DXSILO_SANITIZE=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	./scripts/run-sanitized.sh $(ASAN_BUILD) $(CTEST_JOBS) all

tsan: deps
	$(SANITIZE_CMAKE) -B $(TSAN_BUILD) -DXSILO_TSAN=ON
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_SUITES)
	./scripts/run-sanitized.sh $(TSAN_BUILD) $(CTEST_JOBS) $(TSAN_SUITES)

fuzz-build: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DXSILO_FUZZ=ON -DXSILO_BUILD_TESTS=OFF -DXSILO_BUILD_TOOLS=OFF
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_decode fuzz_seeds fuzz_tensorpipe_descriptor \
	  $(PARSER_FUZZERS)

fuzz: fuzz-build
	mkdir -p $(FUZZ_BUILD)/corpus
	$(FUZZ_BUILD)/fuzz/fuzz_seeds $(FUZZ_BUILD)/corpus
	$(FUZZ_BUILD)/fuzz/fuzz_decode -runs=$(FUZZ_RUNS) -max_len=65536 -rss_limit_mb=2048 \
	  $(FUZZ_BUILD)/corpus
	$(FUZZ_BUILD)/fuzz/fuzz_tensorpipe_descriptor -runs=$(FUZZ_RUNS) -max_len=4096 \
	  -rss_limit_mb=2048
	for f in $(PARSER_FUZZERS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus-$$f && \
	  dict=fuzz/dicts/$${f#fuzz_}.dict; \
	  $(FUZZ_BUILD)/fuzz/$$f -runs=$(FUZZ_RUNS) -max_len=8192 -rss_limit_mb=2048 \
	    $$( [ -f $$dict ] && echo -dict=$$dict ) \
	    $(FUZZ_BUILD)/corpus-$$f fuzz/seeds/$${f#fuzz_} || exit 1; \
	done

test: unit asan
	$(MAKE) fuzz FUZZ_RUNS=$(FUZZ_RUNS)

format:
	find include src tests tools fuzz -name '*.h' -o -name '*.cpp' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
