/* See host/obs/report.h. Reads the whole metrics and trace files into
 * memory (both are small: one line per step, a bounded span buffer per
 * device) and prints the SVG with fprintf; JSON through cJSON. */
#include "host/obs/report.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host/util/out.h"

/* ---- metrics ---- */

/* Bounds on what a report reads (docs: README, meshrun report): memory
 * stays within a few hundred MiB whatever the input. */
#define REPORT_MAX_LINE 65536
#define REPORT_MAX_BYTES (1ull << 30)
#define REPORT_MAX_ROWS (1 << 22)
#define REPORT_MAX_TRACE (128 << 20)

enum { HAS_LOSS = 1, HAS_TOK_DEV = 2, HAS_TOK_GLOBAL = 4, HAS_COMM = 8, HAS_TIME = 16, HAS_EVAL = 32 };

struct row {
	int64_t step;
	int line;
	unsigned has;
	double loss, tok_dev, tok_global, comm_wait_s, step_time_s;
	double eval_loss;        /* the held-out loss after the step, when evaluated */
};

struct metrics {
	struct row *r;
	int n;
};

static bool num_field(const cJSON *j, const char *key, double *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
	if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
		return false;
	*out = v->valuedouble;
	return true;
}

static int bad_input(char *err, size_t errlen, const char *path, int line, const char *what)
{
	if (line > 0)
		snprintf(err, errlen, "report: %s:%d: %s", path, line, what);
	else
		snprintf(err, errlen, "report: %s: %s", path, what);
	return -EBADMSG;
}

static bool blank(const char *s)
{
	for (; *s; s++)
		if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n')
			return false;
	return true;
}

/* One metrics line into r: 0 or -EBADMSG (err names path:line). Fields
 * other than step are optional; a missing or null one is not plotted. */
static int parse_row(const char *text, const char *path, int line, struct row *r,
		     char *err, size_t errlen)
{
	cJSON *j = cJSON_Parse(text);
	if (!j)
		return bad_input(err, errlen, path, line, "not valid JSON");
	int rc = 0;
	double step, v;
	memset(r, 0, sizeof(*r));
	r->line = line;
	if (!cJSON_IsObject(j)) {
		rc = bad_input(err, errlen, path, line, "not a JSON object");
	} else if (!num_field(j, "step", &step) || step < 0 || step != floor(step) || step > 9e15) {
		rc = bad_input(err, errlen, path, line, "no integer 'step'");
	} else {
		r->step = (int64_t)step;
		r->has |= num_field(j, "loss", &r->loss) ? HAS_LOSS : 0;
		r->has |= num_field(j, "eval_loss", &r->eval_loss) ? HAS_EVAL : 0;
		r->has |= num_field(j, "tokens_per_s_per_device", &r->tok_dev) ? HAS_TOK_DEV : 0;
		/* tokens_per_s is the name before tokens_per_s_global */
		if (num_field(j, "tokens_per_s_global", &v) || num_field(j, "tokens_per_s", &v)) {
			r->tok_global = v;
			r->has |= HAS_TOK_GLOBAL;
		}
		r->has |= num_field(j, "comm_wait_s", &r->comm_wait_s) ? HAS_COMM : 0;
		if (num_field(j, "step_time_s", &r->step_time_s) && r->step_time_s > 0)
			r->has |= HAS_TIME;
	}
	cJSON_Delete(j);
	return rc;
}

static int row_cmp(const void *a, const void *b)
{
	const struct row *x = a, *y = b;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	return x->line - y->line;
}

/* After a restart or --resume a metrics file may hold a step twice (the
 * run appends from its last checkpoint): the last occurrence in the file
 * is the one that counts, so rows are sorted by (step, line) and only the
 * last row of each step is kept. */
static void keep_last_of_each_step(struct metrics *m)
{
	qsort(m->r, (size_t)m->n, sizeof(*m->r), row_cmp);
	int k = 0;
	for (int i = 0; i < m->n; i++) {
		if (i + 1 < m->n && m->r[i + 1].step == m->r[i].step)
			continue;
		m->r[k++] = m->r[i];
	}
	m->n = k;
}

/* One line of f into buf (at most cap - 1 bytes, NUL-terminated), its
 * newline dropped: its length; -1 at the end of the file with nothing
 * read; -2 when the line goes on past cap - 1 bytes. *nl says whether it
 * ended in a newline, *total counts every byte read. */
