/* meshrun report: the SVG is read back and every plotted point must be the
 * metrics value it stands for (data-value attributes, and the circle
 * positions must be a linear map of them that the axis ticks agree with);
 * old and new metrics names, duplicate steps, the trace split into
 * compute / communication / idle, one-line errors and the exit codes; and
 * a real training run's metrics file plotted step by step. */
#include <cJSON.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/obs/report.h"
#include "tests/proc.h"

static char path_m[128], path_t[128], path_svg[128];

static void setup(void)
{
	proc_setup("meshrun-report", 0);
	snprintf(path_m, sizeof(path_m), "%s/m.jsonl", tmpdir);
	snprintf(path_t, sizeof(path_t), "%s/t.json", tmpdir);
	snprintf(path_svg, sizeof(path_svg), "%s/r.svg", tmpdir);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	ck_assert(f);
	ck_assert_int_ge(fputs(text, f), 0);
	ck_assert_int_eq(fclose(f), 0);
}

static char *read_all(const char *path)
{
	FILE *f = fopen(path, "r");
	ck_assert_msg(f, "no %s", path);
	static char buf[1 << 20];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	return buf;
}

/* ---- reading the SVG back ---- */

/* The value of attribute name in the tag starting at tag (0 if absent). */
static bool attr(const char *tag, const char *name, char *out, size_t outlen)
{
	const char *end = strchr(tag, '>');
	char key[64];
	snprintf(key, sizeof(key), " %s=\"", name);
	const char *p = strstr(tag, key);
	if (!p || (end && p > end))
		return false;
	p += strlen(key);
	size_t n = strcspn(p, "\"");
	snprintf(out, outlen, "%.*s", (int)(n < outlen - 1 ? n : outlen - 1), p);
	return true;
}

static double attr_num(const char *tag, const char *name)
{
	char v[64];
	ck_assert_msg(attr(tag, name, v, sizeof(v)), "no %s in %.80s", name, tag);
	return strtod(v, NULL);
}

struct pt {
	long step;
	double value, cx, cy;
};

/* The circles of one series, in document order. */
static int points(const char *svg, const char *series, struct pt *p, int max)
{
	int n = 0;
	char s[64];
	for (const char *c = strstr(svg, "<circle "); c; c = strstr(c + 1, "<circle ")) {
		if (!attr(c, "data-series", s, sizeof(s)) || strcmp(s, series))
			continue;
		ck_assert_int_lt(n, max);
		p[n++] = (struct pt){ (long)attr_num(c, "data-step"), attr_num(c, "data-value"),
				      attr_num(c, "cx"), attr_num(c, "cy") };
	}
	return n;
}

/* The <g> of one panel as its own string (static buffer). */
static const char *panel(const char *svg, const char *series)
{
	static char buf[1 << 18];
	char key[96];
	snprintf(key, sizeof(key), "<g class=\"panel\" data-series=\"%s\">", series);
	const char *a = strstr(svg, key);
	ck_assert_msg(a, "no panel %s", series);
	const char *b = strstr(a, "</g>");
	ck_assert(b);
	snprintf(buf, sizeof(buf), "%.*s", (int)(b - a), a);
	return buf;
}

static bool has_text(const char *svg, const char *cls, const char *text)
{
	char key[256];
	snprintf(key, sizeof(key), "class=\"%s\"", cls);
	for (const char *p = strstr(svg, key); p; p = strstr(p + 1, key)) {
		const char *gt = strchr(p, '>');
		if (gt && !strncmp(gt + 1, text, strlen(text)) && gt[1 + strlen(text)] == '<')
			return true;
	}
	return false;
}

static void assert_close(double got, double want)
{
	ck_assert_msg(fabs(got - want) <= 1e-8 * fmax(1, fabs(want)), "got %.17g want %.17g", got, want);
}

/* The points' positions are one linear map of (step, value) with y growing
 * down, and the y tick labels sit on that same map: inverting it at each
 * tick's position gives the tick's value. */
