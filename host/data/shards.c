/* The token-shard source: llmc, raw and megatron (docs/data.md). The
 * shards a path names, in name order, make one list of rows: shard k's
 * tokens give floor((tokens - 1) / T) rows, row j covering its tokens
 * [j T, j T + T] (consecutive rows share one token, so every token but a
 * shard's first is a target once per epoch; a tail shorter than a row is
 * not read). Training reads the rows of an epoch in the order
 * data_perm(seed + epoch, rows, i); evaluation reads them in order. A
 * row is one pread; nothing else of the corpus is read or kept. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/data/shard.h"
#include "host/data/source.h"

/* files a source keeps open (shards beyond are opened again on use) */
#define FD_CACHE 16

struct fd_slot {
	int64_t file;        /* shard * 2, + 1 for its .idx; -1: empty */
	int fd;
};

struct shards_src {
	struct data_source s;    /* first */
	enum shard_format fmt;
	char *spec_path;         /* as configured, for messages */
	struct shard *sh;
	int n;
	int64_t all_rows;        /* every shard's rows */
	int64_t first, count;    /* the rows this source reads: [first, first + count) */
	bool respect;
	long long eot;
	struct fd_slot cache[FD_CACHE];
	int victim;
	uint8_t *raw;            /* one row as stored */
	uint32_t *tok;           /* one row decoded */
	int trace_fd;            /* MESHRUN_TEST_DATA_TRACE, else -1 */
};

static struct shards_src *ss(struct data_source *d) { return (struct shards_src *)d; }
static const struct shards_src *css(const struct data_source *d)
{
	return (const struct shards_src *)d;
}

static void shards_close(struct data_source *d)
{
	struct shards_src *s = ss(d);
	if (!s)
		return;
	for (int i = 0; i < FD_CACHE; i++)
		if (s->cache[i].file >= 0)
			close(s->cache[i].fd);
	for (int i = 0; i < s->n; i++) {
		free(s->sh[i].path);
		free(s->sh[i].idx);
	}
	if (s->trace_fd >= 0)
		close(s->trace_fd);
	free(s->sh);
	free(s->spec_path);
	free(s->raw);
	free(s->tok);
	free(s);
}

/* ---- the files a path names ---- */

struct names {
	char **v;
	int n, cap;
};

static int names_add(struct names *nm, const char *s, size_t len)
{
	if (nm->n == nm->cap) {
		int cap = nm->cap ? 2 * nm->cap : 16;
		char **v = realloc(nm->v, sizeof(*v) * (size_t)cap);
		if (!v)
			return -ENOMEM;
		nm->v = v;
		nm->cap = cap;
	}
	if (!(nm->v[nm->n] = strndup(s, len)))
		return -ENOMEM;
	nm->n++;
	return 0;
}

static void names_free(struct names *nm)
{
	for (int i = 0; i < nm->n; i++)
		free(nm->v[i]);
	free(nm->v);
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && !strcmp(s + n - k, suffix);
}

/* A megatron name: PREFIX, PREFIX.bin or PREFIX.idx, all the same shard. */
static size_t prefix_len(const char *s, enum shard_format f)
{
	size_t n = strlen(s);
	if (f == SHARD_MEGATRON && (ends_with(s, ".bin") || ends_with(s, ".idx")))
		n -= 4;
	return n;
}

static int list_dir(const char *dir, const char *suffix, struct names *nm, char *err, size_t errlen)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[4096];
	int rc = 0;
	if (!d)
		return data_err(err, errlen, -EBADMSG, "unable to open directory '%s': %s", dir,
				strerror(errno));
	while (!rc && (e = readdir(d)))
		if (e->d_name[0] != '.' && ends_with(e->d_name, suffix)) {
			snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
			rc = names_add(nm, path, strlen(path));
		}
	closedir(d);
	if (rc)
		return data_err(err, errlen, rc, "out of memory");
	if (!nm->n)
		return data_err(err, errlen, -EBADMSG, "directory '%s' has no *%s files", dir, suffix);
	return 0;
}

