# hakmem build. `make` builds out/release; `make debug` builds out/debug with
# assertions; `make test` and `make bench` install what they need first.

CC      ?= cc
CXX     ?= g++
PREFIX  ?= /usr/local
# The library directory, under PREFIX (Debian's: lib/x86_64-linux-gnu).
LIBDIR  ?= lib
# The version is HAKMEM_VERSION in the public header: one place to change.
VERSION := $(shell sed -n 's/^\#define HAKMEM_VERSION "\(.*\)"/\1/p' include/hakmem.h)
SOMAJOR := 0

# Every module under core/, one folder deep (core/box/, core/large/, ...).
SRCS := $(wildcard core/*.c core/*/*.c)
HDRS := $(wildcard include/*.h core/*.h core/*/*.h)

# -fno-builtin: the compiler must not turn our own code into calls to malloc
# (e.g. malloc+memset -> calloc) that would recurse into hakmem.
# WERROR= (debian/rules): a distribution's newer compiler warns, not fails.
WERROR ?= -Werror
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -fPIC -fvisibility=hidden \
	-ftls-model=initial-exec -fno-builtin -fno-semantic-interposition \
	-fno-plt -pthread -Wall -Wextra $(WERROR) -Iinclude -Icore
RELEASE_CFLAGS := $(BASE_CFLAGS) -O2 -DNDEBUG -g
# Test builds may fail OS calls on demand (HAK_FAULT_INJECT, core/box/os.h).
DEBUG_CFLAGS   := $(BASE_CFLAGS) -O1 -g -DHAK_DEBUG -DHAK_FAULT_INJECT

# Checked builds (docs/RELIABILITY.md), with clang:
#   ubsan: UndefinedBehaviorSanitizer; the whole cmocka suite runs against it.
#   tsan:  ThreadSanitizer, hak_ names only (HAK_NO_OVERRIDE), so TSan's own
#          malloc serves the runtime and the tests call hakmem by name
#          (tests/hak_names.h renames their malloc, free, ...).
#   fuzz:  libFuzzer coverage with AddressSanitizer and UBSan, hak_ names only.
SAN_CC := clang
CHECK_CFLAGS := $(DEBUG_CFLAGS) -fno-omit-frame-pointer
UBSAN_FLAGS  := -fsanitize=undefined -fno-sanitize-recover=all
TSAN_FLAGS   := -fsanitize=thread
FUZZ_FLAGS   := -fsanitize=address,undefined -fno-sanitize-recover=all
UBSAN_CFLAGS := $(CHECK_CFLAGS) $(UBSAN_FLAGS)
TSAN_CFLAGS  := $(CHECK_CFLAGS) $(TSAN_FLAGS) -DHAK_NO_OVERRIDE
# The count build (make count): the release build with ThreadSanitizer's
# instrumentation but not its runtime: tests/scale/count.c takes the hooks and
# counts atomics, locks and cache lines shared between threads, by call site.
# (-Wno-tsan: gcc's ThreadSanitizer does not model atomic_thread_fence and
# says so; the count build counts, it checks nothing.)
COUNT_CFLAGS := $(RELEASE_CFLAGS) -fsanitize=thread -Wno-tsan -DHAK_COUNT
FUZZ_CFLAGS  := $(CHECK_CFLAGS) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -DHAK_NO_OVERRIDE

.PHONY: all release debug count checked tests test fuzz soak bench bench-bins bench-instr install clean format

all: release

# ---- library -----------------------------------------------------------------
# lib_rules(name, flags, compiler)
define lib_rules
out/$(1)/obj/%.o: %.c $(HDRS) Makefile
	@mkdir -p $$(dir $$@)
	$$($(3)) $$($(2)) -c $$< -o $$@

out/$(1)/libhakmem.a: $$(SRCS:%.c=out/$(1)/obj/%.o)
	@rm -f $$@
	ar rcs $$@ $$^

out/$(1)/libhakmem.so.$(VERSION): $$(SRCS:%.c=out/$(1)/obj/%.o)
	$$(CC) -shared -pthread -Wl,-soname,libhakmem.so.$(SOMAJOR) -Wl,-z,now \
		-Wl,--no-undefined -o $$@ $$^

