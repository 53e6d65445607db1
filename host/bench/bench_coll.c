/* `meshrun bench collectives`, the job: every device thread runs the timed loop
 * (barrier, collective; mean per iteration, max over ranks) and then checks
 * every element of one more run against inputs whose expected results are
 * exact small integers. Bandwidths are defined as in nccl-tests. */
#include "host/bench/bench_coll.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/agent/agent.h"
#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/util/clock.h"
#include "host/util/mix.h"
#include "net/coll.h"

const char *const bench_coll_op_names[B_NOPS] = {
	"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "permute", "broadcast",
};
#define bop_names bench_coll_op_names

/* exact small integers: any sum over <= 4096 devices is exact */
static float val(int dev, size_t i, int salt)
{
	return (float)((dev * 37 + (int)(i % 1009) * 3 + salt * 11) % 61) - 20.0f;
}

/* all_to_all block from rank r to rank q: `per` floats, or uneven with
 * zeros in check mode */
static size_t a2a_count(int r, int q, size_t per, bool uneven)
{
	if (!uneven)
		return per;
	return ((r + 2 * q) % 3 == 0) ? 0 : per + (size_t)((r * 5 + q * 3) % 7);
}

static float a2a_val(int r, int q, size_t i)
{
	return (float)(((r * 64 + q * 8) % 2039) + (int)(i % 8));
}

/* One case: op at `count` (per-rank count for check mode; derived from a
 * byte size in timed mode). */
struct ccase {
	int op;
	size_t count;             /* floats: see setup() */
	int shift, root;
	bool uneven;
	/* all_gather and reduce_scatter in their list forms (coll_*_v):
	 * the concatenation is runs of `run` floats, each at a stride of
	 * run + 1 in s->lst (a gap float between runs that must survive) */
	size_t run;
};

struct dev_state {
	struct device_ctx *dc;
	struct coll_dev *cd;
	struct coll_group g;
	struct mesh_group mg;
	float *in, *out;
	size_t cap_in, cap_out;
	float *lst;               /* a list case's runs (struct ccase.run) */
	size_t cap_lst;
	struct coll_iov *iov;
	size_t cap_iov;
	int niov;
	size_t *sb, *rb;          /* all_to_all sizes, bytes */
	size_t first_bad;         /* first wrong element, or SIZE_MAX */
	float got, want;
	bool async;               /* bench_opts.async */
};

static int reserve(float **p, size_t *cap, size_t n)
{
	if (n <= *cap && *p)  /* never NULL, even for 0 (memset's argument) */
		return 0;
	free(*p);
	*p = malloc(n * sizeof(float) + 64);
	if (!*p) {
		*cap = 0;
		return -1;
	}
	*cap = n;
	return 0;
}

#define LIST_GAP 7777.0f

/* The floats of a list case's runs: all_reduce's buffer, the others'
 * n blocks. */
static size_t list_total(const struct dev_state *s, const struct ccase *c)
{
	return c->op == B_AR ? c->count : c->count * (size_t)s->g.n;
}

/* A list case (c->run): all_gather's own block, or reduce_scatter's or
 * all_reduce's whole input, laid out over runs with gaps; the same
 * values as the contiguous op's. */
static int setup_list(struct dev_state *s, const struct ccase *c, int salt)
{
	int n = s->g.n, r = s->g.rank, dev = s->dc->device_id;
	size_t total = list_total(s, c), run = c->run, nrun = (total + run - 1) / run;
	if (reserve(&s->lst, &s->cap_lst, total + nrun + 1))
		return -1;
	if (nrun + 1 > s->cap_iov) {
		free(s->iov);
		s->cap_iov = 0;
		if (!(s->iov = malloc(sizeof(*s->iov) * (nrun + 1))))
			return -1;
		s->cap_iov = nrun + 1;
	}
	s->niov = (int)nrun;
	for (size_t j = 0; j < nrun; j++)
		s->iov[j] = (struct coll_iov){ s->lst + j * (run + 1),
					      total - j * run < run ? total - j * run : run };
	for (size_t k = 0; k < total + nrun; k++)
		s->lst[k] = LIST_GAP;
	for (size_t k = 0; k < total; k++) {
		bool mine = k / c->count == (size_t)r;
		if (c->op != B_AG || mine)
			s->lst[k + k / run] = c->op != B_AG ? val(dev, k, salt)
							     : val(dev, k % c->count, salt);
	}
	for (int b = 0; b < n; b++)
		s->sb[b] = c->count;    /* the blocks' counts (floats) */
	return 0;
}

