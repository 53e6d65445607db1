/* Data sources (host/data/): synthetic and text rows depend only on (seed,
 * step, row) however a batch is split; token shards written here by the
 * test's own code in every format (llmc uint16 and uint32, raw 2 and 4
 * bytes, megatron uint16 and int32) read back exactly; over 3 epochs of a
 * 3-shard corpus of uneven shards the rows each rank sees are those of a
 * reference order computed here from docs/data.md's definition, no row
 * twice in an epoch, the same rows per step however the batch is split;
 * resume continues with the next row; document boundaries mask the right
 * targets; evaluation reads the held-out rows in order; every bad input
 * is one line naming the file; `data pack` writes what the readers read.
 * Runs under ASan too (make test). */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/config/config.h"
#include "host/data/data.h"
#include "host/data/pack.h"

#define GPL3 "/usr/share/common-licenses/GPL-3"

/* For checks inside loops: free while they hold (every passing ck_assert
 * is reported to the parent process, one write each) */
#define EXPECT(cond, ...) do { if (!(cond)) ck_abort_msg(__VA_ARGS__); } while (0)

static char dir[64];
static char err[1024];

/* made and removed by the parent process, so a failing (forked) test
 * leaves nothing behind */
static void setup(void)
{
	strcpy(dir, "/tmp/check_data.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	err[0] = '\0';
}

static void teardown(void)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}

/* Empties dir: the tests of a TCase share it, one after another. */
static void fresh(void)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'/*", dir);
	ck_assert_int_eq(system(cmd), 0);
}

static const char *at(const char *name)
{
	static char p[8][256];
	static int k;
	k = (k + 1) % 8;
	snprintf(p[k], sizeof(p[k]), "%s/%s", dir, name);
	return p[k];
}

static void cfg_for(struct cfg *c, const char *type, const char *path, long long seed, long long V,
		    int T)
{
	cfg_defaults(c);
	snprintf(c->dataset_type, sizeof(c->dataset_type), "%s", type);
	ck_assert_uint_lt(strlen(path), sizeof(c->dataset_path));
	memcpy(c->dataset_path, path, strlen(path) + 1);
	c->data_shuffle_seed = seed;
	c->vocab_size = V;
	c->max_target_length = T;
}

static struct data_source *open_role(const struct cfg *c, enum data_role role, int B)
{
	struct data_source *d;
	int rc = data_open(&d, c, role, B, err, sizeof(err));
	ck_assert_msg(rc == 0, "%s", err);
	return d;
}

static struct data_source *open_ok(const struct cfg *c)
{
	return open_role(c, DATA_TRAIN, 1);
}

static void batch_ok(struct data_source *d, int64_t step, int B, int row0, int n, int32_t *in,
		     int32_t *tg)
{
	int rc = data_batch(d, step, B, row0, n, in, tg, err, sizeof(err));
	ck_assert_msg(rc == 0, "step %lld: %s", (long long)step, err);
}

static uint8_t *slurp(const char *p, long *len)
{
	FILE *f = fopen(p, "rb");
	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	*len = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *b = malloc((size_t)*len + 1);
	ck_assert_int_eq(fread(b, 1, (size_t)*len, f), (size_t)*len);
	fclose(f);
	return b;
}

static void spit(const char *p, const void *b, size_t len)
{
	FILE *f = fopen(p, "wb");
	ck_assert_ptr_nonnull(f);
	if (len)
		ck_assert_int_eq(fwrite(b, 1, len, f), len);
	ck_assert_int_eq(fclose(f), 0);
}

/* ---- the formats, written by hand (little-endian) ---- */

static void put_le(FILE *f, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		ck_assert_int_ne(fputc((int)(v >> (8 * i) & 0xff), f), EOF);
}

static void put_tokens(FILE *f, const uint32_t *tok, int64_t n, int width)
{
	for (int64_t i = 0; i < n; i++)
		put_le(f, tok[i], width);
}

/* llm.c: int32 header[256] = { magic, version, count }, then the tokens */
static void write_llmc_as(const char *path, const uint32_t *tok, int64_t n, int width,
			  int32_t magic, int32_t version, int64_t count)
{
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	put_le(f, (uint32_t)magic, 4);
	put_le(f, (uint32_t)version, 4);
	put_le(f, (uint32_t)count, 4);
	for (int i = 3; i < 256; i++)
		put_le(f, 0, 4);
	put_tokens(f, tok, n, width);
	ck_assert_int_eq(fclose(f), 0);
}

static void write_llmc(const char *path, const uint32_t *tok, int64_t n, int width)
{
	write_llmc_as(path, tok, n, width, width == 2 ? 20240520 : 20240801, width == 2 ? 1 : 7, n);
}

static void write_raw(const char *path, const uint32_t *tok, int64_t n, int width)
{
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	put_tokens(f, tok, n, width);
	ck_assert_int_eq(fclose(f), 0);
}

/* Megatron: PREFIX.bin holds the tokens, PREFIX.idx "MMIDIDX\0\0", u64
 * version 1, u8 dtype (8 uint16, 4 int32), u64 sequences, u64 document
 * index entries, int32 lengths, int64 byte offsets, int64 document index
 * (0, ends of documents); one sequence per document here. */
static void write_megatron(const char *prefix, const uint32_t *tok, const int64_t *doc_len,
			   int ndocs, int width)
{
	char p[300];
	int64_t n = 0;
	for (int i = 0; i < ndocs; i++)
		n += doc_len[i];
	snprintf(p, sizeof(p), "%s.bin", prefix);
	write_raw(p, tok, n, width);
	snprintf(p, sizeof(p), "%s.idx", prefix);
	FILE *f = fopen(p, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fwrite("MMIDIDX\0\0", 1, 9, f), 9);
	put_le(f, 1, 8);
	put_le(f, width == 2 ? 8 : 4, 1);
	put_le(f, (uint64_t)ndocs, 8);
	put_le(f, (uint64_t)ndocs + 1, 8);
	for (int i = 0; i < ndocs; i++)
		put_le(f, (uint64_t)doc_len[i], 4);
	for (int64_t i = 0, off = 0; i < ndocs; off += doc_len[i] * width, i++)
		put_le(f, (uint64_t)off, 8);
	for (int i = 0; i <= ndocs; i++)
		put_le(f, (uint64_t)i, 8);
	ck_assert_int_eq(fclose(f), 0);
}

/* ---- the reference order, from docs/data.md#shuffle ---- */

static uint64_t doc_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static uint64_t doc_hash(uint64_t seed, int64_t s, int64_t r)
{
	return doc_mix(doc_mix(doc_mix(seed) ^ (uint64_t)s) ^ (uint64_t)r);
}

/* "k bits, k the smallest even number >= 2 with 2^k >= n; halves of k/2
 * bits; key = mix(mix(seed) ^ n); four rounds (L, R) <- (R, L ^ (mix(key ^
 * j << 56 ^ R) & mask)), x = L << k/2 | R; again while x >= n." */