static long read_line(FILE *f, char *buf, size_t cap, bool *nl, uint64_t *total)
{
	size_t n = 0;
	int c;
	*nl = false;
	while ((c = getc_unlocked(f)) != EOF) {
		(*total)++;
		if (c == '\n') {
			*nl = true;
			break;
		}
		if (n == cap - 1)
			return -2;
		buf[n++] = (char)c;
	}
	buf[n] = 0;
	return n == 0 && !*nl ? -1 : (long)n;
}

/* Reads the metrics lines in bounded memory: a line of at most
 * REPORT_MAX_LINE bytes, a file of at most REPORT_MAX_BYTES and
 * REPORT_MAX_ROWS lines, else refused (an endless input such as /dev/zero
 * is refused within one line's bound). A last line without its newline
 * that does not parse was cut by a crash: it is left out, with a warning
 * in warn. */
static int metrics_read(const char *path, struct metrics *m, char *warn, size_t warnlen,
			char *err, size_t errlen)
{
	char es[128], what[128];
	memset(m, 0, sizeof(*m));
	FILE *f = fopen(path, "r");
	if (!f) {
		snprintf(err, errlen, "report: unable to open '%s': %s", path,
			 util_errstr(errno, es, sizeof(es)));
		return -EBADMSG;
	}
	struct stat st;
	if (!fstat(fileno(f), &st) && S_ISREG(st.st_mode) && (uint64_t)st.st_size > REPORT_MAX_BYTES) {
		fclose(f);
		snprintf(what, sizeof(what), "larger than %llu MiB (the report's bound)",
			 (unsigned long long)(REPORT_MAX_BYTES >> 20));
		return bad_input(err, errlen, path, 0, what);
	}
	char *buf = malloc(REPORT_MAX_LINE + 1);
	size_t rcap = 0;
	uint64_t total = 0;
	int rc = buf ? 0 : -ENOMEM, line = 0;
	long n;
	bool nl;
	if (!buf)
		snprintf(err, errlen, "report: out of memory reading '%s'", path);
	while (!rc && (n = read_line(f, buf, REPORT_MAX_LINE + 1, &nl, &total)) != -1) {
		line++;
		if (n == -2) {
			snprintf(what, sizeof(what), "no newline within %d bytes (not a metrics file?)",
				 REPORT_MAX_LINE);
			rc = bad_input(err, errlen, path, line, what);
			break;
		}
		if (total > REPORT_MAX_BYTES || m->n == REPORT_MAX_ROWS) {
			snprintf(what, sizeof(what), "larger than %llu MiB or %d lines (the report's bound)",
				 (unsigned long long)(REPORT_MAX_BYTES >> 20), REPORT_MAX_ROWS);
			rc = bad_input(err, errlen, path, line, what);
			break;
		}
		if (memchr(buf, 0, (size_t)n)) {
			rc = bad_input(err, errlen, path, line, "a NUL byte (not a metrics file?)");
			break;
		}
		if (blank(buf))
			continue;
		if ((size_t)m->n == rcap) {
			rcap = rcap ? rcap * 2 : 64;
			struct row *r = realloc(m->r, rcap * sizeof(*r));
			if (!r) {
				snprintf(err, errlen, "report: out of memory reading '%s'", path);
				rc = -ENOMEM;
				break;
			}
			m->r = r;
		}
		if ((rc = parse_row(buf, path, line, &m->r[m->n], err, errlen))) {
			if (nl)
				break;
			/* the last line, without its newline: its writer stopped mid-line */
			snprintf(warn, warnlen, "report: %s:%d: the last line is cut short (no newline); "
				 "drawn without it", path, line);
			rc = 0;
			break;
		}
		m->n++;
	}
	if (!rc && ferror(f))
		rc = bad_input(err, errlen, path, line + 1, util_errstr(errno, es, sizeof(es)));
	if (!rc && m->n == 0)
		rc = bad_input(err, errlen, path, 0, "no metrics lines");
	free(buf);
	fclose(f);
	if (rc) {
		free(m->r);
		m->r = NULL;
		return rc;
	}
	keep_last_of_each_step(m);
	return 0;
}

/* ---- trace: per-device compute, communication and idle seconds ---- */

struct iv {
	double a, b;
};

struct ivs {
	struct iv *v;
	int n, cap;
};

enum { SPAN_STEP, SPAN_COMPUTE, SPAN_COMM, SPAN_KINDS };

struct dev_spans {
	int tid, pid;
	struct ivs k[SPAN_KINDS];
};

struct dev_time {
	int device, host;
	double step_s, compute_s, comm_s, idle_s;
};

struct trace_sum {
	struct dev_time *d;
	int n;
};