/* Sizes the buffers for case c and fills inputs. */
static int setup(struct dev_state *s, const struct ccase *c, int salt)
{
	int n = s->g.n, r = s->g.rank, dev = s->dc->device_id;
	size_t cnt = c->count, nin = 0, nout = 0;
	switch (c->op) {
	case B_AG: nin = cnt; nout = cnt * (size_t)n; break;
	case B_RS: nin = cnt * (size_t)n; nout = cnt; break;
	case B_AR: nin = 0; nout = cnt; break;
	case B_PERM: nin = cnt; nout = cnt; break;
	case B_BCAST: nin = 0; nout = cnt; break;
	case B_A2A:
		for (int q = 0; q < n; q++) {
			s->sb[q] = a2a_count(r, q, cnt, c->uneven);
			s->rb[q] = a2a_count(q, r, cnt, c->uneven);
			nin += s->sb[q];
			nout += s->rb[q];
		}
		break;
	}
	if (reserve(&s->in, &s->cap_in, nin) || reserve(&s->out, &s->cap_out, nout))
		return -1;
	if (c->run)
		return setup_list(s, c, salt);
	switch (c->op) {
	case B_AG:
	case B_RS:
	case B_PERM:
		for (size_t i = 0; i < nin; i++)
			s->in[i] = val(dev, i, salt);
		memset(s->out, 0, nout * sizeof(float));
		break;
	case B_AR:
	case B_BCAST:
		for (size_t i = 0; i < nout; i++)
			s->out[i] = val(dev, i, salt);
		break;
	case B_A2A: {
		size_t o = 0;
		for (int q = 0; q < n; q++)
			for (size_t i = 0; i < s->sb[q]; i++)
				s->in[o++] = a2a_val(r, q, i);
		memset(s->out, 0, nout * sizeof(float));
		for (int q = 0; q < n; q++) {
			s->sb[q] *= sizeof(float);
			s->rb[q] *= sizeof(float);
		}
		break;
	}
	}
	return 0;
}

/* The async form of c (NULL with err for ops that have none, or a bad
 * argument); coll_wait finishes it. */
static struct coll_handle *start_async(struct dev_state *s, const struct ccase *c, char *err,
				       size_t errlen)
{
	size_t cnt = c->count;
	if (c->run && c->op == B_AR)
		return coll_all_reduce_v_async(s->cd, &s->g, s->iov, s->niov, err, errlen);
	if (c->run)
		return c->op == B_AG ? coll_all_gather_v_async(s->cd, &s->g, s->iov, s->niov, s->sb,
							       err, errlen)
				     : coll_reduce_scatter_v_async(s->cd, &s->g, s->iov, s->niov,
								   s->sb, err, errlen);
	switch (c->op) {
	case B_AG:
		return coll_all_gather_async(s->cd, &s->g, s->out, s->in, cnt * sizeof(float), err,
					     errlen);
	case B_RS:
		return coll_reduce_scatter_async(s->cd, &s->g, s->out, s->in, cnt, err, errlen);
	case B_AR:
		return coll_all_reduce_async(s->cd, &s->g, s->out, cnt, err, errlen);
	case B_PERM:
		return coll_permute_async(s->cd, &s->g, s->out, s->in, cnt * sizeof(float), c->shift,
					  err, errlen);
	}
	return NULL;
}

static bool has_async(int op)
{
	return op == B_AG || op == B_RS || op == B_AR || op == B_PERM;
}