static uint64_t ref_perm(uint64_t seed, uint64_t n, uint64_t i)
{
	if (n < 2)
		return 0;
	int k = 2;
	while ((1ULL << k) < n)
		k++;
	if (k % 2)
		k++;
	uint64_t mask = (1ULL << (k / 2)) - 1, key = doc_mix(doc_mix(seed) ^ n), x = i;
	do {
		uint64_t L = x >> (k / 2), R = x & mask;
		for (uint64_t j = 0; j < 4; j++) {
			uint64_t f = doc_mix(key ^ (j << 56) ^ R) & mask, t = R;
			R = L ^ f;
			L = t;
		}
		x = L << (k / 2) | R;
	} while (x >= n);
	return x;
}

/* ---- synthetic and text ---- */

/* one global batch of B rows, fetched in chunks of `split` rows */
static void fetch(struct data_source *d, int64_t step, int B, int split, int32_t *in, int32_t *tg)
{
	int T = data_seq_len(d);
	for (int r0 = 0; r0 < B; r0 += split)
		batch_ok(d, step, B, r0, split, in + (size_t)r0 * T, tg + (size_t)r0 * T);
}

/* _i: 0 = synthetic, 1 = text */
START_TEST(test_split_invariance)
{
	struct cfg c;
	cfg_for(&c, _i ? "text" : "synthetic", GPL3, 1234, 256, 64);
	struct data_source *d = open_ok(&c), *d2 = open_ok(&c);
	enum { B = 8, T = 64 };
	static int32_t in1[B * T], tg1[B * T], in[B * T], tg[B * T];
	for (int64_t step = 0; step < 5; step++) {
		fetch(d, step, B, B, in1, tg1);
		const int splits[] = { 1, 2, 4 };
		for (int k = 0; k < 3; k++) {
			memset(in, 0xff, sizeof(in));
			memset(tg, 0xff, sizeof(tg));
			fetch(k == 2 ? d2 : d, step, B, splits[k], in, tg);
			ck_assert_msg(!memcmp(in, in1, sizeof(in)) && !memcmp(tg, tg1, sizeof(tg)),
				      "step %lld split %d differs", (long long)step, splits[k]);
		}
		/* a device holding rows 5..7 only */
		batch_ok(d, step, B, 5, 3, in, tg);
		ck_assert(!memcmp(in, in1 + 5 * T, sizeof(int32_t) * 3 * T));
		ck_assert(!memcmp(tg, tg1 + 5 * T, sizeof(int32_t) * 3 * T));
		for (int r = 1; r < B; r++)
			ck_assert_msg(memcmp(in1, in1 + r * T, sizeof(int32_t) * T), "rows 0 and %d equal",
				      r);
	}
	fetch(d, 0, B, B, in1, tg1);
	fetch(d, 1, B, B, in, tg);
	ck_assert(memcmp(in, in1, sizeof(in)));
	data_close(d2);
	cfg_for(&c, _i ? "text" : "synthetic", GPL3, 1235, 256, 64);
	d2 = open_ok(&c);
	fetch(d2, 0, B, B, in, tg);
	ck_assert(memcmp(in, in1, sizeof(in)));
	ck_assert(!data_masks(d2));
	ck_assert_int_eq(data_rows(d2), -1);
	data_close(d2);
	data_close(d);
}
END_TEST

/* _i indexes vocab sizes */
START_TEST(test_shift_and_range)
{
	const int vocabs[] = { 1, 2, 7, 256, 1000, 50257 };
	int V = vocabs[_i];
	enum { B = 16, T = 33 };
	struct cfg c;
	cfg_for(&c, "synthetic", "", 7, V, T);
	struct data_source *d = open_ok(&c);
	ck_assert_int_eq(data_seq_len(d), T);
	ck_assert_str_eq(data_type_name(d), "synthetic");
	int32_t in[B * T], tg[B * T];
	int seen_max = 0;
	for (int64_t step = -2; step < 40; step++) {
		batch_ok(d, step, B, 0, B, in, tg);
		for (int r = 0; r < B; r++)
			for (int t = 0; t < T; t++) {
				int32_t x = in[r * T + t], y = tg[r * T + t];
				EXPECT(x >= 0 && x < V && y >= 0 && y < V, "token %d/%d, vocab %d", x, y, V);
				EXPECT(t + 1 == T || in[r * T + t + 1] == y, "step %lld row %d t %d: not shifted",
				       (long long)step, r, t);
				seen_max = x > seen_max ? x : seen_max;
			}
	}
	ck_assert_int_ge(seen_max, V > 200 ? V / 2 : V - 1);
	data_close(d);
}
END_TEST

START_TEST(test_synthetic_learnable)
{
	/* plug-in conditional entropy H(target | input) over many rows: the
	 * bigram structure keeps it far below ln V, the noise above 0 */
	enum { V = 256, T = 128, B = 64, STEPS = 40 };
	struct cfg c;
	cfg_for(&c, "synthetic", "", 3, V, T);
	struct data_source *d = open_ok(&c);
	static uint32_t counts[V][V];
	static int32_t in[B * T], tg[B * T];
	memset(counts, 0, sizeof(counts));
	for (int s = 0; s < STEPS; s++) {
		batch_ok(d, s, B, 0, B, in, tg);
		for (int i = 0; i < B * T; i++)
			counts[in[i]][tg[i]]++;
	}
	double H = 0, total = (double)B * T * STEPS, top = 0;
	for (int x = 0; x < V; x++) {
		double row = 0, best = 0;
		for (int y = 0; y < V; y++) {
			row += counts[x][y];
			best = counts[x][y] > best ? counts[x][y] : best;
		}
		for (int y = 0; y < V; y++)
			if (counts[x][y])
				H -= counts[x][y] / total * log(counts[x][y] / row);
		top += best;
	}
	ck_assert_msg(H > 0.3 && H < 0.8, "conditional entropy %g nats (ln V = %g)", H, log(V));
	ck_assert_msg(top / total > 0.9 && top / total < 0.97, "most likely successor %g", top / total);

	/* evaluation rows are not training rows, and need eval_steps */
	struct data_source *e = open_role(&c, DATA_EVAL, B);
	int32_t ein[T], etg[T];
	batch_ok(e, 0, B, 0, 1, ein, etg);
	ck_assert(memcmp(ein, in, sizeof(ein)));
	ck_assert_int_eq(data_eval_batches(e, B, 3, err, sizeof(err)), 3);
	ck_assert_int_eq(data_eval_batches(e, B, -1, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "'eval_steps' must be > 0"), "%s", err);
	data_close(e);
	data_close(d);
}
END_TEST