static void assert_mapping(const char *svg, const char *series, const struct pt *p, int n)
{
	ck_assert_int_ge(n, 3);
	double bx = (p[1].cx - p[0].cx) / (p[1].step - p[0].step);
	int k = 1;
	while (k < n && p[k].value == p[0].value)
		k++;
	ck_assert_int_lt(k, n);
	double by = (p[k].cy - p[0].cy) / (p[k].value - p[0].value);
	ck_assert(bx > 0 && by < 0);
	for (int i = 0; i < n; i++) {
		ck_assert_double_eq_tol(p[i].cx, p[0].cx + bx * (p[i].step - p[0].step), 0.02);
		ck_assert_double_eq_tol(p[i].cy, p[0].cy + by * (p[i].value - p[0].value), 0.02);
	}
	const char *g = panel(svg, series);
	int ticks = 0;
	for (const char *t = strstr(g, "class=\"ytick\""); t; t = strstr(t + 1, "class=\"ytick\"")) {
		const char *tag = t;
		while (*tag != '<')
			tag--;
		double y = attr_num(tag, "y") - 4, v = strtod(strchr(t, '>') + 1, NULL);
		ck_assert_double_eq_tol(p[0].value + (y - p[0].cy) / by, v, fabs(v) * 1e-6 + 0.2 / -by);
		ticks++;
	}
	ck_assert_int_ge(ticks, 3);
}

/* ---- the cases ---- */

static const double LOSS[5] = { 5.5842380469697179, 5.0984257238390924, 4.5323, 4.25297, 4.1359 };
static const double TOKDEV[5] = { 2241.4, 3227.4, 3612.9, 5020.1, 7480.2 };
static const double COMMW[5] = { 0.031, 0.018, 0.0123, 0.009, 0.0071 };
static const double STEPT[5] = { 0.228, 0.159, 0.142, 0.102, 0.068 };

static void write_new_metrics(const char *path)
{
	char text[4096] = "";
	for (int s = 0; s < 5; s++) {
		char line[512];
		snprintf(line, sizeof(line), "{\"step\":%d,\"loss\":%.17g,\"loss_hex\":\"%a\","
			 "\"step_time_s\":%.17g,\"tokens_per_s_global\":%.17g,"
			 "\"tokens_per_s_per_device\":%.17g,\"comm_wait_s\":%.17g,\"mfu\":0.1}\n",
			 s, LOSS[s], LOSS[s], STEPT[s], TOKDEV[s] * 4, TOKDEV[s], COMMW[s]);
		strcat(text, line);
	}
	write_file(path, text);
}

