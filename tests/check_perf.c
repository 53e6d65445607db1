/* The step-time model (host/perf/perf.h) against what its parts must
 * give by hand: with compute from a FLOP rate and free links, 1F1B's
 * table is (M+S-1)(F+B); GPipe's the same; devices sharing half as many
 * cores as they are take twice as long (their optimizers too); a
 * transfer's measured CPU is charged to its two ends, and is part of a
 * slower link's time; the data-parallel gradient sum is
 * a ring all-reduce of the gradients; gathers waited for at every use
 * (neither weight flag) cost their link time, gathers ahead hide behind
 * compute; --search lists the fastest first; `meshrun plan` prints
 * predicted_step_s on a line of its own. (Whether the predictions match
 * measured steps is a benchmark, bench/sched.sh, not a test.) */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>

#include "host/config/config.h"
#include "host/perf/perf.h"
#include "tests/proc.h"

static char err[1024];

/* A tiny dense model (vocabulary 8: the head costs next to nothing) on
 * hosts x dph with the overrides. */
static void make_cfg(struct cfg *c, int hosts, int dph, const char *const *kv)
{
	const char *base[] = { "vocab_size=8", "base_emb_dim=64", "base_num_query_heads=4", "base_num_kv_heads=4",
			       "base_mlp_dim=128", "max_target_length=32", "base_num_decoder_layers=8",
			       "per_device_batch_size=4", NULL };
	cfg_defaults(c);
	for (const char *const *k = base; *k; k++)
		ck_assert_msg(cfg_override(c, *k, err, sizeof(err)) == 0, "%s", err);
	for (; kv && *kv; kv++)
		ck_assert_msg(cfg_override(c, *kv, err, sizeof(err)) == 0, "%s: %s", *kv, err);
	ck_assert_msg(cfg_finish(c, hosts, dph, err, sizeof(err)) == 0, "%s", err);
}

#define KV(...) ((const char *const[]){ __VA_ARGS__, NULL })

static const struct perf_machine free_links = {
	.dcn = { 1e15, 0 }, .ici = { 1e15, 0 }, .flops = 1e9,
};

static void predict(const struct cfg *c, const struct perf_machine *mc, struct perf_parts *p)
{
	ck_assert_msg(perf_predict(c, mc, NULL, p, err, sizeof(err)) == 0, "%s", err);
}

/* F and B of a chunk of `lps` layers at the config's microbatch. */
static void chunk_costs(const struct cfg *c, int lps, double *f, double *b)
{
	struct model_dims d;
	struct perf_compute pc;
	ck_assert(model_dims_from_cfg(&d, c, err, sizeof(err)) == 0);
	int mb = perf_mb_rows(c, &d, err, sizeof(err));
	ck_assert_int_gt(mb, 0);
	perf_analytic(&d, mb, 1e9, &pc);
	*f = lps * pc.f_layer[0];
	*b = lps * pc.b_layer[0];
}

START_TEST(test_1f1b_and_gpipe_tables)
{
	const char *scheds[] = { "pipeline_schedule=1f1b", "pipeline_schedule=gpipe" };
	for (int k = 0; k < 2; k++)
		for (int M = 4; M <= 16; M *= 2) {
			struct cfg c;
			struct perf_parts p;
			char mkv[64];
			double f, b;
			snprintf(mkv, sizeof(mkv), "num_pipeline_microbatches=%d", M);
			make_cfg(&c, 4, 1, KV("dcn_data_parallelism=1", "dcn_pipeline_parallelism=4", scheds[k], mkv,
					      "num_layers_per_pipeline_stage=2", "pipeline_recompute=false"));
			chunk_costs(&c, 2, &f, &b);
			predict(&c, &free_links, &p);
			double want = (M + 3) * (f + b);
			ck_assert_msg(fabs(p.table - want) < 0.01 * want, "%s M=%d: table %g, (M+S-1)(F+B) %g",
				      scheds[k], M, p.table, want);
			ck_assert_msg(fabs(p.bubble - 3.0 / (M + 3)) < 0.01, "bubble %g", p.bubble);
		}
}
END_TEST

/* ZB-H1 with recompute off times I and W from the given fractions of B
 * (`--iw`): its table is M(F+I+W) + (S-1)(F+I-W) when W <= F+I (Qi et
 * al. 2023; the W's fill the bubble), and with no fractions given it
 * takes the compute figures' own I and W (from --flops: W the weights'
 * matmuls once, I the rest of B). */