START_TEST(test_text_windows_follow_hash)
{
	long len;
	uint8_t *file = slurp(GPL3, &len);
	ck_assert_int_gt(len, 30000);
	enum { B = 6, T = 100 };
	struct cfg c;
	cfg_for(&c, "text", GPL3, 99, 256, T);
	struct data_source *d = open_ok(&c);
	int32_t in[B * T], tg[B * T];
	for (int64_t step = 0; step < 20; step++) {
		batch_ok(d, step, B, 0, B, in, tg);
		for (int r = 0; r < B; r++) {
			uint64_t start = doc_hash(99, step, r) % (uint64_t)(len - T);
			for (int t = 0; t < T; t++)
				EXPECT(in[r * T + t] == file[start + t] && tg[r * T + t] == file[start + t + 1],
				       "step %lld row %d t %d", (long long)step, r, t);
		}
	}
	/* a held-out tail: training windows stay out of it */
	c.eval_split_fraction = 0.25;
	data_close(d);
	d = open_ok(&c);
	int64_t train = len - (int64_t)ceil(0.25 * (double)len);
	for (int64_t step = 0; step < 20; step++) {
		batch_ok(d, step, B, 0, B, in, tg);
		for (int r = 0; r < B; r++) {
			uint64_t start = doc_hash(99, step, r) % (uint64_t)(train - T);
			ck_assert_int_eq(in[r * T], file[start]);
			ck_assert_int_eq(tg[r * T + T - 1], file[start + T]);
		}
	}
	free(file);
	data_close(d);
}
END_TEST

START_TEST(test_eval_windows)
{
	long len;
	uint8_t *file = slurp(GPL3, &len);
	const int Ls[] = { 1, 64, 128, 1000 };
	for (int k = 0; k < 4; k++) {
		int L = Ls[k];
		struct cfg c;
		cfg_for(&c, "text", GPL3, 0, 256, L);
		struct data_source *d = open_role(&c, DATA_EVAL, 3);
		int64_t n = data_rows(d);
		ck_assert_int_eq(n, len / (L + 1));
		ck_assert(data_masks(d));
		ck_assert_int_eq(data_eval_batches(d, 3, -1, err, sizeof(err)), (n + 2) / 3);
		ck_assert_int_eq(data_eval_batches(d, 3, 2, err, sizeof(err)), 2);
		int32_t *in = malloc(sizeof(int32_t) * 3 * L), *tg = malloc(sizeof(int32_t) * 3 * L);
		for (int64_t b = 0; b * 3 < n; b++) {
			batch_ok(d, b, 3, 0, 3, in, tg);
			for (int r = 0; r < 3; r++) {
				int64_t w = b * 3 + r;
				/* non-overlapping windows of L+1 bytes, padding past the end */
				for (int t = 0; t < L; t++)
					EXPECT(in[r * L + t] == (w < n ? file[w * (L + 1) + t] : 0) &&
					       tg[r * L + t] == (w < n ? file[w * (L + 1) + t + 1] : -1),
					       "L %d window %lld t %d", L, (long long)w, t);
			}
		}
		free(in);
		free(tg);
		data_close(d);
	}
	free(file);
}
END_TEST

START_TEST(test_tiny_text)
{
	fresh();
	/* exactly T+1 bytes: one possible window, every row is the file */
	const char *text = "abcdefghi";
	spit(at("t"), text, 9);
	struct cfg c;
	cfg_for(&c, "text", at("t"), 5, 256, 8);
	struct data_source *d = open_ok(&c);
	int32_t in[3 * 8], tg[3 * 8];
	batch_ok(d, 17, 3, 0, 3, in, tg);
	for (int r = 0; r < 3; r++)
		for (int t = 0; t < 8; t++) {
			ck_assert_int_eq(in[r * 8 + t], text[t]);
			ck_assert_int_eq(tg[r * 8 + t], text[t + 1]);
		}
	data_close(d);

	/* bytes >= 128 are tokens 128..255, not negative */
	uint8_t hi[3] = { 0xff, 0x80, 0x00 };
	spit(at("hi"), hi, 3);
	cfg_for(&c, "text", at("hi"), 0, 256, 2);
	d = open_ok(&c);
	batch_ok(d, 0, 1, 0, 1, in, tg);
	ck_assert_int_eq(in[0], 255);
	ck_assert_int_eq(in[1], 128);
	ck_assert_int_eq(tg[1], 0);
	data_close(d);
}
END_TEST

/* ---- token shards ---- */

/* A corpus in memory: shard s holds n[s] tokens. */
struct corpus {
	int nshards;
	int64_t n[4];
	uint32_t *tok[4];
};

static void corpus_free(struct corpus *k)
{
	for (int s = 0; s < k->nshards; s++)
		free(k->tok[s]);
}

/* Tokens that say where they are: shard s, position i. With width 2 the
 * corpus must stay below 65536 tokens to keep them unique. */
static void corpus_make(struct corpus *k, int nshards, const int64_t *n, int width)
{
	int64_t base = 0;
	k->nshards = nshards;
	for (int s = 0; s < nshards; s++) {
		k->n[s] = n[s];
		k->tok[s] = malloc(sizeof(uint32_t) * (size_t)n[s]);
		for (int64_t i = 0; i < n[s]; i++)
			k->tok[s][i] = width == 2 ? (uint32_t)(base + i) : (uint32_t)(s * 1000000 + i + 70000);
		base += n[s];
	}
}

/* Writes k in format fmt ("llmc", "raw", "megatron") as dir/k<s>.bin
 * (megatron: dir/k<s>.bin + .idx, documents of 50 tokens and the rest). */
static void corpus_write(const struct corpus *k, const char *fmt, int width)
{
	for (int s = 0; s < k->nshards; s++) {
		char name[16];
		snprintf(name, sizeof(name), "k%d", s);
		if (!strcmp(fmt, "megatron")) {
			int64_t docs[64];
			int nd = 0;
			for (int64_t left = k->n[s]; left > 0; left -= docs[nd++])
				docs[nd] = left < 50 ? left : 50;
			write_megatron(at(name), k->tok[s], docs, nd, width);
			continue;
		}
		strcat(name, ".bin");
		if (!strcmp(fmt, "llmc"))
			write_llmc(at(name), k->tok[s], k->n[s], width);
		else
			write_raw(at(name), k->tok[s], k->n[s], width);
	}
}

/* Global row r of k with rows of T+1 tokens: shard and first token. */
static void corpus_row(const struct corpus *k, int T, int64_t r, int *shard, int64_t *first)
{
	for (int s = 0; s < k->nshards; s++) {
		int64_t rows = k->n[s] > T ? (k->n[s] - 1) / T : 0;
		if (r < rows) {
			*shard = s;
			*first = r * T;
			return;
		}
		r -= rows;
	}
	ck_abort_msg("row past the corpus");
}

static int64_t corpus_rows(const struct corpus *k, int T)
{
	int64_t rows = 0;
	for (int s = 0; s < k->nshards; s++)
		rows += k->n[s] > T ? (k->n[s] - 1) / T : 0;
	return rows;
}

