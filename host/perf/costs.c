/* A run's own costs for the step-time model (`meshrun plan --costs-from
 * TRACE`): the compute actions a `--trace` recorded (each with the CPU
 * its device thread spent in it), the optimizer's and the step's spans,
 * and the cores the devices got between them, fitted to the same fluid
 * model perf.c times the table with. Reading only: the table the trace
 * must match is checked by perf_predict. */
#include "host/perf/perf.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/ckpt/safetensors.h"
#include "host/obs/trace.h"
#include "host/pipeline/schedule.h"

/* The action a span's name starts with ("F mb3 c1", "head mb0"), or -1
 * for spans that are not compute actions. */
static int span_op(const char *name)
{
	static const int ops[] = { PA_EMBED, PA_F, PA_B, PA_I, PA_W, PA_HEAD, PA_EMBED_BACK, PA_FC };
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		const char *n = pipe_act_name(ops[i]);
		size_t l = strlen(n);
		if (!strncmp(name, n, l) && !strncmp(name + l, " mb", 3))
			return ops[i];
	}
	return -1;
}

static double num(const cJSON *o, const char *key, double dflt)
{
	const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(x) ? x->valuedouble : dflt;
}

static int cmp_ts(const void *a, const void *b)
{
	const struct perf_tspan *x = a, *y = b;
	return x->ts < y->ts ? -1 : x->ts > y->ts;
}

/* The cores C the devices got: on the fluid model's terms (n devices
 * computing at once each run at min(1, C / n) of full speed) the spans'
 * CPU seconds are the integral of min(n(t), C) over the time any of them
 * computed; C solved by bisection, at most the most devices that ever
 * computed at once. */
struct edge {
	double t;
	int d;
};

static int cmp_edge(const void *a, const void *b)
{
	const struct edge *x = a, *y = b;
	return x->t < y->t ? -1 : x->t > y->t ? 1 : x->d - y->d;  /* ends before starts */
}

static double fit_cores(const struct perf_trace *tr)
{
	size_t m = 0, k = 0;
	double cpu = 0;
	for (int d = 0; d < tr->ndev; d++)
		m += 2 * (size_t)tr->n[d];
	struct edge *e = malloc(sizeof(*e) * (m ? m : 1));
	if (!e)
		return 0;
	for (int d = 0; d < tr->ndev; d++)
		for (int i = 0; i < tr->n[d]; i++) {
			const struct perf_tspan *s = &tr->sp[d][i];
			e[k++] = (struct edge){ s->ts, 1 };
			e[k++] = (struct edge){ s->ts + s->dur, -1 };
			cpu += s->cpu;
		}
	qsort(e, m, sizeof(*e), cmp_edge);
	/* time with n devices computing, n = 1 .. ndev */
	double *at = calloc((size_t)tr->ndev + 1, sizeof(double)), lo = 0, hi = 0;
	for (size_t i = 0, n = 0; at && i + 1 < m; i++) {
		n += e[i].d;
		if (n > 0 && n <= (size_t)tr->ndev)
			at[n] += e[i + 1].t - e[i].t;
	}
	for (int n = 1; at && n <= tr->ndev; n++)
		if (at[n] > 0)
			hi = n;
	for (int it = 0; at && it < 60; it++) {
		double c = (lo + hi) / 2, got = 0;
		for (int n = 1; n <= tr->ndev; n++)
			got += at[n] * fmin(n, c);
		if (got < cpu)
			lo = c;
		else
			hi = c;
	}
	free(at);
	free(e);
	return hi;
}

/* tr->untraced: each device's forward+backward span less the spans of
 * its own row inside it (they do not overlap), over the steps read. */