START_TEST(test_zb_h1_iw)
{
	const double fr[][2] = { { 0.5, 0.5 }, { 0.56, 0.46 }, { 0.7, 0.3 }, { 0, 0 } };
	for (int k = 0; k < 4; k++)
		for (int M = 4; M <= 16; M *= 2) {
			struct cfg c;
			struct perf_parts p;
			struct perf_machine mc = free_links;
			struct model_dims d;
			struct perf_compute pc;
			char mkv[64];
			double f, b;
			snprintf(mkv, sizeof(mkv), "num_pipeline_microbatches=%d", M);
			make_cfg(&c, 4, 1, KV("dcn_data_parallelism=1", "dcn_pipeline_parallelism=4",
					      "pipeline_schedule=zb_h1", mkv, "num_layers_per_pipeline_stage=2",
					      "pipeline_recompute=false"));
			chunk_costs(&c, 2, &f, &b);
			mc.i_frac = fr[k][0];
			mc.w_frac = fr[k][1];
			double i = fr[k][0] * b, w = fr[k][1] * b;
			if (k == 3) {
				ck_assert(model_dims_from_cfg(&d, &c, err, sizeof(err)) == 0);
				perf_analytic(&d, perf_mb_rows(&c, &d, err, sizeof(err)), 1e9, &pc);
				i = 2 * pc.i_layer[0];
				w = 2 * pc.w_layer[0];
				ck_assert_msg(fabs(i + w - b) < 1e-9 * b && w < i, "I %g W %g B %g", i, w, b);
			}
			predict(&c, &mc, &p);
			double want = M * (f + i + w) + 3 * (f + i - w);
			ck_assert_msg(fabs(p.table - want) < 0.01 * want, "I/B %g W/B %g M=%d: table %g, "
				      "M(F+I+W)+(S-1)(F+I-W) %g", i / b, w / b, M, p.table, want);
		}
}
END_TEST

/* Muon's Newton-Schulz runs once per matrix across the mesh: on 4
 * data-parallel devices (or 4 FSDP ones) each runs a quarter of one
 * device's; AdamW runs none. */
START_TEST(test_muon_once_per_matrix)
{
	struct cfg one, data, fsdp, adam;
	struct perf_parts p1, pd, pf, pa;
	make_cfg(&one, 1, 1, KV("opt_type=muon"));
	make_cfg(&data, 4, 1, KV("opt_type=muon"));
	make_cfg(&fsdp, 4, 1, KV("opt_type=muon", "dcn_data_parallelism=1", "dcn_fsdp_parallelism=4"));
	make_cfg(&adam, 4, 1, NULL);
	predict(&one, &free_links, &p1);
	predict(&data, &free_links, &pd);
	predict(&fsdp, &free_links, &pf);
	predict(&adam, &free_links, &pa);
	ck_assert_msg(p1.muon_ns > 0, "one device: Newton-Schulz %g s", p1.muon_ns);
	ck_assert_msg(fabs(pd.muon_ns - p1.muon_ns / 4) < 1e-9 * p1.muon_ns, "data=4: %g, one device %g", pd.muon_ns,
		      p1.muon_ns);
	ck_assert_msg(fabs(pf.muon_ns - p1.muon_ns / 4) < 1e-9 * p1.muon_ns, "fsdp=4: %g, one device %g", pf.muon_ns,
		      p1.muon_ns);
	ck_assert(pa.muon_ns == 0);
}
END_TEST

/* 4 devices of a data-parallel mesh on one machine: 2 cores take twice
 * as long as 4, 8 no longer than 4; the optimizer too. */
START_TEST(test_shared_cores)
{
	struct cfg c;
	struct perf_parts own, two, eight;
	struct perf_machine mc = free_links;
	make_cfg(&c, 1, 4, NULL);
	predict(&c, &mc, &own);
	mc.cores = 2;
	predict(&c, &mc, &two);
	mc.cores = 8;
	predict(&c, &mc, &eight);
	ck_assert_msg(fabs(two.table - 2 * own.table) < 1e-9 * own.table, "%g vs %g", two.table, own.table);
	ck_assert_msg(fabs(eight.table - own.table) < 1e-9 * own.table, "%g vs %g", eight.table, own.table);
	/* every device runs its optimizer at once, so at the same share; the
	 * work a step counts it at full speed either way */
	ck_assert(own.optimizer > 0);
	ck_assert_msg(fabs(two.optimizer - 2 * own.optimizer) < 1e-9 * own.optimizer, "%g vs %g", two.optimizer,
		      own.optimizer);
	ck_assert_msg(fabs(eight.optimizer - own.optimizer) < 1e-9 * own.optimizer, "%g vs %g", eight.optimizer,
		      own.optimizer);
	ck_assert_msg(fabs(two.work - own.work) < 1e-9 * own.work, "work %g vs %g", two.work, own.work);
}
END_TEST

/* The transfers' CPU (measured figures: a byte costs its sender xs and
 * its receiver xr): 1F1B on 4 stages, M = 8, moves each microbatch's
 * activation forward and its gradient back over 3 hops, 2 x 8 x 3
 * messages of the microbatch's activation bytes, so the work by action
 * has 48 x bytes x (xs + xr) of it; each end pays its part on the
 * critical path, so the step grows, by less than all of it (the other
 * stages' sends run beside); on a link slower than the ends' CPU, that
 * CPU is part of the link's time: it adds less than on free links. */