static int ivs_add(struct ivs *s, double a, double b)
{
	if (s->n == s->cap) {
		int cap = s->cap ? s->cap * 2 : 64;
		struct iv *v = realloc(s->v, (size_t)cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = (struct iv){ a, b };
	return 0;
}

static int iv_cmp(const void *x, const void *y)
{
	const struct iv *a = x, *b = y;
	return a->a < b->a ? -1 : a->a > b->a;
}

/* Sorts and merges s in place into disjoint intervals: its union. */
static void ivs_union(struct ivs *s)
{
	qsort(s->v, (size_t)s->n, sizeof(*s->v), iv_cmp);
	int k = 0;
	for (int i = 0; i < s->n; i++) {
		if (k && s->v[i].a <= s->v[k - 1].b) {
			if (s->v[i].b > s->v[k - 1].b)
				s->v[k - 1].b = s->v[i].b;
		} else {
			s->v[k++] = s->v[i];
		}
	}
	s->n = k;
}

/* out = x ∩ y for two unions (disjoint, sorted); out has room for
 * x->n + y->n intervals. */
static void ivs_intersect(const struct ivs *x, const struct ivs *y, struct ivs *out)
{
	out->n = 0;
	for (int i = 0, j = 0; i < x->n && j < y->n;) {
		double a = fmax(x->v[i].a, y->v[j].a), b = fmin(x->v[i].b, y->v[j].b);
		if (a < b)
			out->v[out->n++] = (struct iv){ a, b };
		if (x->v[i].b < y->v[j].b)
			i++;
		else
			j++;
	}
}

static double ivs_len(const struct ivs *s)
{
	double t = 0;
	for (int i = 0; i < s->n; i++)
		t += s->v[i].b - s->v[i].a;
	return t;
}

/* What the bar panel shows, per device, all clipped to the device's step
 * spans (S = the union of its "step" spans):
 *   communication = |union of its collective spans (cat "comm") ∩ S|
 *   compute       = |union of its forward+backward and optimizer spans
 *                   (cat "compute") ∩ S| minus their overlap with the
 *                   communication union
 *   idle          = |S| - compute - communication: time in the step
 *                   outside every span of the other two kinds
 * in seconds, summed over every step in the trace. */
static int dev_time_of(struct dev_spans *ds, struct dev_time *t)
{
	for (int k = 0; k < SPAN_KINDS; k++)
		ivs_union(&ds->k[k]);
	struct ivs *S = &ds->k[SPAN_STEP];
	struct ivs c = { 0 }, m = { 0 }, cm = { 0 };
	c.v = malloc(sizeof(*c.v) * (size_t)(S->n + ds->k[SPAN_COMPUTE].n + 1));
	m.v = malloc(sizeof(*m.v) * (size_t)(S->n + ds->k[SPAN_COMM].n + 1));
	cm.v = malloc(sizeof(*cm.v) * (size_t)(S->n + ds->k[SPAN_COMPUTE].n + ds->k[SPAN_COMM].n + 1));
	int rc = c.v && m.v && cm.v ? 0 : -ENOMEM;
	if (!rc) {
		ivs_intersect(&ds->k[SPAN_COMPUTE], S, &c);
		ivs_intersect(&ds->k[SPAN_COMM], S, &m);
		ivs_intersect(&c, &m, &cm);
		t->device = ds->tid;
		t->host = ds->pid;
		t->step_s = ivs_len(S) * 1e-6;
		t->comm_s = ivs_len(&m) * 1e-6;
		t->compute_s = (ivs_len(&c) - ivs_len(&cm)) * 1e-6;
		t->idle_s = fmax(0, t->step_s - t->comm_s - t->compute_s);
	}
	free(c.v);
	free(m.v);
	free(cm.v);
	return rc;
}

/* The whole file, at most REPORT_MAX_TRACE bytes (more, or an endless
 * input, is refused: errno EFBIG), NUL-terminated. NULL with errno. */
static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	struct stat st;
	if (!fstat(fileno(f), &st) && S_ISREG(st.st_mode) && (uint64_t)st.st_size > REPORT_MAX_TRACE) {
		fclose(f);
		errno = EFBIG;
		return NULL;
	}
	char *buf = NULL;
	size_t cap = 0, n = 0, r;
	do {
		if (n == REPORT_MAX_TRACE + 1) {
			free(buf);
			fclose(f);
			errno = EFBIG;
			return NULL;
		}
		if (cap - n < 65536) {
			size_t want = cap * 2 + 65536;
			if (want > REPORT_MAX_TRACE + 2)
				want = REPORT_MAX_TRACE + 2;
			char *b = realloc(buf, cap = want);
			if (!b) {
				free(buf);
				fclose(f);
				errno = ENOMEM;
				return NULL;
			}
			buf = b;
		}
		n += r = fread(buf + n, 1, cap - n - 1, f);
	} while (r > 0);
	int bad = ferror(f);
	fclose(f);
	if (bad) {
		free(buf);
		errno = EIO;
		return NULL;
	}
	buf[n] = 0;
	*len = n;
	return buf;
}

static int line_of(const char *text, const char *at)
{
	int line = 1;
	for (const char *p = text; p < at && *p; p++)
		line += *p == '\n';
	return line;
}

static struct dev_spans *dev_of(struct dev_spans **ds, int *n, int tid, int pid)
{
	for (int i = 0; i < *n; i++)
		if ((*ds)[i].tid == tid)
			return &(*ds)[i];
	struct dev_spans *d = realloc(*ds, sizeof(**ds) * (size_t)(*n + 1));
	if (!d)
		return NULL;
	*ds = d;
	memset(&d[*n], 0, sizeof(d[*n]));
	d[*n].tid = tid;
	d[*n].pid = pid;
	return &d[(*n)++];
}

/* Files the complete ("ph":"X") events of the three categories the
 * training job writes by thread (= device); other events are ignored. */
static int collect_spans(const cJSON *events, const char *path, struct dev_spans **ds, int *n,
			 char *err, size_t errlen)
{
	static const char *const cats[SPAN_KINDS] = { "step", "compute", "comm" };
	int i = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, events) {
		i++;
		const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
		const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
		if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X") || !cJSON_IsString(cat))
			continue;
		int k = 0;
		while (k < SPAN_KINDS && strcmp(cat->valuestring, cats[k]))
			k++;
		if (k == SPAN_KINDS)
			continue;
		double ts, dur, tid, pid = 0;
		if (!num_field(e, "ts", &ts) || !num_field(e, "dur", &dur) || dur < 0 ||
		    !num_field(e, "tid", &tid) || tid < 0 || tid > 1e6) {
			char what[96];
			snprintf(what, sizeof(what), "event %d lacks a numeric ts, dur or tid", i);
			return bad_input(err, errlen, path, 0, what);
		}
		num_field(e, "pid", &pid);
		struct dev_spans *d = dev_of(ds, n, (int)tid, (int)pid);
		if (!d || ivs_add(&d->k[k], ts, ts + dur)) {
			snprintf(err, errlen, "report: out of memory reading '%s'", path);
			return -ENOMEM;
		}
	}
	return 0;
}