static int run_case(struct dev_state *s, const struct ccase *c, char *err, size_t errlen)
{
	size_t cnt = c->count;
	if (s->async && has_async(c->op)) {
		struct coll_handle *h = start_async(s, c, err, errlen);
		if (!h)
			return -EINVAL;
		return coll_wait(h, xport_now_ns() + (uint64_t)(s->dc->cfg->collective_timeout_s * 1e9),
				 err, errlen);
	}
	if (c->run && c->op == B_AR)
		return coll_all_reduce_v(s->cd, &s->g, s->iov, s->niov, err, errlen);
	if (c->run)
		return c->op == B_AG ? coll_all_gather_v(s->cd, &s->g, s->iov, s->niov, s->sb, err,
							 errlen)
				     : coll_reduce_scatter_v(s->cd, &s->g, s->iov, s->niov, s->sb, err,
							     errlen);
	switch (c->op) {
	case B_AG:
		return coll_all_gather(s->cd, &s->g, s->out, s->in, cnt * sizeof(float), err, errlen);
	case B_RS:
		return coll_reduce_scatter(s->cd, &s->g, s->out, s->in, cnt, err, errlen);
	case B_AR:
		return coll_all_reduce(s->cd, &s->g, s->out, cnt, err, errlen);
	case B_A2A:
		return coll_all_to_all(s->cd, &s->g, s->out, s->rb, s->in, s->sb, err, errlen);
	case B_PERM:
		return coll_permute(s->cd, &s->g, s->out, s->in, cnt * sizeof(float), c->shift,
				    err, errlen);
	case B_BCAST:
		return coll_broadcast(s->cd, &s->g, s->out, cnt * sizeof(float), c->root, err, errlen);
	}
	return -EINVAL;
}

static void note_bad(struct dev_state *s, size_t idx, float got, float want, uint64_t *wrong)
{
	if (!*wrong) {
		s->first_bad = idx;
		s->got = got;
		s->want = want;
	}
	(*wrong)++;
}

/* A list case: every run's gap intact, and the output (all_gather's
 * concatenation, reduce_scatter's own block) moved to s->out for the
 * checks of the contiguous op. */
static uint64_t list_out(struct dev_state *s, const struct ccase *c)
{
	size_t total = list_total(s, c), run = c->run, nrun = (total + run - 1) / run;
	uint64_t wrong = 0;
	for (size_t j = 0; j + 1 < nrun; j++)
		if (s->lst[j * (run + 1) + run] != LIST_GAP)
			note_bad(s, j * (run + 1) + run, s->lst[j * (run + 1) + run], LIST_GAP, &wrong);
	size_t k0 = c->op == B_RS ? (size_t)s->g.rank * c->count : 0;
	size_t nk = c->op == B_RS ? c->count : total;
	for (size_t k = 0; k < nk; k++)
		s->out[k] = s->lst[k0 + k + (k0 + k) / run];
	return wrong;
}

/* Counts elements of the output that differ from the expected result. */
static uint64_t verify(struct dev_state *s, const struct ccase *c, int salt)
{
	int n = s->g.n, r = s->g.rank;
	const int *devs = s->g.devs;
	size_t cnt = c->count;
	uint64_t wrong = 0;
	s->first_bad = SIZE_MAX;
	if (c->run && (wrong = list_out(s, c)))
		return wrong;
	switch (c->op) {
	case B_AG:
		for (size_t k = 0; k < cnt * (size_t)n; k++) {
			float want = val(devs[k / cnt], k % cnt, salt);
			if (s->out[k] != want)
				note_bad(s, k, s->out[k], want, &wrong);
		}
		break;
	case B_RS:
	case B_AR:
		for (size_t i = 0; i < cnt; i++) {
			size_t src_i = c->op == B_RS ? (size_t)r * cnt + i : i;
			float want = 0;
			for (int p = 0; p < n; p++)
				want += val(devs[p], src_i, salt);
			if (s->out[i] != want)
				note_bad(s, i, s->out[i], want, &wrong);
		}
		break;
	case B_PERM: {
		int sh = ((c->shift % n) + n) % n;
		int from = devs[(r - sh + n) % n];
		for (size_t i = 0; i < cnt; i++) {
			float want = val(from, i, salt);
			if (s->out[i] != want)
				note_bad(s, i, s->out[i], want, &wrong);
		}
		break;
	}
	case B_BCAST:
		for (size_t i = 0; i < cnt; i++) {
			float want = val(devs[c->root], i, salt);
			if (s->out[i] != want)
				note_bad(s, i, s->out[i], want, &wrong);
		}
		break;
	case B_A2A: {
		size_t o = 0;
		for (int q = 0; q < n; q++)
			for (size_t i = 0; i < s->rb[q] / sizeof(float); i++, o++) {
				float want = a2a_val(q, r, i);
				if (s->out[o] != want)
					note_bad(s, o, s->out[o], want, &wrong);
			}
		break;
	}
	}
	return wrong;
}

