/* An LD_PRELOAD library for bench/copies.sh: counts the bytes that pass
 * through memcpy and memmove in copies of 2 KiB or more, by call site
 * (the caller's return address), and writes one line per site to
 * $MEMCPY_COUNT_DIR/<pid> at exit: bytes, calls, object, symbol, offset.
 * Calls inside libc itself are not seen (they do not go through the PLT),
 * nor copies gcc inlines; OpenSSL's and meshrun's calls are. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SITES 64
#define MIN_LEN 2048

static struct {
	_Atomic(void *) ra;
	_Atomic unsigned long long bytes, calls;
} site[SITES];

static void *(*real_memcpy)(void *, const void *, size_t);
static void *(*real_memmove)(void *, const void *, size_t);

static void count(void *ra, size_t n)
{
	if (n < MIN_LEN)
		return;
	for (int i = 0; i < SITES; i++) {
		void *cur = atomic_load(&site[i].ra);
		if (!cur && atomic_compare_exchange_strong(&site[i].ra, &cur, ra))
			cur = ra;
		if (cur == ra) {
			atomic_fetch_add(&site[i].bytes, n);
			atomic_fetch_add(&site[i].calls, 1);
			return;
		}
	}
}

void *memcpy(void *d, const void *s, size_t n)
{
	if (!real_memcpy)
		real_memcpy = (void *(*)(void *, const void *, size_t))dlsym(RTLD_NEXT, "memcpy");
	count(__builtin_return_address(0), n);
	return real_memcpy(d, s, n);
}

void *memmove(void *d, const void *s, size_t n)
{
	if (!real_memmove)
		real_memmove = (void *(*)(void *, const void *, size_t))dlsym(RTLD_NEXT, "memmove");
	count(__builtin_return_address(0), n);
	return real_memmove(d, s, n);
}

__attribute__((destructor)) static void dump(void)
{
	const char *dir = getenv("MEMCPY_COUNT_DIR");
	char path[4096];
	if (!dir)
		return;
	snprintf(path, sizeof(path), "%s/%d", dir, (int)getpid());
	FILE *f = fopen(path, "w");
	if (!f)
		return;
	for (int i = 0; i < SITES && site[i].ra; i++) {
		Dl_info di;
		const char *obj = "?", *sym = "?";
		uintptr_t off = 0;
		if (dladdr(site[i].ra, &di)) {
			obj = strrchr(di.dli_fname, '/') ? strrchr(di.dli_fname, '/') + 1 : di.dli_fname;
			sym = di.dli_sname ? di.dli_sname : "?";
			off = (uintptr_t)site[i].ra - (uintptr_t)di.dli_fbase;
		}
		fprintf(f, "%llu %llu %s %s 0x%lx\n", (unsigned long long)site[i].bytes,
			(unsigned long long)site[i].calls, obj, sym, (unsigned long)off);
	}
	fclose(f);
}
