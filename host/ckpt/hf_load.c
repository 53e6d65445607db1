/* See host/ckpt/hf_load.h. The directory's tensors, from every shard,
 * are one table sorted by name; each HF tensor the model needs is found
 * there by the name host/ckpt/ckpt.c gives a parameter's slice, and this
 * device's block of it (the parameter's goff and local shape, layers in
 * the model's storage order) is read as runs of contiguous elements. */
#include "host/ckpt/hf_load.h"

#include <cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/ckpt/ckpt.h"
#include "host/ckpt/safetensors.h"
#include "host/model/model.h"
#include "host/util/clock.h"
#include "host/util/mem.h"
#include "host/util/threads.h"

/* One tensor of the checkpoint: its shard and entry, and the blocks of
 * it this host read (a list through hf_block.next). */
struct hf_ent {
	const char *name;
	int file;
	const struct st_entry *e;
	int first_block;
	bool used;
};

struct hf_block {
	int next, nd;
	int off[MODEL_MAX_DIMS], shape[MODEL_MAX_DIMS];
	const float *data;          /* in the params of the device that read it */
	int job0, job1;             /* its reads, while in the batch not yet run */
};

struct hf_src {
	char dir[4096];
	int nfiles;
	struct st_file **files;
	char **file_names;
	struct hf_ent *ents;        /* sorted by name */
	int nents;
	uint64_t index_bytes;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int devices, arrived;
	int fail_rc;                /* the host's first failure */
	char fail_err[640];
	int check_rc;               /* 1: not checked yet */
	char check_err[2048];
	struct hf_block *blocks;
	int nblocks, capblocks;
	int skipped_mtp, skipped_other, mtp_layer;
	uint64_t tensor_bytes;      /* the model's tensors in the files */
	double t0, t1;
	int threads;                /* readers (util_load_threads) */
	bool mmap;                  /* read through mappings of the files (hf_load_mmap) */
	struct hf_job *jobs;        /* the reads and copies of one batch, in tensor order */
	int njobs, capjobs;
	int batch_block0;           /* blocks from here on are being read in this batch */
	int block_job0;             /* the block being added reads from this job on */
	int loads;                  /* hf_src_load_into calls so far */
};

/* One piece of work of a batch: r's rows of tensor e (into r.dst, and
 * r.dst2 when another device of the host holds the same block); or,
 * with e NULL, r.n floats copied from src into r.dst (a block another
 * device of this host read in an earlier batch). */
struct hf_job {
	struct st_file *f;
	const struct st_entry *e;
	struct st_rows r;
	const float *src;
};

/* A job holds at most this many floats (4 MiB): big tensors are shared
 * out in pieces, rows of column splits gathered into pieces */
#define HF_JOB_FLOATS ((size_t)1 << 20)

bool hf_load_mmap(void)
{
	const char *v = getenv("MESHRUN_LOAD_MMAP");
	return v ? strcmp(v, "0") != 0 : true;
}

static int cmp_ent(const void *a, const void *b)
{
	return strcmp(((const struct hf_ent *)a)->name, ((const struct hf_ent *)b)->name);
}

static struct hf_ent *find_ent(const struct hf_src *s, const char *name)
{
	struct hf_ent key = { .name = name };
	return bsearch(&key, s->ents, (size_t)s->nents, sizeof(key), cmp_ent);
}

static bool ends_with(const char *s, const char *tail)
{
	size_t n = strlen(s), t = strlen(tail);
	return n >= t && !strcmp(s + n - t, tail);
}

/* FP8 checkpoints carry a scale per weight block; nothing here dequantizes them. */
static int refuse_fp8(const struct hf_src *s, const char *name, char *err, size_t errlen)
{
	if (!ends_with(name, "weight_scale_inv"))
		return 0;
	snprintf(err, errlen, "checkpoint: '%s' is an FP8 checkpoint (tensor '%s'), which meshrun does "
		 "not load: convert it to BF16 first", s->dir, name);
	return -EBADMSG;
}

static int add_file(struct hf_src *s, const char *name, char *err, size_t errlen)
{
	for (int i = 0; i < s->nfiles; i++)
		if (!strcmp(s->file_names[i], name))
			return i;
	if (!*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..")) {
		snprintf(err, errlen, "checkpoint: '%s/model.safetensors.index.json' names shard '%.200s', "
			 "not a file of the directory", s->dir, name);
		return -EBADMSG;
	}
	char **fn = realloc(s->file_names, sizeof(*fn) * (size_t)(s->nfiles + 1));
	if (fn)
		s->file_names = fn;
	if (!fn || !(fn[s->nfiles] = strdup(name))) {
		snprintf(err, errlen, "checkpoint: out of memory");
		return -ENOMEM;
	}
	return s->nfiles++;
}