START_TEST(test_transfer_cpu)
{
	struct cfg c;
	struct model_dims d;
	struct perf_compute pc;
	struct perf_parts none, charged, slow;
	struct perf_machine mc = free_links;
	make_cfg(&c, 4, 1, KV("dcn_data_parallelism=1", "dcn_pipeline_parallelism=4", "pipeline_schedule=1f1b",
			      "num_pipeline_microbatches=8", "num_layers_per_pipeline_stage=2",
			      "pipeline_recompute=false"));
	ck_assert(model_dims_from_cfg(&d, &c, err, sizeof(err)) == 0);
	int mb = perf_mb_rows(&c, &d, err, sizeof(err));
	ck_assert_int_gt(mb, 0);
	perf_analytic(&d, mb, 1e9, &pc);
	ck_assert_msg(perf_predict(&c, &mc, &pc, &none, err, sizeof(err)) == 0, "%s", err);
	ck_assert(none.work_kind[PERF_XFER] == 0);
	double bytes = (double)mb * d.T * d.C * sizeof(float), xs = 2e-9, xr = 3e-9;
	pc.xfer_send = xs;
	pc.xfer_recv = xr;
	ck_assert_msg(perf_predict(&c, &mc, &pc, &charged, err, sizeof(err)) == 0, "%s", err);
	double all = 48 * bytes * (xs + xr);
	ck_assert_msg(fabs(charged.work_kind[PERF_XFER] - all) < 1e-9 * all, "transfers %g, want %g",
		      charged.work_kind[PERF_XFER], all);
	ck_assert_msg(fabs(charged.work - none.work - all) < 1e-9 * all, "work %g - %g", charged.work, none.work);
	ck_assert_msg(charged.step > none.step + 2 * bytes * (xs + xr) && charged.step < none.step + all,
		      "step %g without %g, transfers %g", charged.step, none.step, all);
	double charged_add = charged.step - none.step;
	/* a link of 1 GB/s: a message's bytes take longer on it than its ends' CPU */
	mc.dcn = mc.ici = (struct perf_link){ 1e9, 0 };
	ck_assert_msg(perf_predict(&c, &mc, &pc, &slow, err, sizeof(err)) == 0, "%s", err);
	pc.xfer_send = pc.xfer_recv = 0;
	ck_assert_msg(perf_predict(&c, &mc, &pc, &none, err, sizeof(err)) == 0, "%s", err);
	/* the ends' CPU hides in the link's time: it adds less than on free links */
	ck_assert_msg(slow.step - none.step < 0.95 * charged_add, "step %g, without the CPU %g; on free links +%g",
		      slow.step, none.step, charged_add);
}
END_TEST

/* data = 4 over hosts: the gradients all-reduced on a ring of 4. */
START_TEST(test_data_tail)
{
	struct cfg c;
	struct perf_parts p;
	struct perf_machine mc = free_links;
	mc.dcn = (struct perf_link){ 1e8, 1e-4 };
	make_cfg(&c, 4, 1, NULL);
	predict(&c, &mc, &p);
	double want = 2 * 3 * (1e-4 + p.mem_grads / 4 / 1e8);
	ck_assert_msg(fabs(p.tail - want) < 1e-9 + 1e-6 * want, "tail %g, ring all-reduce %g", p.tail, want);
}
END_TEST

/* Muon's Newton-Schulz in the optimizer's time: on one device every
 * matrix of the 8 layers (4 attention 64x64, 3 MLP 128x64: 10 r^2 (2c +
 * r) flops each) at 1 GFLOP/s; on 4 devices, split by FSDP or copied
 * over data, once per matrix over the group: a quarter each, not the
 * whole again on every device. */
START_TEST(test_muon_by_hand)
{
	const char *meshes[][2] = { { "ici_data_parallelism=4", NULL },
				    { "ici_data_parallelism=1", "ici_fsdp_parallelism=4" } };
	struct cfg c;
	struct perf_parts one, four, adamw;
	make_cfg(&c, 1, 1, KV("opt_type=muon"));
	predict(&c, &free_links, &one);
	make_cfg(&c, 1, 1, NULL);
	predict(&c, &free_links, &adamw);
	double want = 8 * (4 * 10.0 * 64 * 64 * (2 * 64 + 64) + 3 * 10.0 * 64 * 64 * (2 * 128 + 64)) / 1e9;
	ck_assert_msg(fabs(one.muon_ns - want) < 1e-9 * want, "one device: Newton-Schulz %g s, by hand %g",
		      one.muon_ns, want);
	ck_assert_msg(fabs(one.optimizer - adamw.optimizer - want) < 1e-9 * want, "optimizer %g, AdamW's %g",
		      one.optimizer, adamw.optimizer);
	for (int k = 0; k < 2; k++) {
		make_cfg(&c, 1, 4, KV("opt_type=muon", meshes[k][0], meshes[k][1]));
		predict(&c, &free_links, &four);
		ck_assert_msg(fabs(four.muon_ns - want / 4) < 1e-9 * want, "%s: Newton-Schulz %g s a device, want %g",
			      meshes[k][0], four.muon_ns, want / 4);
	}
}
END_TEST