static int untraced(struct perf_trace *tr, const cJSON *ev)
{
	int nst = tr->step1 - tr->step0 + 1;
	double *fb0 = calloc((size_t)tr->ndev * nst, sizeof(double)), *fb1 = calloc((size_t)tr->ndev * nst, sizeof(double));
	tr->untraced = calloc((size_t)tr->ndev, sizeof(double));
	if (!fb0 || !fb1 || !tr->untraced) {
		free(fb0);
		free(fb1);
		return -ENOMEM;
	}
	const cJSON *e;
	for (int pass = 0; pass < 2; pass++)
		cJSON_ArrayForEach(e, ev) {
			const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
			const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
			int d = (int)num(e, "tid", -1), st = (int)num(args, "step", -1);
			if (!cJSON_IsString(nm) || d < 0 || d >= tr->ndev || st < tr->step0 || st > tr->step1 ||
			    num(e, "dur", -1) < 0)
				continue;
			double t0 = num(e, "ts", 0) * 1e-6, dur = num(e, "dur", 0) * 1e-6;
			size_t j = (size_t)d * nst + (size_t)(st - tr->step0);
			bool fb = !strcmp(nm->valuestring, "forward+backward");
			if (pass == 0 && fb) {
				fb0[j] = t0;
				fb1[j] = t0 + dur;
				tr->untraced[d] += dur / nst;
			} else if (pass == 1 && !fb && fb1[j] > 0 && t0 >= fb0[j] && t0 + dur <= fb1[j]) {
				tr->untraced[d] -= dur / nst;
			}
		}
	for (int d = 0; d < tr->ndev; d++)
		tr->untraced[d] = fmax(0, tr->untraced[d]);
	free(fb0);
	free(fb1);
	return 0;
}

void perf_trace_release(struct perf_trace *tr)
{
	for (int d = 0; tr->sp && d < tr->ndev; d++)
		free(tr->sp[d]);
	free(tr->sp);
	free(tr->n);
	free(tr->untraced);
	free(tr->send_cpu);
	free(tr->recv_cpu);
	free(tr->nsend);
	free(tr->nrecv);
	free(tr->fb_cpu);
	memset(tr, 0, sizeof(*tr));
}

