/* The synthetic source: every token a pure function of (seed, step, row),
 * nothing read from disk (docs/data.md#synthetic).
 *
 * Row hash: h(seed, s, r) = mix(mix(mix(seed) ^ s) ^ r) on uint64 (s and r
 * converted from signed), mix being SplitMix64's finaliser applied to
 * x + 0x9e3779b97f4a7c15 (host/util/mix.h). A fixed random successor
 * function succ(x) = mix(x ^ K) mod V (K a constant, so every seed speaks
 * the same "language"). With x_t = mix(h + t * 0x9e3779b97f4a7c15), the
 * t-th draw of the SplitMix64 stream seeded with h = h(seed, s, r): token
 * 0 is x_0 mod V; token t is x_t mod V (noise) when the top 4 bits of x_t
 * are zero (probability 1/16), else succ(token t-1). The best possible
 * loss is the entropy of that mixture, about 0.58 nats for V = 256, and a
 * bigram model reaches it. Evaluation row i is training row i of step -1,
 * a step no run trains. */
#include <errno.h>
#include <stdlib.h>

#include "host/data/source.h"
#include "host/util/mix.h"

/* the synthetic successor function's key: fixed, not seeded */
#define SUCC_KEY 0x6d65736872756e21ULL
/* a synthetic token is noise when the top 4 bits of its draw are 0 */
#define NOISE_SHIFT 60

static uint64_t row_hash(uint64_t seed, int64_t step, int64_t row)
{
	return mix64(mix64(mix64(seed) ^ (uint64_t)step) ^ (uint64_t)row);
}

/* Token t of a row: the t-th draw of the SplitMix64 stream seeded with
 * the row hash decides between succ(previous) and noise. */
static uint32_t synthetic_next(uint64_t h, int t, uint64_t prev, uint64_t V)
{
	uint64_t x = mix64(h + (uint64_t)t * MIX64_GOLDEN);
	if (t == 0 || (x >> NOISE_SHIFT) == 0)
		return (uint32_t)(x % V);
	return (uint32_t)(mix64(prev ^ SUCC_KEY) % V);
}

static int syn_open(struct data_source **out, const struct data_spec *sp, char *err, size_t errlen)
{
	(void)sp;
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : data_err(err, errlen, -ENOMEM, "out of memory");
}

static int64_t syn_rows(const struct data_source *d)
{
	(void)d;
	return -1;
}

static int syn_batch(struct data_source *d, const struct data_req *rq, int32_t *inputs,
		     int32_t *targets, char *err, size_t errlen)
{
	int T = d->T;
	(void)err;
	(void)errlen;
	for (int i = 0; i < rq->nrows; i++) {
		int64_t r = rq->row0 + i;
		uint64_t h = d->role == DATA_TRAIN ? row_hash(d->seed, rq->step, r)
			     : row_hash(d->seed, -1, rq->step * rq->global_rows + r);
		int32_t *in = inputs + (size_t)i * T, *tg = targets + (size_t)i * T;
		uint64_t tok = synthetic_next(h, 0, 0, (uint64_t)d->V);
		for (int t = 0; t < T; t++) {
			in[t] = (int32_t)tok;
			tok = synthetic_next(h, t + 1, tok, (uint64_t)d->V);
			tg[t] = (int32_t)tok;
		}
	}
	return 0;
}

static void syn_position(const struct data_source *d, struct data_pos *p, char *where,
			 size_t wherelen)
{
	(void)d;
	(void)p;
	if (wherelen)
		where[0] = '\0';
}

static void syn_close(struct data_source *d)
{
	free(d);
}

const struct data_type data_type_synthetic = {
	.name = "synthetic",
	.open = syn_open,
	.rows = syn_rows,
	.batch = syn_batch,
	.position = syn_position,
	.close = syn_close,
};