/* FSDP over a slow link: gathered at every use (no flag) the table waits
 * for each gather; gathered once, for the first only. */
START_TEST(test_gathers)
{
	struct cfg a, b;
	struct perf_parts pa, pb;
	struct perf_machine mc = free_links;
	mc.dcn = (struct perf_link){ 1e6, 0 };  /* 1 MB/s: the gathers dominate */
	const char *common[] = { "dcn_data_parallelism=1", "dcn_fsdp_parallelism=2", "ici_pipeline_parallelism=2",
				 "ici_data_parallelism=1", "num_pipeline_microbatches=4" };
	make_cfg(&a, 2, 2, KV(common[0], common[1], common[2], common[3], common[4]));
	make_cfg(&b, 2, 2, KV(common[0], common[1], common[2], common[3], common[4], "pipeline_fsdp_ag_once=true"));
	predict(&a, &mc, &pa);
	predict(&b, &mc, &pb);
	/* per use: 2 R M = 32 gathers and R M = 16 reduce-scatters a stage (R
	 * = 4 repeats), each a layer over the link; once: R of each */
	ck_assert_msg(pa.table > 4 * pb.table, "per use %g, once %g", pa.table, pb.table);
	ck_assert_msg(pa.bubble > 0.9, "per use: idle %g", pa.bubble);
}
END_TEST

START_TEST(test_search_sorted)
{
	struct cfg c;
	struct perf_machine mc = free_links;
	mc.dcn = (struct perf_link){ 1.25e9, 5e-5 };
	mc.mem_bytes = 64.0 * (1 << 30);
	make_cfg(&c, 1, 1, NULL);
	fflush(stdout);
	/* its printout is read back through a pipe */
	int fds[2];
	ck_assert_int_eq(pipe(fds), 0);
	int saved = dup(1);
	dup2(fds[1], 1);
	int rc = perf_search(&c, 8, 1, &mc, 5, err, sizeof(err));
	fflush(stdout);
	dup2(saved, 1);
	close(fds[1]);
	ck_assert_msg(rc == 0, "%s", err);
	char out[8192];
	ssize_t n = read(fds[0], out, sizeof(out) - 1);
	close(fds[0]);
	ck_assert_int_gt(n, 0);
	out[n] = 0;
	double prev = 0;
	int rows = 0;
	for (char *l = strstr(out, "\n  tensor="); l; l = strstr(l + 1, "\n  tensor=")) {
		/* the step is the first number after the description */
		char *q = l + 3;
		while (*q && !(*q == ' ' && q[1] == ' '))
			q++;
		double step = strtod(q, NULL);
		ck_assert_msg(step > 0 && step >= prev, "not sorted: %g after %g\n%s", step, prev, out);
		prev = step;
		rows++;
	}
	ck_assert_msg(rows == 5, "%s", out);
}
END_TEST

/* --search tries the zero-bubble schedules: zb_h1 and zbv are listed,
 * and zb_h1 beats 1f1b at the same mesh, M and recompute (its bubble is
 * (S-1)(F+I-W) against (S-1)(F+B); this model's W is not free). */
START_TEST(test_search_zero_bubble)
{
	struct cfg c;
	struct perf_machine mc = free_links;
	mc.dcn = (struct perf_link){ 1.25e9, 5e-5 };
	make_cfg(&c, 1, 1, NULL);
	fflush(stdout);
	FILE *tf = tmpfile();
	ck_assert(tf);
	int saved = dup(1);
	dup2(fileno(tf), 1);
	int rc = perf_search(&c, 4, 1, &mc, 1000, err, sizeof(err));
	fflush(stdout);
	dup2(saved, 1);
	close(saved);
	ck_assert_msg(rc == 0, "%s", err);
	static char out[1 << 17];
	rewind(tf);
	size_t n = fread(out, 1, sizeof(out) - 1, tf);
	fclose(tf);
	out[n] = 0;
	ck_assert_msg(strstr(out, " zbv v=2 ") && strstr(out, " zb_h1 v=1 "), "%s", out);
	int pairs = 0;
	for (char *l = strstr(out, " 1f1b v=1 "); l; l = strstr(l + 1, " 1f1b v=1 ")) {
		char *b = l;
		while (b > out && b[-1] != '\n')
			b--;
		char row[256], want[256], *e = strchr(b, '\n');
		size_t len = e ? (size_t)(e - b) : strlen(b);
		ck_assert(len < sizeof(row));
		memcpy(row, b, len);
		row[len] = 0;
		/* the description up to the step column, with zb_h1 for 1f1b */
		char *gap = strstr(row, "  ");
		while (gap && gap == row)
			gap = strstr(gap + 2, "  ");
		ck_assert(gap);
		double step = strtod(gap, NULL);
		*gap = 0;
		snprintf(want, sizeof(want), "%.*szb_h1%s", (int)(strstr(row, "1f1b") - row), row,
			 strstr(row, "1f1b") + 4);
		char *z = strstr(out, want);
		ck_assert_msg(z, "no %s\n%s", want, out);
		double zstep = strtod(z + strlen(want), NULL);
		ck_assert_msg(zstep < step, "%s: %g, 1f1b %g", want, zstep, step);
		pairs++;
	}
	ck_assert_msg(pairs >= 8, "%d pairs\n%s", pairs, out);
}
END_TEST

