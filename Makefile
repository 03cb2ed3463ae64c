# diffattn: the README's commands. `make demo` and `make test` install what is missing
# (scripts/setup.sh: Debian packages; scripts/venv.sh: the test environment .venv/), configure
# and build, then run the demo or every test.
BUILD   ?= build
JOBS    ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release
# The test environment: .venv/ from the machine's Python 3.11 with requirements-test.txt, and
# diffattn installed into it for development (pip install -e .). pip's CMake build shares the
# build tree $(BUILD) with `make build` (same generator and options), so nothing compiles twice.
VENV    ?= .venv
VPY     := $(VENV)/bin/python
PIP_DEV := -C build-dir=$(BUILD) -C cmake.build-type=Release \
           -C cmake.define.DIFFATTN_TESTS=ON -C cmake.define.DIFFATTN_BENCH=ON
# The kernel tests again under AddressSanitizer and UndefinedBehaviorSanitizer, in their own
# build tree (only the kernels and their tests are built there).
SAN_BUILD ?= $(BUILD)/asan
SAN_TESTS := test_fused test_reference test_ssm
# libFuzzer harnesses (fuzz/), built with clang in their own tree. `make test` replays each
# checked-in corpus and fuzzes FUZZ_REPLAY_SECONDS per harness; `make fuzz` fuzzes FUZZ_SECONDS.
FUZZ_BUILD ?= $(BUILD)/fuzz
FUZZ_SECONDS ?= 300
FUZZ_REPLAY_SECONDS ?= 4

.PHONY: all setup setup-test venv install-dev configure build test test-cpp test-python test-sanitize fuzz-build fuzz test-fuzz demo corpus clean

all: build

setup:
	@scripts/setup.sh

setup-test:
	@scripts/setup.sh test

# The language-model corpus (docs/corpus.md): Debian packages' text, split by document into
# data/corpus/{train,heldout}.jsonl (about 55 MB).
corpus:
	@scripts/setup.sh corpus
	python3 scripts/corpus.py --out $${DIFFATTN_DATA_DIR:-data}/corpus

venv: setup-test
	@scripts/venv.sh

# diffattn into .venv (editable: the Python sources are used in place; the compiled module and
# the `diffattn` command are installed). Run again after changing C++ sources.
install-dev: venv
	CMAKE_GENERATOR="Unix Makefiles" CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(VPY) -m pip install -q \
	  --disable-pip-version-check --no-build-isolation --no-deps -e . $(PIP_DEV)

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

configure: setup $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: setup-test install-dev build
	$(MAKE) --no-print-directory test-cpp test-python test-sanitize test-fuzz

test-cpp:
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-python:
	$(VPY) -m pytest -q tests/python

$(SAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDIFFATTN_SANITIZE=ON \
	  -DDIFFATTN_PYTHON=OFF -DDIFFATTN_BENCH=OFF

test-sanitize: setup-test $(SAN_BUILD)/CMakeCache.txt
	cmake --build $(SAN_BUILD) -j $(JOBS) --target $(SAN_TESTS)
	@set -e; for t in $(SAN_TESTS); do \
	  echo "== $$t under ASan + UBSan"; \
	  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $(SAN_BUILD)/tests/cpp/$$t --gtest_brief=1; \
	done

$(FUZZ_BUILD)/CMakeCache.txt:
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DDIFFATTN_FUZZ=ON -DDIFFATTN_PYTHON=OFF -DDIFFATTN_BENCH=OFF -DDIFFATTN_TESTS=OFF

fuzz-build: setup-test $(FUZZ_BUILD)/CMakeCache.txt
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers

# The libFuzzer harnesses, then the tokenizer against the tokenizers library (a Python
# differential fuzzer: fuzz/tokenizer_vs_library.py, corpus fuzz/corpus_text/).
test-fuzz: fuzz-build
	scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_REPLAY_SECONDS)
	$(VPY) fuzz/tokenizer_vs_library.py --seconds $(FUZZ_REPLAY_SECONDS) --artifacts $(FUZZ_BUILD)/artifacts/tokenizer_vs_library

fuzz: fuzz-build
	scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)
	$(VPY) fuzz/tokenizer_vs_library.py --seconds $(FUZZ_SECONDS) --artifacts $(FUZZ_BUILD)/artifacts/tokenizer_vs_library

demo: build
	$(BUILD)/diffattn demo

clean:
	rm -rf $(BUILD)

# The test environment too (the next `make test` makes it again).
distclean: clean
	rm -rf $(VENV)