START_TEST(test_points)
{
	char err[256] = "";
	write_new_metrics(path_m);
	ck_assert_int_eq(report_write(path_m, NULL, path_svg, NULL, 0, err, sizeof(err)), 0);
	const char *svg = read_all(path_svg);
	ck_assert(!strstr(svg, "<script") && !strstr(svg, "href") && !strstr(svg, "@import"));
	ck_assert(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
	struct pt p[16];
	ck_assert_int_eq(points(svg, "loss", p, 16), 5);
	for (int s = 0; s < 5; s++) {
		ck_assert_int_eq(p[s].step, s);
		assert_close(p[s].value, LOSS[s]);
	}
	assert_mapping(svg, "loss", p, 5);
	ck_assert_int_eq(points(svg, "tokens_per_s", p, 16), 5);
	for (int s = 0; s < 5; s++)
		assert_close(p[s].value, TOKDEV[s]);
	assert_mapping(svg, "tokens_per_s", p, 5);
	ck_assert_int_eq(points(svg, "comm_share", p, 16), 5);
	for (int s = 0; s < 5; s++)
		assert_close(p[s].value, 100 * COMMW[s] / STEPT[s]);
	assert_mapping(svg, "comm_share", p, 5);
	ck_assert(has_text(svg, "xlabel", "step"));
	ck_assert(has_text(svg, "ylabel", "loss (nats/token)"));
	ck_assert(has_text(svg, "ylabel", "tokens/s per device"));
	ck_assert(has_text(svg, "ylabel", "communication (% of step)"));
	ck_assert(has_text(svg, "xtick", "4"));
	ck_assert(!strstr(svg, "no comm_wait_s"));
}
END_TEST

/* Before comm_wait_s and the per-device rate: the global rate is plotted
 * and labelled so, and the communication panel says why it is empty. */
START_TEST(test_old_names)
{
	write_file(path_m, "{\"step\":0,\"loss\":3.5,\"step_time_s\":0.5,\"tokens_per_s\":1000}\n"
			   "\n"
			   "{\"step\":1,\"loss\":3.25,\"step_time_s\":0.25,\"tokens_per_s\":2000}\n"
			   "{\"step\":2,\"loss\":3,\"step_time_s\":0.2,\"tokens_per_s\":2500}\n");
	char err[256] = "";
	ck_assert_int_eq(report_write(path_m, NULL, path_svg, NULL, 0, err, sizeof(err)), 0);
	const char *svg = read_all(path_svg);
	struct pt p[8];
	ck_assert_int_eq(points(svg, "tokens_per_s", p, 8), 3);
	assert_close(p[0].value, 1000);
	assert_close(p[2].value, 2500);
	ck_assert(has_text(svg, "ylabel", "tokens/s (global)"));
	ck_assert(!has_text(svg, "ylabel", "tokens/s per device"));
	ck_assert_int_eq(points(svg, "comm_share", p, 8), 0);
	ck_assert(has_text(panel(svg, "comm_share"), "note", "no comm_wait_s in this file"));
	ck_assert_int_eq(points(svg, "loss", p, 8), 3);
	assert_close(p[1].value, 3.25);
}
END_TEST

/* A run resumed at step 1 logs steps 1 and 2 again: the later lines win. */
START_TEST(test_duplicates)
{
	write_file(path_m, "{\"step\":0,\"loss\":4}\n"
			   "{\"step\":1,\"loss\":3.9}\n"
			   "{\"step\":2,\"loss\":3.8}\n"
			   "{\"step\":1,\"loss\":3.7}\n"
			   "{\"step\":2,\"loss\":3.6}\n"
			   "{\"step\":3,\"loss\":3.5}\n");
	char err[256] = "";
	ck_assert_int_eq(report_write(path_m, NULL, path_svg, NULL, 0, err, sizeof(err)), 0);
	struct pt p[8];
	ck_assert_int_eq(points(read_all(path_svg), "loss", p, 8), 4);
	static const double want[4] = { 4, 3.7, 3.6, 3.5 };
	for (int s = 0; s < 4; s++) {
		ck_assert_int_eq(p[s].step, s);
		assert_close(p[s].value, want[s]);
	}
}
END_TEST

/* eval_loss on some steps: drawn in the loss panel on the loss's axes
 * (its own series), a legend naming both, the title saying so. */
START_TEST(test_eval_loss)
{
	write_file(path_m, "{\"step\":0,\"loss\":5}\n"
			   "{\"step\":1,\"loss\":4.5,\"eval_loss\":4.75}\n"
			   "{\"step\":2,\"loss\":4}\n"
			   "{\"step\":3,\"loss\":3.5,\"eval_loss\":4.25}\n"
			   "{\"step\":4,\"loss\":3.25}\n"
			   "{\"step\":5,\"loss\":3,\"eval_loss\":3.5}\n");
	char err[256] = "";
	ck_assert_int_eq(report_write(path_m, NULL, path_svg, NULL, 0, err, sizeof(err)), 0);
	const char *svg = read_all(path_svg);
	struct pt p[8], e[8], all[16];
	ck_assert_int_eq(points(svg, "loss", p, 8), 6);
	ck_assert_int_eq(points(svg, "eval_loss", e, 8), 3);
	static const double want[3] = { 4.75, 4.25, 3.5 };
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(e[i].step, 2 * i + 1);
		assert_close(e[i].value, want[i]);
	}
	/* one map for both: the eval points sit on the loss panel's axes */
	memcpy(all, p, sizeof(p[0]) * 6);
	memcpy(all + 6, e, sizeof(e[0]) * 3);
	assert_mapping(svg, "loss", all, 9);
	const char *g = panel(svg, "loss");
	ck_assert(strstr(g, "data-series=\"eval_loss\""));
	ck_assert(has_text(svg, "legend", "eval_loss (held out)"));
	ck_assert(has_text(svg, "title", "Training loss and held-out loss (eval_loss)"));
	/* no eval_loss: the panel as before */
	write_file(path_m, "{\"step\":0,\"loss\":5}\n{\"step\":1,\"loss\":4}\n");
	ck_assert_int_eq(report_write(path_m, NULL, path_svg, NULL, 0, err, sizeof(err)), 0);
	svg = read_all(path_svg);
	ck_assert_int_eq(points(svg, "eval_loss", e, 8), 0);
	ck_assert(has_text(svg, "title", "Training loss"));
	ck_assert(!strstr(svg, "class=\"legend\""));
}
END_TEST

