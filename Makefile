# The two commands of the README: `make run` and `make test`.
BUILD ?= build
JOBS ?= 2
comma := ,
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test unit integration bench clean format fuzz sanitize tsan emulated

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja:
	@cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

configure: deps $(BUILD)/build.ninja

# The build's output goes to $(BUILD)/build.log (its tail is shown when it fails).
build: configure
	@echo "make: building into $(BUILD) (log: $(BUILD)/build.log; a first build takes ~7 minutes on 2 cores)"
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

# libFuzzer targets (clang, ASan + UBSan) in build-fuzz/, each run FUZZ_SECONDS on its corpus in
# fuzz/corpus/ (new inputs are added there). CI runs them briefly.
FUZZ_SECONDS ?= 600
fuzz: deps
	@cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DTROUPE_FUZZ=ON -DTROUPE_BUILD_TESTS=OFF -DTROUPE_WITH_CUDA=OFF > build-fuzz.log 2>&1 || { tail -n 30 build-fuzz.log; exit 1; }
	@cmake --build build-fuzz -j $(JOBS) --target troupe_frame_fuzz troupe_config_fuzz troupe_data_fuzz troupe_files_fuzz >> build-fuzz.log 2>&1 || { tail -n 40 build-fuzz.log; exit 1; }
	@for t in frame config data files; do \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  build-fuzz/bin/troupe_$${t}_fuzz -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -timeout=10 -rss_limit_mb=2048 fuzz/corpus/$$t > build-fuzz/$$t.log 2>&1; rc=$$?; \
	  tail -n 12 build-fuzz/$$t.log; [ $$rc -eq 0 ] || { echo "fuzz: $$t failed"; exit 1; }; \
	done

# A sanitizer build in $(1) (no CUDA) with compiler flags $(2) and linker flags $(3), of the
# targets $(4) (every target when none); the build's output goes to $(1)/build.log.
define sanitizer_build
	@cmake -S . -B $(1) -G Ninja -DTROUPE_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Sanitize \
	  -DCMAKE_C_FLAGS="$(2)" -DCMAKE_CXX_FLAGS="$(2)" -DCMAKE_EXE_LINKER_FLAGS="$(3)" > /dev/null
	@echo "make: building into $(1) (log: $(1)/build.log)"
	@cmake --build $(1) -j $(JOBS) $(if $(4),--target $(4)) > $(1)/build.log 2>&1 || { tail -n 40 $(1)/build.log; exit 1; }
endef

# Every test under AddressSanitizer + UndefinedBehaviorSanitizer (gcc), in build-asan/. Leak
# checking is off: UCX and CAF keep process-lifetime allocations by design. What is suppressed
# and why: scripts/ubsan.supp. -O1 -g1 (line tables only): the reports keep file:line and the
# build takes half the time of -O2 -g.
# Left out here (make test runs them): the three long runs of the example's convolutional model
# (its kernels run ~25x slower under ASan+UBSan: 10 CPU minutes of the suite's 70; the elastic
# paths they take are covered here by the built-in models' tests, and the extension API by the
# example's short tests). The quickstart (a GPT trained for 75 s under ASan; the GPT's paths are
# the text and pipeline tests' too), and the allreduce tests rerun with each vendor's layout of
# the shared segments (peer_lines.*.processes: ASan cannot see inside mmapped segments, and the
# same calls run once in CommProcesses and Sweep): CI's 90 minutes were nearly spent.
SAN_FLAGS = -O1 -g1 -fsanitize=address,undefined -fno-omit-frame-pointer
# Executables linked without PIE: UBSan's check records hold pointers (6.4 million relative
# relocations in bin/troupe), which a PIE binary applies at every start, 1.6 s of CPU per process
# on these hosts (0.55 s without). The suite starts thousands of processes.
SAN_LDFLAGS = -fsanitize=address$(comma)undefined -no-pie
SAN_SKIP = ^CustomModel[.](PreemptedResumed|ScaledIntoPipelineStages|AKillAndAJoin)|^Job[.]TheQuickstartKeepsTheReadmesPromise$$|^peer_lines[.].*[.]processes$$
sanitize: deps
	$(call sanitizer_build,build-asan,$(SAN_FLAGS),$(SAN_LDFLAGS))
	@cd build-asan && ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$(CURDIR)/scripts/ubsan.supp \
	  ctest -j $(JOBS) -E '$(SAN_SKIP)' --output-on-failure --timeout 900

# ThreadSanitizer (gcc) on the unit tests and the communicator tests (collectives between
# threads of one process and between processes), in build-tsan/ (those two test programs and the
# commands they run are all it builds). What is suppressed and why:
# scripts/tsan.supp. The communicator tests one at a time: their processes poll, and under TSan
# two tests of four such processes on two cores starved one past its 60 s deadline.
TSAN_FLAGS = -O1 -g1 -fsanitize=thread
TSAN_TESTS = Sweep|Collectives\.|Groups\.|Tags\.|CommProcesses|OtherCalls
# UCX's memory hooks (libucm) intercept madvise, which glibc calls while a thread exits, and take
# a lock TSan intercepts in a thread it has already torn down: every process crashed at its
# first thread exit. Troupe registers no memory with UCX's cache, so the hooks are off here.
tsan: export UCX_MEM_EVENTS = no
tsan: deps
	$(call sanitizer_build,build-tsan,$(TSAN_FLAGS),-fsanitize=thread,troupe_unit_tests troupe_integration_tests)
	@cd build-tsan && export TSAN_OPTIONS="suppressions=$(CURDIR)/scripts/tsan.supp halt_on_error=1 second_deadlock_stack=1" && \
	  ctest -j $(JOBS) -L unit --output-on-failure --timeout 600 && \
	  ctest -j 1 -R '$(TSAN_TESTS)' --output-on-failure --timeout 900

# The CUDA paths without a GPU, in build-emulated/ (TROUPE_CUDA_EMULATION: tests/emulation): the
# GPU tests, and the elastic job on "cuda" workers (scripts/gpu-elastic.sh, 80 steps: the kill
# comes at step 30). About 11 minutes to build, 3 to run, on 2 cores.
emulated: deps
	@cmake -S . -B build-emulated -G Ninja -DTROUPE_CUDA_EMULATION=ON > /dev/null
	@echo "make: building into build-emulated (log: build-emulated/build.log)"
	@cmake --build build-emulated -j $(JOBS) > build-emulated/build.log 2>&1 || { tail -n 40 build-emulated/build.log; exit 1; }
	@cd build-emulated && ctest -j $(JOBS) -L gpu --output-on-failure --timeout 600
	@scripts/gpu-elastic.sh $(CURDIR)/build-emulated/bin/troupe cuda 80

bench: build
	@$(BUILD)/bin/troupe bench control

format:
	@git ls-files '*.h' '*.cpp' | xargs clang-format -i

clean:
	@rm -rf $(BUILD)