static int dev_cmp(const void *x, const void *y)
{
	const struct dev_time *a = x, *b = y;
	return a->device - b->device;
}

static int trace_read(const char *path, struct trace_sum *ts, char *err, size_t errlen)
{
	memset(ts, 0, sizeof(*ts));
	size_t len;
	char *text = slurp(path, &len);
	if (!text && errno == EFBIG) {
		snprintf(err, errlen, "report: '%s' is larger than %d MiB (the report's bound)", path,
			 REPORT_MAX_TRACE >> 20);
		return -EBADMSG;
	}
	if (!text) {
		char es[128];
		snprintf(err, errlen, "report: unable to read '%s': %s", path,
			 util_errstr(errno, es, sizeof(es)));
		return -EBADMSG;
	}
	const char *end = NULL;
	cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
	if (!root) {
		int rc = bad_input(err, errlen, path, line_of(text, end ? end : text), "not valid JSON");
		free(text);
		return rc;
	}
	free(text);
	/* Chrome accepts an object with traceEvents or a bare array */
	const cJSON *events = cJSON_IsArray(root) ? root : cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
	struct dev_spans *ds = NULL;
	int n = 0, rc;
	if (!cJSON_IsArray(events))
		rc = bad_input(err, errlen, path, 0, "no traceEvents array");
	else
		rc = collect_spans(events, path, &ds, &n, err, errlen);
	if (!rc && !(ts->d = calloc((size_t)n + 1, sizeof(*ts->d)))) {
		snprintf(err, errlen, "report: out of memory reading '%s'", path);
		rc = -ENOMEM;
	}
	for (int i = 0; !rc && i < n; i++) {
		if (!ds[i].k[SPAN_STEP].n)
			continue;
		if ((rc = dev_time_of(&ds[i], &ts->d[ts->n++])))
			snprintf(err, errlen, "report: out of memory reading '%s'", path);
	}
	if (!rc && ts->n == 0)
		rc = bad_input(err, errlen, path, 0, "no step spans");
	for (int i = 0; i < n; i++)
		for (int k = 0; k < SPAN_KINDS; k++)
			free(ds[i].k[k].v);
	free(ds);
	cJSON_Delete(root);
	if (rc) {
		free(ts->d);
		ts->d = NULL;
		return rc;
	}
	qsort(ts->d, (size_t)ts->n, sizeof(*ts->d), dev_cmp);
	return 0;
}