/* The measured figures (perf_measure) on the tiny model, with one
 * thread beside: the forward that thread ran is recorded (it sets the
 * figures' level), the transfers' CPU a byte is measured for each end
 * (between 0 and a microsecond), and the cores the two threads got while
 * measuring are at most two, over at least the warm-up; the split
 * backward is measured with W reading in place exactly when the run's
 * does (pipeline_recompute false). */
START_TEST(test_measured)
{
	struct cfg c;
	struct perf_compute pc;
	make_cfg(&c, 1, 1, NULL);
	ck_assert_msg(perf_measure(&c, 2, 1, 1, &pc, err, sizeof(err)) == 0, "%s", err);
	ck_assert(pc.f_layer[0] > 0 && pc.b_layer[0] > 0 && pc.i_layer[0] > 0 && pc.w_layer[0] > 0);
	ck_assert_msg(pc.f_beside > 0, "f_beside %g", pc.f_beside);
	ck_assert_msg(pc.xfer_send > 0 && pc.xfer_send < 1e-6 && pc.xfer_recv > 0 && pc.xfer_recv < 1e-6,
		      "transfer CPU %g / %g s a byte", pc.xfer_send, pc.xfer_recv);
	ck_assert_msg(pc.cores_seen > 0 && pc.cores_seen <= 2.05 && pc.cores_window >= 0.5, "cores %g over %g s",
		      pc.cores_seen, pc.cores_window);
	ck_assert_int_eq(pc.rows, 2);
	/* I and W as the run splits them: W reads the weights' inputs in
	 * place without recompute (so I copies none), from a stash with it */
	ck_assert(!pc.w_in_place);
	make_cfg(&c, 1, 1, KV("pipeline_recompute=false"));
	ck_assert_msg(perf_measure(&c, 2, 1, 0, &pc, err, sizeof(err)) == 0, "%s", err);
	ck_assert(pc.w_in_place && pc.i_layer[0] > 0 && pc.w_layer[0] > 0);
}
END_TEST

/* --costs-from: a run's trace of 1F1B on 2 stages, M = 2, written here.
 * Stage 0 runs E0 F0 E1 F1 B0 e0 B1 e1, stage 1 F0 H0 B0 F1 H1 B1; in the
 * step read (step 1; step 0, ten times as slow, is the warm-up left out)
 * stage 0's F costs 0.8 and 1.2 (mean 1), its B 3, embed 0.01 and
 * embed_back 0.02; stage 1's F 2, head 0.5, B 4; every span's CPU its
 * wall (the cores fitted: both devices'), the optimizer 0.25. On free
 * links by hand: stage 1's B0 ends at 0.01+1+2+0.5+4 = 7.51, its B1 at
 * 7.51+2+0.5+4 = 14.01, stage 0's B1 then runs 3 and e1 0.02: the table
 * 17.03, the step 17.28 (the run itself, its first F 0.8, ended 0.2
 * earlier: the per-stage timelines are set side by side; with each
 * action its own cost the table is the run's, 16.83). A trace of M = 2 is refused for M = 4, for
 * zb_h1 (its I where the trace has B) and on 4 stages, in one line. */
struct tspan {
	int dev;
	const char *name;
	double ts, cpu;
};

/* send > 0: device 0's two sends on its row with their CPU, send s each
 * (a trace with the transfers' CPU: at 0.05 its 0.1 s in no span is
 * theirs); wait > 0: its executor's one send wait a step, with that CPU,
 * and one receive posted ahead with post (a trace with the executor's
 * spans) */