/* ---- CPU per thread of this agent (to see where the cipher runs) ---- */

#define MAX_THREADS 64

struct thr_cpu {
	int tid;
	char name[16];
	uint64_t ns;              /* on a CPU so far (schedstat) */
};

/* Every thread of this process with its CPU time so far; the count. */
static int thread_cpu(struct thr_cpu *t, int max)
{
	DIR *d = opendir("/proc/self/task");
	int n = 0;
	if (!d)
		return 0;
	for (struct dirent *e; n < max && (e = readdir(d));) {
		char path[300];
		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		t[n].tid = atoi(e->d_name);
		snprintf(path, sizeof(path), "/proc/self/task/%s/schedstat", e->d_name);
		FILE *f = fopen(path, "r");
		unsigned long long ns = 0;
		if (!f)
			continue;
		if (fscanf(f, "%llu", &ns) != 1)
			ns = 0;
		fclose(f);
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		f = fopen(path, "r");
		t[n].name[0] = 0;
		if (f) {
			if (fgets(t[n].name, sizeof(t[n].name), f))
				t[n].name[strcspn(t[n].name, "\n")] = 0;
			fclose(f);
		}
		t[n].ns = ns;
		n++;
	}
	closedir(d);
	return n;
}

/* "# threads SIZE: host 0's CPU us per iteration: mr-dev0 12.3 ..." for
 * the threads that ran between `before` and `now`. */
static void print_thread_cpu(size_t size, const struct thr_cpu *before, int nb,
			     const struct thr_cpu *now, int k, int iters)
{
	printf("# threads %zu: host 0's CPU us per iteration:", size);
	for (int i = 0; i < k; i++) {
		uint64_t was = 0;
		for (int j = 0; j < nb; j++)
			if (before[j].tid == now[i].tid)
				was = before[j].ns;
		double us = (double)(now[i].ns - was) / 1e3 / iters;
		if (us >= 0.05)
			printf(" %s %.1f", now[i].name, us);
	}
	printf("\n");
}

/* What every rank contributes to the summary: time and wrong count. */
struct rank_stat {
	double time_us;
	double cpu_us;            /* the agent process's user+sys over the timed
				   * loop, per iteration; first device of a host only */
	double loop_us;           /* wall time of the timed loop, barriers
				   * included, per iteration */
	uint64_t wrong;
	uint64_t dcn_bytes;       /* payload this device sent to other hosts
				   * in the timed loop, all iterations */
	uint64_t hash;            /* --check-bits: FNV-1a of the result */
};

static int gather_stats(struct dev_state *s, struct rank_stat *mine, struct rank_stat *all,
			char *err, size_t errlen)
{
	return coll_all_gather(s->cd, &s->g, all, mine, sizeof(*mine), err, errlen);
}

static void case_label(const struct ccase *c, char *buf, size_t len)
{
	if (c->op == B_PERM)
		snprintf(buf, len, "%s shift %+d", bop_names[c->op], c->shift);
	else if (c->op == B_BCAST)
		snprintf(buf, len, "%s root %d", bop_names[c->op], c->root);
	else if (c->run)
		snprintf(buf, len, "%s_v runs %zu", bop_names[c->op], c->run);
	else
		snprintf(buf, len, "%s", bop_names[c->op]);
}

/* Values whose sums round, so another summation order shows in the bits. */
static float rough(int dev, size_t i)
{
	return (float)((dev * 7919 + (long)(i % 100003) * 104729) % 100003) / 997.0f * (i % 2 ? 1 : -1) +
	       1e-3f * (float)dev;
}

static uint64_t fnv(const float *p, size_t n)
{
	return fnv1a(p, n * sizeof(float));
}

/* --check-bits' input: rough values over c's buffer (in place: the runs
 * with their gaps; contiguous: buf) for n floats */
static void fill_rough(struct dev_state *s, const struct ccase *c, float *buf, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (c->run)
			s->lst[i + i / c->run] = rough(s->dc->device_id, i);
		else
			buf[i] = rough(s->dc->device_id, i);
	}
}