/* ---- SVG ---- */

#define SVG_W 880.0
#define PLOT_L 96.0             /* plot area x range */
#define PLOT_R (SVG_W - 40.0)
#define PANEL_H 260.0
#define PLOT_TOP 44.0           /* plot area within a panel */
#define PLOT_BOT (PANEL_H - 58.0)
#define BAR_ROW 30.0

static const char *const FONT = "font-family=\"sans-serif\"";

static void xml_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		switch (*s) {
		case '&': fputs("&amp;", f); break;
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '"': fputs("&quot;", f); break;
		default: fputc(*s, f);
		}
	}
}

/* A tick spacing of 1, 2 or 5 x 10^k giving about five ticks over span. */
static double nice_step(double span)
{
	double raw = span / 5, mag = pow(10, floor(log10(raw))), r = raw / mag;
	return mag * (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10);
}

struct axis {
	double lo, hi, tick;
};

/* Widens [lo, hi] to whole ticks (and to something when lo == hi). */
static struct axis axis_of(double lo, double hi, bool integer)
{
	if (!(hi > lo)) {
		double pad = fabs(lo) > 0 ? fabs(lo) * 0.1 : 1;
		lo -= pad;
		hi += pad;
		if (lo < 0 && hi - pad >= 0 && !integer)
			lo = 0;
	}
	double t = nice_step(hi - lo);
	if (integer && t < 1)
		t = 1;
	return (struct axis){ floor(lo / t) * t, ceil(hi / t) * t, t };
}

static double map(const struct axis *a, double v, double p0, double p1)
{
	return p0 + (v - a->lo) / (a->hi - a->lo) * (p1 - p0);
}

/* A panel's points: a series name (data-series), a colour, and for a
 * second series on the same axes a legend label. */
struct series {
	const char *name, *color, *label;
	int n;
	const int64_t *step;
	const double *val;
};

struct line_panel {
	const char *title, *ylabel, *note;
	bool zero_base;
	struct series s[2];        /* s[1].n == 0: one series */
};

static void svg_axes(FILE *f, double top, const struct axis *ax, const struct axis *ay,
		     const char *ylabel)
{
	double y0 = top + PLOT_TOP, y1 = top + PLOT_BOT;
	fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
		"stroke=\"#444\"/>\n", PLOT_L, y0, PLOT_R - PLOT_L, y1 - y0);
	for (long k = lround(ax->lo / ax->tick); k <= lround(ax->hi / ax->tick); k++) {
		double x = map(ax, k * ax->tick, PLOT_L, PLOT_R);
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>"
			"<text class=\"xtick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
			x, y1, x, y1 + 5, x, y1 + 19, k * ax->tick);
	}
	for (long k = lround(ay->lo / ay->tick); k <= lround(ay->hi / ay->tick); k++) {
		double y = map(ay, k * ay->tick, y1, y0);
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
			"<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>"
			"<text class=\"ytick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
			PLOT_L + 0.5, y, PLOT_R - 0.5, y, PLOT_L - 5, y, PLOT_L, y,
			PLOT_L - 8, y + 4, k * ay->tick);
	}
	fprintf(f, "<text class=\"xlabel\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n",
		(PLOT_L + PLOT_R) / 2, y1 + 40);
	fprintf(f, "<text class=\"ylabel\" transform=\"translate(%.1f %.1f) rotate(-90)\" "
		"text-anchor=\"middle\">", PLOT_L - 62, (y0 + y1) / 2);
	xml_text(f, ylabel);
	fputs("</text>\n", f);
}

/* One series of a panel: a polyline through every point and a circle per
 * point carrying the value (9 significant digits) it was drawn from. */