/* The index's weight_map: each tensor's shard. Its shards are the files. */
static int read_index(struct hf_src *s, const char *path, cJSON **map, char *err, size_t errlen)
{
	struct stat st;
	cJSON *j = json_read_file(path, err, errlen);
	if (!j)
		return -EBADMSG;
	if (!stat(path, &st))
		s->index_bytes = (uint64_t)st.st_size;
	cJSON *wm = cJSON_DetachItemFromObjectCaseSensitive(j, "weight_map");
	cJSON_Delete(j);
	if (!cJSON_IsObject(wm)) {
		cJSON_Delete(wm);
		snprintf(err, errlen, "checkpoint: '%s' has no weight_map object", path);
		return -EBADMSG;
	}
	*map = wm;
	const cJSON *v;
	cJSON_ArrayForEach(v, wm) {
		int rc;
		if (!cJSON_IsString(v)) {
			snprintf(err, errlen, "checkpoint: '%s': weight_map entry '%.200s' is not a file name",
				 path, v->string);
			return -EBADMSG;
		}
		if ((rc = refuse_fp8(s, v->string, err, errlen)) || (rc = add_file(s, v->valuestring, err, errlen)) < 0)
			return rc;
	}
	return 0;
}

/* Every shard's tensors in one table sorted by name; a name in two
 * shards, or (with an index) where the index does not say, is refused. */
static int table(struct hf_src *s, const cJSON *map, char *err, size_t errlen)
{
	int n = 0;
	for (int f = 0; f < s->nfiles; f++)
		n += st_count(s->files[f]);
	s->ents = calloc(n ? (size_t)n : 1, sizeof(*s->ents));
	if (!s->ents) {
		snprintf(err, errlen, "checkpoint: out of memory for %d tensors", n);
		return -ENOMEM;
	}
	for (int f = 0; f < s->nfiles; f++)
		for (int i = 0; i < st_count(s->files[f]); i++) {
			const struct st_entry *e = st_entry_at(s->files[f], i);
			s->ents[s->nents++] = (struct hf_ent){ e->name, f, e, -1, false };
			int rc = refuse_fp8(s, e->name, err, errlen);
			if (rc)
				return rc;
		}
	qsort(s->ents, (size_t)s->nents, sizeof(*s->ents), cmp_ent);
	for (int i = 1; i < s->nents; i++)
		if (!strcmp(s->ents[i - 1].name, s->ents[i].name)) {
			snprintf(err, errlen, "checkpoint: tensor '%s' is in both '%s' and '%s'", s->ents[i].name,
				 st_path(s->files[s->ents[i - 1].file]), st_path(s->files[s->ents[i].file]));
			return -EBADMSG;
		}
	if (!map)
		return 0;
	for (int i = 0; i < s->nents; i++) {
		const struct hf_ent *t = &s->ents[i];
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(map, t->name);
		if (!v || strcmp(v->valuestring, s->file_names[t->file])) {
			snprintf(err, errlen, "checkpoint: '%s' holds tensor '%s', but the index %s%s%s",
				 st_path(s->files[t->file]), t->name, v ? "puts it in '" : "does not list it",
				 v ? v->valuestring : "", v ? "'" : "");
			return -EBADMSG;
		}
	}
	const cJSON *v;
	cJSON_ArrayForEach(v, map) {
		if (!find_ent(s, v->string)) {
			snprintf(err, errlen, "checkpoint: the index puts tensor '%s' in '%s', which has no such tensor",
				 v->string, v->valuestring);
			return -EBADMSG;
		}
	}
	return 0;
}

/* Opens dir's checkpoint: with file NULL the model (its index, or
 * model.safetensors), else that one file. */