out/$(1)/libhakmem.so: out/$(1)/libhakmem.so.$(VERSION)
	ln -sf libhakmem.so.$(VERSION) out/$(1)/libhakmem.so.$(SOMAJOR)
	ln -sf libhakmem.so.$(VERSION) $$@
endef
$(eval $(call lib_rules,release,RELEASE_CFLAGS,CC))
$(eval $(call lib_rules,debug,DEBUG_CFLAGS,CC))
$(eval $(call lib_rules,ubsan,UBSAN_CFLAGS,SAN_CC))
$(eval $(call lib_rules,tsan,TSAN_CFLAGS,SAN_CC))
$(eval $(call lib_rules,fuzz,FUZZ_CFLAGS,SAN_CC))
$(eval $(call lib_rules,count,COUNT_CFLAGS,CC))

# The count build's runtime: linked in, not instrumented.
out/count/obj/count_rt.o: tests/scale/count.c Makefile
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -g -fPIC -pthread -fvisibility=hidden \
		-ftls-model=initial-exec -Wall -Wextra -Werror -c $< -o $@
out/count/libhakmem.so.$(VERSION): out/count/obj/count_rt.o

release: out/release/libhakmem.so out/release/libhakmem.a out/release/hakmem
debug: out/debug/libhakmem.so out/debug/libhakmem.a
count: out/count/libhakmem.so

# ---- the hakmem command (docs/hakmem.1) ----------------------------------------
# It preloads the library found at CMD_LIBDIR_REL from its own directory (the
# install layout: bin/ -> the lib directory install uses) or beside itself
# (the build tree: out/release).
CMD_LIBDIR_REL := ../$(LIBDIR)

# (Rebuilt when LIBDIR changes: out/release/cmd-libdir holds the last one.)
out/release/cmd-libdir: FORCE
	@mkdir -p $(dir $@)
	@echo '$(CMD_LIBDIR_REL)' | cmp -s - $@ || echo '$(CMD_LIBDIR_REL)' > $@
.PHONY: FORCE
FORCE:

out/release/hakmem: tools/hakmem.c Makefile out/release/cmd-libdir
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -D_FORTIFY_SOURCE=2 -O2 -g -Wall -Wextra $(WERROR) -Wl,-z,now \
		-DHAKMEM_VERSION='"$(VERSION)"' \
		-DHAKMEM_SONAME='"libhakmem.so.$(SOMAJOR)"' -DHAKMEM_LIBDIR_REL='"$(CMD_LIBDIR_REL)"' \
		$< -o $@

# make install also installs it (PREFIX/bin) and its man page.
.PHONY: install-cmd
install: install-cmd
install-cmd: out/release/hakmem
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 755 out/release/hakmem $(DESTDIR)$(PREFIX)/bin/
	install -m 644 docs/hakmem.1 $(DESTDIR)$(PREFIX)/share/man/man1/

# ---- tests -------------------------------------------------------------------
# Each tests/test_*.c is a cmocka program linked statically against the debug
# library, so its malloc/free are hakmem's.
TEST_SRCS := $(wildcard tests/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=out/tests/%)
TEST_CFLAGS := -std=c11 -D_GNU_SOURCE -O1 -g -pthread -Wall -Wextra -Werror \
	-Wno-alloc-size-larger-than -fno-builtin -Iinclude -Icore -DHAK_DEBUG -DHAK_FAULT_INJECT