/* The global row whose tokens in/tg hold (checked token by token). */
static int64_t which_row(const struct corpus *k, int T, const int32_t *in, const int32_t *tg)
{
	int64_t r0 = 0;
	for (int s = 0; s < k->nshards; s++) {
		int64_t rows = k->n[s] > T ? (k->n[s] - 1) / T : 0;
		for (int64_t j = 0; j < rows; j++)
			if ((uint32_t)in[0] == k->tok[s][j * T]) {
				for (int t = 0; t < T; t++)
					EXPECT((uint32_t)in[t] == k->tok[s][j * T + t] &&
					       (uint32_t)tg[t] == k->tok[s][j * T + t + 1],
					       "shard %d row %lld t %d: other tokens", s, (long long)j, t);
				return r0 + j;
			}
		r0 += rows;
	}
	ck_abort_msg("a row that is no row of the corpus (first token %d)", in[0]);
	return -1;
}

/* _i: llmc 2, llmc 4, raw 2, raw 4, megatron 2, megatron 4 */
START_TEST(test_formats_read_back)
{
	fresh();
	static const char *const fmts[] = { "llmc", "raw", "megatron" };
	const char *fmt = fmts[_i / 2];
	int width = _i % 2 ? 4 : 2;
	const int64_t n[3] = { 1000, 333, 2501 };
	enum { T = 16 };
	struct corpus k;
	corpus_make(&k, 3, n, width);
	corpus_write(&k, fmt, width);
	struct cfg c;
	cfg_for(&c, fmt, at("k*"), 0, width == 2 ? 65536 : 3200000, T);
	c.dataset_token_bytes = width;
	/* evaluation over all of it reads the rows in order */
	struct data_source *d = open_role(&c, DATA_EVAL, 1);
	ck_assert_str_eq(data_type_name(d), fmt);
	int64_t rows = data_rows(d);
	ck_assert_int_eq(rows, (1000 - 1) / T + (333 - 1) / T + (2501 - 1) / T);
	int32_t in[T], tg[T];
	for (int64_t r = 0; r < rows; r++) {
		int s;
		int64_t first;
		batch_ok(d, r, 1, 0, 1, in, tg);
		corpus_row(&k, T, r, &s, &first);
		for (int t = 0; t < T; t++)
			EXPECT((uint32_t)in[t] == k.tok[s][first + t] &&
			       (uint32_t)tg[t] == k.tok[s][first + t + 1], "row %lld t %d", (long long)r, t);
	}
	batch_ok(d, rows, 1, 0, 1, in, tg);  /* padding */
	ck_assert_int_eq(tg[0], -1);
	data_close(d);
	/* a directory means its *.bin (megatron: *.idx) */
	snprintf(c.dataset_path, sizeof(c.dataset_path), "%s", dir);
	d = open_role(&c, DATA_EVAL, 1);
	ck_assert_int_eq(data_rows(d), rows);
	data_close(d);
	corpus_free(&k);
}
END_TEST

/* _i: 0 llmc uint16, 1 megatron int32 */
START_TEST(test_epochs_follow_reference)
{
	fresh();
	const int64_t n[3] = { 1000, 333, 2501 };
	enum { T = 16, B = 8, EPOCHS = 3 };
	int width = _i ? 4 : 2;
	const char *fmt = _i ? "megatron" : "llmc";
	struct corpus k;
	corpus_make(&k, 3, n, width);
	corpus_write(&k, fmt, width);
	struct cfg c;
	cfg_for(&c, fmt, at("k*"), 42, width == 2 ? 65536 : 3200000, T);
	struct data_source *d = open_role(&c, DATA_TRAIN, B), *d2 = open_role(&c, DATA_TRAIN, B);
	int64_t N = corpus_rows(&k, T);
	ck_assert_int_eq(data_rows(d), N);
	int64_t steps = (EPOCHS * N + B - 1) / B;
	int *seen = calloc((size_t)N * (EPOCHS + 1), sizeof(int));
	static int32_t in[B * T], tg[B * T], in2[B * T], tg2[B * T];
	for (int64_t s = 0; s < steps; s++) {
		/* two ranks of 4 rows (2 hosts x 1 device)... */
		for (int rank = 0; rank < 2; rank++)
			batch_ok(d, s, B, rank * 4, 4, in + rank * 4 * T, tg + rank * 4 * T);
		/* ... and four of 2 (1 host x 4 devices), in another source */
		for (int rank = 0; rank < 4; rank++)
			batch_ok(d2, s, B, rank * 2, 2, in2 + rank * 2 * T, tg2 + rank * 2 * T);
		ck_assert(!memcmp(in, in2, sizeof(in)) && !memcmp(tg, tg2, sizeof(tg)));
		for (int i = 0; i < B; i++) {
			int64_t g = s * B + i, e = g / N;
			int64_t want = (int64_t)ref_perm(42 + (uint64_t)e, (uint64_t)N, (uint64_t)(g % N));
			int64_t got = which_row(&k, T, in + i * T, tg + i * T);
			EXPECT(got == want, "step %lld row %d: row %lld, reference %lld", (long long)s, i,
			       (long long)got, (long long)want);
			EXPECT(seen[e * N + got]++ == 0, "row %lld twice in epoch %lld", (long long)got,
			       (long long)e);
		}
		struct data_pos p;
		data_position(d, s, B, &p);
		ck_assert_int_eq(p.sample, s * B);
		ck_assert_int_eq(p.epoch, s * B / N);
		ck_assert_int_eq(p.epoch_rows, N);
		ck_assert_int_eq(p.seed, 42 + (uint64_t)(s * B / N));
		ck_assert_int_eq(p.row, (int64_t)ref_perm(p.seed, (uint64_t)N, (uint64_t)(s * B % N)));
		char note[256];
		bool begins = (s * B + B - 1) / N != (s * B - 1) / N && s > 0;
		ck_assert_int_eq(data_epoch_note(d, s, B, note, sizeof(note)), begins);
	}
	/* every row once in every whole epoch; the order differs by epoch */
	for (int e = 0; e < EPOCHS; e++)
		for (int64_t r = 0; r < N; r++)
			EXPECT(seen[e * N + r] == 1, "epoch %d: row %lld seen %d times", e, (long long)r,
			       seen[e * N + r]);
	ck_assert(ref_perm(42, (uint64_t)N, 0) != ref_perm(43, (uint64_t)N, 0) ||
		  ref_perm(42, (uint64_t)N, 1) != ref_perm(43, (uint64_t)N, 1));
	free(seen);
	data_close(d);
	data_close(d2);
	corpus_free(&k);
}
END_TEST