static int src_open(struct hf_src **out, const char *dir, const char *file, int devices, char *err,
		    size_t errlen)
{
	char path[4200];
	cJSON *map = NULL;
	int rc;
	struct hf_src *s = calloc(1, sizeof(*s));
	*out = NULL;
	if (!s) {
		snprintf(err, errlen, "checkpoint: out of memory");
		return -ENOMEM;
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->devices = devices;
	s->check_rc = 1;
	s->threads = util_load_threads();
	s->mmap = hf_load_mmap();
	if (ckpt_find(dir, s->dir, sizeof(s->dir), NULL, err, errlen)) {
		rc = -EBADMSG;
		goto fail;
	}
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", s->dir);
	if (!file && !access(path, F_OK))
		rc = read_index(s, path, &map, err, errlen);
	else
		rc = add_file(s, file ? file : "model.safetensors", err, errlen) < 0 ? -ENOMEM : 0;
	if (rc)
		goto fail;
	s->files = calloc((size_t)s->nfiles + 1, sizeof(*s->files));
	if (!s->files) {
		snprintf(err, errlen, "checkpoint: out of memory");
		rc = -ENOMEM;
		goto fail;
	}
	for (int f = 0; f < s->nfiles; f++) {
		snprintf(path, sizeof(path), "%s/%s", s->dir, s->file_names[f]);
		if (!(s->files[f] = st_open_header(path, err, errlen))) {
			rc = -EBADMSG;
			goto fail;
		}
	}
	if ((rc = table(s, map, err, errlen)))
		goto fail;
	cJSON_Delete(map);
	*out = s;
	return 0;
fail:
	cJSON_Delete(map);
	hf_src_close(s);
	return rc == -ENOMEM ? rc : -EBADMSG;
}

int hf_src_open(struct hf_src **out, const char *dir, int devices, char *err, size_t errlen)
{
	return src_open(out, dir, NULL, devices, err, errlen);
}

int hf_src_open_file(struct hf_src **out, const char *dir, const char *file, int devices, char *err,
		     size_t errlen)
{
	return src_open(out, dir, file, devices, err, errlen);
}

const char *hf_src_meta(const struct hf_src *s, const char *key)
{
	return s->nfiles ? st_meta(s->files[0], key) : NULL;
}

const char *hf_src_dir(const struct hf_src *s)
{
	return s->dir;
}


void hf_src_close(struct hf_src *s)
{
	if (!s)
		return;
	for (int f = 0; s->files && f < s->nfiles; f++)
		st_close(s->files[f]);
	for (int f = 0; f < s->nfiles; f++)
		free(s->file_names[f]);
	free(s->file_names);
	free(s->files);
	free(s->ents);
	free(s->blocks);
	free(s->jobs);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s);
}

/* ---- checking every tensor against the model ---- */

static void shape_text(char *out, size_t n, int nd, const int64_t *s64, const int *s32)
{
	size_t used = 0;
	used += (size_t)snprintf(out, n, "[");
	for (int i = 0; i < nd && used < n; i++)
		used += (size_t)snprintf(out + used, n - used, "%s%lld", i ? ", " : "",
					 s64 ? (long long)s64[i] : (long long)s32[i]);
	if (used < n)
		snprintf(out + used, n - used, "]");
}

/* One tensor the model needs: there, of the whole shape, in a dtype that loads. */
static int check_one(struct hf_src *s, const char *name, int nd, const int *shape, char *err, size_t errlen)
{
	char want[64], got[64];
	struct hf_ent *t = find_ent(s, name);
	shape_text(want, sizeof(want), nd, NULL, shape);
	if (!t) {
		snprintf(err, errlen, "checkpoint: '%.300s' has no tensor '%.160s' (the model needs shape %s)", s->dir,
			 name, want);
		return -EBADMSG;
	}
	bool same = t->e->ndim == nd;
	for (int i = 0; same && i < nd; i++)
		same = t->e->shape[i] == shape[i];
	if (!same) {
		shape_text(got, sizeof(got), t->e->ndim, t->e->shape, NULL);
		snprintf(err, errlen, "checkpoint: '%.300s': tensor '%.160s' has shape %s, the model (config.json) "
			 "needs %s", st_path(s->files[t->file]), name, got, want);
		return -EBADMSG;
	}
	if (!t->e->loads) {
		snprintf(err, errlen, "checkpoint: '%.300s': tensor '%.160s' has dtype '%.20s' (only F32, BF16 and F16 load)",
			 st_path(s->files[t->file]), name, t->e->dtype);
		return -EBADMSG;
	}
	t->used = true;
	s->tensor_bytes += t->e->nbytes;
	return 0;
}

/* The decoder layer of a "model.layers.N." name, or -1. */
static int layer_of(const char *name)
{
	int l, n = 0;
	if (sscanf(name, "model.layers.%d.%n", &l, &n) != 1 || !n)
		return -1;
	return l;
}

