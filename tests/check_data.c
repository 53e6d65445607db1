/* Datasets: rows depend only on (seed, step, row) however a batch is split,
 * targets are inputs shifted by one, tokens stay in range, the synthetic
 * set has structure a model can learn, text windows follow the documented
 * hash, eval windows tile the file, and bad inputs give clear errors. */
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
#include "host/train/data.h"

#define GPL3 "/usr/share/common-licenses/GPL-3"

static char dir[64];
static char err[512];
static char paths[5][256]; /* [4] is never created */

/* made and removed by the parent process, so a failing (forked) test
 * leaves nothing behind */
static void setup(void)
{
	strcpy(dir, "/tmp/check_data.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	for (int i = 0; i < 5; i++)
		snprintf(paths[i], sizeof(paths[i]), "%s/f%d", dir, i);
	err[0] = '\0';
}

static void teardown(void)
{
	for (int i = 0; i < 5; i++)
		unlink(paths[i]);
	rmdir(dir);
}

static void cfg_for(struct cfg *c, const char *type, const char *path, long long seed, int V, int T)
{
	cfg_defaults(c);
	snprintf(c->dataset_type, sizeof(c->dataset_type), "%s", type);
	snprintf(c->dataset_path, sizeof(c->dataset_path), "%s", path);
	c->data_shuffle_seed = seed;
	c->vocab_size = V;
	c->max_target_length = T;
}

static struct dataset *open_ok(const struct cfg *c)
{
	struct dataset *d = data_open(c, err, sizeof(err));
	ck_assert_msg(d, "%s", err);
	return d;
}

static uint8_t *slurp(const char *p, long *len)
{
	FILE *f = fopen(p, "rb");
	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	*len = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *b = malloc((size_t)*len);
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

/* the row hash exactly as data.h documents it */
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

/* one global batch of B rows, fetched in chunks of `split` rows */
static void fetch(const struct dataset *d, int64_t step, int B, int split, int32_t *in, int32_t *tg)
{
	int T = data_seq_len(d);
	for (int r0 = 0; r0 < B; r0 += split)
		data_batch(d, step, B, r0, split, in + (size_t)r0 * T, tg + (size_t)r0 * T);
}

/* _i: 0 = synthetic, 1 = text */
START_TEST(test_split_invariance)
{
	struct cfg c;
	cfg_for(&c, _i ? "text" : "synthetic", GPL3, 1234, 256, 64);
	struct dataset *d = open_ok(&c), *d2 = open_ok(&c);
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
		data_batch(d, step, B, 5, 3, in, tg);
		ck_assert(!memcmp(in, in1 + 5 * T, sizeof(int32_t) * 3 * T));
		ck_assert(!memcmp(tg, tg1 + 5 * T, sizeof(int32_t) * 3 * T));
		/* rows of one step differ from each other */
		for (int r = 1; r < B; r++)
			ck_assert_msg(memcmp(in1, in1 + r * T, sizeof(int32_t) * T), "rows 0 and %d equal",
				      r);
	}
	/* another step, another seed: other rows */
	fetch(d, 0, B, B, in1, tg1);
	fetch(d, 1, B, B, in, tg);
	ck_assert(memcmp(in, in1, sizeof(in)));
	data_close(d2);
	cfg_for(&c, _i ? "text" : "synthetic", GPL3, 1235, 256, 64);
	d2 = open_ok(&c);
	fetch(d2, 0, B, B, in, tg);
	ck_assert(memcmp(in, in1, sizeof(in)));
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
	struct dataset *d = open_ok(&c);
	ck_assert_int_eq(data_seq_len(d), T);
	ck_assert_int_eq(data_vocab(d), V);
	ck_assert_int_eq(data_text_len(d), 0);
	int32_t in[B * T], tg[B * T];
	int seen_max = 0;
	for (int64_t step = -2; step < 40; step++) {
		data_batch(d, step, B, 0, B, in, tg);
		for (int r = 0; r < B; r++)
			for (int t = 0; t < T; t++) {
				int32_t x = in[r * T + t], y = tg[r * T + t];
				ck_assert_msg(x >= 0 && x < V && y >= 0 && y < V, "token %d/%d, vocab %d", x,
					      y, V);
				if (t + 1 < T)
					ck_assert_int_eq(in[r * T + t + 1], y);
				seen_max = x > seen_max ? x : seen_max;
			}
	}
	/* and the tokens actually use the vocabulary */
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
	struct dataset *d = open_ok(&c);
	static uint32_t counts[V][V];
	static int32_t in[B * T], tg[B * T];
	memset(counts, 0, sizeof(counts));
	for (int s = 0; s < STEPS; s++) {
		data_batch(d, s, B, 0, B, in, tg);
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
	struct dataset *d = open_ok(&c);
	ck_assert_int_eq(data_text_len(d), len);
	int32_t in[B * T], tg[B * T];
	for (int64_t step = 0; step < 20; step++) {
		data_batch(d, step, B, 0, B, in, tg);
		for (int r = 0; r < B; r++) {
			uint64_t start = doc_hash(99, step, r) % (uint64_t)(len - T);
			for (int t = 0; t < T; t++) {
				ck_assert_int_eq(in[r * T + t], file[start + t]);
				ck_assert_int_eq(tg[r * T + t], file[start + t + 1]);
			}
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
	struct cfg c;
	cfg_for(&c, "text", GPL3, 0, 256, 128);
	struct dataset *d = open_ok(&c);
	const int Ls[] = { 1, 64, 128, 1000 };
	for (int k = 0; k < 4; k++) {
		int L = Ls[k];
		int64_t n = data_text_windows(d, L);
		ck_assert_int_eq(n, len / (L + 1));
		int32_t *in = malloc(sizeof(int32_t) * L), *tg = malloc(sizeof(int32_t) * L);
		for (int64_t w = 0; w < n; w++) {
			ck_assert_int_eq(data_text_window(d, w, L, in, tg), 0);
			/* non-overlapping windows of L+1 bytes */
			for (int t = 0; t < L; t++) {
				ck_assert_int_eq(in[t], file[w * (L + 1) + t]);
				ck_assert_int_eq(tg[t], file[w * (L + 1) + t + 1]);
			}
		}
		ck_assert_int_eq(data_text_window(d, n, L, in, tg), -ERANGE);
		ck_assert_int_eq(data_text_window(d, -1, L, in, tg), -ERANGE);
		free(in);
		free(tg);
	}
	ck_assert_int_eq(data_text_windows(d, 0), -EINVAL);
	data_close(d);

	cfg_for(&c, "synthetic", "", 0, 256, 16);
	d = open_ok(&c);
	int32_t a[4], b[4];
	ck_assert_int_eq(data_text_windows(d, 4), -EINVAL);
	ck_assert_int_eq(data_text_window(d, 0, 4, a, b), -EINVAL);
	data_close(d);
	free(file);
}
END_TEST

START_TEST(test_tiny_text)
{
	/* exactly T+1 bytes: one possible window, every row is the file */
	const char *text = "abcdefghi";
	spit(paths[0], text, 9);
	struct cfg c;
	cfg_for(&c, "text", paths[0], 5, 256, 8);
	struct dataset *d = open_ok(&c);
	int32_t in[3 * 8], tg[3 * 8];
	data_batch(d, 17, 3, 0, 3, in, tg);
	for (int r = 0; r < 3; r++)
		for (int t = 0; t < 8; t++) {
			ck_assert_int_eq(in[r * 8 + t], text[t]);
			ck_assert_int_eq(tg[r * 8 + t], text[t + 1]);
		}
	ck_assert_int_eq(data_text_windows(d, 8), 1);
	data_close(d);

	/* bytes >= 128 are tokens 128..255, not negative */
	uint8_t hi[3] = { 0xff, 0x80, 0x00 };
	spit(paths[1], hi, 3);
	cfg_for(&c, "text", paths[1], 0, 256, 2);
	d = open_ok(&c);
	data_batch(d, 0, 1, 0, 1, in, tg);
	ck_assert_int_eq(in[0], 255);
	ck_assert_int_eq(in[1], 128);
	ck_assert_int_eq(tg[1], 0);
	data_close(d);
}
END_TEST

static void expect_error(const struct cfg *c, const char *want)
{
	err[0] = '\0';
	struct dataset *d = data_open(c, err, sizeof(err));
	ck_assert_msg(!d, "accepted, want error '%s'", want);
	ck_assert_msg(strstr(err, want), "got '%s', want '%s'", err, want);
	ck_assert_msg(!strncmp(err, "data: ", 6) && !strchr(err, '\n'), "%s", err);
}

START_TEST(test_errors)
{
	struct cfg c;
	char want[512];

	snprintf(want, sizeof(want), "data: unable to open '%s': No such file or directory", paths[4]);
	cfg_for(&c, "text", paths[4], 0, 256, 16);
	expect_error(&c, want);

	spit(paths[3], "", 0);
	snprintf(want, sizeof(want), "data: '%s' is empty", paths[3]);
	cfg_for(&c, "text", paths[3], 0, 256, 16);
	expect_error(&c, want);

	spit(paths[2], "0123456789abcdef", 16);
	snprintf(want, sizeof(want), "data: '%s' has 16 bytes, fewer than max_target_length + 1 = 17",
		 paths[2]);
	cfg_for(&c, "text", paths[2], 0, 256, 16);
	expect_error(&c, want);

	snprintf(want, sizeof(want), "data: '%s' is not a regular file", dir);
	cfg_for(&c, "text", dir, 0, 256, 16);
	expect_error(&c, want);

	cfg_for(&c, "text", "", 0, 256, 16);
	expect_error(&c, "dataset_type 'text' needs key 'dataset_path'");

	cfg_for(&c, "text", GPL3, 0, 100, 16);
	expect_error(&c, "key 'vocab_size' >= 256, got 100");

	cfg_for(&c, "tokens", GPL3, 0, 256, 16);
	expect_error(&c, "data: key 'dataset_type' has unknown value 'tokens'");

	cfg_for(&c, "synthetic", "", 0, 256, 0);
	expect_error(&c, "key 'max_target_length' must be in");

	cfg_for(&c, "synthetic", "", 0, 0, 16);
	expect_error(&c, "key 'vocab_size' must be in");
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
	tcase_add_test(tc, test_errors);
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