static double bar(const char *svg, int device, const char *kind)
{
	char d[16], k[32];
	for (const char *r = strstr(svg, "<rect "); r; r = strstr(r + 1, "<rect "))
		if (attr(r, "data-device", d, sizeof(d)) && atoi(d) == device &&
		    attr(r, "data-kind", k, sizeof(k)) && !strcmp(k, kind))
			return attr_num(r, "data-value");
	ck_abort_msg("no bar %d %s", device, kind);
	return 0;
}

/* Device 0: a compute span overlapping a collective by 10 us, a collective
 * running past the step's end (clipped). Device 1 (another host): two
 * steps, overlapping collective spans (their union counts once). Old
 * metrics names: the global rate is divided by the trace's 2 devices. */
START_TEST(test_trace)
{
	write_file(path_t,
		   "{\"traceEvents\":["
		   "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"device 0\"}},"
		   "{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":0,\"dur\":100,\"pid\":0,\"tid\":0},"
		   "{\"name\":\"forward+backward\",\"cat\":\"compute\",\"ph\":\"X\",\"ts\":10,\"dur\":40,\"pid\":0,\"tid\":0},"
		   "{\"name\":\"all_gather fsdp\",\"cat\":\"comm\",\"ph\":\"X\",\"ts\":40,\"dur\":20,\"pid\":0,\"tid\":0},"
		   "{\"name\":\"optimizer\",\"cat\":\"compute\",\"ph\":\"X\",\"ts\":70,\"dur\":10,\"pid\":0,\"tid\":0},"
		   "{\"name\":\"all_reduce data\",\"cat\":\"comm\",\"ph\":\"X\",\"ts\":90,\"dur\":30,\"pid\":0,\"tid\":0},"
		   "{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":0,\"dur\":100,\"pid\":1,\"tid\":1},"
		   "{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":100,\"dur\":100,\"pid\":1,\"tid\":1},"
		   "{\"name\":\"forward+backward\",\"cat\":\"compute\",\"ph\":\"X\",\"ts\":0,\"dur\":150,\"pid\":1,\"tid\":1},"
		   "{\"name\":\"a\",\"cat\":\"comm\",\"ph\":\"X\",\"ts\":140,\"dur\":15,\"pid\":1,\"tid\":1},"
		   "{\"name\":\"b\",\"cat\":\"comm\",\"ph\":\"X\",\"ts\":150,\"dur\":10,\"pid\":1,\"tid\":1},"
		   "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"host 1\"}}]}");
	write_file(path_m, "{\"step\":0,\"loss\":3.5,\"tokens_per_s\":1000}\n"
			   "{\"step\":1,\"loss\":3.25,\"tokens_per_s\":3000}\n");
	char err[256] = "";
	ck_assert_int_eq(report_write(path_m, path_t, path_svg, NULL, 0, err, sizeof(err)), 0);
	const char *svg = read_all(path_svg);
	assert_close(bar(svg, 0, "communication"), 30e-6);
	assert_close(bar(svg, 0, "compute"), 40e-6);
	assert_close(bar(svg, 0, "idle"), 30e-6);
	assert_close(bar(svg, 1, "communication"), 20e-6);
	assert_close(bar(svg, 1, "compute"), 140e-6);
	assert_close(bar(svg, 1, "idle"), 40e-6);
	ck_assert(has_text(svg, "legend", "compute"));
	ck_assert(has_text(svg, "legend", "communication"));
	ck_assert(has_text(svg, "legend", "idle"));
	ck_assert(has_text(svg, "xlabel", "seconds (summed over every step in the trace)"));
	ck_assert(strstr(svg, "class=\"caption\""));
	struct pt p[4];
	ck_assert_int_eq(points(svg, "tokens_per_s", p, 4), 2);
	assert_close(p[0].value, 500);
	assert_close(p[1].value, 1500);
	ck_assert(has_text(svg, "ylabel", "tokens/s per device"));
}
END_TEST