START_TEST(test_perm_is_bijection)
{
	const uint64_t ns[] = { 1, 2, 3, 4, 5, 16, 17, 255, 1000, 4097, 65536 };
	for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++)
		for (uint64_t seed = 0; seed < (ns[k] > 5000 ? 1 : 3); seed++) {
			uint64_t n = ns[k];
			uint8_t *hit = calloc(n, 1);
			int fixed = 0;
			for (uint64_t i = 0; i < n; i++) {
				uint64_t p = data_perm(seed, n, i);
				EXPECT(p < n && p == ref_perm(seed, n, i), "n %llu seed %llu i %llu: %llu",
				       (unsigned long long)n, (unsigned long long)seed, (unsigned long long)i,
				       (unsigned long long)p);
				EXPECT(!hit[p]++, "n %llu seed %llu: %llu twice", (unsigned long long)n,
				       (unsigned long long)seed, (unsigned long long)p);
				fixed += p == i;
			}
			/* a shuffle, not the identity (tiny n may be it by chance:
			 * n = 5, seed 1 is) */
			ck_assert_msg(n < 16 || fixed < (int)n / 4, "n %llu: %d fixed points",
				      (unsigned long long)n, fixed);
			free(hit);
		}
	/* far past memory: still in range, still a function */
	uint64_t big = 1ULL << 40;
	ck_assert_uint_lt(data_perm(7, big, big - 1), big);
	ck_assert_uint_eq(data_perm(7, big, 12345), ref_perm(7, big, 12345));
}
END_TEST

START_TEST(test_seek_continues)
{
	fresh();
	const int64_t n[1] = { 3000 };
	enum { T = 16, B = 6 };
	struct corpus k;
	corpus_make(&k, 1, n, 2);
	corpus_write(&k, "raw", 2);
	struct cfg c;
	cfg_for(&c, "raw", at("k0.bin"), 9, 65536, T);
	struct data_source *d = open_role(&c, DATA_TRAIN, B), *r = open_role(&c, DATA_TRAIN, B);
	static int32_t in[B * T], tg[B * T], in2[B * T], tg2[B * T];
	int64_t N = data_rows(d);
	/* resumed at step 40 from a checkpoint's position: the same rows */
	struct data_pos p;
	data_position(d, 40, B, &p);
	ck_assert_int_eq(data_seek(r, 40, &p, err, sizeof(err)), 0);
	for (int64_t s = 40; s < 40 + 2 * N / B; s++) {
		batch_ok(d, s, B, 0, B, in, tg);
		batch_ok(r, s, B, 0, B, in2, tg2);
		ck_assert(!memcmp(in, in2, sizeof(in)));
	}
	/* a checkpoint of a run with another global batch: the next row */
	p.sample = 123;
	ck_assert_int_eq(data_seek(r, 7, &p, err, sizeof(err)), 0);
	batch_ok(r, 7, B, 0, B, in2, tg2);
	batch_ok(r, 8, B, 0, B, in2 + 0, tg2);
	for (int i = 0; i < B; i++) {
		int64_t g = 123 + B + i;
		ck_assert_int_eq(which_row(&k, T, in2 + i * T, tg2 + i * T),
				 (int64_t)ref_perm(9 + (uint64_t)(g / N), (uint64_t)N, (uint64_t)(g % N)));
	}
	/* another corpus */
	p.epoch_rows = N + 1;
	ck_assert_int_eq(data_seek(r, 7, &p, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "data position counts"), "%s", err);
	data_close(d);
	data_close(r);
	corpus_free(&k);
}
END_TEST

/* ---- documents ---- */

START_TEST(test_documents_llmc_eot)
{
	fresh();
	enum { T = 16, N = 400, EOT = 9 };
	uint32_t tok[N];
	for (int i = 0; i < N; i++)
		tok[i] = (uint32_t)(10 + i % 50);
	const int eots[] = { 0, 15, 16, 17, 100, 101, 255, 399 };
	for (size_t i = 0; i < sizeof(eots) / sizeof(eots[0]); i++)
		tok[eots[i]] = EOT;
	write_llmc(at("d.bin"), tok, N, 2);
	struct cfg c;
	cfg_for(&c, "llmc", at("d.bin"), 0, 100, T);
	c.dataset_respect_documents = true;
	struct data_source *d;
	ck_assert_int_eq(data_open(&d, &c, DATA_EVAL, 1, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "needs key 'eot_token'"), "%s", err);
	c.eot_token = EOT;
	d = open_role(&c, DATA_EVAL, 1);
	int32_t in[T], tg[T];
	int masked = 0;
	for (int64_t r = 0; r < data_rows(d); r++) {
		batch_ok(d, r, 1, 0, 1, in, tg);
		for (int t = 0; t < T; t++) {
			uint32_t want = tok[r * T + t + 1];
			/* the token after an EOT starts a document: no loss */
			bool after_eot = tok[r * T + t] == EOT;
			ck_assert_int_eq(tg[t], (after_eot ? -1 : (int32_t)want));
			masked += after_eot;
		}
	}
	/* each EOT but the last token's is some row's input once */
	ck_assert_int_eq(masked, 7);
	data_close(d);
}
END_TEST

START_TEST(test_documents_megatron)
{
	fresh();
	enum { T = 16 };
	const int64_t docs[] = { 5, 40, 3, 1, 17, 60, 16, 32, 9 };
	int nd = sizeof(docs) / sizeof(docs[0]);
	int64_t n = 0, starts[16];
	for (int i = 0; i < nd; i++)
		starts[i] = n, n += docs[i];
	uint32_t *tok = malloc(sizeof(uint32_t) * (size_t)n);
	for (int64_t i = 0; i < n; i++)
		tok[i] = (uint32_t)(i % 97);
	write_megatron(at("m"), tok, docs, nd, 2);
	struct cfg c;
	cfg_for(&c, "megatron", at("m"), 0, 100, T);
	c.dataset_respect_documents = true;
	struct data_source *d = open_role(&c, DATA_EVAL, 1);
	int32_t in[T], tg[T];
	int masked = 0;
	for (int64_t r = 0; r < data_rows(d); r++) {
		batch_ok(d, r, 1, 0, 1, in, tg);
		for (int t = 0; t < T; t++) {
			int64_t pos = r * T + t + 1;  /* the target's token */
			bool start = false;
			for (int i = 1; i < nd; i++)
				start |= starts[i] == pos;
			ck_assert_msg(tg[t] == (start ? -1 : (int32_t)tok[pos]), "row %lld t %d: %d",
				      (long long)r, t, tg[t]);
			masked += start;
		}
	}
	ck_assert_int_ge(masked, 6);
	data_close(d);
	/* without respect_documents nothing is masked */
	c.dataset_respect_documents = false;
	d = open_role(&c, DATA_TRAIN, 1);
	ck_assert(!data_masks(d));
	data_close(d);
	free(tok);
}
END_TEST

/* ---- held-out rows ---- */

