/* The text source: one file of bytes, each byte a token (vocabulary 256),
 * read by range (docs/data.md#text).
 *
 * Training row r of step s is the window of T+1 bytes starting at
 * h(seed, s, r) mod (n - T), n being the bytes training may use (the
 * whole file, or what eval_split_fraction leaves) and h the row hash of
 * host/data/synthetic.c. So text rows are drawn with replacement: no
 * epochs. Evaluation splits the held-out bytes (the last
 * ceil(eval_split_fraction x size) of the file, or a whole file) into
 * consecutive non-overlapping windows of T+1 bytes: window w covers bytes
 * [w (T+1), w (T+1) + T] (so the byte at each window boundary is never a
 * target). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/data/source.h"
#include "host/util/mix.h"

struct text_src {
	struct data_source s;    /* first */
	char *path;
	int fd;
	int64_t len;             /* bytes of the file */
	int64_t lo, hi;          /* the bytes this source reads: [lo, hi) */
	uint8_t *buf;            /* one row */
};

static struct text_src *ts(struct data_source *d) { return (struct text_src *)d; }
static const struct text_src *cts(const struct data_source *d) { return (const struct text_src *)d; }

static void text_close(struct data_source *d)
{
	struct text_src *t = ts(d);
	if (!t)
		return;
	if (t->fd >= 0)
		close(t->fd);
	free(t->path);
	free(t->buf);
	free(t);
}

static int text_open(struct data_source **out, const struct data_spec *sp, char *err, size_t errlen)
{
	struct text_src *t = calloc(1, sizeof(*t));
	int rc = -EBADMSG;
	if (!t)
		return data_err(err, errlen, -ENOMEM, "out of memory");
	t->fd = -1;
	if (!(t->path = strdup(sp->path)) || !(t->buf = malloc((size_t)sp->T + 1))) {
		rc = data_err(err, errlen, -ENOMEM, "out of memory");
		goto fail;
	}
	t->fd = data_open_file(sp->path, &t->len, err, errlen);
	if (t->fd < 0) {
		rc = t->fd;
		goto fail;
	}
	if (t->len == 0) {
		data_err(err, errlen, -EBADMSG, "'%s' is empty", sp->path);
		goto fail;
	}
	int64_t held = sp->split > 0 ? (int64_t)ceil(sp->split * (double)t->len) : 0;
	bool eval = sp->role == DATA_EVAL;
	t->lo = eval ? t->len - (held ? held : t->len) : 0;
	t->hi = eval ? t->len : t->len - held;
	if (t->hi - t->lo < (int64_t)sp->T + 1) {
		if (!held)
			data_err(err, errlen, -EBADMSG, "'%s' has %lld bytes, fewer than max_target_length + 1 = %d",
				 sp->path, (long long)t->len, sp->T + 1);
		else
			data_err(err, errlen, -EBADMSG, "'%s': eval_split_fraction %g leaves %lld bytes for %s, "
				 "fewer than max_target_length + 1 = %d", sp->path, sp->split,
				 (long long)(t->hi - t->lo), eval ? "evaluation" : "training", sp->T + 1);
		goto fail;
	}
	*out = &t->s;
	return 0;
fail:
	text_close(&t->s);
	return rc;
}

static int64_t text_rows(const struct data_source *d)
{
	const struct text_src *t = cts(d);
	return d->role == DATA_TRAIN ? -1 : (t->hi - t->lo) / ((int64_t)d->T + 1);
}

static uint64_t row_hash(uint64_t seed, int64_t step, int64_t row)
{
	return mix64(mix64(mix64(seed) ^ (uint64_t)step) ^ (uint64_t)row);
}

static int text_batch(struct data_source *d, const struct data_req *rq, int32_t *inputs,
		      int32_t *targets, char *err, size_t errlen)
{
	struct text_src *t = ts(d);
	int T = d->T;
	int64_t windows = text_rows(d);
	for (int i = 0; i < rq->nrows; i++) {
		int32_t *in = inputs + (size_t)i * T, *tg = targets + (size_t)i * T;
		int64_t at;
		if (d->role == DATA_TRAIN) {
			at = (int64_t)(row_hash(d->seed, rq->step, rq->row0 + i) % (uint64_t)(t->hi - T));
		} else {
			int64_t w = rq->step * rq->global_rows + rq->row0 + i;
			if (w >= windows) {  /* past the end: padding, no loss */
				for (int k = 0; k < T; k++)
					in[k] = 0, tg[k] = -1;
				continue;
			}
			at = t->lo + w * ((int64_t)T + 1);
		}
		int rc = data_pread(t->fd, t->buf, (size_t)T + 1, at, t->path, err, errlen);
		if (rc)
			return rc;
		for (int k = 0; k < T; k++) {
			in[k] = t->buf[k];
			tg[k] = t->buf[k + 1];
		}
	}
	return 0;
}

static void text_position(const struct data_source *d, struct data_pos *p, char *where,
			  size_t wherelen)
{
	(void)d;
	(void)p;
	if (wherelen)
		where[0] = '\0';
}

const struct data_type data_type_text = {
	.name = "text",
	.open = text_open,
	.rows = text_rows,
	.batch = text_batch,
	.position = text_position,
	.close = text_close,
};