static void write_trace_exec(const char *path, const struct tspan *sp, int n, double opt, double send,
			     double wait, double post)
{
	bool xfer = send > 0;
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "{\"traceEvents\": [\n");
	fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {\"name\": \"device 0\"}}");
	for (int step = 0; step < 2; step++) {
		double k = step ? 1 : 10, base = step ? 100e6 : 0;
		for (int i = 0; i < n; i++)
			fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"pipeline\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, "
				"\"pid\": %d, \"tid\": %d, \"args\": {\"step\": %d, \"cpu_us\": %.3f}}", sp[i].name,
				base + k * sp[i].ts * 1e6, k * sp[i].cpu * 1e6, sp[i].dev, sp[i].dev, step, k * sp[i].cpu * 1e6);
		/* device 0's forward+backward and its two receive waits: 0.1 s of
		 * it in no span (its two sends, at walls) */
		static const struct { const char *name; double t0, t1; } row[] = {
			{ "forward+backward", 0, 16.93 }, { "stage recv grad 4", 2.02, 7.31 },
			{ "stage recv grad 5", 10.33, 13.81 },
		};
		for (int i = 0; i < 3; i++)
			fprintf(f, ",\n{\"name\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": 0, \"tid\": 0, "
				"\"args\": {\"step\": %d}}", row[i].name, base + k * row[i].t0 * 1e6,
				k * (row[i].t1 - row[i].t0) * 1e6, step);
		for (int i = 0; xfer && i < 2; i++)
			fprintf(f, ",\n{\"name\": \"stage send act %d\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": 0, "
				"\"tid\": 0, \"args\": {\"step\": %d, \"cpu_us\": %.3f}}", i, base + k * (0.81 + i) * 1e6,
				k * send * 1e6, step, k * send * 1e6);
		if (wait > 0)
			fprintf(f, ",\n{\"name\": \"stage send wait\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": 0, "
				"\"tid\": 0, \"args\": {\"step\": %d, \"cpu_us\": %.3f}}\n,{\"name\": \"stage post grad 5\", "
				"\"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": 0, \"tid\": 0, \"args\": {\"step\": %d, "
				"\"cpu_us\": %.3f}}", base + k * 16.83 * 1e6, k * 0.01e6, step, k * wait * 1e6,
				base + k * 7.31 * 1e6, k * 0.001e6, step, k * post * 1e6);
		for (int d = 0; d < 2; d++)
			fprintf(f, ",\n{\"name\": \"optimizer\", \"cat\": \"compute\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, "
				"\"pid\": %d, \"tid\": %d, \"args\": {\"step\": %d}}", base + 90e6, k * opt * 1e6, d, d, step);
	}
	fprintf(f, "\n]}\n");
	fclose(f);
}

static void write_trace(const char *path, const struct tspan *sp, int n, double opt, bool xfer)
{
	write_trace_exec(path, sp, n, opt, xfer ? 0.05 : 0, 0, 0);
}