/* What the model does not use: skipped when Hugging Face's model skips it
 * too, else refused as a tensor of no parameter. */
static int check_rest(struct hf_src *s, const struct model *m, char *err, size_t errlen)
{
	const struct model_dims *d = model_dims(m);
	for (int i = 0; i < s->nents; i++) {
		const struct hf_ent *t = &s->ents[i];
		int l = layer_of(t->name);
		char got[64];
		if (t->used)
			continue;
		if (l >= d->L) {  /* multi-token prediction: inference ignores it */
			s->skipped_mtp++;
			if (s->mtp_layer < 0 || l < s->mtp_layer)
				s->mtp_layer = l;
			continue;
		}
		if (ends_with(t->name, "rotary_emb.inv_freq") || (d->tied && !strcmp(t->name, "lm_head.weight"))) {
			s->skipped_other++;
			continue;
		}
		shape_text(got, sizeof(got), t->e->ndim, t->e->shape, NULL);
		snprintf(err, errlen, "checkpoint: '%.300s': tensor '%.160s' (shape %s) is not a tensor of this model "
			 "(config.json's)", st_path(s->files[t->file]), t->name, got);
		return -EBADMSG;
	}
	return 0;
}

/* The name of a parameter's slice with a dest's prefix ("m." for
 * AdamW's first moment in optimizer.safetensors). */
static int full_name(const struct model *m, const struct param_info *p, int layer, int expert,
		     const char *prefix, char *out, size_t outlen)
{
	size_t k = strlen(prefix);
	if (k >= outlen)
		return -ENAMETOOLONG;
	memcpy(out, prefix, k);
	return ckpt_hf_name(m, p, layer, expert, out + k, outlen - k);
}

/* Every tensor of the whole model (global shapes) under each prefix,
 * then the rest. */
static int check_all(struct hf_src *s, const struct model *m, const struct hf_dest *d, int nd,
		     char *err, size_t errlen)
{
	char name[192];
	int rc = 0;
	s->mtp_layer = -1;
	for (int k = 0; k < nd && !rc; k++)
		for (int i = 0; i < model_num_params(m) && !rc; i++) {
			const struct param_info *p = model_param(m, i);
			const int *g = p->global_shape;
			const char *pre = d[k].prefix;
			if (!p->stacked) {
				if (!(rc = full_name(m, p, -1, -1, pre, name, sizeof(name))))
					rc = check_one(s, name, p->ndim, g, err, errlen);
				continue;
			}
			int l0 = ckpt_hf_layer0(m, p);
			for (int l = 0; l < g[0] && !rc; l++) {
				if (!ckpt_hf_per_expert(p)) {
					if (!(rc = full_name(m, p, l0 + l, -1, pre, name, sizeof(name))))
						rc = check_one(s, name, p->ndim - 1, g + 1, err, errlen);
					continue;
				}
				for (int e = 0; e < g[1] && !rc; e++)
					if (!(rc = full_name(m, p, l0 + l, e, pre, name, sizeof(name))))
						rc = check_one(s, name, p->ndim - 2, g + 2, err, errlen);
			}
			if (rc && rc != -EBADMSG) {
				snprintf(err, errlen, "checkpoint: parameter '%s' has no Hugging Face name", p->name);
				rc = -EBADMSG;
			}
		}
	return rc ? rc : check_rest(s, m, err, errlen);
}

/* ---- reading blocks ---- */

/* Which floats of a dest's layout to fill: all (r NULL), or those in the
 * sorted, disjoint ranges r; base is the layout index of the block being
 * filled. */
struct want {
	const struct hf_range *r;
	int nr;
	size_t base;
};

/* The first range of w that ends after lo (w->nr when none). */
static int first_range(const struct want *w, size_t lo)
{
	int a = 0, b = w->nr;
	while (a < b) {
		int mid = (a + b) / 2;
		if (w->r[mid].hi <= lo)
			a = mid + 1;
		else
			b = mid;
	}
	return a;
}

/* Whether w wants every float of [lo, hi) (*all), or any (the result). */
static bool wanted(const struct want *w, size_t lo, size_t hi, bool *all)
{
	*all = true;
	if (!w->r || lo == hi)
		return lo < hi;
	int k = first_range(w, lo);
	*all = k < w->nr && w->r[k].lo <= lo && w->r[k].hi >= hi;
	return k < w->nr && w->r[k].lo < hi;
}

