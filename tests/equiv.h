/* Equivalence checks shared by the training suites (check_train,
 * check_pipeline): run meshrun through tests/proc.h, read a metrics
 * file's exact losses (loss_hex), and compare a multi-device run with one
 * device on the same global batch, twice for determinism. Header-only,
 * static inline functions, like proc.h (a suite that uses some of them,
 * check_remesh, warns of no other); the suites run without forking, so the
 * single-device baselines are cached across tests. */
#ifndef MESHRUN_TESTS_EQUIV_H
#define MESHRUN_TESTS_EQUIV_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/proc.h"

/* Runs a meshrun command line (killed after 120 s; stdout and stderr to
 * tmpdir/log.out); returns its exit status (-1: killed at the deadline). */
static inline int run(const char *args)
{
	struct proc p;
	return proc_run(&p, "log", args, 120);
}

/* The contents of tmpdir/name (malloc'd; "" if absent). */
static inline char *read_tmp(const char *name)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	FILE *f = fopen(path, "r");
	if (!f)
		return strdup("");
	/* the whole file, however long (a trace can pass 1 MiB) */
	size_t cap = 1 << 16, n = 0, got;
	char *buf = malloc(cap);
	while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
		n += got;
		if (n + 1 == cap) {
			char *more = realloc(buf, cap *= 2);
			if (!more)
				free(buf);
			buf = more;
		}
	}
	fclose(f);
	if (buf)
		buf[n] = 0;
	return buf ? buf : strdup("");
}

/* Reads the losses (exact, from loss_hex) of a metrics file. */
static inline int losses(const char *name, double *out, int max)
{
	char path[256], line[4096];
	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	FILE *f = fopen(path, "r");
	int n = 0;
	if (!f)
		return 0;
	while (n < max && fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "\"loss_hex\":\"");
		ck_assert_msg(p, "metrics line without loss_hex: %s", line);
		out[n++] = strtod(p + 12, NULL);
	}
	fclose(f);
	return n;
}

/* With MESHRUN_RECORD_LOSSES=FILE set, appends one line per run to FILE:
 * the command line's arguments (tmpdir removed), a tab, and each step's
 * loss_hex, so a restructure can be compared run by run with the losses
 * recorded before it (`sort` both files, then `diff`). */
static inline void record_losses(const char *args, const char *name)
{
	const char *path = getenv("MESHRUN_RECORD_LOSSES");
	if (!path || !*path)
		return;
	char cmd[1024], line[4096], file[256];
	size_t n = 0, tl = strlen(tmpdir);
	for (const char *a = args; *a && n + 1 < sizeof(cmd);)
		if (tl && !strncmp(a, tmpdir, tl))
			a += tl, cmd[n++] = '@';
		else
			cmd[n++] = *a++;
	cmd[n] = 0;
	snprintf(file, sizeof(file), "%s/%s", tmpdir, name);
	FILE *in = fopen(file, "r"), *out = fopen(path, "a");
	ck_assert_msg(in && out, "record %s to %s", file, path);
	fprintf(out, "%s\t", cmd);
	while (fgets(line, sizeof(line), in)) {
		char *p = strstr(line, "\"loss_hex\":\"");
		if (p)
			fprintf(out, " %.*s", (int)strcspn(p + 12, "\""), p + 12);
	}
	fputc('\n', out);
	fclose(in);
	fclose(out);
}

static inline void show_log_on_failure(int rc, int want)
{
	if (rc != want) {
		char *log = read_tmp("log.out");
		fprintf(stderr, "%s\n", log);
		free(log);
	}
	ck_assert_int_eq(rc, want);
}

/* Tolerance: a sharded run sums gradients and partial products in another
 * order (per-device partial sums, then a ring all-reduce; a vocabulary
 * split sums its softmax per part) than one device does, so float32
 * rounding differs at ~1e-7 relative per step and grows slowly through
 * training; in an MoE model a near-tie in the router can then send a token
 * to another expert, which moves the loss by ~1e-6 (measured: worst 3e-6,
 * tensor-parallel deepseek-tiny). 1e-4 relative over 10 steps leaves a
 * wide margin over that and is far below any real bug (a wrong row or a
 * missing gradient changes step 1's loss by > 1e-2). */
#define REL_TOL 1e-4

/* 10 steps of `preset` on hosts x dph devices (global batch 8) against one
 * device with per_device_batch_size=8; twice, to check determinism. */
/* Single-device losses of (preset, opt), computed once per process: the
 * check_train process runs the suite without forking (see main). */
static struct {
	char key[256];
	double loss[10];
} cache[16];
static int ncache;

static inline void single_losses(const char *preset, const char *opt, int batch, double *out)
{
	char key[256], args[1024];
	snprintf(key, sizeof(key), "%s %s %d", preset, opt, batch);
	for (int i = 0; i < ncache; i++)
		if (!strcmp(cache[i].key, key)) {
			memcpy(out, cache[i].loss, sizeof(cache[i].loss));
			return;
		}
	snprintf(args, sizeof(args), "train --config %s steps=10 per_device_batch_size=%d %s --metrics %s/one.jsonl",
		 preset, batch, opt, tmpdir);
	show_log_on_failure(run(args), 0);
	record_losses(args, "one.jsonl");
	ck_assert_int_eq(losses("one.jsonl", out, 10), 10);
	if (ncache < 16) {
		snprintf(cache[ncache].key, sizeof(cache[ncache].key), "%s", key);
		memcpy(cache[ncache++].loss, out, sizeof(cache[0].loss));
	}
}

/* The same with a global batch of `batch` rows (a multiple of the
 * devices). */
static inline void equivalence_batch(const char *preset, int hosts, int dph, const char *extra, const char *opt,
			      int batch)
{
	char args[1024];
	double one[10], dp[10], dp2[10];
	int pdb = batch / (hosts * dph);
	ck_assert_int_eq(pdb * hosts * dph, batch);
	single_losses(preset, opt, batch, one);
	for (int k = 0; k < 2; k++) {
		snprintf(args, sizeof(args), "local --hosts %d --devices-per-host %d --config %s steps=10 "
			 "per_device_batch_size=%d %s %s --metrics %s/dp%d.jsonl", hosts, dph, preset, pdb,
			 extra, opt, tmpdir, k);
		show_log_on_failure(run(args), 0);
		if (k == 0)
			record_losses(args, "dp0.jsonl");
	}
	ck_assert_int_eq(losses("dp0.jsonl", dp, 10), 10);
	ck_assert_int_eq(losses("dp1.jsonl", dp2, 10), 10);
	double worst = 0;
	for (int s = 0; s < 10; s++) {
		double rel = fabs(dp[s] - one[s]) / fabs(one[s]);
		worst = rel > worst ? rel : worst;
		ck_assert_msg(rel < REL_TOL, "%s %dx%d %s step %d: loss %.9g, one device %.9g",
			      preset, hosts, dph, extra, s, dp[s], one[s]);
		ck_assert_msg(dp[s] == dp2[s], "step %d: two identical runs differ: %a vs %a", s, dp[s], dp2[s]);
	}
	ck_assert(one[9] < one[0] - 0.5); /* and it trains */
	fprintf(stderr, "%s %dx%d %s %s: worst relative loss difference to one device %.2e\n",
		preset, hosts, dph, extra, opt, worst);
}

static inline void equivalence_opt(const char *preset, int hosts, int dph, const char *extra, const char *opt)
{
	equivalence_batch(preset, hosts, dph, extra, opt, 8);
}

#endif