out/tests/%: tests/%.c out/debug/libhakmem.a $(HDRS) $(wildcard tests/*.h)
	@mkdir -p out/tests
	$(CC) $(TEST_CFLAGS) $< -o $@ out/debug/libhakmem.a -lcmocka -pthread

# The C++ operators' tests: C++, against the same library.
out/tests/test_cxx: tests/test_cxx.cc out/debug/libhakmem.a $(HDRS) $(wildcard tests/*.h)
	@mkdir -p out/tests
	$(CXX) -std=c++17 -O1 -g -pthread -Wall -Wextra -Werror -fno-builtin -Iinclude -Icore \
		-DHAK_DEBUG -DHAK_FAULT_INJECT $< -o $@ out/debug/libhakmem.a -lcmocka -pthread

out/tests/cxx_prog: tests/real/cxx_prog.cpp
	@mkdir -p out/tests
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror $< -o $@

out/tests/cxx_replaced: tests/real/cxx_replaced.cpp
	@mkdir -p out/tests
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror $< -o $@

out/tests/cxx_replaced_static: tests/real/cxx_replaced.cpp out/release/libhakmem.a
	@mkdir -p out/tests
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror $< -o $@ out/release/libhakmem.a -pthread

out/tests/cxx_prog_linked: tests/real/cxx_prog.cpp out/release/libhakmem.so
	@mkdir -p out/tests
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror $< -o $@ \
		-Lout/release -Wl,--no-as-needed -lhakmem -Wl,--as-needed -Wl,-rpath,$(CURDIR)/out/release

# The same tests against the checked builds (see above).
# clang: glibc declares memalign alignment-checked; the tests pass impossible ones on purpose.
SAN_TEST_CFLAGS := $(TEST_CFLAGS) -fno-omit-frame-pointer -Wno-unknown-warning-option \
	-Wno-builtin-assume-aligned-alignment -Wno-non-power-of-two-alignment
UBSAN_TEST_BINS := $(TEST_SRCS:tests/%.c=out/ubsan/tests/%)
TSAN_TEST_BINS  := $(TEST_SRCS:tests/%.c=out/tsan/tests/%)

out/ubsan/tests/%: tests/%.c out/ubsan/libhakmem.a $(HDRS) $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(SAN_CC) $(SAN_TEST_CFLAGS) $(UBSAN_FLAGS) $< -o $@ out/ubsan/libhakmem.a -lcmocka -pthread

out/tsan/tests/%: tests/%.c out/tsan/libhakmem.a $(HDRS) $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(SAN_CC) $(SAN_TEST_CFLAGS) $(TSAN_FLAGS) -include tests/hak_names.h $< -o $@ \
		out/tsan/libhakmem.a -lcmocka -pthread

# Fuzz targets (tests/fuzz/): libFuzzer, ASan and UBSan, against out/fuzz.
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
# Each also as <target>_check: the same programs in checked mode (HAKMEM_CHECK=1).
FUZZ_BINS := $(FUZZ_SRCS:tests/fuzz/%.c=out/fuzz/%) $(FUZZ_SRCS:tests/fuzz/%.c=out/fuzz/%_check)
FUZZ_CC = $(SAN_CC) -std=c11 -D_GNU_SOURCE -O1 -g -pthread -Wall -Wextra -Werror -Iinclude -Icore \
	-DHAK_FAULT_INJECT -fno-omit-frame-pointer -fsanitize=fuzzer $(FUZZ_FLAGS)

out/fuzz/%_check: tests/fuzz/%.c out/fuzz/libhakmem.a $(HDRS) $(wildcard tests/fuzz/*.h tests/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -DFUZZ_CHECKED $< -o $@ out/fuzz/libhakmem.a -pthread

out/fuzz/%: tests/fuzz/%.c out/fuzz/libhakmem.a $(HDRS) $(wildcard tests/fuzz/*.h tests/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $< -o $@ out/fuzz/libhakmem.a -pthread

checked: $(UBSAN_TEST_BINS) $(TSAN_TEST_BINS) $(FUZZ_BINS)

tests: release debug $(TEST_BINS) out/tests/test_cxx out/tests/cxx_prog out/tests/cxx_prog_linked \
	out/tests/cxx_replaced out/tests/cxx_replaced_static checked \
	count out/bench/bench_threads out/bench/bench_larson

# The builds are independent files: as many compilers as cores (unless -j was given).
NPROC := $(shell nproc 2>/dev/null || echo 2)
# (Deferred: MAKEFLAGS holds -j only once the makefile has been read.)
SUBMAKE_J = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(NPROC))

test:
	@tests/deps.sh
	@$(MAKE) --no-print-directory $(SUBMAKE_J) tests
	@tests/run.sh

# Longer fuzz runs than make test's: FUZZ_SECONDS per target (tests/fuzz/run.sh).
fuzz:
	@tests/deps.sh
	@$(MAKE) --no-print-directory checked
	@tests/fuzz/run.sh

# Minutes of load with content checks, and redis-server under traffic
# (tests/soak/run.sh; SOAK_SECONDS sets the length). Not part of make test.
soak:
	@tests/deps.sh
	@$(MAKE) --no-print-directory release
	@tests/soak/run.sh

# ---- benchmarks --------------------------------------------------------------
BENCH_SRCS := $(wildcard bench/bench_*.c)
BENCH_BINS := $(BENCH_SRCS:bench/%.c=out/bench/%)

out/bench/%: bench/%.c bench/bench_util.h
	@mkdir -p out/bench
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -g -pthread -Wall -Wextra -Werror $< -o $@ -pthread -lm

bench-bins: release $(BENCH_BINS)

bench:
	@bench/deps.sh
	@$(MAKE) --no-print-directory $(SUBMAKE_J) bench-bins
	@bench/run.sh
	@BENCH_SET=threads RUNS=$${THREADS_RUNS:-5} ALLOCATORS="$${THREADS_ALLOCATORS:-hakmem mimalloc jemalloc}" \
		bench/run.sh
	@bench/syscalls.sh

# mmap/munmap/madvise/mremap/mprotect/brk calls per run (strace -f -c), hakmem
# vs the other allocators; `make bench` runs it after bench/run.sh.
.PHONY: bench-syscalls
bench-syscalls:
	@bench/deps.sh
	@$(MAKE) --no-print-directory bench-bins
	@bench/syscalls.sh

# Instructions per malloc+free pair (valgrind --tool=callgrind), hakmem vs
# the other allocators: deterministic, unlike timings on a shared machine.
bench-instr:
	@bench/deps.sh
	@$(MAKE) --no-print-directory bench-bins
	@bench/instr.sh

# Real programs (git gc --aggressive, gcc, CPython) under each allocator:
# time, peak RSS, page faults (bench/real.sh). Not part of make bench.
.PHONY: bench-real
bench-real:
	@bench/deps.sh
	@$(MAKE) --no-print-directory release
	@bench/real.sh

# ---- install -----------------------------------------------------------------
# The CMake package's way up from LIBDIR/cmake/hakmem to PREFIX.
CMAKE_UP := $(shell echo '$(LIBDIR)/cmake/hakmem' | sed -e 's|[^/][^/]*|..|g')
INSTALL_LIB := $(DESTDIR)$(PREFIX)/$(LIBDIR)
install: release
	install -d $(INSTALL_LIB) $(DESTDIR)$(PREFIX)/include $(INSTALL_LIB)/pkgconfig $(INSTALL_LIB)/cmake/hakmem
	install -m 644 out/release/libhakmem.so.$(VERSION) $(INSTALL_LIB)/
	ln -sf libhakmem.so.$(VERSION) $(INSTALL_LIB)/libhakmem.so.$(SOMAJOR)
	ln -sf libhakmem.so.$(SOMAJOR) $(INSTALL_LIB)/libhakmem.so
	install -m 644 out/release/libhakmem.a $(INSTALL_LIB)/
	install -m 644 include/hakmem.h $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@VERSION@|$(VERSION)|g' \
		hakmem.pc.in > $(INSTALL_LIB)/pkgconfig/hakmem.pc
	for f in hakmem-config hakmem-config-version; do \
		sed -e 's|@VERSION@|$(VERSION)|g' -e 's|@SOMAJOR@|$(SOMAJOR)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
			-e 's|@UP@|$(CMAKE_UP)|g' cmake/$$f.cmake.in > $(INSTALL_LIB)/cmake/hakmem/$$f.cmake || exit 1; \
	done

# ---- Debian packages (debian/) ----------------------------------------------
# Built from a copy of the tracked files (dpkg-buildpackage cleans its tree:
# this one's out/ stays), into out/deb/: libhakmem0, libhakmem-dev, hakmem.
.PHONY: deb
deb:
	@rm -rf out/deb && mkdir -p out/deb/src
	git ls-files -z | tar --null -T - -cf - | tar -xf - -C out/deb/src
	cd out/deb/src && dpkg-buildpackage -b -us -uc
	@rm -rf out/deb/src

format:
	clang-format -i $(SRCS) $(HDRS) $(TEST_SRCS) $(BENCH_SRCS) tests/test_cxx.cc tests/real/*.cpp \
		tools/*.c tests/unwind/*.c

clean:
	rm -rf out