/* ---- the batch: reads and copies, done on the host's threads ---- */

static struct hf_job *new_job(struct hf_src *s, char *err, size_t errlen)
{
	if (s->njobs == s->capjobs) {
		int cap = s->capjobs ? 2 * s->capjobs : 1024;
		struct hf_job *nj = realloc(s->jobs, sizeof(*nj) * (size_t)cap);
		if (!nj) {
			snprintf(err, errlen, "checkpoint: out of memory for %d reads", cap);
			return NULL;
		}
		s->jobs = nj;
		s->capjobs = cap;
	}
	struct hf_job *j = &s->jobs[s->njobs++];
	*j = (struct hf_job){ .r.rows = 1 };
	return j;
}

/* Adds the read of n elements of t from `first` into dst: pieces of at
 * most HF_JOB_FLOATS, or one more row of the batch's last job, of the
 * same block, when it reads the same length at a steady stride (a column
 * split's rows). */
static int push_read(struct hf_src *s, struct hf_ent *t, uint64_t first, size_t n, float *dst, char *err,
		     size_t errlen)
{
	struct hf_job *l = s->njobs > s->block_job0 ? &s->jobs[s->njobs - 1] : NULL;
	struct st_rows *r = l ? &l->r : NULL;
	if (!n)
		return 0;
	if (l && l->e == t->e && r->n == n && (r->rows + 1) * n <= HF_JOB_FLOATS && first > r->first &&
	    dst > r->dst) {
		if (r->rows == 1) {
			r->fstride = first - r->first;
			r->dstride = dst - r->dst;
		}
		if (first == r->first + r->rows * r->fstride && dst == r->dst + (ptrdiff_t)r->rows * r->dstride) {
			r->rows++;
			return 0;
		}
	}
	for (size_t done = 0; done < n; done += HF_JOB_FLOATS) {
		struct hf_job *j = new_job(s, err, errlen);
		if (!j)
			return -ENOMEM;
		j->f = s->files[t->file];
		j->e = t->e;
		j->r.first = first + done;
		j->r.n = n - done < HF_JOB_FLOATS ? n - done : HF_JOB_FLOATS;
		j->r.dst = dst + done;
	}
	return 0;
}

static int push_copy(struct hf_src *s, float *dst, const float *src, size_t n, char *err, size_t errlen)
{
	for (size_t done = 0; done < n; done += HF_JOB_FLOATS) {
		struct hf_job *j = new_job(s, err, errlen);
		if (!j)
			return -ENOMEM;
		j->src = src + done;
		j->r.dst = dst + done;
		j->r.n = n - done < HF_JOB_FLOATS ? n - done : HF_JOB_FLOATS;
	}
	return 0;
}

/* The batch's threads share a counter of jobs taken and the first
 * failure in job order: a job is taken only after every job before it,
 * and taken jobs run to the end, so the failure reported is the first
 * one in tensor order however the threads ran. */
struct hf_run {
	struct hf_src *s;
	pthread_mutex_t mu;
	int next, stop;
	int fail_job, fail_rc;
	char fail_err[640];
};

static void *run_jobs(void *arg)
{
	struct hf_run *r = arg;
	const struct hf_src *s = r->s;
	uint16_t *buf = malloc(sizeof(uint16_t) * ST_BOUNCE);
	char err[640];
	for (;;) {
		int i = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED);
		if (i >= s->njobs || __atomic_load_n(&r->stop, __ATOMIC_RELAXED))
			break;
		const struct hf_job *j = &s->jobs[i];
		int rc = 0;
		if (!j->e) {
			util_copy_stream(j->r.dst, j->src, j->r.n);
		} else if (!buf) {
			snprintf(err, sizeof(err), "checkpoint: out of memory for a read buffer");
			rc = -ENOMEM;
		} else {
			rc = st_read_rows(j->f, j->e, &j->r, buf, ST_BOUNCE, err, sizeof(err));
		}
		if (rc) {
			pthread_mutex_lock(&r->mu);
			if (!r->fail_rc || i < r->fail_job) {
				r->fail_job = i;
				r->fail_rc = rc == -ENOMEM ? rc : -EIO;
				snprintf(r->fail_err, sizeof(r->fail_err), "%s", err);
			}
			pthread_mutex_unlock(&r->mu);
			__atomic_store_n(&r->stop, 1, __ATOMIC_RELAXED);
		}
	}
	free(buf);
	return NULL;
}