/* --check-bits: all_reduce, contiguous and over runs, of values that
 * round, twice at every count: every rank's result and the rerun's must
 * be the same bits. Prints each result's hash so separate jobs (a rerun,
 * another setting) can be compared. Adds the cases that differ to *bad. */
static int check_bits(struct dev_state *s, const struct bench_opts *o, struct rank_stat *all,
		      uint64_t *bad)
{
	struct device_ctx *dc = s->dc;
	int n = s->g.n, rc;
	for (int ci = 0; ci < o->ncounts; ci++) {
		for (int list = 0; list < 2; list++) {
			struct ccase c = { .op = B_AR, .count = o->counts[ci], .run = list ? 128 : 0 };
			uint64_t first = 0;
			bool same = true;
			for (int rerun = 0; rerun < 2; rerun++) {
				if (setup(s, &c, 0))
					return -EIO;
				fill_rough(s, &c, s->out, c.count);
				if ((rc = run_case(s, &c, dc->err, sizeof(dc->err))))
					return rc == -EINVAL ? -EIO : -EHOSTDOWN;
				struct rank_stat mine = { .wrong = list ? list_out(s, &c) : 0,
							  .hash = fnv(s->out, c.count) };
				if ((rc = gather_stats(s, &mine, all, dc->err, sizeof(dc->err))))
					return -EHOSTDOWN;
				if (!rerun)
					first = all[0].hash;
				for (int p = 0; p < n; p++)
					same = same && !all[p].wrong && all[p].hash == first;
			}
			if (!same)
				(*bad)++;
			if (dc->device_id == 0)
				printf("bits all_reduce%s count %-9zu %016llx %s\n", list ? "_v" : "  ",
				       c.count, (unsigned long long)first,
				       same ? "on every rank, rerun the same" : "mismatch between ranks or runs");
		}
		/* reduce_scatter, contiguous and over runs: each rank's block
		 * the same bits in both forms */
		uint64_t h[2] = { 0, 0 };
		for (int list = 0; list < 2; list++) {
			struct ccase c = { .op = B_RS, .count = o->counts[ci], .run = list ? 128 : 0 };
			size_t total = c.count * (size_t)n;
			if (setup(s, &c, 0))
				return -EIO;
			fill_rough(s, &c, s->in, total);
			if ((rc = run_case(s, &c, dc->err, sizeof(dc->err))))
				return rc == -EINVAL ? -EIO : -EHOSTDOWN;
			if (list && list_out(s, &c))
				h[1] = ~h[0];   /* a gap overwritten: differs */
			else
				h[list] = fnv(s->out, c.count);
		}
		struct rank_stat mine = { .wrong = h[0] != h[1] };
		if ((rc = gather_stats(s, &mine, all, dc->err, sizeof(dc->err))))
			return -EHOSTDOWN;
		bool same = true;
		for (int p = 0; p < n; p++)
			same = same && !all[p].wrong;
		if (!same)
			(*bad)++;
		if (dc->device_id == 0)
			printf("bits reduce_scatter count %-9zu %s\n", o->counts[ci],
			       same ? "contiguous and list the same on every rank" : "contiguous and list differ");
	}
	return 0;
}

