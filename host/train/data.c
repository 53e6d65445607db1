/* Datasets (see data.h): every token is a pure function of the seed, the
 * step and the global row, so any split of a batch over devices reads the
 * same rows. Text files are read whole into memory once. */
#include "host/train/data.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/config/config.h"
#include "host/util/mix.h"

/* the synthetic successor function's key: fixed, not seeded */
#define SUCC_KEY 0x6d65736872756e21ULL
/* a synthetic token is noise when the top 4 bits of its draw are 0 */
#define NOISE_SHIFT 60

enum data_kind { DATA_SYNTHETIC, DATA_TEXT };

struct dataset {
	enum data_kind kind;
	uint64_t seed;
	int T, V;
	uint8_t *text;
	int64_t len;
};

static void seterr(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static uint64_t row_hash(uint64_t seed, int64_t step, int64_t row)
{
	return mix64(mix64(mix64(seed) ^ (uint64_t)step) ^ (uint64_t)row);
}

static int read_text(struct dataset *d, const char *path, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	int rc = 0;
	if (fd < 0 || fstat(fd, &st) < 0) {
		rc = -errno;
		seterr(err, errlen, "data: unable to open '%s': %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = -EINVAL;
		seterr(err, errlen, "data: '%s' is not a regular file", path);
		goto out;
	}
	if (st.st_size == 0) {
		rc = -EINVAL;
		seterr(err, errlen, "data: '%s' is empty", path);
		goto out;
	}
	if (st.st_size < (off_t)d->T + 1) {
		rc = -EINVAL;
		seterr(err, errlen, "data: '%s' has %lld bytes, fewer than max_target_length + 1 = %d",
		       path, (long long)st.st_size, d->T + 1);
		goto out;
	}
	d->len = (int64_t)st.st_size;
	d->text = malloc((size_t)d->len);
	if (!d->text) {
		rc = -ENOMEM;
		seterr(err, errlen, "data: '%s': out of memory for %lld bytes", path, (long long)d->len);
		goto out;
	}
	for (int64_t got = 0; got < d->len;) {
		ssize_t r = read(fd, d->text + got, (size_t)(d->len - got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rc = r < 0 ? -errno : -EIO;
			seterr(err, errlen, "data: unable to read '%s': %s", path,
			       r < 0 ? strerror(errno) : "file shrank while reading");
			goto out;
		}
		got += r;
	}
out:
	if (fd >= 0)
		close(fd);
	return rc;
}

struct dataset *data_open(const struct cfg *c, char *err, size_t errlen)
{
	if (c->max_target_length < 1 || c->max_target_length > (1 << 24)) {
		seterr(err, errlen, "data: key 'max_target_length' must be in [1, %d], got %lld",
		       1 << 24, c->max_target_length);
		return NULL;
	}
	if (c->vocab_size < 1 || c->vocab_size > INT32_MAX) {
		seterr(err, errlen, "data: key 'vocab_size' must be in [1, %d], got %lld", INT32_MAX,
		       c->vocab_size);
		return NULL;
	}
	struct dataset *d = calloc(1, sizeof(*d));
	if (!d) {
		seterr(err, errlen, "data: out of memory");
		return NULL;
	}
	d->seed = (uint64_t)c->data_shuffle_seed;
	d->T = (int)c->max_target_length;
	d->V = (int)c->vocab_size;

	if (!strcmp(c->dataset_type, "synthetic")) {
		d->kind = DATA_SYNTHETIC;
	} else if (!strcmp(c->dataset_type, "text")) {
		d->kind = DATA_TEXT;
		if (d->V < 256) {
			seterr(err, errlen, "data: dataset_type 'text' has byte tokens and needs key 'vocab_size' >= 256, got %d",
			       d->V);
			goto out_fail;
		}
		if (!c->dataset_path[0]) {
			seterr(err, errlen, "data: dataset_type 'text' needs key 'dataset_path'");
			goto out_fail;
		}
		if (read_text(d, c->dataset_path, err, errlen))
			goto out_fail;
	} else {
		seterr(err, errlen, "data: key 'dataset_type' has unknown value '%s' (synthetic | text)",
		       c->dataset_type);
		goto out_fail;
	}
	return d;

out_fail:
	data_close(d);
	return NULL;
}

void data_close(struct dataset *d)
{
	if (!d)
		return;
	free(d->text);
	free(d);
}

int data_seq_len(const struct dataset *d)
{
	return d->T;
}

int data_vocab(const struct dataset *d)
{
	return d->V;
}

int64_t data_text_len(const struct dataset *d)
{
	return d->kind == DATA_TEXT ? d->len : 0;
}

/* Token t of a synthetic row: the t-th draw of the SplitMix64 stream
 * seeded with the row hash decides between succ(previous) and noise. */
static uint32_t synthetic_next(uint64_t h, int t, uint64_t prev, uint64_t V)
{
	uint64_t x = mix64(h + (uint64_t)t * MIX64_GOLDEN);
	if (t == 0 || (x >> NOISE_SHIFT) == 0)
		return (uint32_t)(x % V);
	return (uint32_t)(mix64(prev ^ SUCC_KEY) % V);
}

// inputs, targets (nrows, T): rows [row0, row0+nrows) of the global batch
void data_batch(const struct dataset *d, int64_t step, int global_batch, int row0, int nrows,
		int32_t *inputs, int32_t *targets)
{
	assert(row0 >= 0 && nrows >= 0 && row0 + nrows <= global_batch);
	(void)global_batch;
	int T = d->T;
	for (int i = 0; i < nrows; i++) {
		uint64_t h = row_hash(d->seed, step, row0 + i);
		int32_t *in = inputs + (size_t)i * T, *tg = targets + (size_t)i * T;
		if (d->kind == DATA_TEXT) {
			const uint8_t *w = d->text + h % (uint64_t)(d->len - T);
			for (int t = 0; t < T; t++) {
				in[t] = w[t];
				tg[t] = w[t + 1];
			}
		} else {
			uint64_t tok = synthetic_next(h, 0, 0, (uint64_t)d->V);
			for (int t = 0; t < T; t++) {
				in[t] = (int32_t)tok;
				tok = synthetic_next(h, t + 1, tok, (uint64_t)d->V);
				tg[t] = (int32_t)tok;
			}
		}
	}
}

int64_t data_text_windows(const struct dataset *d, int L)
{
	if (d->kind != DATA_TEXT || L < 1)
		return -EINVAL;
	return d->len / ((int64_t)L + 1);
}

int data_text_window(const struct dataset *d, int64_t w, int L, int32_t *inputs,
		     int32_t *targets)
{
	int64_t n = data_text_windows(d, L);
	if (n < 0)
		return (int)n;
	if (w < 0 || w >= n)
		return -ERANGE;
	const uint8_t *p = d->text + w * ((int64_t)L + 1);
	for (int t = 0; t < L; t++) {
		inputs[t] = p[t];
		targets[t] = p[t + 1];
	}
	return 0;
}