START_TEST(test_costs_from)
{
	static const struct tspan sp[] = {
		{ 0, "embed mb0", 0, 0.01 }, { 0, "F mb0 c0", 0.01, 0.8 }, { 0, "embed mb1", 0.81, 0.01 },
		{ 0, "F mb1 c0", 0.82, 1.2 }, { 0, "B mb0 c0", 7.31, 3 }, { 0, "embed_back mb0", 10.31, 0.02 },
		{ 0, "B mb1 c0", 13.81, 3 }, { 0, "embed_back mb1", 16.81, 0.02 },
		{ 1, "F mb0 c1", 0.81, 2 }, { 1, "head mb0", 2.81, 0.5 }, { 1, "B mb0 c1", 3.31, 4 },
		{ 1, "F mb1 c1", 7.31, 2 }, { 1, "head mb1", 9.31, 0.5 }, { 1, "B mb1 c1", 9.81, 4 },
	};
	char path[] = "/tmp/check_perf-trace-XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	write_trace(path, sp, (int)(sizeof(sp) / sizeof(sp[0])), 0.25, false);
	struct perf_trace tr;
	ck_assert_msg(perf_trace_read(path, &tr, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(tr.ndev, 2);
	ck_assert_int_eq(tr.step0, 1);
	ck_assert_msg(fabs(tr.opt_s - 0.25) < 1e-9 && fabs(tr.cores - 2) < 1e-6, "optimizer %g, cores %g", tr.opt_s,
		      tr.cores);
	struct perf_machine mc = free_links;
	struct perf_parts p;
	struct cfg c;
	mc.flops = 0;
	mc.run = &tr;
	const char *pp[] = { "dcn_data_parallelism=1", "dcn_pipeline_parallelism=2", "num_layers_per_pipeline_stage=4",
			     "pipeline_recompute=false" };
	make_cfg(&c, 2, 1, KV(pp[0], pp[1], pp[2], pp[3], "pipeline_schedule=1f1b", "num_pipeline_microbatches=2"));
	ck_assert_msg(perf_predict(&c, &mc, NULL, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(fabs(p.table - 17.03) < 1e-6, "table %.9g, by hand 17.03", p.table);
	ck_assert_msg(fabs(p.step - 17.28) < 1e-6, "step %.9g, by hand 17.28", p.step);
	/* the run's own timeline: its first F took 0.8, so all after it ran 0.2 earlier */
	ck_assert_msg(fabs(p.stage_end[1] - 14.01) < 1e-6 && fabs(p.run_end[1] - 13.81) < 1e-6 &&
		      fabs(p.run_end[0] - 16.83) < 1e-6, "stage 1 ends %g, run %g; stage 0 run %g", p.stage_end[1],
		      p.run_end[1], p.run_end[0]);
	/* each action its own mean: the timeline is the run's */
	mc.run_by = PERF_RUN_ACTION;
	ck_assert_msg(perf_predict(&c, &mc, NULL, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(fabs(p.table - 16.83) < 1e-6 && fabs(p.stage_end[1] - 13.81) < 1e-6, "table %.9g, stage 1 %.9g",
		      p.table, p.stage_end[1]);
	/* the walls, cores not shared (every span's CPU its wall here), and
	 * stage 0's two sends 0.05 s each (its 0.1 s in no span): stage 1
	 * starts each of its chains 0.05 s later, the table ends at 16.88 */
	mc.run_by = PERF_RUN_WALL;
	ck_assert_msg(fabs(tr.untraced[0] - 0.1) < 1e-6 && tr.untraced[1] == 0, "untraced %g, %g", tr.untraced[0],
		      tr.untraced[1]);
	ck_assert_msg(perf_predict(&c, &mc, NULL, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(fabs(p.table - 16.88) < 1e-6, "table %.9g, by hand 16.88", p.table);
	ck_assert_int_eq(p.xfer_by, PERF_XFER_UNTRACED);
	mc.run_by = PERF_RUN_KIND;
	/* the same run traced with its sends' CPU: nothing is left
	 * untraced; each send costs its 0.05 s with every --costs-by, so
	 * kind's table is 17.03 + 0.05 (stage 1 starts its chains 0.05 s
	 * later, as at walls) and the walls' the same 16.88 */
	perf_trace_release(&tr);
	write_trace(path, sp, (int)(sizeof(sp) / sizeof(sp[0])), 0.25, true);
	ck_assert_msg(perf_trace_read(path, &tr, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(tr.xfer_traced && tr.nsend[0] == 2 && fabs(tr.send_cpu[0] - 0.1) < 1e-9 && fabs(tr.untraced[0]) < 1e-9,
		      "traced %d, sends %d, %g s, untraced %g", tr.xfer_traced, tr.nsend[0], tr.send_cpu[0], tr.untraced[0]);
	ck_assert_msg(perf_predict(&c, &mc, NULL, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(fabs(p.table - 17.08) < 1e-6 && p.xfer_by == PERF_XFER_TRACED, "table %.9g, by hand 17.08",
		      p.table);
	mc.run_by = PERF_RUN_WALL;
	ck_assert_msg(perf_predict(&c, &mc, NULL, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(fabs(p.table - 16.88) < 1e-6 && p.xfer_by == PERF_XFER_TRACED, "table %.9g, by hand 16.88",
		      p.table);
	ck_assert(!tr.exec_traced);
	/* the executor's spans: device 0's send waits (0.04 s CPU a step)
	 * are its two sends' (0.05 + 0.02 each), the same table as sends of
	 * 0.07 s; its posting (0.003 s) its receives', which have no CPU
	 * traced here, so nothing is charged for them */
	double tables[2];
	for (int v = 0; v < 2; v++) {
		perf_trace_release(&tr);
		write_trace_exec(path, sp, (int)(sizeof(sp) / sizeof(sp[0])), 0.25, v ? 0.07 : 0.05, v ? 0 : 0.04,
				 v ? 0 : 0.003);
		ck_assert_msg(perf_trace_read(path, &tr, err, sizeof(err)) == 0, "%s", err);
		ck_assert_int_eq(tr.exec_traced, !v);
		ck_assert_msg(fabs(tr.wait_cpu[0] - (v ? 0 : 0.04)) < 1e-9 && fabs(tr.post_cpu[0] - (v ? 0 : 0.003)) < 1e-9 &&
			      tr.wait_cpu[1] == 0, "wait %g, post %g", tr.wait_cpu[0], tr.post_cpu[0]);
		mc.run_by = PERF_RUN_KIND;
		ck_assert_msg(perf_predict(&c, &mc, NULL, &p, err, sizeof(err)) == 0, "%s", err);
		tables[v] = p.table;
	}
	ck_assert_msg(fabs(tables[0] - tables[1]) < 1e-9 && tables[0] > 17.08 + 1e-6,
		      "table with the waits %.9g, with sends of 0.07 s %.9g (0.05 s: 17.08)", tables[0], tables[1]);
	mc.run_by = PERF_RUN_KIND;
	/* the same trace against another M, schedule, mesh */
	const char *bad[][3] = { { "pipeline_schedule=1f1b", "num_pipeline_microbatches=4", "microbatches" },
				 { "pipeline_schedule=zb_h1", "num_pipeline_microbatches=2", "'B mb0 c0'" } };
	for (int k = 0; k < 3; k++) {
		if (k < 2)
			make_cfg(&c, 2, 1, KV(pp[0], pp[1], pp[2], pp[3], bad[k][0], bad[k][1]));
		else
			make_cfg(&c, 4, 1, KV(pp[0], "dcn_pipeline_parallelism=4", "num_layers_per_pipeline_stage=2", pp[3],
					      "pipeline_schedule=1f1b", "num_pipeline_microbatches=2"));
		ck_assert_int_eq(perf_predict(&c, &mc, NULL, &p, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, path) && strstr(err, k < 2 ? bad[k][2] : "2 devices") && !strchr(err, '\n'),
			      "%s", err);
	}
	perf_trace_release(&tr);
	/* the cores fitted: two devices computing at once for 1 s, half a
	 * CPU second each, got one core */
	static const struct tspan two[] = { { 0, "F mb0 c0", 0, 0.5 }, { 1, "F mb0 c1", 0, 0.5 } };
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "{\"traceEvents\": [");
	for (int i = 0; i < 2; i++)
		fprintf(f, "%s{\"name\": \"%s\", \"ph\": \"X\", \"ts\": 0, \"dur\": 1e6, \"tid\": %d, \"args\": {\"step\": 0, "
			"\"cpu_us\": %g}}", i ? "," : "", two[i].name, two[i].dev, two[i].cpu * 1e6);
	fprintf(f, "]}");
	fclose(f);
	ck_assert_msg(perf_trace_read(path, &tr, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(fabs(tr.cores - 1) < 1e-6 && tr.step0 == 0, "cores %g, step %d", tr.cores, tr.step0);
	perf_trace_release(&tr);
	unlink(path);
	ck_assert_int_eq(perf_trace_read(path, &tr, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, path) && !strchr(err, '\n'), "%s", err);
}
END_TEST

static void setup(void)
{
	proc_setup("check_perf", 0);
}

START_TEST(test_command)
{
	struct proc p;
	int rc = proc_run(&p, "plan", "plan --config configs/llama-tiny.yml --hosts 2 --flops 1e10 "
			  "ici_data_parallelism=1 dcn_data_parallelism=1 dcn_pipeline_parallelism=2 "
			  "pipeline_schedule=1f1b num_pipeline_microbatches=4", 30);
	char *out = slurp(p.out);
	ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
	char *l = strstr(out, "predicted_step_s: ");
	ck_assert_msg(l && (l == out || l[-1] == '\n'), "%s", out);
	ck_assert_msg(strtod(l + 18, NULL) > 0, "%s", out);
	ck_assert_msg(strstr(out, "memory per device: ") && strstr(out, "schedule: S=2 stages"), "%s", out);
	/* measured, with the cores given: the cores the devices' threads
	 * got while the layer was measured are printed beside them, the
	 * machine's (at most its CPUs), not the figure given */
	rc = proc_run(&p, "plan", "plan --config configs/llama-tiny.yml --hosts 2 --cores 64 --threads 1 "
		      "ici_data_parallelism=1 dcn_data_parallelism=1 dcn_pipeline_parallelism=2 "
		      "pipeline_schedule=1f1b num_pipeline_microbatches=4", 30);
	out = slurp(p.out);
	ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
	ck_assert_msg(strstr(out, "cores: the 2 devices share 64.00 cores\n"), "%s", out);
	l = strstr(out, "cores seen: the 2 devices' threads got ");
	ck_assert_msg(l && l[-1] == '\n', "%s", out);
	double seen = strtod(l + strlen("cores seen: the 2 devices' threads got "), NULL);
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	ck_assert_msg(seen > 0 && seen <= (cpus < 2 ? cpus : 2) + 0.05, "seen %g on %ld CPUs: %s", seen, cpus, out);
	rc = proc_run(&p, "plan", "plan --config configs/llama-tiny.yml --search", 30);
	ck_assert_int_eq(rc, 2);
	ck_assert_msg(strstr(slurp(p.out), "--search needs --flops"), "%s", slurp(p.out));
	rc = proc_run(&p, "plan", "plan --hosts 2", 30);
	ck_assert_int_eq(rc, 2);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("perf");
	TCase *tc = tcase_create("model");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_muon_by_hand);
	tcase_add_test(tc, test_1f1b_and_gpipe_tables);
	tcase_add_test(tc, test_zb_h1_iw);
	tcase_add_test(tc, test_shared_cores);
	tcase_add_test(tc, test_transfer_cpu);
	tcase_add_test(tc, test_muon_once_per_matrix);
	tcase_add_test(tc, test_data_tail);
	tcase_add_test(tc, test_gathers);
	tcase_add_test(tc, test_search_sorted);
	tcase_add_test(tc, test_search_zero_bubble);
	tcase_add_test(tc, test_costs_from);
	suite_add_tcase(s, tc);
	tc = tcase_create("command");
	tcase_set_timeout(tc, 60);
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, test_command);
	tcase_add_test(tc, test_measured);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
