# diffattn: the README's commands. `make demo` and `make test` install what is missing
# (scripts/setup.sh), configure and build, then run the demo or every test.
BUILD   ?= build
JOBS    ?= $(shell nproc)
PYTHON  ?= /usr/bin/python3
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: all setup configure build test test-cpp test-python demo clean

all: build

setup:
	@scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

configure: setup $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	$(MAKE) --no-print-directory test-cpp test-python

test-cpp:
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-python:
	PYTHONPATH=$(BUILD)/python $(PYTHON) -m pytest -q tests/python

demo: build
	$(BUILD)/diffattn demo

clean:
	rm -rf $(BUILD)