static void expect_error(const char *m, const char *t, const char *out, int rc, const char *want)
{
	char err[256] = "";
	ck_assert_int_eq(report_write(m, t, out, NULL, 0, err, sizeof(err)), rc);
	ck_assert_msg(!strcmp(err, want), "err '%s', want '%s'", err, want);
	ck_assert(!strchr(err, '\n'));
}

START_TEST(test_errors)
{
	char want[256], none[160];
	write_file(path_m, "{\"step\":0,\"loss\":1}\n{\"step\":1,\"loss\":1}\n[1,2]\n");
	snprintf(want, sizeof(want), "report: %s:3: not a JSON object", path_m);
	expect_error(path_m, NULL, path_svg, -EBADMSG, want);
	write_file(path_m, "{\"step\":0,\"loss\":1}\n{\"step\":1,\"lo\n");
	snprintf(want, sizeof(want), "report: %s:2: not valid JSON", path_m);
	expect_error(path_m, NULL, path_svg, -EBADMSG, want);
	write_file(path_m, "{\"step\":0.5,\"loss\":1}\n");
	snprintf(want, sizeof(want), "report: %s:1: no integer 'step'", path_m);
	expect_error(path_m, NULL, path_svg, -EBADMSG, want);
	write_file(path_m, "\n\n");
	snprintf(want, sizeof(want), "report: %s: no metrics lines", path_m);
	expect_error(path_m, NULL, path_svg, -EBADMSG, want);
	snprintf(none, sizeof(none), "%s/none.jsonl", tmpdir);
	snprintf(want, sizeof(want), "report: unable to open '%s': no such file or directory", none);
	expect_error(none, NULL, path_svg, -EBADMSG, want);

	write_file(path_m, "{\"step\":0,\"loss\":1}\n");
	write_file(path_t, "{\"traceEvents\":[\n{\"ph\":\"X\",\n\"ts\":1,]}");
	snprintf(want, sizeof(want), "report: %s:3: not valid JSON", path_t);
	expect_error(path_m, path_t, path_svg, -EBADMSG, want);
	write_file(path_t, "{\"traceEvents\":[{\"ph\":\"X\",\"cat\":\"step\",\"ts\":1,\"tid\":0}]}");
	snprintf(want, sizeof(want), "report: %s: event 1 lacks a numeric ts, dur or tid", path_t);
	expect_error(path_m, path_t, path_svg, -EBADMSG, want);
	write_file(path_t, "{\"events\":[]}");
	snprintf(want, sizeof(want), "report: %s: no traceEvents array", path_t);
	expect_error(path_m, path_t, path_svg, -EBADMSG, want);

	snprintf(none, sizeof(none), "%s/no/such/dir.svg", tmpdir);
	snprintf(want, sizeof(want), "report: unable to write '%s': no such file or directory", none);
	expect_error(path_m, NULL, none, -ENOENT, want);
}
END_TEST

