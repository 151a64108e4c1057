# hakmem build. `make` builds out/release; `make debug` builds out/debug with
# assertions; `make test` and `make bench` install what they need first.

CC      ?= cc
CXX     ?= g++
PREFIX  ?= /usr/local
VERSION := 0.1.0
SOMAJOR := 0

SRCS := $(wildcard core/*.c core/box/*.c core/front/*.c core/superslab/*.c)
HDRS := $(wildcard include/*.h core/*.h core/box/*.h core/front/*.h core/superslab/*.h)

# -fno-builtin: the compiler must not turn our own code into calls to malloc
# (e.g. malloc+memset -> calloc) that would recurse into hakmem.
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -fPIC -fvisibility=hidden \
	-ftls-model=initial-exec -fno-builtin -fno-semantic-interposition \
	-fno-plt -pthread -Wall -Wextra -Werror -Iinclude -Icore
RELEASE_CFLAGS := $(BASE_CFLAGS) -O2 -DNDEBUG -g
DEBUG_CFLAGS   := $(BASE_CFLAGS) -O1 -g -DHAK_DEBUG

.PHONY: all release debug tests test bench bench-bins bench-instr install clean format

all: release

# ---- library -----------------------------------------------------------------
define lib_rules
out/$(1)/obj/%.o: %.c $(HDRS) Makefile
	@mkdir -p $$(dir $$@)
	$$(CC) $$($(2)) -c $$< -o $$@

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
$(eval $(call lib_rules,release,RELEASE_CFLAGS))
$(eval $(call lib_rules,debug,DEBUG_CFLAGS))

release: out/release/libhakmem.so out/release/libhakmem.a
debug: out/debug/libhakmem.so out/debug/libhakmem.a

# ---- tests -------------------------------------------------------------------
# Each tests/test_*.c is a cmocka program linked statically against the debug
# library, so its malloc/free are hakmem's.
TEST_SRCS := $(wildcard tests/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=out/tests/%)
TEST_CFLAGS := -std=c11 -D_GNU_SOURCE -O1 -g -pthread -Wall -Wextra -Werror \
	-Wno-alloc-size-larger-than -fno-builtin -Iinclude -Icore -DHAK_DEBUG

out/tests/%: tests/%.c out/debug/libhakmem.a $(HDRS) $(wildcard tests/*.h)
	@mkdir -p out/tests
	$(CC) $(TEST_CFLAGS) $< -o $@ out/debug/libhakmem.a -lcmocka -pthread

out/tests/cxx_prog: tests/real/cxx_prog.cpp
	@mkdir -p out/tests
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror $< -o $@

out/tests/cxx_prog_linked: tests/real/cxx_prog.cpp out/release/libhakmem.so
	@mkdir -p out/tests
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror $< -o $@ \
		-Lout/release -Wl,--no-as-needed -lhakmem -Wl,--as-needed -Wl,-rpath,$(CURDIR)/out/release

tests: release debug $(TEST_BINS) out/tests/cxx_prog out/tests/cxx_prog_linked

test:
	@tests/deps.sh
	@$(MAKE) --no-print-directory tests
	@tests/run.sh

# ---- benchmarks --------------------------------------------------------------
BENCH_SRCS := $(wildcard bench/bench_*.c)
BENCH_BINS := $(BENCH_SRCS:bench/%.c=out/bench/%)

out/bench/%: bench/%.c
	@mkdir -p out/bench
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -g -pthread -Wall -Wextra -Werror $< -o $@ -pthread

bench-bins: release $(BENCH_BINS)

bench:
	@bench/deps.sh
	@$(MAKE) --no-print-directory bench-bins
	@bench/run.sh
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

# ---- install -----------------------------------------------------------------
install: release
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include \
		$(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 out/release/libhakmem.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libhakmem.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libhakmem.so.$(SOMAJOR)
	ln -sf libhakmem.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libhakmem.so
	install -m 644 out/release/libhakmem.a $(DESTDIR)$(PREFIX)/lib/
	install -m 644 include/hakmem.h $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' hakmem.pc.in \
		> $(DESTDIR)$(PREFIX)/lib/pkgconfig/hakmem.pc

format:
	clang-format -i $(SRCS) $(HDRS) $(TEST_SRCS) $(BENCH_SRCS)

clean:
	rm -rf out