/* Check mode: every op at every count; returns 0 or -errno. */
static int check_all(struct dev_state *s, const struct bench_opts *o, struct rank_stat *all)
{
	struct device_ctx *dc = s->dc;
	int n = s->g.n;
	uint64_t total_wrong = 0;
	int salt = 0;
	for (int ci = 0; ci < o->ncounts; ci++) {
		struct ccase cases[16];
		int nc = 0;
		size_t cnt = o->counts[ci];
		if (!o->lists_only) {
			cases[nc++] = (struct ccase){ .op = B_AG, .count = cnt };
			cases[nc++] = (struct ccase){ .op = B_RS, .count = cnt };
			cases[nc++] = (struct ccase){ .op = B_AR, .count = cnt };
			cases[nc++] = (struct ccase){ .op = B_A2A, .count = cnt, .uneven = true };
			cases[nc++] = (struct ccase){ .op = B_PERM, .count = cnt, .shift = 1 };
			cases[nc++] = (struct ccase){ .op = B_PERM, .count = cnt, .shift = -1 };
			cases[nc++] = (struct ccase){ .op = B_PERM, .count = cnt, .shift = 2 };
			cases[nc++] = (struct ccase){ .op = B_BCAST, .count = cnt, .root = 0 };
			cases[nc++] = (struct ccase){ .op = B_BCAST, .count = cnt, .root = n - 1 };
		}
		/* the list forms over FSDP rows, a message over many runs of
		 * 128 floats; beside the others at most 256K floats a rank
		 * (their lines say the count: a test's time), above that over
		 * runs of 8192 (longer than a record: written where they lie) */
		size_t cap = o->lists_only ? SIZE_MAX : (1u << 18), lc = cnt < cap ? cnt : cap;
		size_t run = cnt > (1u << 18) ? 8192 : 128;
		cases[nc++] = (struct ccase){ .op = B_AG, .count = lc, .run = run };
		cases[nc++] = (struct ccase){ .op = B_RS, .count = lc, .run = run };
		cases[nc++] = (struct ccase){ .op = B_AR, .count = lc, .run = run };
		for (int k = 0; k < nc; k++) {
			const struct ccase *c = &cases[k];
			char label[64];
			case_label(c, label, sizeof(label));
			salt++;
			if (setup(s, c, salt)) {
				snprintf(dc->err, sizeof(dc->err), "bench collectives: out of memory");
				return -ENOMEM;
			}
			int rc = run_case(s, c, dc->err, sizeof(dc->err));
			if (rc)
				return rc == -EINVAL ? -EIO : -EHOSTDOWN;
			if (o->corrupt && s->g.rank == 0 && c->op == B_AR && cnt)
				s->out[cnt / 2] += 1.0f;
			struct rank_stat mine = { .wrong = verify(s, c, salt) };
			if (mine.wrong)
				fprintf(stderr, "mismatch: %s count %zu on device %d: element %zu is %.9g, "
					"want %.9g (%llu wrong)\n", label, c->count, dc->device_id,
					s->first_bad, s->got, s->want, (unsigned long long)mine.wrong);
			if ((rc = gather_stats(s, &mine, all, dc->err, sizeof(dc->err))))
				return -EHOSTDOWN;
			uint64_t w = 0;
			for (int p = 0; p < n; p++)
				w += all[p].wrong;
			total_wrong += w;
			if (dc->device_id == 0)
				printf("check %-18s count %-9zu wrong %llu\n", label, c->count,
				       (unsigned long long)w);
		}
	}
	if (o->check_bits) {
		int rc = check_bits(s, o, all, &total_wrong);
		if (rc)
			return rc;
	}
	if (dc->device_id == 0) {
		if (total_wrong)
			printf("check failed: %llu wrong elements\n", (unsigned long long)total_wrong);
		else
			printf("check ok: %d ops x %d counts on %d devices%s\n", o->lists_only ? 3 : 12,
			       o->ncounts, n,
			       o->async ? " (async forms)" : "");
		fflush(stdout);
	}
	if (total_wrong) {
		snprintf(dc->err, sizeof(dc->err), "bench collectives: %llu wrong elements",
			 (unsigned long long)total_wrong);
		return -EIO;
	}
	return 0;
}