/* The shard names (megatron: prefixes) path gives, sorted, each once. */
static int expand(const char *path, enum shard_format f, struct names *nm, char *err, size_t errlen)
{
	struct stat st;
	int rc = 0;
	if (!path[0])
		return data_err(err, errlen, -EINVAL, "dataset_type '%s' needs key 'dataset_path'",
				f == SHARD_LLMC ? "llmc" : f == SHARD_RAW ? "raw" : "megatron");
	if (strpbrk(path, "*?[")) {
		glob_t g;
		int r = glob(path, GLOB_NOSORT, NULL, &g);
		if (r == GLOB_NOMATCH)
			return data_err(err, errlen, -EBADMSG, "'%s' matches no file", path);
		if (r)
			return data_err(err, errlen, -EBADMSG, "unable to expand '%s'", path);
		for (size_t i = 0; !rc && i < g.gl_pathc; i++)
			rc = names_add(nm, g.gl_pathv[i], prefix_len(g.gl_pathv[i], f));
		globfree(&g);
		if (rc)
			return data_err(err, errlen, rc, "out of memory");
	} else if (!stat(path, &st) && S_ISDIR(st.st_mode)) {
		if ((rc = list_dir(path, f == SHARD_MEGATRON ? ".idx" : ".bin", nm, err, errlen)))
			return rc;
		for (int i = 0; f == SHARD_MEGATRON && i < nm->n; i++)
			nm->v[i][prefix_len(nm->v[i], f)] = '\0';
	} else if (names_add(nm, path, prefix_len(path, f))) {
		return data_err(err, errlen, -ENOMEM, "out of memory");
	}
	qsort(nm->v, (size_t)nm->n, sizeof(char *), name_cmp);
	int k = 0;
	for (int i = 0; i < nm->n; i++) {
		if (k && !strcmp(nm->v[k - 1], nm->v[i])) {
			free(nm->v[i]);
			continue;
		}
		nm->v[k++] = nm->v[i];
	}
	nm->n = k;
	return 0;
}

/* ---- opening ---- */

static const char *fmt_name(enum shard_format f)
{
	return f == SHARD_LLMC ? "llmc" : f == SHARD_RAW ? "raw" : "megatron";
}

static int open_shards(struct shards_src *s, const struct data_spec *sp, char *err, size_t errlen)
{
	struct names nm = { 0 };
	int rc = expand(sp->path, s->fmt, &nm, err, errlen);
	if (rc)
		goto out;
	if (!(s->sh = calloc((size_t)nm.n, sizeof(*s->sh)))) {
		rc = data_err(err, errlen, -ENOMEM, "out of memory");
		goto out;
	}
	s->n = nm.n;  /* zeroed: shards_close frees what each got */
	for (int i = 0; i < nm.n; i++) {
		struct shard *h = &s->sh[i];
		size_t len = strlen(nm.v[i]) + 5;
		h->path = malloc(len);
		h->idx = s->fmt == SHARD_MEGATRON ? malloc(len) : NULL;
		if (!h->path || (s->fmt == SHARD_MEGATRON && !h->idx)) {
			rc = data_err(err, errlen, -ENOMEM, "out of memory");
			goto out;
		}
		snprintf(h->path, len, "%s%s", nm.v[i], s->fmt == SHARD_MEGATRON ? ".bin" : "");
		if (h->idx)
			snprintf(h->idx, len, "%s.idx", nm.v[i]);
		if ((rc = data_shard_header(h, s->fmt, sp->token_bytes, err, errlen)))
			goto out;
		if (h->width == 2 && sp->V > 65536) {
			rc = data_err(err, errlen, -EBADMSG, "'%s' holds uint16 tokens, too narrow for "
				      "vocab_size %lld", h->path, sp->V);
			goto out;
		}
		h->rows = h->tokens > sp->T ? (h->tokens - 1) / sp->T : 0;
		h->row0 = s->all_rows;
		s->all_rows += h->rows;
	}
out:
	names_free(&nm);
	return rc;
}