START_TEST(test_eval_split)
{
	fresh();
	const int64_t n[2] = { 800, 900 };
	enum { T = 16, B = 4 };
	struct corpus k;
	corpus_make(&k, 2, n, 2);
	corpus_write(&k, "llmc", 2);
	struct cfg c;
	cfg_for(&c, "llmc", at("k*.bin"), 3, 65536, T);
	c.eval_split_fraction = 0.1;
	int64_t N = corpus_rows(&k, T), held = (int64_t)ceil(0.1 * (double)N);
	struct data_source *t = open_role(&c, DATA_TRAIN, B), *e = open_role(&c, DATA_EVAL, B);
	ck_assert_int_eq(data_rows(t), N - held);
	ck_assert_int_eq(data_rows(e), held);
	static int32_t in[B * T], tg[B * T];
	/* training never reads a held-out row */
	for (int64_t s = 0; s < 2 * N / B; s++) {
		batch_ok(t, s, B, 0, B, in, tg);
		for (int i = 0; i < B; i++)
			EXPECT(which_row(&k, T, in + i * T, tg + i * T) < N - held, "step %lld row %d held out",
			       (long long)s, i);
	}
	/* evaluation reads the last rows in order */
	for (int64_t b = 0; b < data_eval_batches(e, B, -1, err, sizeof(err)); b++) {
		batch_ok(e, b, B, 0, B, in, tg);
		for (int i = 0; i < B && b * B + i < held; i++)
			ck_assert_int_eq(which_row(&k, T, in + i * T, tg + i * T), N - held + b * B + i);
	}
	data_close(t);
	data_close(e);
	/* eval_dataset_path: a file of its own, in its own format */
	write_raw(at("ev.tok"), k.tok[1], 200, 4);
	snprintf(c.eval_dataset_path, sizeof(c.eval_dataset_path), "%s", at("ev.tok"));
	snprintf(c.eval_dataset_type, sizeof(c.eval_dataset_type), "raw");
	c.dataset_token_bytes = 4;
	e = open_role(&c, DATA_EVAL, B);
	ck_assert_int_eq(data_rows(e), (200 - 1) / T);
	batch_ok(e, 1, B, 0, 1, in, tg);
	ck_assert_int_eq((uint32_t)in[0], k.tok[1][B * T]);
	data_close(e);
	corpus_free(&k);
}
END_TEST

/* ---- 32-bit tokens ---- */

START_TEST(test_vocab_above_65536)
{
	fresh();
	enum { T = 8, N = 100 };
	uint32_t tok[N];
	for (int i = 0; i < N; i++)
		tok[i] = 129279 - (uint32_t)i * 997 % 129280;
	write_llmc(at("w.bin"), tok, N, 4);
	struct cfg c;
	cfg_for(&c, "llmc", at("w.bin"), 0, 129280, T);
	struct data_source *d = open_role(&c, DATA_EVAL, 1);
	int32_t in[T], tg[T];
	for (int64_t r = 0; r < data_rows(d); r++) {
		batch_ok(d, r, 1, 0, 1, in, tg);
		for (int t = 0; t < T; t++)
			ck_assert_int_eq(in[t], (int32_t)tok[r * T + t]);
	}
	data_close(d);
	/* uint16 shards cannot hold such a vocabulary */
	write_llmc(at("n.bin"), tok, N, 2);
	cfg_for(&c, "llmc", at("n.bin"), 0, 129280, T);
	ck_assert_int_eq(data_open(&d, &c, DATA_TRAIN, 1, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "holds uint16 tokens, too narrow for vocab_size 129280") &&
		      strstr(err, at("n.bin")), "%s", err);
}
END_TEST

/* ---- bad inputs: one line naming the file ---- */

static void expect_error(const struct cfg *c, int B, int want_rc, const char *want)
{
	struct data_source *d = NULL;
	err[0] = '\0';
	int rc = data_open(&d, c, DATA_TRAIN, B, err, sizeof(err));
	ck_assert_msg(rc == want_rc, "rc %d (want %d), '%s', want '%s'", rc, want_rc, err, want);
	ck_assert_ptr_null(d);
	ck_assert_msg(strstr(err, want), "got '%s', want '%s'", err, want);
	ck_assert_msg(!strncmp(err, "data: ", 6) && !strchr(err, '\n'), "%s", err);
}

START_TEST(test_errors_text)
{
	fresh();
	struct cfg c;
	char want[512];

	snprintf(want, sizeof(want), "data: unable to open '%s': No such file or directory", at("none"));
	cfg_for(&c, "text", at("none"), 0, 256, 16);
	expect_error(&c, 1, -EBADMSG, want);

	spit(at("empty"), "", 0);
	snprintf(want, sizeof(want), "data: '%s' is empty", at("empty"));
	cfg_for(&c, "text", at("empty"), 0, 256, 16);
	expect_error(&c, 1, -EBADMSG, want);

	spit(at("short"), "0123456789abcdef", 16);
	snprintf(want, sizeof(want), "data: '%s' has 16 bytes, fewer than max_target_length + 1 = 17",
		 at("short"));
	cfg_for(&c, "text", at("short"), 0, 256, 16);
	expect_error(&c, 1, -EBADMSG, want);

	snprintf(want, sizeof(want), "data: '%s' is not a regular file", dir);
	cfg_for(&c, "text", dir, 0, 256, 16);
	expect_error(&c, 1, -EBADMSG, want);

	cfg_for(&c, "text", "", 0, 256, 16);
	expect_error(&c, 1, -EINVAL, "dataset_type 'text' needs key 'dataset_path'");
	cfg_for(&c, "text", GPL3, 0, 100, 16);
	expect_error(&c, 1, -EINVAL, "key 'vocab_size' >= 256, got 100");
	cfg_for(&c, "tokens", GPL3, 0, 256, 16);
	expect_error(&c, 1, -EINVAL, "data: key 'dataset_type' has unknown value 'tokens'");
	cfg_for(&c, "synthetic", "", 0, 256, 0);
	expect_error(&c, 1, -EINVAL, "key 'max_target_length' must be in");
	cfg_for(&c, "synthetic", "", 0, 0, 16);
	expect_error(&c, 1, -EINVAL, "key 'vocab_size' must be in");
	cfg_for(&c, "text", GPL3, 0, 256, 16);
	c.dataset_respect_documents = true;
	expect_error(&c, 1, -EINVAL, "'dataset_respect_documents' needs token shards");
	cfg_for(&c, "synthetic", "", 0, 256, 16);
	c.eval_split_fraction = 1;
	expect_error(&c, 1, -EINVAL, "key 'eval_split_fraction' must be in [0, 1)");
}
END_TEST