START_TEST(test_cut_and_endless)
{
	char want[256], warn[256], err[256];
	struct pt p[4];
	/* a run killed mid-line: the cut last line is left out, with a warning */
	write_file(path_m, "{\"step\":0,\"loss\":3}\n{\"step\":1,\"loss\":2}\n{\"step\":2,\"lo");
	ck_assert_int_eq(report_write(path_m, NULL, path_svg, warn, sizeof(warn), err, sizeof(err)), 0);
	snprintf(want, sizeof(want), "report: %s:3: the last line is cut short (no newline); "
		 "drawn without it", path_m);
	ck_assert_str_eq(warn, want);
	ck_assert_int_eq(points(read_all(path_svg), "loss", p, 4), 2);
	assert_close(p[1].value, 2);
	/* a last line without its newline that parses is a line like any */
	write_file(path_m, "{\"step\":0,\"loss\":3}\n{\"step\":1,\"loss\":2}");
	ck_assert_int_eq(report_write(path_m, NULL, path_svg, warn, sizeof(warn), err, sizeof(err)), 0);
	ck_assert_str_eq(warn, "");
	ck_assert_int_eq(points(read_all(path_svg), "loss", p, 4), 2);
	/* a cut line in the middle is still an error */
	write_file(path_m, "{\"step\":0,\"loss\":3}\n{\"step\":1,\"lo\n{\"step\":2,\"loss\":2}\n");
	snprintf(want, sizeof(want), "report: %s:2: not valid JSON", path_m);
	expect_error(path_m, NULL, path_svg, -EBADMSG, want);

	/* endless inputs end within a bound */
	double t0 = now_s();
	expect_error("/dev/zero", NULL, path_svg, -EBADMSG,
		     "report: /dev/zero:1: no newline within 65536 bytes (not a metrics file?)");
	write_file(path_m, "{\"step\":0,\"loss\":3}\n");
	expect_error(path_m, "/dev/zero", path_svg, -EBADMSG,
		     "report: '/dev/zero' is larger than 128 MiB (the report's bound)");
	ck_assert_double_lt(now_s() - t0, 10);
	/* so do files over the size bound, at once (a sparse 2 GiB file) */
	char big[160];
	snprintf(big, sizeof(big), "%s/big.jsonl", tmpdir);
	int fd = open(big, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 2ll << 30), 0);
	close(fd);
	snprintf(want, sizeof(want), "report: %s: larger than 1024 MiB (the report's bound)", big);
	expect_error(big, NULL, path_svg, -EBADMSG, want);
	snprintf(want, sizeof(want), "report: '%s' is larger than 128 MiB (the report's bound)", big);
	expect_error(path_m, big, path_svg, -EBADMSG, want);
	ck_assert_double_lt(now_s() - t0, 10);
}
END_TEST

/* ---- through the binary ---- */

/* `meshrun report args`: exit code, and its stderr into stderr_text. */
static int run(const char *args, char *stderr_text, size_t len)
{
	char line[1024];
	struct proc p;
	snprintf(line, sizeof(line), "report %s", args);
	int rc = proc_run_words(&p, "report", line, 30, false);
	snprintf(stderr_text, len, "%s", read_all(p.err));
	return rc;
}

START_TEST(test_binary)
{
	char args[512], text[1024], want[256];
	write_new_metrics(path_m);
	snprintf(args, sizeof(args), "%s -o %s", path_m, path_svg);
	ck_assert_int_eq(run(args, text, sizeof(text)), 0);
	struct pt p[8];
	ck_assert_int_eq(points(read_all(path_svg), "loss", p, 8), 5);
	assert_close(p[4].value, LOSS[4]);

	write_file(path_m, "{\"step\":0}\n{\"step\":1}\n7\n");
	ck_assert_int_eq(run(args, text, sizeof(text)), 4);
	snprintf(want, sizeof(want), "meshrun: report: %s:3: not a JSON object\n", path_m);
	ck_assert_str_eq(text, want);

	ck_assert_int_eq(run(path_m, text, sizeof(text)), 2);
	ck_assert(strstr(text, "usage: meshrun report"));
	snprintf(args, sizeof(args), "%s -o %s --bogus", path_m, path_svg);
	ck_assert_int_eq(run(args, text, sizeof(text)), 2);

	/* a cut last line: drawn, one warning line */
	write_file(path_m, "{\"step\":0,\"loss\":3}\n{\"step\":1,\"loss\":2}\n{\"step\":2,\"lo");
	snprintf(args, sizeof(args), "%s -o %s", path_m, path_svg);
	ck_assert_int_eq(run(args, text, sizeof(text)), 0);
	snprintf(want, sizeof(want), "meshrun: report: %s:3: the last line is cut short (no newline); "
		 "drawn without it\n", path_m);
	ck_assert_str_eq(text, want);
	/* an endless input: refused, bad input */
	snprintf(args, sizeof(args), "/dev/zero -o %s", path_svg);
	ck_assert_int_eq(run(args, text, sizeof(text)), 4);
	ck_assert_str_eq(text, "meshrun: report: /dev/zero:1: no newline within 65536 bytes (not a metrics file?)\n");
}
END_TEST