/* Maps the files the batch reads, when s reads through mappings: a file
 * that will not map (an address-space limit) is read with pread. */
static void map_files(struct hf_src *s)
{
	for (int i = 0; i < s->njobs && s->mmap; i++)
		if (s->jobs[i].e)
			st_map(s->jobs[i].f);
}

/* Runs the batch's jobs on s->threads threads (this one among them)
 * and empties it; the first failing job's error. */
static int run_batch(struct hf_src *s, char *err, size_t errlen)
{
	struct hf_run r = { .s = s };
	pthread_t th[64];
	int n = 0, want = s->threads - 1;
	if (want > s->njobs - 1)
		want = s->njobs - 1;
	pthread_mutex_init(&r.mu, NULL);
	map_files(s);
	while (n < want && !pthread_create(&th[n], NULL, run_jobs, &r))
		n++;  /* fewer threads when one cannot start: the work is the same */
	run_jobs(&r);
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&r.mu);
	for (int f = 0; f < s->nfiles; f++)
		st_unmap(s->files[f]);
	s->njobs = 0;
	s->block_job0 = 0;
	s->batch_block0 = s->nblocks;
	if (r.fail_rc)
		snprintf(err, errlen, "%s", r.fail_err);
	return r.fail_rc;
}

/* Adds the reads of the wanted parts of one run of n elements of t from
 * element `first` into dst (layout index lo). */
static int read_run(struct hf_src *s, struct hf_ent *t, const struct want *w, uint64_t first, size_t n,
		    float *dst, size_t lo, char *err, size_t errlen)
{
	size_t hi = lo + n;
	int rc = 0;
	if (!w->r)
		return push_read(s, t, first, n, dst, err, errlen);
	for (int k = first_range(w, lo); k < w->nr && w->r[k].lo < hi && !rc; k++) {
		size_t x = w->r[k].lo > lo ? w->r[k].lo : lo, y = w->r[k].hi < hi ? w->r[k].hi : hi;
		rc = push_read(s, t, first + (x - lo), y - x, dst + (x - lo), err, errlen);
	}
	return rc;
}

/* Remembers a block this device read whole, for the host's next device
 * that holds the same one. */
static int keep_block(struct hf_src *s, struct hf_ent *t, int nd, const int *off, const int *b,
		      const float *dst, char *err, size_t errlen)
{
	if (s->nblocks == s->capblocks) {
		int cap = s->capblocks ? 2 * s->capblocks : 256;
		struct hf_block *nb = realloc(s->blocks, sizeof(*nb) * (size_t)cap);
		if (!nb) {
			snprintf(err, errlen, "checkpoint: out of memory");
			return -ENOMEM;
		}
		s->blocks = nb;
		s->capblocks = cap;
	}
	struct hf_block *x = &s->blocks[s->nblocks];
	x->nd = nd;
	memcpy(x->off, off, sizeof(int) * (size_t)nd);
	memcpy(x->shape, b, sizeof(int) * (size_t)nd);
	x->data = dst;
	x->job0 = s->block_job0;
	x->job1 = s->njobs;
	x->next = t->first_block;
	t->first_block = s->nblocks++;
	return 0;
}

/* Makes dst (another device's copy of block x, of the batch not yet
 * run) the second destination of x's reads: written from the same read
 * of the file, while the values are in cache, instead of copied from x
 * afterwards. False when a read of x has one already (a third device). */
static bool second_dest(struct hf_src *s, const struct hf_block *x, float *dst)
{
	if (x->job1 <= x->job0)
		return false;
	for (int i = x->job0; i < x->job1; i++)
		if (s->jobs[i].r.dst2)
			return false;
	for (int i = x->job0; i < x->job1; i++)
		s->jobs[i].r.dst2 = dst + (s->jobs[i].r.dst - x->data);
	return true;
}

/* dst (the block, row-major) = the block at off of shape b of tensor t
 * (shape g, nd dims): a copy of one another device of this host read
 * whole, or runs of contiguous elements read from the file (only the
 * wanted parts of them). */