/* Timed mode: one table per op. */
static int time_op(struct dev_state *s, const struct bench_opts *o, int op, struct rank_stat *all)
{
	struct device_ctx *dc = s->dc;
	int n = s->g.n;
	if (dc->device_id == 0) {
		printf("# %s: %d hosts x %d devices, segment %lld bytes, %d iters, %d warmup, %s\n",
		       bop_names[op], dc->mesh->num_hosts, dc->mesh->devices_per_host,
		       (long long)dc->cfg->segment_bytes, o->iters, o->warmup,
		       o->barrier ? "barrier before each" : "timed back to back");
		printf("# %12s %12s %12s %11s %11s %6s\n", "size", "count", "time_us", "algbw_GBps",
		       "busbw_GBps", "wrong");
		fflush(stdout);
	}
	double cpu_us[BENCH_MAX_LIST] = { 0 }, busy[BENCH_MAX_LIST] = { 0 };
	size_t row_bytes[BENCH_MAX_LIST] = { 0 };   /* the size column of each row */
	uint64_t dcn_host0[BENCH_MAX_LIST] = { 0 }, dcn_all[BENCH_MAX_LIST] = { 0 };
	for (int si = 0; si < o->nsizes; si++) {
		/* size = the full buffer as nccl-tests defines it */
		size_t floats = o->sizes[si] / sizeof(float);
		struct ccase c = { .op = op, .shift = 1, .root = 0 };
		size_t size_floats;
		switch (op) {
		case B_AG:
		case B_RS:
		case B_A2A:
			c.count = floats / (size_t)n;
			size_floats = c.count * (size_t)n;
			break;
		default:
			c.count = floats;
			size_floats = floats;
			break;
		}
		int salt = 100 + si;
		if (setup(s, &c, salt)) {
			snprintf(dc->err, sizeof(dc->err), "bench collectives: out of memory");
			return -EIO;
		}
		int rc;
		for (int it = 0; it < o->warmup; it++)
			if ((rc = run_case(s, &c, dc->err, sizeof(dc->err))))
				return -EHOSTDOWN;
		/* default: one barrier, then iters back to back, as nccl-tests
		 * times them (throughput view, the one bench link's stream
		 * matches). --barrier: a barrier before every timed collective,
		 * so each one pays its own start-up and drains its own tail
		 * (latency view). */
		struct thr_cpu thr0[MAX_THREADS];
		int nthr0 = dc->device_id == 0 ? thread_cpu(thr0, MAX_THREADS) : 0;
		double total = 0, cpu0 = util_cpu_us();
		uint64_t loop0 = xport_now_ns(), dcn0 = 0;
		for (int it = 0; it < o->iters; it++) {
			if ((o->barrier || it == 0) &&
			    (rc = coll_barrier(s->cd, &s->g, dc->err, sizeof(dc->err))))
				return -EHOSTDOWN;
			if (it == 0)
				dcn0 = xport_remote_bytes(dc->xport, dc->device_id);
			uint64_t t0 = xport_now_ns();
			if ((rc = run_case(s, &c, dc->err, sizeof(dc->err))))
				return -EHOSTDOWN;
			total += (double)(xport_now_ns() - t0);
		}
		/* CPU and wall of the timed loop alone, as bench/mpi_coll.c
		 * counts Open MPI's: read before the refill and checked run */
		double cpu = (util_cpu_us() - cpu0) / o->iters;
		double loop = (double)(xport_now_ns() - loop0) / 1e3 / o->iters;
		struct thr_cpu thr1[MAX_THREADS];
		int nthr1 = dc->device_id == 0 ? thread_cpu(thr1, MAX_THREADS) : 0;
		uint64_t dcn = xport_remote_bytes(dc->xport, dc->device_id) - dcn0;
		/* fresh inputs (all_reduce worked in place), one checked run */
		if (setup(s, &c, salt))
			return -EIO;
		if ((rc = run_case(s, &c, dc->err, sizeof(dc->err))))
			return -EHOSTDOWN;
		if (o->corrupt && s->g.rank == 0 && c.count)
			s->out[0] += 1.0f;
		if (dc->device_id == 0)
			print_thread_cpu(size_floats * sizeof(float), thr0, nthr0, thr1, nthr1, o->iters);
		struct rank_stat mine = { .time_us = total / o->iters / 1e3,
					  .cpu_us = dc->local_index == 0 ? cpu : 0,
					  .loop_us = loop,
					  .wrong = verify(s, &c, salt),
					  .dcn_bytes = dcn };
		if (mine.wrong)
			fprintf(stderr, "mismatch: %s size %zu on device %d: element %zu is %.9g, "
				"want %.9g (%llu wrong)\n", bop_names[op], size_floats * sizeof(float),
				dc->device_id, s->first_bad, s->got, s->want,
				(unsigned long long)mine.wrong);
		if ((rc = gather_stats(s, &mine, all, dc->err, sizeof(dc->err))))
			return -EHOSTDOWN;
		double t = 0;
		uint64_t wrong = 0;
		dcn_host0[si] = dcn_all[si] = 0;
		for (int p = 0; p < n; p++) {
			dcn_all[si] += all[p].dcn_bytes;
			if (xport_host_of(dc->xport, s->g.devs[p]) == 0)
				dcn_host0[si] += all[p].dcn_bytes;
			if (all[p].time_us > t)
				t = all[p].time_us;
			wrong += all[p].wrong;
			cpu_us[si] += all[p].cpu_us;
			/* each agent's CPU against its own loop's wall time */
			if (all[p].loop_us > 0)
				busy[si] += all[p].cpu_us / all[p].loop_us;
		}
		row_bytes[si] = size_floats * sizeof(float);
		if (dc->device_id == 0) {
			double bytes = (double)size_floats * sizeof(float);
			double alg = t > 0 ? bytes / t / 1e3 : 0;
			double f = 1;
			if (op == B_AG || op == B_RS || op == B_A2A)
				f = (double)(n - 1) / n;
			else if (op == B_AR)
				f = 2.0 * (n - 1) / n;
			printf("  %12zu %12zu %12.1f %11.3f %11.3f %6llu\n", size_floats * sizeof(float),
			       size_floats, t, alg, alg * f, (unsigned long long)wrong);
			fflush(stdout);
		}
		if (wrong) {
			snprintf(dc->err, sizeof(dc->err), "bench collectives: %s: %llu wrong elements",
				 bop_names[op], (unsigned long long)wrong);
			return -EIO;
		}
	}
	if (dc->device_id == 0) {
		/* CPU the agents spent per iteration against the wall time of
		 * the same loop (barriers included in both): a figure near the
		 * machine's core count means the op is CPU-bound here */
		for (int si = 0; si < o->nsizes; si++)
			printf("# cpu %zu: %.1f us per iteration, all agents (user+sys); "
			       "%.2f cores busy\n", row_bytes[si],
			       cpu_us[si], busy[si]);
		/* payload bytes the devices posted to other hosts (no framing,
		 * no TLS): what the algorithm sends across, a count */
		for (int si = 0; si < o->nsizes && dc->mesh->num_hosts > 1; si++)
			printf("# dcn %zu: %.0f bytes per iteration from host 0, %.0f from all hosts "
			       "(payload)\n", row_bytes[si], (double)dcn_host0[si] / o->iters,
			       (double)dcn_all[si] / o->iters);
		fflush(stdout);
	}
	if (dc->device_id == 0 && dc->mesh->num_hosts > 1) {
		printf("# tls key updates sent by host 0 so far: %llu (every %lld bytes per link)\n",
		       (unsigned long long)agent_tls_key_updates(dc->agent), dc->cfg->tls_key_update_bytes);
		fflush(stdout);
	}
	return 0;
}

