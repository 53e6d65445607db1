/* The seeded mixer: SplitMix64's step, x + 0x9e3779b97f4a7c15 through its
 * finaliser. A pure function, so anything derived from it (data rows,
 * initial weights) depends only on its inputs, never on the mesh. */
#ifndef MESHRUN_MIX_H
#define MESHRUN_MIX_H

#include <stddef.h>
#include <stdint.h>

#define MIX64_GOLDEN 0x9e3779b97f4a7c15ull

static inline uint64_t mix64(uint64_t x)
{
	x += MIX64_GOLDEN;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* FNV-1a over n bytes: a name's or a result's fingerprint (not seeded,
 * not for tables an adversary fills). */
static inline uint64_t fnv1a(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ull;
	return h;
}

#endif