static int fill_block(struct hf_src *s, struct hf_ent *t, int nd, const int *g, const int *off,
		      const int *b, float *dst, const struct want *w, char *err, size_t errlen)
{
	size_t numel = 1;
	bool all;
	for (int i = 0; i < nd; i++)
		numel *= (size_t)b[i];
	if (!wanted(w, w->base, w->base + numel, &all))
		return 0;
	for (int k = t->first_block; k >= 0; k = s->blocks[k].next) {
		const struct hf_block *x = &s->blocks[k];
		if (x->nd == nd && !memcmp(x->off, off, sizeof(int) * (size_t)nd) &&
		    !memcmp(x->shape, b, sizeof(int) * (size_t)nd)) {
			if (k >= s->batch_block0 && second_dest(s, x, dst))
				return 0;
			/* a block of this batch that has its second destination
			 * already is read before it is copied */
			int rc = k >= s->batch_block0 ? run_batch(s, err, errlen) : 0;
			return rc ? rc : push_copy(s, dst, x->data, numel, err, errlen);
		}
	}
	s->block_job0 = s->njobs;
	/* dimensions after k are whole: a run is b[k] x the rest */
	int k = nd - 1;
	while (k > 0 && b[k] == g[k])
		k--;
	size_t run = 1, stride[MODEL_MAX_DIMS], idx[MODEL_MAX_DIMS] = { 0 };
	for (int j = nd - 1; j >= 0; j--) {
		stride[j] = j == nd - 1 ? 1 : stride[j + 1] * (size_t)g[j + 1];
		if (j >= k)
			run *= (size_t)b[j];
	}
	for (size_t r = 0; r * run < numel; r++) {
		uint64_t first = nd ? (uint64_t)off[k] * stride[k] : 0;
		for (int j = 0; j < k; j++)
			first += (uint64_t)(off[j] + (int)idx[j]) * stride[j];
		int rc = read_run(s, t, w, first, run, dst + r * run, w->base + r * run, err, errlen);
		if (rc)
			return rc;
		for (int j = k - 1; j >= 0; j--) {  /* next multi-index over the dims before k */
			if (++idx[j] < (size_t)b[j])
				break;
			idx[j] = 0;
		}
	}
	/* a block read in part is no use to another device */
	return all ? keep_block(s, t, nd, off, b, dst, err, errlen) : 0;
}

/* This device's block of one HF tensor: dims [from, ndim) of p. */
static int fill_slice(struct hf_src *s, const struct model *m, const struct param_info *p, int layer,
		      int expert, int from, const char *prefix, float *dst, struct want *w, char *err,
		      size_t errlen)
{
	char name[192];
	struct hf_ent *t;
	if (full_name(m, p, layer, expert, prefix, name, sizeof(name)) || !(t = find_ent(s, name))) {
		snprintf(err, errlen, "checkpoint: no tensor for parameter '%s'", p->name);
		return -EBADMSG;
	}
	return fill_block(s, t, p->ndim - from, p->global_shape + from, p->goff + from, p->shape + from,
			  dst, w, err, errlen);
}

/* This device's shards of every parameter, into buf in m's layout. */
static int fill_all(struct hf_src *s, const struct model *m, const char *prefix, float *buf,
		    const struct hf_range *r, int nr, char *err, size_t errlen)
{
	struct want w = { .r = nr ? r : NULL, .nr = nr };
	int rc = 0;
	for (int i = 0; i < model_num_params(m) && !rc; i++) {
		const struct param_info *p = model_param(m, i);
		if (!p->numel)
			continue;
		if (!p->stacked) {
			w.base = p->offset;
			rc = fill_slice(s, m, p, -1, -1, 0, prefix, buf + w.base, &w, err, errlen);
			continue;
		}
		int l0 = ckpt_hf_layer0(m, p);
		size_t per = p->numel / (size_t)p->shape[0];
		for (int q = 0; q < p->shape[0] && !rc; q++) {
			/* storage index goff[0] + q holds this layer (a pipeline's order) */
			int layer = l0 + model_stack_layer(m, p->goff[0] + q, p->global_shape[0]);
			size_t slice = p->offset + per * (size_t)q;
			if (!ckpt_hf_per_expert(p)) {
				w.base = slice;
				rc = fill_slice(s, m, p, layer, -1, 1, prefix, buf + w.base, &w, err, errlen);
				continue;
			}
			size_t pe = per / (size_t)p->shape[1];
			for (int x = 0; x < p->shape[1] && !rc; x++) {
				w.base = slice + pe * (size_t)x;
				rc = fill_slice(s, m, p, layer, p->goff[1] + x, 2, prefix, buf + w.base, &w, err,
						errlen);
			}
		}
	}
	return rc;
}