/* A real run's metrics file: the plotted loss of every step is the
 * file's `loss` to the precision the SVG prints (%.9g). */
START_TEST(test_real_metrics)
{
	char args[512];
	struct proc p;
	snprintf(args, sizeof(args), "train --config configs/llama-tiny.yml steps=4 --metrics %s", path_m);
	int rc = proc_run(&p, "train", args, 120);
	ck_assert_msg(rc == 0, "train: exit %d:\n%s", rc, slurp(p.out));
	snprintf(args, sizeof(args), "report %s -o %s", path_m, path_svg);
	rc = proc_run(&p, "report", args, 30);
	ck_assert_msg(rc == 0, "report: exit %d:\n%s", rc, slurp(p.out));

	/* the metrics file, one JSON object a line */
	double loss[8];
	long step[8];
	int n = 0;
	char line[4096];
	FILE *f = fopen(path_m, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		cJSON *o = cJSON_Parse(line);
		ck_assert_msg(o, "not JSON: %s", line);
		const cJSON *js = cJSON_GetObjectItemCaseSensitive(o, "step");
		const cJSON *jl = cJSON_GetObjectItemCaseSensitive(o, "loss");
		ck_assert_msg(cJSON_IsNumber(js) && cJSON_IsNumber(jl), "%s", line);
		ck_assert_int_lt(n, 8);
		step[n] = (long)js->valuedouble;
		loss[n++] = jl->valuedouble;
		cJSON_Delete(o);
	}
	fclose(f);
	ck_assert_int_eq(n, 4);

	const char *svg = read_all(path_svg);
	struct pt pt[8];
	ck_assert_int_eq(points(svg, "loss", pt, 8), n);
	int k = 0;
	for (const char *c = strstr(svg, "<circle "); c; c = strstr(c + 1, "<circle ")) {
		char series[64], value[64], want[64];
		if (!attr(c, "data-series", series, sizeof(series)) || strcmp(series, "loss"))
			continue;
		ck_assert_int_eq(pt[k].step, step[k]);
		ck_assert_int_eq(step[k], k);
		ck_assert(attr(c, "data-value", value, sizeof(value)));
		snprintf(want, sizeof(want), "%.9g", loss[k]);
		ck_assert_msg(!strcmp(value, want), "step %ld: plotted %s, metrics loss %.17g", step[k], value,
			      loss[k]);
		ck_assert_double_eq_tol(pt[k].value, loss[k], 1e-8 * fabs(loss[k]));
		k++;
	}
	ck_assert_int_eq(k, n);
	assert_mapping(svg, "loss", pt, n);
}
END_TEST

static Suite *report_suite(void)
{
	Suite *s = suite_create("report");
	struct { const char *name; const TTest *fn; } cases[] = {
		{ "points", test_points }, { "old_names", test_old_names },
		{ "duplicates", test_duplicates }, { "trace", test_trace },
		{ "errors", test_errors }, { "cut_and_endless", test_cut_and_endless },
		{ "binary", test_binary },
		{ "real_metrics", test_real_metrics }, { "eval_loss", test_eval_loss },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_add_checked_fixture(tc, setup, teardown);
		tcase_set_timeout(tc, 60);
		tcase_add_test(tc, cases[i].fn);
		suite_add_tcase(s, tc);
	}
	return s;
}

int main(void)
{
	SRunner *r = srunner_create(report_suite());
	srunner_run_all(r, CK_NORMAL);
	int failed = srunner_ntests_failed(r);
	srunner_free(r);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