int bench_coll_job(struct device_ctx *dc)
{
	const struct bench_opts *o = dc->job_arg;
	struct dev_state *s = calloc(1, sizeof(*s));
	int rc = -EIO;
	if (!s) {
		snprintf(dc->err, sizeof(dc->err), "bench collectives: out of memory");
		return -EIO;
	}
	s->dc = dc;
	s->async = o->async;
	/* one group over every device, host-major ring order */
	mesh_group(dc->mesh, dc->device_id, (1u << AX_COUNT) - 1, &s->mg);
	s->g = (struct coll_group){ .id = s->mg.id, .n = s->mg.n, .rank = s->mg.rank,
				    .devs = s->mg.devs };
	int n = s->g.n;
	s->sb = calloc((size_t)n * 2, sizeof(size_t));
	struct rank_stat *all = calloc((size_t)n, sizeof(*all));
	s->cd = coll_dev_new(dc->xport, dc->device_id, (size_t)dc->cfg->segment_bytes,
			     dc->cfg->collective_timeout_s);
	if (!s->sb || !all || !s->cd) {
		snprintf(dc->err, sizeof(dc->err), "bench collectives: out of memory");
		goto out;
	}
	s->rb = s->sb + n;
	if (o->direct_max >= 0)
		coll_set_direct_max(s->cd, (size_t)o->direct_max);
	coll_set_two_level(s->cd, dc->cfg->coll_two_level);

	if (o->ncounts) {
		rc = check_all(s, o, all);
	} else {
		rc = 0;
		for (int op = 0; op < B_NOPS && !rc; op++)
			if (o->all_ops || op == o->op)
				rc = time_op(s, o, op, all);
	}
out:
	coll_dev_free(s->cd);
	free(all);
	free(s->sb);
	free(s->in);
	free(s->out);
	free(s->lst);
	free(s->iov);
	free(s);
	return rc;
}