int hf_src_load_into(struct hf_src *s, const struct model *m, const struct hf_dest *d, int nd,
		     const struct hf_range *r, int nr, char *err, size_t errlen)
{
	pthread_mutex_lock(&s->mu);
	if (!s->t0)
		s->t0 = util_now_s();
	if (s->check_rc == 1)
		s->check_rc = check_all(s, m, d, nd, s->check_err, sizeof(s->check_err));
	int rc = s->check_rc;
	if (rc)
		snprintf(err, errlen, "%s", s->check_err);
	for (int k = 0; k < nd && !rc; k++)
		rc = fill_all(s, m, d[k].prefix, d[k].buf, r, nr, err, errlen);
	/* the host's last device runs the batch, so a block several devices
	 * hold is read once into all of them; a batch not run (an error
	 * adding to it) is dropped, and every device fails (hf_src_done) */
	int brc = 0;
	if (rc)
		s->njobs = 0;
	else if (++s->loads >= s->devices)
		brc = run_batch(s, err, errlen);
	rc = rc ? rc : brc;
	s->t1 = util_now_s();
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int hf_src_load(struct hf_src *s, const struct model *m, float *params, char *err, size_t errlen)
{
	struct hf_dest d = { .prefix = "", .buf = params };
	return hf_src_load_into(s, m, &d, 1, NULL, 0, err, errlen);
}

int hf_src_done(struct hf_src *s, int rc, char *err, size_t errlen)
{
	pthread_mutex_lock(&s->mu);
	s->arrived++;
	if (rc && !s->fail_rc) {
		s->fail_rc = rc;
		snprintf(s->fail_err, sizeof(s->fail_err), "%s", err);
	}
	if (s->arrived == s->devices && s->njobs) {
		/* a device never loaded: its siblings' reads are not run when
		 * one failed, else run now */
		int brc = s->fail_rc ? (s->njobs = 0) : run_batch(s, s->fail_err, sizeof(s->fail_err));
		if (brc)
			s->fail_rc = brc;
		s->t1 = util_now_s();
	}
	pthread_cond_broadcast(&s->cv);
	while (s->arrived < s->devices)
		pthread_cond_wait(&s->cv, &s->mu);
	if (!rc && s->fail_rc) {
		rc = s->fail_rc;
		snprintf(err, errlen, "%s", s->fail_err);
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int hf_src_load_done(struct hf_src *s, const struct model *m, float *params, char *err, size_t errlen)
{
	return hf_src_done(s, hf_src_load(s, m, params, err, errlen), err, errlen);
}

uint64_t hf_src_bytes_read(const struct hf_src *s)
{
	uint64_t n = s->index_bytes;
	for (int f = 0; f < s->nfiles; f++)
		n += st_bytes_read(s->files[f]);
	return n;
}

void hf_src_counts(const struct hf_src *s, struct hf_src_count *c)
{
	c->headers = s->index_bytes;
	for (int f = 0; f < s->nfiles; f++)
		c->headers += st_header_bytes(s->files[f]);
	c->read = hf_src_bytes_read(s);
	c->tensors = c->read - c->headers;
	c->all = s->tensor_bytes;
	c->seconds = s->t1 - s->t0;
}

void hf_src_summary(const struct hf_src *s, char *out, size_t outlen)
{
	struct hf_src_count c;
	hf_src_counts(s, &c);
	uint64_t head = c.headers, all = c.read;
	int used = snprintf(out, outlen, "load: read %llu bytes of '%s' on this host (index and headers %llu, "
			    "tensors %llu of the checkpoint's %llu) from %d file%s in %.2f s",
			    (unsigned long long)all, s->dir, (unsigned long long)head,
			    (unsigned long long)(all - head), (unsigned long long)s->tensor_bytes, s->nfiles,
			    s->nfiles == 1 ? "" : "s", s->t1 - s->t0);
	if (s->skipped_mtp && used > 0 && (size_t)used < outlen)
		used += snprintf(out + used, outlen - (size_t)used, "; skipped %d tensors of the "
				 "multi-token-prediction layer %d and beyond (not a decoder layer)",
				 s->skipped_mtp, s->mtp_layer);
	if (s->skipped_other && used > 0 && (size_t)used < outlen)
		snprintf(out + used, outlen - (size_t)used, "; skipped %d tensors the model ties or "
			 "computes (lm_head.weight tied, rotary inv_freq)", s->skipped_other);
}
