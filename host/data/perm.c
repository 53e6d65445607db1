/* The epoch's row order (source.h, docs/data.md#shuffle): a bijection of
 * [0, n) computed one index at a time, so no list as long as the corpus
 * is ever made. A balanced Feistel network permutes [0, 2^k) for the
 * smallest even k >= 2 with 2^k >= n; an index it sends past n is sent
 * through again until it lands inside (cycle walking), which keeps it a
 * bijection of [0, n). 2^k < 4n, so a few rounds on average. */
#include "host/data/source.h"
#include "host/util/mix.h"

#define FEISTEL_ROUNDS 4

uint64_t data_perm(uint64_t seed, uint64_t n, uint64_t i)
{
	if (n <= 1)
		return 0;
	int k = 2;
	while (k < 64 && (1ULL << k) < n)
		k++;
	k += k & 1;
	int h = k / 2;
	uint64_t mask = (1ULL << h) - 1;
	uint64_t key = mix64(mix64(seed) ^ n);
	uint64_t x = i;
	do {
		uint64_t l = x >> h, r = x & mask;
		for (int j = 0; j < FEISTEL_ROUNDS; j++) {
			uint64_t f = mix64(key ^ ((uint64_t)j << 56) ^ r) & mask;
			uint64_t nl = r;
			r = l ^ f;
			l = nl;
		}
		x = (l << h) | r;
	} while (x >= n);
	return x;
}