START_TEST(test_errors_llmc_raw)
{
	fresh();
	uint32_t tok[300];
	struct cfg c;
	char want[512];
	for (int i = 0; i < 300; i++)
		tok[i] = (uint32_t)(i % 250);

	write_llmc_as(at("magic.bin"), tok, 300, 2, 20240521, 1, 300);
	snprintf(want, sizeof(want), "'%s': bad magic 20240521", at("magic.bin"));
	cfg_for(&c, "llmc", at("magic.bin"), 0, 256, 16);
	expect_error(&c, 1, -EBADMSG, want);

	write_llmc_as(at("ver.bin"), tok, 300, 4, 20240801, 1, 300);
	snprintf(want, sizeof(want), "'%s': llm.c magic 20240801 needs version 7, the header says 1",
		 at("ver.bin"));
	cfg_for(&c, "llmc", at("ver.bin"), 0, 256, 16);
	expect_error(&c, 1, -EBADMSG, want);

	write_llmc_as(at("size.bin"), tok, 300, 2, 20240520, 1, 301);
	snprintf(want, sizeof(want), "'%s' has 1624 bytes, but its header says 301 uint16 tokens",
		 at("size.bin"));
	cfg_for(&c, "llmc", at("size.bin"), 0, 256, 16);
	expect_error(&c, 1, -EBADMSG, want);

	spit(at("tiny.bin"), tok, 100);
	snprintf(want, sizeof(want), "'%s' has 100 bytes, shorter than llm.c's 1024-byte header",
		 at("tiny.bin"));
	cfg_for(&c, "llmc", at("tiny.bin"), 0, 256, 16);
	expect_error(&c, 1, -EBADMSG, want);

	snprintf(want, sizeof(want), "'%s/nothing*.bin' matches no file", dir);
	cfg_for(&c, "llmc", want + 1, 0, 256, 16);
	*strrchr(c.dataset_path, '\'') = '\0';
	expect_error(&c, 1, -EBADMSG, want);

	/* 300 tokens: 18 rows of 17 */
	write_llmc(at("few.bin"), tok, 300, 2);
	snprintf(want, sizeof(want), "'%s' gives 18 rows of 17 tokens for training, fewer than one "
		 "global batch of 19", at("few.bin"));
	cfg_for(&c, "llmc", at("few.bin"), 0, 256, 16);
	expect_error(&c, 19, -EBADMSG, want);

	write_raw(at("odd.tok"), tok, 300, 2);
	FILE *f = fopen(at("odd.tok"), "ab");
	fputc(1, f);
	fclose(f);
	snprintf(want, sizeof(want), "'%s' has 601 bytes, not a whole number of 2-byte tokens",
		 at("odd.tok"));
	cfg_for(&c, "raw", at("odd.tok"), 0, 256, 16);
	expect_error(&c, 1, -EBADMSG, want);
	c.dataset_token_bytes = 3;
	expect_error(&c, 1, -EINVAL, "key 'dataset_token_bytes' must be 2 or 4, got 3");

	cfg_for(&c, "llmc", "", 0, 256, 16);
	expect_error(&c, 1, -EINVAL, "dataset_type 'llmc' needs key 'dataset_path'");
	cfg_for(&c, "llmc", at("few.bin"), 0, 256, 16);
	c.eot_token = 256;
	expect_error(&c, 1, -EINVAL, "key 'eot_token' is 256, not below vocab_size 256");
}
END_TEST

START_TEST(test_token_out_of_range)
{
	fresh();
	/* found at read time, naming the shard and the token's offset */
	uint32_t tok[400];
	for (int i = 0; i < 400; i++)
		tok[i] = (uint32_t)(i % 200);
	tok[333] = 5000;
	write_llmc(at("v.bin"), tok, 400, 2);
	struct cfg c;
	cfg_for(&c, "llmc", at("v.bin"), 0, 256, 16);
	struct data_source *d = open_role(&c, DATA_EVAL, 1);
	int32_t in[16], tg[16];
	int rc = 0;
	for (int64_t r = 0; r < data_rows(d) && !rc; r++)
		rc = data_batch(d, r, 1, 0, 1, in, tg, err, sizeof(err));
	char want[300];
	snprintf(want, sizeof(want), "data: '%s': token 5000 at token offset 333 is not below "
		 "vocab_size 256", at("v.bin"));
	ck_assert_int_eq(rc, -EBADMSG);
	ck_assert_msg(!strcmp(err, want), "'%s'", err);
	data_close(d);
}
END_TEST

/* Writes a Megatron index by hand with one field changed. */
static void write_idx_bad(const char *prefix, int what)
{
	uint32_t tok[200];
	int64_t docs[4] = { 50, 50, 50, 50 };
	for (int i = 0; i < 200; i++)
		tok[i] = (uint32_t)i;
	write_megatron(prefix, tok, docs, 4, 2);
	char p[300];
	snprintf(p, sizeof(p), "%s.idx", prefix);
	long len;
	uint8_t *b = slurp(p, &len);
	if (what == 0)
		b[0] = 'X';                 /* magic */
	else if (what == 1)
		b[9] = 2;                   /* version */
	else if (what == 2)
		b[17] = 7;                  /* dtype float32 */
	else if (what == 3)
		b[34 + 16 + 24] = 0x90;     /* sequence 3's offset: 144 -> past the .bin */
	else if (what == 4)
		len -= 8;                   /* size */
	else if (what == 5)
		b[34 + 16 + 32 + 16] = 5;   /* document index entry 2: 2 -> 5, past the 4 sequences */
	spit(p, b, (size_t)len);
	free(b);
}

START_TEST(test_errors_megatron)
{
	fresh();
	static const char *const want[] = {
		"bad magic (a Megatron index begins with MMIDIDX\\0\\0)",
		"index version 2, meshrun reads version 1",
		"dtype code 7 (float32) is not a token type meshrun reads",
		"sequence 3 starts at byte 400 of the .bin, not where the one before it ends (300)",
		"has 114 bytes, but 4 sequences and 5 document-index entries take 122",
		"document index entry 2 is 5",
	};
	for (int w = 0; w < 6; w++) {
		char prefix[32], msg[512];
		snprintf(prefix, sizeof(prefix), "bad%d", w);
		write_idx_bad(at(prefix), w);
		struct cfg c;
		cfg_for(&c, "megatron", at(prefix), 0, 256, 16);
		snprintf(msg, sizeof(msg), "'%s.idx", at(prefix));
		expect_error(&c, 1, -EBADMSG, msg);
		ck_assert_msg(strstr(err, want[w]), "case %d: '%s'", w, err);
	}
	/* offsets that leave the .bin: a .bin cut short */
	uint32_t tok[200];
	int64_t docs[2] = { 100, 100 };
	for (int i = 0; i < 200; i++)
		tok[i] = (uint32_t)i;
	write_megatron(at("cut"), tok, docs, 2, 2);
	ck_assert_int_eq(truncate(at("cut.bin"), 300), 0);
	struct cfg c;
	cfg_for(&c, "megatron", at("cut.bin"), 0, 256, 16);
	char msg[512];
	snprintf(msg, sizeof(msg), "'%s.idx': sequence 1 ends at byte 400, past the end of '%s.bin' "
		 "(300 bytes)", at("cut"), at("cut"));
	expect_error(&c, 1, -EBADMSG, msg);
	ck_assert_int_eq(truncate(at("cut.bin"), 402), 0);
	snprintf(msg, sizeof(msg), "'%s.bin' has 402 bytes, but '%s.idx' describes 400", at("cut"),
		 at("cut"));
	expect_error(&c, 1, -EBADMSG, msg);
	unlink(at("cut.idx"));
	snprintf(msg, sizeof(msg), "unable to open '%s.idx'", at("cut"));
	expect_error(&c, 1, -EBADMSG, msg);
}
END_TEST

/* ---- data pack ---- */

