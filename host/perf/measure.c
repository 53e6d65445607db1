/* The compute figures of the step-time model, measured here (see
 * perf.h): the model's own stage calls at the model's shapes, one
 * microbatch of rows on one device, one layer of each kind (forward,
 * backward, and the split backward's I and W on their own); each figure
 * the mean of a few runs' CPU seconds after a warm-up of at least WARM_S
 * (what the computation costs, whatever else runs; the mean, since a
 * run's CPU is the sum of its actions and sharing the cores skews the
 * runs to the slow side: the median was 1-9% below it), taken while
 * the step's other devices compute beside it as they do in a run (the
 * same layer's forward on as many threads: they share the cores, caches
 * and clock; one thread alone on an idle machine measured up to a third
 * less than the run's actions cost), their level set by every forward
 * those threads ran meanwhile; the CPU a byte of an encrypted transfer
 * costs its two ends; and how many cores the
 * devices of a machine get between them now when they all compute at
 * once (their CPU seconds over the wall seconds: the machine's other load
 * is in that). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "host/perf/perf.h"
#include "host/util/clock.h"
#include "kernels/kernels.h"
#include "net/aead.h"

#define RUNS 15
#define WARM_S 0.5

/* CPU seconds of this process (every thread: OpenBLAS's too) or of the
 * calling thread: what a computation costs, whatever else the machine
 * runs meanwhile. */