static int shards_open(struct data_source **out, const struct data_spec *sp, enum shard_format f,
		       char *err, size_t errlen)
{
	struct shards_src *s = calloc(1, sizeof(*s));
	int rc;
	if (!s)
		return data_err(err, errlen, -ENOMEM, "out of memory");
	s->fmt = f;
	s->trace_fd = -1;
	for (int i = 0; i < FD_CACHE; i++)
		s->cache[i].file = -1;
	s->respect = sp->respect_documents;
	s->eot = sp->eot;
	if (s->respect && f != SHARD_MEGATRON && sp->eot < 0) {
		rc = data_err(err, errlen, -EINVAL, "dataset_respect_documents with dataset_type '%s' "
			      "needs key 'eot_token' (the token between documents; GPT-2: 50256)",
			      fmt_name(f));
		goto fail;
	}
	if (!(s->spec_path = strdup(sp->path)) ||
	    !(s->raw = malloc(4 * ((size_t)sp->T + 1))) ||
	    !(s->tok = malloc(sizeof(uint32_t) * ((size_t)sp->T + 1)))) {
		rc = data_err(err, errlen, -ENOMEM, "out of memory");
		goto fail;
	}
	if ((rc = open_shards(s, sp, err, errlen)))
		goto fail;
	int64_t held = sp->split > 0 ? (int64_t)ceil(sp->split * (double)s->all_rows) : 0;
	s->first = sp->role == DATA_EVAL && held ? s->all_rows - held : 0;
	s->count = sp->role == DATA_EVAL ? (held ? held : s->all_rows) : s->all_rows - held;
	const char *trace = getenv("MESHRUN_TEST_DATA_TRACE");
	if (trace && sp->role == DATA_TRAIN &&
	    (s->trace_fd = open(trace, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) < 0) {
		rc = data_err(err, errlen, -EIO, "unable to open MESHRUN_TEST_DATA_TRACE '%s': %s", trace,
			      strerror(errno));
		goto fail;
	}
	s->s.masks = s->respect;
	*out = &s->s;
	return 0;
fail:
	shards_close(&s->s);
	return rc;
}

static int llmc_open(struct data_source **o, const struct data_spec *sp, char *e, size_t el)
{
	return shards_open(o, sp, SHARD_LLMC, e, el);
}

static int raw_open(struct data_source **o, const struct data_spec *sp, char *e, size_t el)
{
	return shards_open(o, sp, SHARD_RAW, e, el);
}

static int megatron_open(struct data_source **o, const struct data_spec *sp, char *e, size_t el)
{
	return shards_open(o, sp, SHARD_MEGATRON, e, el);
}

static int64_t shards_rows(const struct data_source *d)
{
	return css(d)->count;
}

/* ---- reading ---- */

/* An open descriptor for shard k's tokens (idx: its .idx). */
static int file_fd(struct shards_src *s, int k, bool idx, char *err, size_t errlen)
{
	int64_t file = 2 * (int64_t)k + idx;
	for (int i = 0; i < FD_CACHE; i++)
		if (s->cache[i].file == file)
			return s->cache[i].fd;
	const char *path = idx ? s->sh[k].idx : s->sh[k].path;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return data_err(err, errlen, -EIO, "unable to open '%s': %s", path, strerror(errno));
	posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
	struct fd_slot *v = &s->cache[s->victim];
	s->victim = (s->victim + 1) % FD_CACHE;
	if (v->file >= 0)
		close(v->fd);
	*v = (struct fd_slot){ file, fd };
	return fd;
}

/* The shard holding global row r. */
static int shard_of(const struct shards_src *s, int64_t r)
{
	int lo = 0, hi = s->n - 1;
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (s->sh[mid].row0 <= r)
			lo = mid;
		else
			hi = mid - 1;
	}
	/* an empty shard shares its row0 with the next one, so the last
	 * shard starting at or before r is never empty */
	return lo;
}

/* Megatron: masks every target of the row at shard token a that starts
 * a document, i.e. the documents starting in (a, a + T]. */
static int mask_documents(struct shards_src *s, int k, int64_t a, int32_t *tg, char *err,
			  size_t errlen)
{
	const struct shard *h = &s->sh[k];
	int T = s->s.T, fd = file_fd(s, k, true, err, errlen);
	int64_t lo = 0, hi = h->ndoc - 1, st;
	int rc;
	if (fd < 0)
		return fd;
	/* the first document starting after a (the end, ndoc - 1, does) */
	while (lo < hi) {
		int64_t mid = lo + (hi - lo) / 2;
		if ((rc = data_shard_doc_start(h, fd, mid, &st, err, errlen)))
			return rc;
		if (st > a)
			hi = mid;
		else
			lo = mid + 1;
	}
	for (int64_t d = lo; d < h->ndoc - 1; d++) {
		if ((rc = data_shard_doc_start(h, fd, d, &st, err, errlen)))
			return rc;
		if (st > a + T)
			break;
		if (st > a)
			tg[st - a - 1] = -1;
	}
	return 0;
}