static void svg_series(FILE *f, const struct series *p, const struct axis *ax, const struct axis *ay,
		       double y0, double y1)
{
	fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", p->color);
	for (int i = 0; i < p->n; i++)
		fprintf(f, "%s%.2f,%.2f", i ? " " : "", map(ax, (double)p->step[i], PLOT_L, PLOT_R),
			map(ay, p->val[i], y1, y0));
	fputs("\"/>\n", f);
	double r = p->n > 200 ? 1.2 : 2.8;
	for (int i = 0; i < p->n; i++)
		fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"%.1f\" fill=\"%s\" data-series=\"%s\" "
			"data-step=\"%" PRId64 "\" data-value=\"%.9g\"><title>step %" PRId64 ": %.6g</title></circle>\n",
			map(ax, (double)p->step[i], PLOT_L, PLOT_R), map(ay, p->val[i], y1, y0), r,
			p->color, p->name, p->step[i], p->val[i], p->step[i], p->val[i]);
}

/* One panel of values over the steps [s0, s1], its top edge at top: its
 * series on shared axes (a legend when there are two); a note instead
 * when the first has no point. */
static void svg_line_panel(FILE *f, double top, int64_t s0, int64_t s1, const struct line_panel *p)
{
	fprintf(f, "<g class=\"panel\" data-series=\"%s\">\n<text class=\"title\" x=\"%.1f\" y=\"%.1f\" "
		"font-size=\"15\" font-weight=\"bold\">", p->s[0].name, PLOT_L, top + 26);
	xml_text(f, p->title);
	fputs("</text>\n", f);
	double lo = INFINITY, hi = -INFINITY;
	for (int k = 0; k < 2; k++)
		for (int i = 0; i < p->s[k].n; i++) {
			lo = fmin(lo, p->s[k].val[i]);
			hi = fmax(hi, p->s[k].val[i]);
		}
	if (p->s[0].n == 0)
		lo = hi = 0;
	if (p->zero_base && lo > 0)
		lo = 0;
	struct axis ax = axis_of((double)s0, (double)s1, true), ay = axis_of(lo, hi, false);
	svg_axes(f, top, &ax, &ay, p->ylabel);
	if (p->s[0].n == 0) {
		fprintf(f, "<text class=\"note\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
			"font-size=\"14\" fill=\"#a00\">", (PLOT_L + PLOT_R) / 2, top + (PLOT_TOP + PLOT_BOT) / 2);
		xml_text(f, p->note);
		fputs("</text>\n</g>\n", f);
		return;
	}
	double y0 = top + PLOT_TOP, y1 = top + PLOT_BOT;
	for (int k = 0; k < 2; k++)
		if (p->s[k].n)
			svg_series(f, &p->s[k], &ax, &ay, y0, y1);
	for (int k = 0; p->s[1].n && k < 2; k++) {
		double x = PLOT_R - 330 + 170 * k;
		fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"4\" fill=\"%s\"/>"
			"<text class=\"legend\" x=\"%.1f\" y=\"%.1f\">", x, top + 32, p->s[k].color, x + 20,
			top + 37);
		xml_text(f, p->s[k].label);
		fputs("</text>\n", f);
	}
	fputs("</g>\n", f);
}

static const char *const BAR_KIND[3] = { "compute", "communication", "idle" };
static const char *const BAR_COLOR[3] = { "#4878cf", "#ee854a", "#c8c8c8" };

static void svg_legend(FILE *f, double x, double y)
{
	for (int k = 0; k < 3; k++, x += 150)
		fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"%s\"/>"
			"<text class=\"legend\" x=\"%.1f\" y=\"%.1f\">%s</text>\n",
			x, y - 11, BAR_COLOR[k], x + 20, y, BAR_KIND[k]);
}

static double bar_panel_height(int ndev)
{
	return PLOT_TOP + ndev * BAR_ROW + 150;
}

/* Horizontal stacked bars, one per device: seconds of compute,
 * communication and idle over all traced steps, then the caption that
 * says how they were computed. */