static double cpu_s(clockid_t which)
{
	struct timespec ts;
	clock_gettime(which, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct times {
	double embed_f, layer_f, head, layer_b, embed_b, layer_i, layer_w;
};

static double mean(const double *v, int n)
{
	double sum = 0;
	for (int i = 0; i < n; i++)
		sum += v[i];
	return n > 0 ? sum / n : 0;
}

static void best(double *b, double t)
{
	if (*b <= 0 || t < *b)
		*b = t;
}

/* One layer of kind moe of d at rows sequences: the mean of RUNS, in
 * CPU seconds of clk (the process's, or with threads computing beside
 * it the calling thread's). */
static int measure_layer(const struct model_dims *d, bool moe, int rows, bool w_in_place, clockid_t clk,
			 struct times *out, char *err, size_t errlen)
{
	struct model_dims one = *d;
	one.bsplit = 0;  /* a layer's compute, measured unsplit (the batch split's overlap is not modelled) */
	one.L = 1;
	one.L_dense = moe ? 0 : 1;
	one.L_moe = moe ? 1 : 0;
	/* one stash: the split backward (I, then W) is timed beside B; W
	 * reads the weights' inputs in place when the run's does (no
	 * recompute: host/train/train.c), so I copies none into the stash */
	struct model_mesh split = { .pipe_w_stashes = 1, .pipe_w_reads_acts = w_in_place };
	struct model *m = model_new(&one, rows, &split, err, errlen);
	size_t N = (size_t)rows * d->T, NC = N * (size_t)d->C;
	int32_t *in = malloc(sizeof(int32_t) * N), *tg = malloc(sizeof(int32_t) * N);
	float *x = malloc(sizeof(float) * NC), *y = malloc(sizeof(float) * NC), *dy = malloc(sizeof(float) * NC);
	float *dy0 = malloc(sizeof(float) * NC), *dx = malloc(sizeof(float) * NC);
	int rc = m && in && tg && x && y && dy && dy0 && dx ? 0 : -ENOMEM;
	double runs[7][RUNS];
	memset(out, 0, sizeof(*out));
	for (size_t i = 0; !rc && i < N; i++) {
		in[i] = (int32_t)((i * 7919u) % (size_t)d->V);
		tg[i] = (int32_t)((i * 104729u + 3) % (size_t)d->V);
	}
	if (!rc)
		model_init(m, 1, 0.02f);
	double w0 = util_now_s();
	for (int r = 0; !rc && r <= RUNS; r++) {
		struct model_step st = { .loss_scale = 1.0f / (float)N, .global_tokens = (double)N };
		double l, t[8];
		model_step_begin(m, &st);
		t[0] = cpu_s(clk);
		rc = model_embed_forward(m, x, in);
		t[1] = cpu_s(clk);
		rc = rc ? rc : model_layers_forward(m, 0, 1, y, x);
		t[2] = cpu_s(clk);
		rc = rc ? rc : model_head_forward(m, &l, y, tg);
		rc = rc ? rc : model_head_backward(m, dy, y, tg);
		if (!rc)
			memcpy(dy0, dy, sizeof(float) * NC);
		t[3] = cpu_s(clk);
		rc = rc ? rc : model_layers_backward(m, 0, 1, dy, x);
		t[4] = cpu_s(clk);
		rc = rc ? rc : model_embed_backward(m, dy, in);
		t[5] = cpu_s(clk);
		rc = rc ? rc : model_layers_backward_input(m, 0, 1, dx, dy0, x);
		t[6] = cpu_s(clk);
		rc = rc ? rc : model_layers_backward_weight(m, 0, 1, dy0, x);
		t[7] = cpu_s(clk);
		int erc = model_step_end(m);
		rc = rc ? rc : erc;
		if (r == 0 && util_now_s() - w0 < WARM_S)
			r--;       /* still warming up */
		if (r <= 0)
			continue;
		for (int k = 0; k < 7; k++)
			runs[k][r - 1] = t[k + 1] - t[k];
	}
	if (!rc) {
		out->embed_f = mean(runs[0], RUNS);
		out->layer_f = mean(runs[1], RUNS);
		out->head = mean(runs[2], RUNS);
		out->layer_b = mean(runs[3], RUNS);
		out->embed_b = mean(runs[4], RUNS);
		out->layer_i = mean(runs[5], RUNS);
		out->layer_w = mean(runs[6], RUNS);
	}
	if (rc == -ENOMEM)
		snprintf(err, errlen, "out of memory measuring a layer of %d rows", rows);
	model_free(m);
	free(in);
	free(tg);
	free(x);
	free(y);
	free(dy);
	free(dy0);
	free(dx);
	return rc;
}

/* AdamW's seconds per float (4M floats, the best of RUNS). */
static double measure_optimizer(void)
{
	size_t n = 4u << 20;
	float *p = calloc(n, sizeof(float)), *g = calloc(n, sizeof(float)), *m = calloc(n, sizeof(float)),
	      *v = calloc(n, sizeof(float));
	double b = 0;
	for (int r = 0; p && g && m && v && r <= RUNS; r++) {
		double t0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
		adamw_update(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, r + 1);
		if (r)
			best(&b, (cpu_s(CLOCK_PROCESS_CPUTIME_ID) - t0) / (double)n);
	}
	free(p);
	free(g);
	free(m);
	free(v);
	return b;
}

/* Newton-Schulz's seconds per flop on a c x c matrix (the model's width,
 * at most 512: the orthogonalisation's speed, not a whole large one's
 * time), the best of RUNS. */
static double measure_ns(int c)
{
	c = c < 512 ? c : 512;
	size_t n = (size_t)c * c;
	float *g = malloc(sizeof(float) * n), *s = malloc(sizeof(float) * 6 * n);
	double b = 0;
	for (size_t i = 0; g && i < n; i++)
		g[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
	for (int r = 0; g && s && r <= RUNS; r++) {
		double t0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
		newton_schulz5(s + 5 * n, g, s, c, c);  /* scratch: 5 n */
		if (r)
			best(&b, (cpu_s(CLOCK_PROCESS_CPUTIME_ID) - t0) / newton_schulz5_flops(c, c));
	}
	free(g);
	free(s);
	return b;
}

/* ---- the transfers' CPU ---- */

#define XFER_REC 16384        /* a TLS record's plaintext at most */
#define XFER_ROUND (1u << 20) /* bytes a round */

static bool io_all(int fd, unsigned char *b, size_t n, bool wr)
{
	while (n) {
		ssize_t k = wr ? write(fd, b, n) : read(fd, b, n);
		if (k <= 0)
			return false;
		b += k;
		n -= (size_t)k;
	}
	return true;
}

/* The CPU seconds a byte of an encrypted transfer costs each end, as a
 * run's device threads pay it (net/direct.c: the sender encrypts and
 * writes, the receiver reads and decrypts into the posted buffer):
 * AES-128-GCM (the first of net/tls.c's suites) by the implementation
 * the run's links use (tls_cipher_impl; OpenSSL's with tls_records:
 * openssl; net/aead.h), in 16 KiB records through a local socket pair,
 * the thread's CPU (user and kernel), the median of RUNS rounds of
 * XFER_ROUND bytes. 0 on failure (then not charged). */
static void measure_xfer(const struct cfg *c, double *send_cpb, double *recv_cpb)
{
	int sv[2] = { -1, -1 };
	uint8_t key[16] = { 1 }, iv[AEAD_IV_LEN] = { 2 }, hdr[5] = { 23, 3, 3, 0x40, 0x11 };
	uint8_t *pt = calloc(1, XFER_REC), *ct = malloc(XFER_REC + AEAD_TAG_LEN), *out = malloc(XFER_REC);
	enum aead_impl impl = AEAD_IMPL_AUTO;
	char err[128];
	if (!strcmp(c->tls_records, "openssl"))
		impl = AEAD_IMPL_OPENSSL;
	else
		aead_impl_parse(c->tls_cipher_impl, &impl);  /* the config allows only its words */
	struct aead *e = aead_new(AEAD_AES_128_GCM, impl, true, err, sizeof(err));
	struct aead *d = aead_new(AEAD_AES_128_GCM, impl, false, err, sizeof(err));
	struct aead_piece sp = { pt, ct, XFER_REC }, op = { ct, out, XFER_REC };
	double snd[RUNS], rcv[RUNS];
	bool ok = pt && ct && out && e && d && !aead_set_key(e, key) && !aead_set_key(d, key) &&
		  !socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
	*send_cpb = *recv_cpb = 0;
	for (int r = 0; ok && r <= RUNS; r++) {
		double ts = 0, tr = 0;
		for (size_t done = 0; ok && done < XFER_ROUND; done += XFER_REC) {
			double t0 = cpu_s(CLOCK_THREAD_CPUTIME_ID);
			ok = !aead_seal(e, iv, hdr, sizeof(hdr), &sp, 1, ct + XFER_REC) &&
			     io_all(sv[0], ct, XFER_REC + AEAD_TAG_LEN, true);
			double t1 = cpu_s(CLOCK_THREAD_CPUTIME_ID);
			ok = ok && io_all(sv[1], ct, XFER_REC + AEAD_TAG_LEN, false) &&
			     !aead_open(d, iv, hdr, sizeof(hdr), &op, 1, ct + XFER_REC);
			ts += t1 - t0;
			tr += cpu_s(CLOCK_THREAD_CPUTIME_ID) - t1;
		}
		if (r) {  /* the first round warms up */
			snd[r - 1] = ts / XFER_ROUND;
			rcv[r - 1] = tr / XFER_ROUND;
		}
	}
	if (ok) {
		*send_cpb = util_median(snd, RUNS);
		*recv_cpb = util_median(rcv, RUNS);
	}
	for (int k = 0; k < 2; k++)
		if (sv[k] >= 0)
			close(sv[k]);
	aead_free(e);
	aead_free(d);
	free(pt);
	free(ct);
	free(out);
}

/* ---- cores: one layer's forward on n threads at once ---- */

struct spin {
	const struct model_dims *d;
	int rows;
	double seconds, cpu, wall;
	double call_cpu;  /* CPU seconds of its calls after the first (warm) one */
	int calls;
	pthread_barrier_t *bar;
	atomic_bool *stop;  /* NULL: for `seconds` */
	int rc;
};

static void *spin_main(void *arg)
{
	struct spin *sp = arg;
	struct model_dims one = *sp->d;
	char err[256];
	one.L = 1;
	one.L_dense = 1;
	one.L_moe = 0;
	one.bsplit = 0;
	struct model *m = model_new(&one, sp->rows, NULL, err, sizeof(err));
	size_t N = (size_t)sp->rows * one.T, NC = N * (size_t)one.C;
	float *x = calloc(NC, sizeof(float)), *y = calloc(NC, sizeof(float));
	sp->rc = m && x && y ? 0 : -ENOMEM;
	if (!sp->rc)
		model_init(m, 1, 0.02f);
	pthread_barrier_wait(sp->bar);
	double t0 = util_now_s(), t = t0, c0 = util_thread_cpu_s();
	int calls = 0;
	double c1 = c0;
	struct model_step st = { .loss_scale = 1, .global_tokens = 1 };
	while (!sp->rc && (sp->stop ? !atomic_load(sp->stop) : t - t0 < sp->seconds || calls < 2)) {
		model_step_begin(m, &st);
		model_layers_forward(m, 0, 1, y, x);
		model_step_end(m);
		if (!calls++)
			c1 = util_thread_cpu_s();
		t = util_now_s();
	}
	sp->cpu = util_thread_cpu_s() - c0;
	sp->call_cpu = util_thread_cpu_s() - c1;
	sp->calls = calls - 1;
	sp->wall = t - t0;
	model_free(m);
	free(x);
	free(y);
	return NULL;
}

/* n threads running a layer's forward, started together: for `seconds`,
 * or until *stop (then the caller is the n + 1st of the barrier). */
struct spinners {
	pthread_t th[64];
	struct spin sp[64];
	pthread_barrier_t bar;
	atomic_bool stop;
	int n;
};

static void spin_start(struct spinners *g, const struct model_dims *d, int rows, int n, double seconds, bool until)
{
	g->n = n > 64 ? 64 : n;
	atomic_init(&g->stop, false);
	pthread_barrier_init(&g->bar, NULL, (unsigned)(g->n + until));
	for (int i = 0; i < g->n; i++) {
		g->sp[i] = (struct spin){ .d = d, .rows = rows, .seconds = seconds, .bar = &g->bar,
					  .stop = until ? &g->stop : NULL };
		pthread_create(&g->th[i], NULL, spin_main, &g->sp[i]);
	}
	if (until)
		pthread_barrier_wait(&g->bar);
}

/* Joins them; returns their CPU seconds over the wall seconds; *per_call
 * and *ncalls (if not NULL): their mean CPU seconds a forward after each
 * one's first (0 if none ran one) and how many such forwards they ran. */
static double spin_join(struct spinners *g, double *per_call, int *ncalls)
{
	double cpu = 0, wall = 0, ccpu = 0;
	int calls = 0;
	atomic_store(&g->stop, true);
	for (int i = 0; i < g->n; i++) {
		pthread_join(g->th[i], NULL);
		cpu += g->sp[i].cpu;
		wall = g->sp[i].wall > wall ? g->sp[i].wall : wall;
		ccpu += g->sp[i].call_cpu;
		calls += g->sp[i].calls;
	}
	pthread_barrier_destroy(&g->bar);
	if (per_call)
		*per_call = calls > 0 ? ccpu / calls : 0;
	if (ncalls)
		*ncalls = calls;
	return wall > 0 ? cpu / wall : 0;
}

/* The cores n threads running a layer's forward at once get: their CPU
 * seconds over the wall seconds. */
static double spin(const struct model_dims *d, int rows, int n, double seconds)
{
	struct spinners g;
	spin_start(&g, d, rows, n, seconds, false);
	return spin_join(&g, NULL, NULL);
}

int perf_measure(const struct cfg *c, int rows, int threads, int beside, struct perf_compute *pc,
		 char *err, size_t errlen)
{
	struct model_dims d;
	struct times t[2];
	struct spinners g;
	int rc = model_dims_from_cfg(&d, c, err, errlen), prev = blas_get_threads();
	if (rc)
		return rc;
	memset(pc, 0, sizeof(*pc));
	if (threads > 0)
		blas_set_threads(threads);
	/* the thread's CPU beside other threads: OpenBLAS's own threads
	 * would be missed, so only with one */
	beside = threads <= 1 ? beside : 0;
	clockid_t clk = beside > 0 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_PROCESS_CPUTIME_ID;
	spin_start(&g, &d, rows, beside, 0, true);
	double w0 = util_now_s(), c0 = util_thread_cpu_s();
	pc->w_in_place = !c->pipeline_recompute;
	rc = measure_layer(&d, false, rows, pc->w_in_place, clk, &t[0], err, errlen);
	if (!rc && d.L_moe)
		rc = measure_layer(&d, true, rows, pc->w_in_place, clk, &t[1], err, errlen);
	else
		t[1] = t[0];
	if (!rc)  /* beside the other devices too, as a run's transfers are */
		measure_xfer(c, &pc->xfer_send, &pc->xfer_recv);
	int calls = 0;
	double wall = util_now_s() - w0, mine = util_thread_cpu_s() - c0;
	double rate = spin_join(&g, &pc->f_beside, &calls);
	if (beside > 0 && wall > 0) {  /* every device computed meanwhile */
		pc->cores_seen = rate + mine / wall;
		pc->cores_window = wall;
	}
	blas_set_threads(prev);
	if (rc)
		return rc;
	/* The level: the dense forward's mean over the measuring thread's
	 * RUNS and every call the threads beside it ran meanwhile (a few
	 * hundred: how fast a layer computes in this window, far less moved
	 * by which slices of the cores one thread happened to get); the
	 * measuring thread's figures keep their ratios to its forward. */
	double scale = 1;
	if (calls > 0 && pc->f_beside > 0 && t[0].layer_f > 0)
		scale = (pc->f_beside * calls + t[0].layer_f * RUNS) / (calls + RUNS) / t[0].layer_f;
	for (int k = 0; k < 2; k++) {
		pc->f_layer[k] = scale * t[k].layer_f;
		pc->b_layer[k] = scale * t[k].layer_b;
		pc->i_layer[k] = scale * t[k].layer_i;
		pc->w_layer[k] = scale * t[k].layer_w;
	}
	pc->head = scale * t[0].head;
	pc->embed_f = scale * t[0].embed_f;
	pc->embed_b = scale * t[0].embed_b;
	pc->opt_per_float = measure_optimizer();
	if (!strcmp(c->opt_type, "muon"))
		pc->ns_per_flop = measure_ns(d.C);
	pc->rows = rows;
	pc->threads = threads > 0 ? threads : prev;
	return 0;
}

double perf_measure_cores(const struct cfg *c, int rows, int threads, int devices, double seconds)
{
	struct model_dims d;
	char err[256];
	if (model_dims_from_cfg(&d, c, err, sizeof(err)) || devices < 1)
		return 0;
	int prev = blas_get_threads();
	blas_set_threads(threads > 0 ? threads : 1);
	double got = spin(&d, rows, devices, seconds);
	blas_set_threads(prev);
	return got;
}
