# make run   install dependencies, build, run the main job
# make test  install dependencies, build, run every test (unit, conformance,
#            fuzz smoke run, AddressSanitizer run)
# make fuzz  fuzz every parser of untrusted input FUZZ_RUNS times each
#            (wire-format decoder, tensorpipe descriptor, grpc frames and reassembly,
#            S3 HTTP head, SigV4, S3 XML, TOML job file, tensor codecs)

BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc)
FUZZ_RUNS  ?= 200000
CTEST_JOBS ?= 2
# Fuzzers with a seed corpus in fuzz/seeds/<name without fuzz_> and, for
# some, a dictionary in fuzz/dicts/<name without fuzz_>.dict.
PARSER_FUZZERS = fuzz_compress fuzz_grpc_reassembly fuzz_grpc_wire fuzz_s3_chunked fuzz_s3_http fuzz_s3_sigv4 fuzz_s3_xml \
  fuzz_toml_config

.PHONY: all deps configure build run test unit asan fuzz fuzz-build format clean

all: build

deps:
	./scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job needs the xsilo binary alone (and the libraries it links),
# not the tests, benchmarks or the Python module.
run: configure
	cmake --build $(BUILD) -j $(JOBS) --target xsilo
	./$(BUILD)/tools/xsilo/xsilo fl run --transport grpc+s3 --tier medium --clients 7 --rounds 3

# XSILO_REQUIRE_ALL=1: a test whose prerequisite is missing fails (and a
# skipped one fails the run); the closing line counts the skipped tests.
unit: build
	./scripts/run-ctest.sh $(BUILD) $(CTEST_JOBS)

# Sanitized build of core + transport; the conformance suite's multi-GiB
# and RSS-measuring cases are left to the optimized run.
asan: deps
	CC=clang CXX=clang++ cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug \
	  -DXSILO_SANITIZE=ON -DXSILO_BUILD_TOOLS=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target core_test transport_test
	ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 $(ASAN_BUILD)/tests/core/core_test
	ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 $(ASAN_BUILD)/tests/transport/transport_test \
	  --gtest_filter='-*TensorOver2GiB*:*BroadcastSharesPayload*:*PayloadSizes*'

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
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