static void svg_bar_panel(FILE *f, double top, const struct trace_sum *ts)
{
	fprintf(f, "<g class=\"panel\" data-series=\"time_split\">\n<text class=\"title\" x=\"%.1f\" "
		"y=\"%.1f\" font-size=\"15\" font-weight=\"bold\">Time per device: compute, communication, "
		"idle (from the trace)</text>\n", PLOT_L, top + 26);
	double most = 0;
	for (int i = 0; i < ts->n; i++)
		most = fmax(most, ts->d[i].step_s);
	struct axis ax = axis_of(0, most, false);
	double y0 = top + PLOT_TOP, y1 = y0 + ts->n * BAR_ROW;
	for (long k = 0; k <= lround(ax.hi / ax.tick); k++) {
		double x = map(&ax, k * ax.tick, PLOT_L, PLOT_R);
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
			"<text class=\"xtick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
			x, y0, x, y1 + 5, x, y1 + 19, k * ax.tick);
	}
	for (int i = 0; i < ts->n; i++) {
		const struct dev_time *d = &ts->d[i];
		double v[3] = { d->compute_s, d->comm_s, d->idle_s }, x = PLOT_L, y = y0 + i * BAR_ROW + 4;
		fprintf(f, "<text class=\"ytick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">host %d dev %d"
			"</text>\n", PLOT_L - 8, y + 15, d->host, d->device);
		for (int k = 0; k < 3; k++) {
			double w = map(&ax, v[k], PLOT_L, PLOT_R) - PLOT_L;
			fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
				"data-device=\"%d\" data-kind=\"%s\" data-value=\"%.9g\"><title>device %d %s: "
				"%.4g s (%.1f%%)</title></rect>\n", x, y, w, BAR_ROW - 8, BAR_COLOR[k],
				d->device, BAR_KIND[k], v[k], d->device, BAR_KIND[k], v[k],
				d->step_s > 0 ? 100 * v[k] / d->step_s : 0);
			x += w;
		}
	}
	fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>\n"
		"<text class=\"xlabel\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">seconds (summed over "
		"every step in the trace)</text>\n", PLOT_L, y1, PLOT_R, y1, (PLOT_L + PLOT_R) / 2, y1 + 40);
	svg_legend(f, PLOT_L, y1 + 66);
	static const char *const caption[] = {
		"Per device, within its step spans: communication = the union of its collective spans "
		"(cat \"comm\");",
		"compute = its forward+backward and optimizer spans (cat \"compute\") minus their overlap "
		"with communication;",
		"idle = step span time minus both: in the step but outside every compute and "
		"collective span.",
	};
	for (int k = 0; k < 3; k++) {
		fprintf(f, "<text class=\"caption\" x=\"%.1f\" y=\"%.1f\" font-size=\"12\" fill=\"#333\">",
			PLOT_L, y1 + 92 + 16 * k);
		xml_text(f, caption[k]);
		fputs("</text>\n", f);
	}
	fputs("</g>\n", f);
}

/* ---- the three metrics panels ---- */

struct tok_choice {
	const char *ylabel;
	int devices;           /* divisor for rows with only the global rate */
	bool global;           /* no device count: the panel plots the global rate */
};

/* tokens/s per device: tokens_per_s_per_device where a row has it, else
 * the global rate over the device count taken from the trace or from a
 * newer row that has both rates; with no device count at all the panel
 * plots the global rate and says so. */
static struct tok_choice tok_choose(const struct metrics *m, const struct trace_sum *ts)
{
	bool need = false;
	int devices = ts ? ts->n : 0;
	for (int i = 0; i < m->n; i++) {
		const struct row *r = &m->r[i];
		if ((r->has & HAS_TOK_GLOBAL) && !(r->has & HAS_TOK_DEV))
			need = true;
		if (!devices && (r->has & HAS_TOK_DEV) && (r->has & HAS_TOK_GLOBAL) && r->tok_dev > 0)
			devices = (int)lround(r->tok_global / r->tok_dev);
	}
	if (!need)
		return (struct tok_choice){ "tokens/s per device", 0, false };
	if (devices > 0)
		return (struct tok_choice){ "tokens/s per device", devices, false };
	return (struct tok_choice){ "tokens/s (global)", 0, true };
}

/* which: 0 loss, 1 tokens/s, 2 communication share, 3 eval_loss */
static void fill_series(const struct metrics *m, const struct tok_choice *tc, int which,
			int64_t *step, double *val, int *n)
{
	*n = 0;
	for (int i = 0; i < m->n; i++) {
		const struct row *r = &m->r[i];
		double v;
		if (which == 0 && (r->has & HAS_LOSS))
			v = r->loss;
		else if (which == 3 && (r->has & HAS_EVAL))
			v = r->eval_loss;
		else if (which == 1 && !tc->global && (r->has & HAS_TOK_DEV))
			v = r->tok_dev;
		else if (which == 1 && (r->has & HAS_TOK_GLOBAL))
			v = tc->global ? r->tok_global : r->tok_global / tc->devices;
		else if (which == 2 && (r->has & HAS_COMM) && (r->has & HAS_TIME))
			v = 100 * r->comm_wait_s / r->step_time_s;
		else
			continue;
		step[*n] = r->step;
		val[(*n)++] = v;
	}
}