/* Global row r into in, tg (T each). */
static int read_row(struct shards_src *s, int64_t r, int32_t *in, int32_t *tg, char *err,
		    size_t errlen)
{
	int T = s->s.T, k = shard_of(s, r);
	const struct shard *h = &s->sh[k];
	int64_t a = (r - h->row0) * T;
	int fd = file_fd(s, k, false, err, errlen), rc;
	if (fd < 0)
		return fd;
	size_t n = (size_t)T + 1;
	if ((rc = data_pread(fd, s->raw, n * (size_t)h->width, h->off + a * h->width, h->path, err,
			     errlen)))
		return rc;
	data_shard_decode(s->tok, s->raw, h->width, n);
	for (size_t t = 0; t < n; t++)
		if (s->tok[t] >= (uint64_t)s->s.V)
			return data_err(err, errlen, -EBADMSG, "'%s': token %" PRIu32 " at token offset "
					"%lld is not below vocab_size %lld", h->path, s->tok[t],
					(long long)(a + (int64_t)t), s->s.V);
	for (int t = 0; t < T; t++) {
		in[t] = (int32_t)s->tok[t];
		tg[t] = (int32_t)s->tok[t + 1];
	}
	if (!s->respect)
		return 0;
	if (s->fmt == SHARD_MEGATRON)
		return mask_documents(s, k, a, tg, err, errlen);
	for (int t = 0; t < T; t++)
		if (in[t] == s->eot)  /* the target after the end of a document */
			tg[t] = -1;
	return 0;
}

static void trace_row(struct shards_src *s, const struct data_req *rq, int i, int64_t r)
{
	char line[128];
	int n = snprintf(line, sizeof(line), "step %" PRId64 " sample %" PRId64 " row %" PRId64 "\n",
			 rq->step, rq->sample + rq->row0 + i, r);
	/* one write per line: O_APPEND keeps concurrent writers' lines whole */
	if (write(s->trace_fd, line, (size_t)n) != n)
		return;
}

static int shards_batch(struct data_source *d, const struct data_req *rq, int32_t *inputs,
			int32_t *targets, char *err, size_t errlen)
{
	struct shards_src *s = ss(d);
	int T = d->T;
	for (int i = 0; i < rq->nrows; i++) {
		int32_t *in = inputs + (size_t)i * T, *tg = targets + (size_t)i * T;
		int64_t r;
		if (d->role == DATA_TRAIN) {
			int64_t g = rq->sample + rq->row0 + i, e = g / s->count;
			r = s->first + (int64_t)data_perm(d->seed + (uint64_t)e, (uint64_t)s->count,
							  (uint64_t)(g % s->count));
			if (s->trace_fd >= 0)
				trace_row(s, rq, i, r);
		} else {
			int64_t p = rq->step * rq->global_rows + rq->row0 + i;
			if (p >= s->count) {  /* past the end: padding, no loss */
				for (int t = 0; t < T; t++)
					in[t] = 0, tg[t] = -1;
				continue;
			}
			r = s->first + p;
		}
		int rc = read_row(s, r, in, tg, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

static void shards_position(const struct data_source *d, struct data_pos *p, char *where,
			    size_t wherelen)
{
	const struct shards_src *s = css(d);
	p->row = s->first + (int64_t)data_perm(p->seed, (uint64_t)s->count,
					       (uint64_t)(p->sample % s->count));
	int k = shard_of(s, p->row);
	snprintf(where, wherelen, "'%s' token %lld", s->sh[k].path,
		 (long long)((p->row - s->sh[k].row0) * d->T));
}

#define SHARD_TYPE(fmt) { .name = #fmt, .open = fmt##_open, .rows = shards_rows, \
	.batch = shards_batch, .position = shards_position, .close = shards_close }

const struct data_type data_type_llmc = SHARD_TYPE(llmc);
const struct data_type data_type_raw = SHARD_TYPE(raw);
const struct data_type data_type_megatron = SHARD_TYPE(megatron);