int perf_trace_read(const char *path, struct perf_trace *tr, char *err, size_t errlen)
{
	char jerr[512];
	memset(tr, 0, sizeof(*tr));
	cJSON *root = json_read_file(path, jerr, sizeof(jerr));
	if (!root) {
		snprintf(err, errlen, "--costs-from: %s", jerr);
		return -EINVAL;
	}
	const cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents"), *e;
	int rc = 0, lo = -1, hi = -1;
	double steps_s = 0, opt_s = 0, fb_s = 0;
	int nstep = 0, nopt = 0, nfb = 0;
	/* the devices and steps: compute spans on a device's own row */
	cJSON_ArrayForEach(e, ev) {
		const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
		const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
		int tid = (int)num(e, "tid", -1), step = (int)num(args, "step", -1);
		if (!cJSON_IsString(nm) || tid < 0 || tid >= TRACE_COMM_TID || step < 0 || span_op(nm->valuestring) < 0)
			continue;
		tr->ndev = tid + 1 > tr->ndev ? tid + 1 : tr->ndev;
		lo = lo < 0 || step < lo ? step : lo;
		hi = step > hi ? step : hi;
	}
	snprintf(tr->path, sizeof(tr->path), "%s", path);
	if (!tr->ndev) {
		snprintf(err, errlen, "--costs-from '%s': no compute action spans (not the --trace of a training run?)",
			 path);
		rc = -EINVAL;
		goto out;
	}
	/* the steps after the first (its warm-up), unless it is the only one */
	tr->step0 = hi > lo ? lo + 1 : lo;
	tr->step1 = hi;
	tr->sp = calloc((size_t)tr->ndev, sizeof(*tr->sp));
	tr->n = calloc((size_t)tr->ndev, sizeof(*tr->n));
	int *cap = calloc((size_t)tr->ndev, sizeof(int)), nfbc = 0;
	tr->send_cpu = calloc((size_t)tr->ndev, sizeof(double));
	tr->recv_cpu = calloc((size_t)tr->ndev, sizeof(double));
	tr->nsend = calloc((size_t)tr->ndev, sizeof(int));
	tr->nrecv = calloc((size_t)tr->ndev, sizeof(int));
	tr->fb_cpu = calloc((size_t)tr->ndev, sizeof(double));
	if (!tr->sp || !tr->n || !cap || !tr->send_cpu || !tr->recv_cpu || !tr->nsend || !tr->nrecv || !tr->fb_cpu) {
		free(cap);
		rc = -ENOMEM;
		goto out;
	}
	cJSON_ArrayForEach(e, ev) {
		const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
		const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
		int tid = (int)num(e, "tid", -1), step = (int)num(args, "step", -1);
		if (!cJSON_IsString(nm) || tid < 0 || tid >= tr->ndev || step < tr->step0 || step > tr->step1)
			continue;
		double dur = num(e, "dur", -1) * 1e-6;
		if (!strcmp(nm->valuestring, "step")) {
			steps_s += dur;
			nstep++;
		} else if (!strcmp(nm->valuestring, "optimizer")) {
			opt_s += dur;
			nopt++;
		}
		double cpu = num(args, "cpu_us", -1) * 1e-6;
		if (!strcmp(nm->valuestring, "forward+backward")) {
			fb_s += dur;
			nfb++;
			tr->fb_cpu[tid] += cpu;
			nfbc += cpu >= 0;
		}
		/* a transfer with its CPU ("stage send act 3", "stage recv grad 4";
		 * not the send waits) */
		bool snd = !strncmp(nm->valuestring, "stage send ", 11) && strncmp(nm->valuestring, "stage send wait", 15);
		if ((snd || !strncmp(nm->valuestring, "stage recv ", 11)) && cpu >= 0) {
			*(snd ? &tr->send_cpu[tid] : &tr->recv_cpu[tid]) += cpu;
			(*(snd ? &tr->nsend[tid] : &tr->nrecv[tid]))++;
			tr->xfer_traced |= snd;
		}
		if (span_op(nm->valuestring) < 0)
			continue;
		if (cpu < 0 || dur < 0) {
			snprintf(err, errlen, "--costs-from '%s': span '%s' of device %d has no %s", path,
				 nm->valuestring, tid, cpu < 0 ? "args.cpu_us" : "dur");
			rc = -EINVAL;
			break;
		}
		if (tr->n[tid] == cap[tid]) {
			int nc = cap[tid] ? 2 * cap[tid] : 64;
			struct perf_tspan *x = realloc(tr->sp[tid], sizeof(*x) * (size_t)nc);
			if (!x) {
				rc = -ENOMEM;
				break;
			}
			tr->sp[tid] = x;
			cap[tid] = nc;
		}
		struct perf_tspan *s = &tr->sp[tid][tr->n[tid]++];
		snprintf(s->name, sizeof(s->name), "%s", nm->valuestring);
		s->op = span_op(nm->valuestring);
		s->step = step;
		s->ts = num(e, "ts", 0) * 1e-6;
		s->dur = dur;
		s->cpu = cpu;
	}
	free(cap);
	for (int d = 0; !rc && d < tr->ndev; d++)  /* a step's, or -1 untraced */
		tr->fb_cpu[d] = nfbc == nfb && nfb ? tr->fb_cpu[d] / (tr->step1 - tr->step0 + 1) : -1;
	for (int d = 0; !rc && d < tr->ndev; d++)
		if (tr->n[d])
			qsort(tr->sp[d], (size_t)tr->n[d], sizeof(*tr->sp[d]), cmp_ts);
	if (!rc)
		rc = untraced(tr, ev);
	if (!rc) {
		tr->step_s = nstep ? steps_s / nstep : 0;
		tr->opt_s = nopt ? opt_s / nopt : 0;
		tr->fb_s = nfb ? fb_s / nfb : 0;
		tr->cores = fit_cores(tr);
	}
out:
	cJSON_Delete(root);
	if (rc)
		perf_trace_release(tr);
	if (rc == -ENOMEM)
		snprintf(err, errlen, "--costs-from '%s': out of memory", path);
	return rc;
}