static void svg_header(FILE *f, double height, const char *metrics, const char *trace,
		       const struct metrics *m)
{
	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
		"viewBox=\"0 0 %.0f %.0f\" %s font-size=\"12\">\n"
		"<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
		"<text class=\"title\" x=\"%.1f\" y=\"30\" font-size=\"20\" font-weight=\"bold\">"
		"meshrun report</text>\n<text x=\"%.1f\" y=\"52\" fill=\"#333\">metrics: ",
		SVG_W, height, SVG_W, height, FONT, PLOT_L, PLOT_L);
	xml_text(f, metrics);
	fprintf(f, " (%d steps, %" PRId64 " to %" PRId64 "; a step logged twice is shown as last "
		"logged)", m->n, m->r[0].step, m->r[m->n - 1].step);
	if (trace) {
		fputs("; trace: ", f);
		xml_text(f, trace);
	}
	fputs("</text>\n", f);
}

static int svg_write(FILE *f, const char *metrics, const char *trace, const struct metrics *m,
		     const struct trace_sum *ts)
{
	int64_t *step = malloc(sizeof(*step) * 2 * (size_t)m->n);
	double *val = malloc(sizeof(*val) * 2 * (size_t)m->n);
	if (!step || !val) {
		free(step);
		free(val);
		return -ENOMEM;
	}
	struct tok_choice tc = tok_choose(m, ts);
	char tok_title[128];
	if (tc.devices && !ts)
		snprintf(tok_title, sizeof(tok_title), "Throughput (rows without a per-device rate: "
			 "global / %d devices)", tc.devices);
	else if (tc.devices)
		snprintf(tok_title, sizeof(tok_title), "Throughput (rows without a per-device rate: "
			 "global / %d devices in the trace)", tc.devices);
	else
		snprintf(tok_title, sizeof(tok_title), "Throughput");
	struct line_panel p[3] = {
		{ .title = "Training loss", .ylabel = "loss (nats/token)", .note = "no loss in this file",
		  .s = { { .name = "loss", .color = "#1f77b4", .label = "training loss" },
			 { .name = "eval_loss", .color = "#ff7f0e", .label = "eval_loss (held out)" } } },
		{ .title = tok_title, .ylabel = tc.ylabel, .note = "no tokens/s in this file",
		  .zero_base = true, .s = { { .name = "tokens_per_s", .color = "#2ca02c" } } },
		{ .title = "Communication share of each step (comm_wait_s / step_time_s, device 0 of host 0)",
		  .ylabel = "communication (% of step)", .note = "no comm_wait_s in this file",
		  .zero_base = true, .s = { { .name = "comm_share", .color = "#d62728" } } },
	};
	double top = 64, height = top + 3 * PANEL_H + (ts ? bar_panel_height(ts->n) : 0) + 10;
	svg_header(f, height, metrics, trace, m);
	for (int k = 0; k < 3; k++, top += PANEL_H) {
		fill_series(m, &tc, k, step, val, &p[k].s[0].n);
		p[k].s[0].step = step;
		p[k].s[0].val = val;
		if (k == 0) {  /* the held-out loss beside the training loss */
			fill_series(m, &tc, 3, step + m->n, val + m->n, &p[k].s[1].n);
			p[k].s[1].step = step + m->n;
			p[k].s[1].val = val + m->n;
			if (p[k].s[1].n)
				p[k].title = "Training loss and held-out loss (eval_loss)";
		}
		svg_line_panel(f, top, m->r[0].step, m->r[m->n - 1].step, &p[k]);
	}
	if (ts)
		svg_bar_panel(f, top, ts);
	fputs("</svg>\n", f);
	free(step);
	free(val);
	return 0;
}

int report_write(const char *metrics, const char *trace, const char *out, char *warn,
		 size_t warnlen, char *err, size_t errlen)
{
	struct metrics m;
	struct trace_sum ts = { 0 };
	struct util_out o;
	if (warnlen)
		warn[0] = 0;
	int rc = metrics_read(metrics, &m, warn, warnlen, err, errlen);
	if (rc)
		return rc;
	if (trace && (rc = trace_read(trace, &ts, err, errlen)))
		goto out_metrics;
	/* whole or not at all: a failed write leaves no partial SVG */
	if ((rc = util_out_open(&o, "report", out, err, errlen)))
		goto out_trace;
	if ((rc = svg_write(o.f, metrics, trace, &m, trace ? &ts : NULL))) {
		util_out_abort(&o);
		snprintf(err, errlen, "report: out of memory drawing '%s'", out);
	} else {
		rc = util_out_commit(&o, err, errlen);
	}
out_trace:
	free(ts.d);
out_metrics:
	free(m.r);
	return rc;
}
