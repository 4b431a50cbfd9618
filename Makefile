# The two commands of the README: `make run` and `make test`.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test unit integration bench clean format

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja:
	@cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

configure: deps $(BUILD)/build.ninja

# The build's output goes to $(BUILD)/build.log (its tail is shown when it fails).
build: configure
	@echo "make: building into $(BUILD) (log: $(BUILD)/build.log; a first build takes ~10 minutes on 2 cores)"
	@cmake --build $(BUILD) -j $(JOBS) > $(BUILD)/build.log 2>&1 || { tail -n 40 $(BUILD)/build.log; exit 1; }

# Runs the quickstart: a GPT on the GPL-3 text, data parallel over 2 local agents.
run: build
	@$(BUILD)/bin/troupe run configs/quickstart.toml

test: build
	@cd $(BUILD) && ctest -j $(JOBS) --output-on-failure --timeout 600

unit: build
	@cd $(BUILD) && ctest -j $(JOBS) -L unit --output-on-failure

integration: build
	@cd $(BUILD) && ctest -L integration --output-on-failure

bench: build
	@$(BUILD)/bin/troupe bench control

format:
	@git ls-files '*.h' '*.cpp' | xargs clang-format -i

clean:
	@rm -rf $(BUILD)