/* Reads an llm.c shard by hand: its tokens, count in *n. */
static uint32_t *read_llmc(const char *path, int64_t *n, int *width)
{
	long len;
	uint8_t *b = slurp(path, &len);
	int32_t h[3];
	memcpy(h, b, sizeof(h));
	*width = h[0] == 20240520 ? 2 : 4;
	ck_assert_int_eq(h[1], *width == 2 ? 1 : 7);
	*n = h[2];
	ck_assert_int_eq(len, 1024 + *n * *width);
	uint32_t *t = malloc(sizeof(uint32_t) * (size_t)(*n + 1));
	for (int64_t i = 0; i < *n; i++) {
		t[i] = 0;
		for (int k = 0; k < *width; k++)
			t[i] |= (uint32_t)b[1024 + i * *width + k] << (8 * k);
	}
	free(b);
	return t;
}

START_TEST(test_pack_llmc_and_megatron)
{
	fresh();
	long len;
	uint8_t *text = slurp(GPL3, &len);
	char out[300], *inputs[2] = { (char *)GPL3, (char *)"/usr/share/common-licenses/GPL-2" };
	long len2;
	uint8_t *text2 = slurp(inputs[1], &len2);
	struct pack_stats st;
	struct pack_opts o = { .out = SHARD_LLMC, .in = PACK_TEXT, .shard_tokens = 10000, .eot = 256,
			       .token_bytes = 2, .name = "gpl" };
	snprintf(out, sizeof(out), "%s/llmc", dir);
	o.dir = out;
	ck_assert_msg(data_pack(&o, inputs, 2, &st, err, sizeof(err)) == 0, "%s", err);
	int64_t total = len + len2 + 2;
	ck_assert_int_eq(st.tokens, total);
	ck_assert_int_eq(st.documents, 2);
	ck_assert_int_eq(st.shards, (int)((total + 9999) / 10000));
	/* the shards, read by hand, are the texts with an EOT after each */
	int64_t pos = 0;
	for (int s = 0; s < st.shards; s++) {
		char p[400];
		int64_t n;
		int width;
		snprintf(p, sizeof(p), "%s/gpl_%06d.bin", out, s);
		uint32_t *t = read_llmc(p, &n, &width);
		ck_assert_int_eq(width, 2);
		ck_assert_int_eq(n, s + 1 < st.shards ? 10000 : total - 10000 * s);
		for (int64_t i = 0; i < n; i++, pos++) {
			uint32_t want = pos < len ? text[pos] : pos == len ? 256 : pos < len + 1 + len2 ?
					text2[pos - len - 1] : 256;
			EXPECT(t[i] == want, "shard %d token %lld: %u, want %u", s, (long long)i, t[i], want);
		}
		free(t);
	}
	/* into Megatron: one document per input file, documents kept whole */
	char meg[300];
	snprintf(meg, sizeof(meg), "%s/meg", dir);
	struct pack_opts m = { .out = SHARD_MEGATRON, .in = PACK_LLMC, .shard_tokens = 40000,
			       .eot = -1, .name = "gpl", .dir = meg };
	char glob_in[400];
	snprintf(glob_in, sizeof(glob_in), "%s/gpl_000000.bin", out);
	char *one[1] = { glob_in };
	ck_assert_msg(data_pack(&m, one, 1, &st, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(st.shards, 1);
	ck_assert_int_eq(st.tokens, 10000);
	/* and the readers read it: row r of the Megatron copy is row r of the text */
	struct cfg c;
	cfg_for(&c, "megatron", meg, 0, 257, 64);
	struct data_source *d = open_role(&c, DATA_EVAL, 1);
	ck_assert_int_eq(data_rows(d), (10000 - 1) / 64);
	int32_t in[64], tg[64];
	batch_ok(d, 17, 1, 0, 1, in, tg);
	for (int t = 0; t < 64; t++)
		ck_assert_int_eq(in[t], text[17 * 64 + t]);
	data_close(d);
	/* a token that does not fit the output */
	uint32_t big[3] = { 1, 70000, 2 };
	write_raw(at("big.tok"), big, 3, 4);
	char *bi[1] = { (char *)at("big.tok") };
	struct pack_opts b = { .out = SHARD_LLMC, .in = PACK_RAW, .in_token_bytes = 4, .token_bytes = 2,
			       .shard_tokens = 100, .eot = -1, .name = "b", .dir = out };
	ck_assert_int_eq(data_pack(&b, bi, 1, &st, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "token 70000 at token offset 1 does not fit uint16") &&
		      strstr(err, at("big.tok")), "%s", err);
	b.token_bytes = 0;  /* the input's width */
	ck_assert_msg(data_pack(&b, bi, 1, &st, err, sizeof(err)) == 0, "%s", err);
	snprintf(glob_in, sizeof(glob_in), "%s/b_000000.bin", out);
	int64_t n;
	int width;
	uint32_t *t = read_llmc(glob_in, &n, &width);
	ck_assert_int_eq(width, 4);
	ck_assert_int_eq(n, 3);
	ck_assert_int_eq(t[1], 70000);
	free(t);
	free(text);
	free(text2);
}
END_TEST

static Suite *data_suite(void)
{
	Suite *s = suite_create("data");
	TCase *tc;

	tc = tcase_create("determinism");
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, test_split_invariance, 0, 2);
	suite_add_tcase(s, tc);

	tc = tcase_create("tokens");
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, test_shift_and_range, 0, 6);
	tcase_add_test(tc, test_synthetic_learnable);
	suite_add_tcase(s, tc);

	tc = tcase_create("text");
	tcase_set_timeout(tc, 30);
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_text_windows_follow_hash);
	tcase_add_test(tc, test_eval_windows);
	tcase_add_test(tc, test_tiny_text);
	suite_add_tcase(s, tc);

	tc = tcase_create("shards");
	tcase_set_timeout(tc, 60);
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_add_loop_test(tc, test_formats_read_back, 0, 6);
	tcase_add_test(tc, test_vocab_above_65536);
	tcase_add_test(tc, test_eval_split);
	suite_add_tcase(s, tc);

	tc = tcase_create("shuffle");
	tcase_set_timeout(tc, 60);
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_perm_is_bijection);
	tcase_add_loop_test(tc, test_epochs_follow_reference, 0, 2);
	tcase_add_test(tc, test_seek_continues);
	suite_add_tcase(s, tc);

	tc = tcase_create("documents");
	tcase_set_timeout(tc, 30);
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_documents_llmc_eot);
	tcase_add_test(tc, test_documents_megatron);
	suite_add_tcase(s, tc);

	tc = tcase_create("errors");
	tcase_set_timeout(tc, 30);
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_errors_text);
	tcase_add_test(tc, test_errors_llmc_raw);
	tcase_add_test(tc, test_token_out_of_range);
	tcase_add_test(tc, test_errors_megatron);
	suite_add_tcase(s, tc);

	tc = tcase_create("pack");
	tcase_set_timeout(tc, 60);
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_pack_llmc_and_megatron);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(data_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
