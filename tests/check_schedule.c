/* Pipeline schedules as per-device action lists: every builder's table
 * for S in 2..8, M in S..4S, v in {1, 2, 4} (the validator accepts it;
 * its idle slots and peak saved activations equal the schedule's
 * formula; a shape outside the builder's domain is refused); the
 * circular schedule against MaxText's lockstep iterations and the weight
 * window rule; the validator refusing hand-made broken tables (a receive
 * with no send, a W before its I, a cycle, an overwritten buffer); the
 * pipeline keys' resolution and refusals; `meshrun schedule`. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "host/config/config.h"
#include "host/model/model.h"
#include "host/pipeline/pipe_config.h"
#include "host/pipeline/schedule.h"
#include "tests/proc.h"

static char err[1024];

static struct pipe_shape shape(enum pipe_sched sc, int S, int M, int v, enum pipe_wmode w)
{
	return (struct pipe_shape){ .sched = sc, .stages = S, .microbatches = M, .repeats = v,
				    .layers_per_stage = 1, .delay = 1, .wmode = w, .recompute = true };
}

static void build(struct pipe_table *t, const struct pipe_shape *p)
{
	int rc = pipe_table_build(t, p, err, sizeof(err));
	ck_assert_msg(rc == 0, "%s S=%d M=%d v=%d w=%d: %s", pipe_sched_name(p->sched), p->stages,
		      p->microbatches, p->repeats, p->wmode, err);
}

/* Whether the schedule takes the shape (its domain, docs/pipeline.md). */
static bool in_domain(const struct pipe_shape *p)
{
	int S = p->stages, M = p->microbatches, v = p->repeats;
	switch (p->sched) {
	case PIPE_CIRCULAR:
	case PIPE_INTERLEAVED:
		return M % S == 0 && (p->wmode != PIPE_W_REPEAT || p->sched == PIPE_CIRCULAR || v <= 2);
	case PIPE_ZBV:
		return v == 2;
	default:
		return v == 1;
	}
}

/* Every compute action on its chunk's stage; F = M per chunk; B, or I
 * and W, once per (mb, chunk); every W after its I on the same stage. */
static void check_structure(const struct pipe_table *t)
{
	int M = t->shape.microbatches, E = t->nchunks;
	int *f = calloc((size_t)(M * E), sizeof(int)), *b = calloc((size_t)(M * E), sizeof(int));
	for (int s = 0; s < t->shape.stages; s++)
		for (int k = 0; k < t->n[s]; k++) {
			const struct pipe_action *a = &t->a[s][k];
			if (a->op != PA_F && a->op != PA_B && a->op != PA_I && a->op != PA_W)
				continue;
			ck_assert_int_eq(pipe_chunk_stage(&t->shape, a->chunk), s);
			int *c = a->op == PA_F ? &f[a->mb * E + a->chunk] : &b[a->mb * E + a->chunk];
			if (a->op == PA_W)
				ck_assert_msg(*c == 1, "W before its I");
			(*c)++;
		}
	bool split = pipe_split_backward(t->shape.sched);
	for (int i = 0; i < M * E; i++) {
		ck_assert_int_eq(f[i], 1);
		ck_assert_int_eq(b[i], split ? 2 : 1);
	}
	free(f);
	free(b);
}

/* For every builder, S in 2..8, M in S..4S, v in {1, 2, 4}, every weight
 * mode: refused outside the builder's domain, else validated with its
 * bubble (at F = 1, I = W = 1, B = 2) and each stage's peak of saved
 * chunk inputs equal to the formula. */
START_TEST(test_tables_match_formulas)
{
	int built = 0, refused = 0;
	for (int sc = 0; sc < PIPE_SCHED_COUNT; sc++)
		for (int S = 2; S <= 8; S++)
			for (int M = S; M <= 4 * S; M++)
				for (int v = 1; v <= 4; v *= 2)
					for (int w = PIPE_W_ITER; w <= PIPE_W_REPEAT; w++) {
						struct pipe_shape p = shape(sc, S, M, v, w);
						struct pipe_table t;
						if (!in_domain(&p)) {
							ck_assert_int_eq(pipe_table_build(&t, &p, err, sizeof(err)), -EINVAL);
							ck_assert_msg(strstr(err, "pipeline: "), "%s", err);
							refused++;
							continue;
						}
						build(&t, &p);
						check_structure(&t);
						double f = pipe_bubble_formula(&p), got = pipe_table_bubble(&t);
						if (sc != PIPE_ZBV || M >= 2 * S)
							ck_assert_msg(f >= 0 && fabs(got - f) < 1e-9,
								      "%s S=%d M=%d v=%d: bubble %.6f, formula %.6f",
								      pipe_sched_name(sc), S, M, v, got, f);
						for (int s = 0; s < S; s++) {
							struct pipe_stats st;
							pipe_stage_stats(&t, s, &st);
							int pf = pipe_peak_formula(&p, s);
							if (pf < 0) /* zbv with M < 2S: no closed form */
								ck_assert_int_le(st.peak_saved, 2 * S);
							else
								ck_assert_msg(st.peak_saved == pf,
									      "%s S=%d M=%d v=%d stage %d: peak %d, formula %d",
									      pipe_sched_name(sc), S, M, v, s, st.peak_saved, pf);
						}
						pipe_table_free(&t);
						built++;
					}
	ck_assert_int_gt(built, 1500);
	ck_assert_int_gt(refused, 1500);
}
END_TEST

/* The comparisons at F = I = W: ZB-H1's idle slots a third of
 * 1F1B's, at 1F1B's peak memory on stage 0; ZB-V none for M >= 2S, at
 * 1F1B's memory (2S half-size chunks = S stage inputs); interleaving
 * divides 1F1B's bubble time by v. */
START_TEST(test_schedules_compared)
{
	for (int S = 2; S <= 8; S++)
		for (int M = 2 * S; M <= 4 * S; M += S) {
			struct pipe_table a, z, v2, i2;
			struct pipe_shape p1 = shape(PIPE_1F1B, S, M, 1, PIPE_W_ONCE);
			struct pipe_shape pz = shape(PIPE_ZB_H1, S, M, 1, PIPE_W_ONCE);
			struct pipe_shape pv = shape(PIPE_ZBV, S, M, 2, PIPE_W_ONCE);
			struct pipe_shape pi = shape(PIPE_INTERLEAVED, S, M, 2, PIPE_W_ONCE);
			build(&a, &p1);
			build(&z, &pz);
			build(&v2, &pv);
			build(&i2, &pi);
			struct pipe_stats s1, sz, sv;
			pipe_stage_stats(&a, 0, &s1);
			pipe_stage_stats(&z, 0, &sz);
			pipe_stage_stats(&v2, 0, &sv);
			double idle1 = a.period - s1.busy, idlez = z.period - sz.busy;
			ck_assert_msg(fabs(idle1 - 3 * (S - 1)) < 1e-9, "1F1B idles %g", idle1);
			ck_assert_msg(fabs(idlez - (S - 1)) < 1e-9, "ZB-H1 idles %g", idlez);
			ck_assert_int_eq(sz.peak_saved, s1.peak_saved);
			ck_assert_msg(fabs(v2.period - sv.busy) < 1e-9, "ZB-V idles %g", v2.period - sv.busy);
			ck_assert_int_eq(sv.peak_saved, 2 * s1.peak_saved);
			/* interleaved, v = 2: half of 1F1B's idle time (its chunks cost half) */
			struct pipe_stats si;
			pipe_stage_stats(&i2, 0, &si);
			ck_assert_msg(fabs((i2.period - si.busy) - (S - 1) * 3.0) < 1e-9, "interleaved idles %g",
				      i2.period - si.busy);
			pipe_table_free(&a);
			pipe_table_free(&z);
			pipe_table_free(&v2);
			pipe_table_free(&i2);
		}
}
END_TEST

/* ZB-H1's idle time is (S-1)(F+I-W) for other costs too, while W is at
 * most F (a longer W does not fit where the builder delays it). */
START_TEST(test_zb_h1_costs)
{
	const struct pipe_costs costs[] = {
		{ .f = 2, .i = 3, .w = 1, .b = 4 }, { .f = 2, .i = 2, .w = 2, .b = 4 }, { .f = 3, .i = 2, .w = 1, .b = 3 },
	};
	for (int S = 2; S <= 6; S++)
		for (size_t c = 0; c < sizeof(costs) / sizeof(costs[0]); c++) {
			struct pipe_table t;
			struct pipe_shape p = shape(PIPE_ZB_H1, S, 3 * S, 1, PIPE_W_ONCE);
			struct pipe_stats st;
			build(&t, &p);
			ck_assert_int_eq(pipe_table_simulate(&t, &costs[c], true, err, sizeof(err)), 0);
			pipe_stage_stats(&t, 0, &st);
			double want = (S - 1) * (costs[c].f + costs[c].i - costs[c].w);
			ck_assert_msg(fabs(t.period - st.busy - want) < 1e-9, "S=%d costs %zu: idle %g, want %g", S, c,
				      t.period - st.busy, want);
			pipe_table_free(&t);
		}
}
END_TEST

/* A message's cost (bench/sched_hop.c's model): each send keeps its
 * stage `send` long, its receive starts no sooner than `hop` after the
 * send started, and the sender's share lengthens a 1F1B step (times
 * only: the buffer checks assume the unit costs). */
START_TEST(test_send_cost)
{
	const struct pipe_costs free_send = { .f = 1, .b = 2, .i = 1, .w = 1, .hop = 0.3 };
	struct pipe_costs c = free_send;
	c.send = 0.1;
	for (int sc = 0; sc < PIPE_SCHED_COUNT; sc++) {
		struct pipe_shape p = shape(sc, 3, 6, sc == PIPE_ZBV ? 2 : 1, PIPE_W_ONCE);
		if (!in_domain(&p))
			continue;
		struct pipe_table t;
		build(&t, &p);
		ck_assert_msg(pipe_table_simulate(&t, &c, false, err, sizeof(err)) == 0, "%s: %s",
			      pipe_sched_name(sc), err);
		int sends = 0;
		for (int s = 0; s < p.stages; s++)
			for (int k = 0; k < t.n[s]; k++) {
				const struct pipe_action *a = &t.a[s][k];
				if (a->op != PA_RECV)
					continue;
				const struct pipe_action *snd = NULL;
				for (int j = 0; j < t.n[a->peer] && !snd; j++) {
					const struct pipe_action *b = &t.a[a->peer][j];
					if (b->op == PA_SEND && b->peer == s && !memcmp(&b->val, &a->val, sizeof(a->val)))
						snd = b;
				}
				ck_assert_msg(snd, "%s: a receive without its send", pipe_sched_name(sc));
				ck_assert_msg(fabs(snd->t1 - snd->t0 - 0.1) < 1e-9, "%s: a send takes %g",
					      pipe_sched_name(sc), snd->t1 - snd->t0);
				ck_assert_msg(a->t0 >= snd->t0 + 0.3 - 1e-9, "%s: received at %g, sent at %g",
					      pipe_sched_name(sc), a->t0, snd->t0);
				sends++;
			}
		ck_assert_msg(sends > 0, "%s: no messages", pipe_sched_name(sc));
		if (sc == PIPE_1F1B) {
			double with = t.period;
			ck_assert_int_eq(pipe_table_simulate(&t, &free_send, false, err, sizeof(err)), 0);
			ck_assert_msg(with > t.period + 0.05, "1f1b: %g with sends, %g without", with, t.period);
		}
		pipe_table_free(&t);
	}
}
END_TEST

/* Interleaved 1F1B with a group of g > S microbatches a chunk
 * (pipeline_interleave_group), S in 2..8, M in S..4S, v in {2, 4}, every
 * g in (S, M]: refused when the last group (M mod g) is neither 0 nor at
 * least S, else validated with the formula's bubble, each stage's peak
 * min(vM, 2(S-1-s) + (v-1)g + 1), and every chunk's forwards and
 * backwards in microbatch order (so its gradients add up in the order
 * of g = S: the same bits). g = S given is the default's table. */
static void same_order(const struct pipe_table *a, const struct pipe_table *b)
{
	for (int s = 0; s < a->shape.stages; s++) {
		ck_assert_int_eq(a->n[s], b->n[s]);
		for (int k = 0; k < a->n[s]; k++) {
			ck_assert_int_eq(a->a[s][k].op, b->a[s][k].op);
			ck_assert_int_eq(a->a[s][k].mb, b->a[s][k].mb);
			ck_assert_int_eq(a->a[s][k].chunk, b->a[s][k].chunk);
		}
	}
}

START_TEST(test_group_tables)
{
	int built = 0, refused = 0;
	for (int S = 2; S <= 8; S++)
		for (int M = S; M <= 4 * S; M++)
			for (int v = 2; v <= 4; v *= 2)
				for (int g = S; g <= M; g++) {
					struct pipe_shape p = shape(PIPE_INTERLEAVED, S, M, v, PIPE_W_ONCE);
					struct pipe_table t, t0;
					p.group = g;
					if (M % g && M % g < S) {
						ck_assert_int_eq(pipe_table_build(&t, &p, err, sizeof(err)), -EINVAL);
						ck_assert_msg(strstr(err, g == S ? "a multiple of the stages" : "last group"),
							      "%s", err);
						refused++;
						continue;
					}
					build(&t, &p);
					if (g == S) {
						p.group = 0;
						build(&t0, &p);
						same_order(&t, &t0);
						pipe_table_free(&t0);
						p.group = g;
					}
					check_structure(&t);
					double f = pipe_bubble_formula(&p), got = pipe_table_bubble(&t);
					ck_assert_msg(fabs(got - f) < 1e-9, "S=%d M=%d v=%d g=%d: bubble %.6f, formula %.6f",
						      S, M, v, g, got, f);
					for (int s = 0; s < S; s++) {
						struct pipe_stats st;
						int w = 2 * (S - 1 - s) + (v - 1) * g + 1, last[2][32];
						pipe_stage_stats(&t, s, &st);
						ck_assert_int_eq(pipe_peak_formula(&p, s), w < v * M ? w : v * M);
						ck_assert_msg(st.peak_saved == pipe_peak_formula(&p, s),
							      "S=%d M=%d v=%d g=%d stage %d: peak %d, formula %d", S, M, v, g,
							      s, st.peak_saved, pipe_peak_formula(&p, s));
						memset(last, -1, sizeof(last));
						for (int k = 0; k < t.n[s]; k++) {
							const struct pipe_action *a = &t.a[s][k];
							if (a->op != PA_F && a->op != PA_B)
								continue;
							int *l = &last[a->op == PA_B][a->chunk];
							ck_assert_msg(a->mb == *l + 1, "S=%d M=%d v=%d g=%d stage %d: %s of mb %d "
								      "after mb %d in chunk %d", S, M, v, g, s,
								      pipe_act_name(a->op), a->mb, *l, a->chunk);
							*l = a->mb;
						}
					}
					pipe_table_free(&t);
					built++;
				}
	ck_assert_int_gt(built, 800);
	ck_assert_int_gt(refused, 500);
	/* a group outside [S, M], or for another schedule */
	struct pipe_table t;
	struct pipe_shape p = shape(PIPE_INTERLEAVED, 4, 8, 2, PIPE_W_ONCE);
	p.group = 3;
	ck_assert_int_eq(pipe_table_build(&t, &p, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "[stages, microbatches]"), "%s", err);
	p.group = 9;
	ck_assert_int_eq(pipe_table_build(&t, &p, err, sizeof(err)), -EINVAL);
	p = shape(PIPE_1F1B, 4, 8, 1, PIPE_W_ONCE);
	p.group = 8;
	ck_assert_int_eq(pipe_table_build(&t, &p, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "interleaved_1f1b"), "%s", err);
}
END_TEST

/* Why the group: with every transfer taking `hop` (bench/sched_hop.c's
 * model; here a twentieth of a forward), g = S puts 4S - 2 hops on the
 * critical path (each chunk change waits for a microbatch to go round
 * the ring of stages, with no slack), a group whose every part is larger
 * than S only the ramp's 2(S - 1) (one microbatch down the stages and
 * its gradient back), and a last group of exactly S brings S back. At
 * no hop every one idles the formula's (S-1)(F+B). */
START_TEST(test_group_hops)
{
	const double hop = 0.05;
	for (int S = 2; S <= 8; S++)
		for (int M = S; M <= 4 * S; M += S)
			for (int g = S; g <= M; g++) {
				if (M % g && M % g < S)
					continue;
				struct pipe_shape p = shape(PIPE_INTERLEAVED, S, M, 2, PIPE_W_ONCE);
				struct pipe_costs c = { .f = 1, .b = 2, .i = 1, .w = 1 };
				struct pipe_table t;
				struct pipe_stats st;
				p.recompute = false;
				p.group = g;
				build(&t, &p);
				pipe_stage_stats(&t, 0, &st);
				ck_assert_msg(fabs(t.period - st.busy - (S - 1) * 3.0) < 1e-9, "S=%d M=%d g=%d: idle %g",
					      S, M, g, t.period - st.busy);
				c.hop = hop;
				ck_assert_int_eq(pipe_table_simulate(&t, &c, false, err, sizeof(err)), 0);
				pipe_stage_stats(&t, 0, &st);
				int hops = g == S ? 4 * S - 2 : M % g == S ? 3 * S - 2 : 2 * (S - 1);
				ck_assert_msg(fabs(t.period - st.busy - (S - 1) * 3.0 - hops * hop) < 1e-9,
					      "S=%d M=%d g=%d: idle %g, want %g + %d hops", S, M, g, t.period - st.busy,
					      (S - 1) * 3.0, hops);
				pipe_table_free(&t);
			}
}
END_TEST

/* MoE (a count sum; a counting pass for the schedules that back-propagate
 * before the last forward), layers outside the pipeline, recompute off:
 * every builder's table still validates, and the owners' actions sit
 * where the placement says. */
START_TEST(test_tables_with_moe_outside_recompute)
{
	int built = 0;
	for (int sc = 0; sc < PIPE_SCHED_COUNT; sc++)
		for (int S = 2; S <= 5; S++)
			for (int M = S; M <= 3 * S; M += S)
				for (int v = 1; v <= 2; v++)
					for (int var = 0; var < 4; var++) {
						struct pipe_shape p = shape(sc, S, M, v, (enum pipe_wmode)(var % 3));
						p.moe = var & 1;
						p.outside = var == 1 ? PIPE_OUT_BEFORE : var == 2 ? PIPE_OUT_AFTER : PIPE_OUT_NONE;
						p.recompute = var < 2;
						if (!in_domain(&p))
							continue;
						struct pipe_table t;
						build(&t, &p);
						check_structure(&t);
						ck_assert_int_eq(t.count_pass, p.moe && !pipe_phased(&p));
						for (int s = 0; s < S; s++) {
							int sums = 0, embeds = 0, heads = 0, set[64][8];
							int held[64] = { 0 }, pending = 0, peak = 0;
							for (int k = 0; k < t.n[s]; k++) {
								const struct pipe_action *a = &t.a[s][k];
								/* a W reads the stash its I filled; no I
								 * writes over one still waiting */
								int key = 1 + a->mb * 64 + a->chunk;
								if (a->op == PA_I) {
									ck_assert_int_lt(a->wset, t.w_stashes[s]);
									ck_assert_int_eq(held[a->wset], 0);
									held[a->wset] = key;
									pending++;
									peak = pending > peak ? pending : peak;
								}
								if (a->op == PA_W) {
									ck_assert_int_eq(held[a->wset], key);
									held[a->wset] = 0;
									pending--;
								}
								sums += a->op == PA_COUNT_SUM;
								embeds += a->op == PA_EMBED && !a->val.pass;
								heads += a->op == PA_HEAD;
								/* a backward reads the set its forward filled */
								if (a->op == PA_F)
									set[a->mb][a->chunk / S] = a->aset;
								if (!p.recompute && (a->op == PA_B || a->op == PA_W))
									ck_assert_int_eq(a->aset, set[a->mb][a->chunk / S]);
							}
							ck_assert_int_eq(sums, p.moe ? 1 : 0);
							int owned = pipe_phased(&p) ? (M - s + S - 1) / S : (s == 0 ? M : 0);
							ck_assert_int_eq(embeds, owned);
							int hs = pipe_phased(&p) ? owned
										 : s == pipe_chunk_stage(&p, t.nchunks - 1) ? M : 0;
							ck_assert_int_eq(heads, hs);
							if (!p.recompute)
								ck_assert_int_ge(t.act_sets[s], 2);
							/* as many stashes as I's wait for their W at most */
							ck_assert_int_eq(pending, 0);
							ck_assert_int_eq(t.w_stashes[s], peak);
							ck_assert_int_eq(peak > 0, pipe_split_backward(p.sched));
							/* ZB-H1 delays stage s's W by s microbatches */
							if (p.sched == PIPE_ZB_H1)
								ck_assert_int_eq(peak, s + 1 < M ? s + 1 : M);
						}
						pipe_table_free(&t);
						built++;
					}
	ck_assert_int_gt(built, 150);
}
END_TEST

/* ---- the circular schedule against MaxText's lockstep ---- */

/* Iteration i, stage s runs microbatch (i - d s) mod M of repeat
 * (i - d s) / M, forward then backward in reverse; each microbatch meets
 * the layers in order, d iterations a hop, M - d(S-1) at the wrap. */
START_TEST(test_circular_lockstep)
{
	for (int S = 1; S <= 6; S++)
		for (int d = 1; d <= 2; d++)
			for (int M = S; M <= 4 * S; M += S)
				for (int R = 1; R <= 4; R++) {
					if (d == 2 && M < 2 * S)
						continue;
					struct pipe_shape p = shape(PIPE_CIRCULAR, S, M, R, PIPE_W_REPEAT);
					struct pipe_table t;
					p.delay = d;
					build(&t, &p);
					ck_assert_int_eq(t.iterations, R * M + d * (S - 1));
					for (int s = 0; s < S; s++) {
						int nf = 0, last_it = 1 << 30;
						for (int k = 0; k < t.n[s]; k++) {
							const struct pipe_action *a = &t.a[s][k];
							int mb, r;
							if (a->op != PA_F && a->op != PA_B)
								continue;
							ck_assert(pipe_active(&p, a->iter, s, &mb, &r));
							ck_assert_int_eq(a->mb, mb);
							ck_assert_int_eq(a->chunk, r * S + s);
							if (a->op == PA_F)
								nf++;
							else
								ck_assert_int_lt(a->iter, last_it);  /* falling */
							if (a->op == PA_B)
								last_it = a->iter;
						}
						ck_assert_int_eq(nf, R * M);
					}
					/* microbatch m: chunks 0..S*R-1 in order, d apart */
					for (int m = 0; m < M; m++) {
						int prev = -1;
						for (int c = 0; c < S * R; c++) {
							int s = c % S, it = -1;
							for (int k = 0; k < t.n[s]; k++)
								if (t.a[s][k].op == PA_F && t.a[s][k].mb == m && t.a[s][k].chunk == c)
									it = t.a[s][k].iter;
							ck_assert_int_ge(it, 0);
							if (prev >= 0)
								ck_assert_int_eq(it - prev, s == 0 ? M - d * (S - 1) : d);
							prev = it;
						}
					}
					pipe_table_free(&t);
				}
}
END_TEST

/* ---- weights ---- */

/* One stage's walk: the number of forward (or backward) actions of the
 * stage between the gather of chunk c and its first use in that pass. */
struct walk {
	int gathers, reduce_scatters, max_live;
	int lead[2][64];    /* [pass][repeat]: compute actions between gather and first use, -1 */
	bool after_last[64]; /* chunk r's reduce-scatter follows its last backward directly */
};

static void walk_stage(const struct pipe_table *t, int s, struct walk *w)
{
	int S = t->shape.stages, live = 0, since[64], pass_of[64];
	bool seen[2][64] = { { false } };
	memset(w, 0, sizeof(*w));
	for (int r = 0; r < 64; r++) {
		w->lead[0][r] = w->lead[1][r] = -1;
		since[r] = -1;
	}
	int last_b = -1;
	for (int k = 0; k < t->n[s]; k++) {
		const struct pipe_action *a = &t->a[s][k];
		int r = a->chunk >= 0 ? a->chunk / S : -1;
		if (a->op == PA_GATHER && r >= 0) {
			w->gathers++;
			live++;
			w->max_live = live > w->max_live ? live : w->max_live;
			since[r] = 0;
			pass_of[r] = -1;
		} else if (a->op == PA_RELEASE && r >= 0) {
			live--;
		} else if (a->op == PA_REDUCE_SCATTER && r >= 0) {
			w->reduce_scatters++;
			w->after_last[r] = last_b == r;
		} else if (a->op == PA_F || a->op == PA_B) {
			int ps = a->op == PA_B;
			for (int q = 0; q < 64; q++)
				if (since[q] >= 0 && q != r)
					since[q]++;
			if (since[r] >= 0 && !seen[ps][r]) {
				w->lead[ps][r] = since[r];
				since[r] = -1;
			}
			seen[ps][r] = true;
			last_b = a->op == PA_B ? r : -1;
			(void)pass_of;
		} else if (a->op == PA_SEND || a->op == PA_RECV || a->op == PA_HEAD || a->op == PA_EMBED_BACK) {
			continue;
		} else {
			last_b = -1;
		}
	}
	ck_assert_int_eq(live, 0);
}

/* pipeline_fsdp_ag_per_repeat on the circular schedule: W[0] and W[1]
 * gathered first; W[r] (r >= 2) M forward slots ahead of its first use;
 * W[R-1] and W[R-2] kept for the backward; W[r] (r <= R-3) gathered again
 * after W[r+2]'s last backward, M backward slots ahead; each dW[r]
 * reduce-scattered right after its last backward. At most two live. */
START_TEST(test_window_rule)
{
	for (int S = 2; S <= 6; S++)
		for (int d = 1; d <= 2; d++)
			for (int M = S; M <= 4 * S; M += S)
				for (int R = 1; R <= 5; R++) {
					if (d == 2 && M < 2 * S)
						continue;
					struct pipe_shape p = shape(PIPE_CIRCULAR, S, M, R, PIPE_W_REPEAT);
					struct pipe_table t;
					p.delay = d;
					build(&t, &p);
					ck_assert_int_eq(t.weight_windows, R < 2 ? R : 2);
					for (int s = 0; s < S; s++) {
						struct walk w;
						walk_stage(&t, s, &w);
						ck_assert_int_le(w.max_live, 2);
						ck_assert_int_eq(w.gathers, R + (R > 2 ? R - 2 : 0));
						ck_assert_int_eq(w.reduce_scatters, R);
						for (int r = 0; r < R; r++) {
							ck_assert_int_eq(w.lead[0][r], r < 2 ? r * M : M);
							if (r < R - 2)
								ck_assert_int_eq(w.lead[1][r], M);
							ck_assert(w.after_last[r]);
						}
					}
					pipe_table_free(&t);
				}
}
END_TEST

/* Neither flag: a gather per use, a reduce-scatter per backward;
 * pipeline_fsdp_ag_once: every chunk once, R live; the step without a
 * pipeline: one live, the next gathered ahead, 2L - 1 gathers. */
START_TEST(test_other_weight_modes)
{
	for (int sc = 0; sc < PIPE_SCHED_COUNT; sc++)
		for (int S = 2; S <= 4; S++)
			for (int w = PIPE_W_ITER; w <= PIPE_W_ONCE; w++) {
				int v = sc == PIPE_ZBV ? 2 : sc == PIPE_CIRCULAR || sc == PIPE_INTERLEAVED ? 3 : 1;
				struct pipe_shape p = shape(sc, S, 2 * S, v, (enum pipe_wmode)w);
				struct pipe_table t;
				build(&t, &p);
				bool split = pipe_split_backward(sc);
				for (int s = 0; s < S; s++) {
					struct pipe_stats st;
					pipe_stage_stats(&t, s, &st);
					int M = 2 * S;
					if (w == PIPE_W_ITER) {
						ck_assert_int_eq(st.max_weights, 1);
						ck_assert_int_eq(st.gathers, v * M * (split ? 3 : 2));
						ck_assert_int_eq(st.reduce_scatters, v * M);
					} else {
						ck_assert_int_eq(st.max_weights, v);
						ck_assert_int_eq(st.gathers, v);
						ck_assert_int_eq(st.reduce_scatters, v);
					}
				}
				pipe_table_free(&t);
			}
	for (int L = 1; L <= 6; L++) {
		struct pipe_shape p = { .sched = PIPE_CIRCULAR, .stages = 1, .microbatches = 1, .repeats = L,
					.layers_per_stage = 1, .delay = 1, .wmode = PIPE_W_AHEAD, .one_device = true };
		struct pipe_table t;
		struct pipe_stats st;
		build(&t, &p);
		pipe_stage_stats(&t, 0, &st);
		ck_assert_int_eq(t.weight_windows, 1);
		ck_assert_int_eq(st.gathers, 2 * L - 1);
		ck_assert_int_eq(st.reduce_scatters, L);
		ck_assert_int_eq(t.act_sets[0], 1);
		ck_assert_int_eq(t.bufs[0], L + 2);  /* every layer's input, the output, its gradient */
		ck_assert_int_eq(pipe_landing_bufs(&t, 0, 4), 0);  /* receives nothing */
		pipe_table_free(&t);
	}
}
END_TEST

/* The landing buffers' rule (pipe_landing_bufs, which the executor
 * allocates by): 4 of a receiving stage's microbatch buffers, fewer where
 * 4 pass 64 MiB, at least one; the one-device table's none is in
 * test_other_weight_modes, the executor's own count in check_exec. */
START_TEST(test_landing_rule)
{
	struct pipe_shape p = shape(PIPE_1F1B, 2, 2, 1, PIPE_W_ITER);
	struct pipe_table t;
	build(&t, &p);
	const size_t MiB = 1u << 20;
	for (int s = 0; s < 2; s++) {
		ck_assert_int_eq(pipe_landing_bufs(&t, s, 4), 4);
		ck_assert_int_eq(pipe_landing_bufs(&t, s, 16 * MiB), 4);
		ck_assert_int_eq(pipe_landing_bufs(&t, s, 16 * MiB + 1), 3);
		ck_assert_int_eq(pipe_landing_bufs(&t, s, 20 * MiB), 3);
		ck_assert_int_eq(pipe_landing_bufs(&t, s, 32 * MiB), 2);
		ck_assert_int_eq(pipe_landing_bufs(&t, s, 64 * MiB), 1);
		ck_assert_int_eq(pipe_landing_bufs(&t, s, 200 * MiB), 1);
	}
	pipe_table_free(&t);
}
END_TEST

/* MaxText fills the new slot at the start of block r with
 * W[floor(max(r*M + 1 - d*s, 0) / M), s]. For d*s >= 2 that is W[r-1],
 * not W[r]: stage s would run repeat r on the weights of repeat r-1, and
 * W[R-1,s] would never be loaded (never trained). The validator checks
 * that every compute reads its own chunk's weights; this documents why we
 * do not use that rule. */
START_TEST(test_maxtext_rule_is_wrong)
{
	int wrong = 0;
	for (int S = 2; S <= 6; S++)
		for (int d = 1; d <= 2; d++)
			for (int M = S; M <= 4 * S; M += S)
				for (int R = 1; R <= 5; R++)
					for (int s = 0; s < S && !(d == 2 && M < 2 * S); s++) {
						bool last_loaded = false;
						for (int r = 0; r < R; r++) {
							int x = r * M + 1 - d * s, mt = (x > 0 ? x : 0) / M;
							last_loaded |= mt == R - 1;
							if (r == 0 || d * s < 2) {
								ck_assert_int_eq(mt, r);
								continue;
							}
							ck_assert_int_eq(mt, r - 1);
							wrong++;
						}
						if (d * s >= 2 && R > 1)
							ck_assert(!last_loaded);
					}
	ck_assert_int_gt(wrong, 100);
}
END_TEST

/* ---- the validator ---- */

/* A copy of table t with stage s's action k removed (del) or moved to
 * position to. */
static void edit(struct pipe_table *t, int s, int k, int to)
{
	struct pipe_action a = t->a[s][k];
	memmove(&t->a[s][k], &t->a[s][k + 1], sizeof(a) * (size_t)(t->n[s] - k - 1));
	if (to < 0) {
		t->n[s]--;
		return;
	}
	memmove(&t->a[s][to + 1], &t->a[s][to], sizeof(a) * (size_t)(t->n[s] - 1 - to));
	t->a[s][to] = a;
}

static int find_op(const struct pipe_table *t, int s, int op, int mb, int from)
{
	for (int k = from; k < t->n[s]; k++)
		if (t->a[s][k].op == op && (mb < 0 || t->a[s][k].mb == mb))
			return k;
	return -1;
}

static void refused(struct pipe_table *t, const char *want)
{
	int rc = pipe_table_simulate(t, &t->costs, true, err, sizeof(err));
	ck_assert_msg(rc == -EINVAL && strstr(err, want), "rc %d: %s (want '%s')", rc, err, want);
	ck_assert_msg(!strchr(err, '\n') && !strncmp(err, "pipeline: ", 10), "%s", err);
}

START_TEST(test_validator_refuses)
{
	struct pipe_table t;
	struct pipe_shape p = shape(PIPE_1F1B, 3, 6, 1, PIPE_W_ONCE);
	/* a receive with no send: stage 0's send of mb 1 dropped */
	build(&t, &p);
	int k = find_op(&t, 0, PA_SEND, 1, 0);
	edit(&t, 0, k, -1);
	refused(&t, "stage 1 action");
	ck_assert_msg(strstr(err, "(recv act mb1 e1 from stage 0): no stage sends it"), "%s", err);
	pipe_table_free(&t);
	/* a receive dropped: its send is left over */
	build(&t, &p);
	k = find_op(&t, 1, PA_RECV, 2, 0);
	edit(&t, 1, k, -1);
	refused(&t, "(send act mb2 e1 to stage 1): no stage receives it");
	pipe_table_free(&t);
	/* a send nobody receives: mb 1's activation also sent to stage 2 */
	build(&t, &p);
	k = find_op(&t, 0, PA_SEND, 1, 0);
	t.a[0] = realloc(t.a[0], sizeof(*t.a[0]) * (size_t)(t.n[0] + 1));
	memmove(&t.a[0][k + 1], &t.a[0][k], sizeof(*t.a[0]) * (size_t)(t.n[0] - k));
	t.n[0]++;
	t.a[0][k + 1].peer = 2;
	refused(&t, "(send act mb1 e1 to stage 2): no stage receives it");
	pipe_table_free(&t);
	/* a W before its I (zb_h1) */
	struct pipe_shape z = shape(PIPE_ZB_H1, 3, 6, 1, PIPE_W_ONCE);
	build(&t, &z);
	int wi = find_op(&t, 2, PA_W, 3, 0), ii = find_op(&t, 2, PA_I, 3, 0);
	ck_assert(wi > ii && ii > 0);
	edit(&t, 2, wi, ii);
	refused(&t, "(W mb3 c2): comes before its I");
	pipe_table_free(&t);
	/* a cycle: stage 1 waits for mb 0's gradient from stage 2 before it
	 * sends stage 2 the activation that gradient needs */
	build(&t, &p);
	int g0 = find_op(&t, 1, PA_RECV, 0, 0);
	while (t.a[1][g0].val.kind != PV_GRAD)
		g0 = find_op(&t, 1, PA_RECV, 0, g0 + 1);
	edit(&t, 1, g0, 0);
	refused(&t, "the lists deadlock:");
	ck_assert_msg(strstr(err, "stage 1 waits at action 0 (recv grad mb0 e2 from stage 2)") &&
		      strstr(err, "stage 2 waits at action"), "%s", err);
	pipe_table_free(&t);
	/* a buffer overwritten while its value is still to be read */
	build(&t, &p);
	int f1 = find_op(&t, 0, PA_F, 1, 0), b0 = find_op(&t, 0, PA_B, 0, 0);
	ck_assert(f1 >= 0 && b0 > f1);
	t.a[0][f1].buf[1] = t.a[0][b0].buf[0];  /* mb 1's output onto mb 0's saved input */
	refused(&t, "overwrites a value still to be read");
	pipe_table_free(&t);
	/* a forward whose chunk's weights are not gathered */
	build(&t, &p);
	k = find_op(&t, 1, PA_GATHER, -1, 0);
	while (t.a[1][k].chunk < 0)
		k = find_op(&t, 1, PA_GATHER, -1, k + 1);
	edit(&t, 1, k, -1);
	refused(&t, "its chunk's weights are not gathered in its slot");
	pipe_table_free(&t);
}
END_TEST

START_TEST(test_shape_refused)
{
	struct pipe_table t;
	struct pipe_shape ok = shape(PIPE_CIRCULAR, 4, 8, 2, PIPE_W_REPEAT);
	struct pipe_shape bad[] = { ok, ok, ok, ok, ok, ok, ok };
	bad[0].microbatches = 6;  /* not a multiple of S */
	bad[1].delay = 2;         /* needs M >= 2S = 8 */
	bad[1].microbatches = 4;
	bad[2].delay = 3;
	bad[3].repeats = 0;
	bad[4].stages = 0;
	bad[5].sched = PIPE_1F1B;  /* one chunk */
	bad[6].sched = PIPE_ZBV;   /* two chunks */
	bad[6].repeats = 3;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(pipe_table_build(&t, &bad[i], err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, "pipeline: "), "%s", err);
		ck_assert_ptr_null(t.a);
	}
	build(&t, &ok);
	ck_assert_int_eq(t.iterations, 19);
	pipe_table_free(&t);
}
END_TEST

/* ---- the keys ---- */

/* A config of `devs` devices on one host with the overrides applied; the
 * resolve's return value. */
static int resolve(struct pipe_config *pc, int devs, const char *const *kv)
{
	struct cfg c;
	struct model_dims d;
	cfg_defaults(&c);
	for (; *kv; kv++)
		ck_assert_msg(cfg_override(&c, *kv, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(cfg_finish(&c, 1, devs, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(model_dims_from_cfg(&d, &c, err, sizeof(err)) == 0, "%s", err);
	err[0] = 0;
	return pipe_config_resolve(pc, &c, &d, err, sizeof(err));
}

#define KV(...) ((const char *const[]){ __VA_ARGS__, NULL })

START_TEST(test_keys_resolve)
{
	struct pipe_config pc;
	/* one stage: the keys describe a pipeline of one stage */
	ck_assert_int_eq(resolve(&pc, 1, KV("steps=1")), 0);
	ck_assert_int_eq(pc.shape.stages, 1);
	ck_assert_int_eq(pc.shape.microbatches, 1);
	ck_assert_int_eq(pc.shape.repeats, 2);
	ck_assert_int_eq(pc.shape.sched, PIPE_CIRCULAR);
	ck_assert(pc.shape.recompute);
	/* S=4, 8 layers: R = 2, M = S, or 2S with the delay */
	ck_assert_int_eq(resolve(&pc, 4, KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8")), 0);
	ck_assert_int_eq(pc.shape.repeats, 2);
	ck_assert_int_eq(pc.shape.microbatches, 4);
	ck_assert_int_eq(pc.shape.delay, 1);
	ck_assert_int_eq(pc.shape.wmode, PIPE_W_ITER);
	ck_assert_int_eq(pc.global_batch, 16);
	ck_assert_int_eq(pc.microbatch_rows, 4);
	ck_assert_int_eq(resolve(&pc, 4, KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8",
					    "pipeline_delay_activation_forwarding=true",
					    "pipeline_fsdp_ag_per_repeat=true")), 0);
	ck_assert_int_eq(pc.shape.microbatches, 8);
	ck_assert_int_eq(pc.shape.delay, 2);
	ck_assert_int_eq(pc.shape.wmode, PIPE_W_REPEAT);
	/* two layers per stage, one repeat; fewer layers pipelined: the rest after */
	ck_assert_int_eq(resolve(&pc, 2, KV("ici_pipeline_parallelism=2", "base_num_decoder_layers=8",
					    "num_layers_per_pipeline_stage=2", "pipeline_parallel_layers=4")), 0);
	ck_assert_int_eq(pc.shape.repeats, 1);
	ck_assert_int_eq(pc.layers, 4);
	ck_assert_int_eq(pc.first_layer, 0);
	ck_assert_int_eq(pc.layers_after, 4);
	ck_assert_int_eq(pc.shape.outside, PIPE_OUT_AFTER);
	/* MoE: the MoE layers are pipelined, the dense ones run before */
	ck_assert_int_eq(resolve(&pc, 2, KV("ici_pipeline_parallelism=2", "base_num_decoder_layers=6",
					    "num_experts=4", "num_experts_per_tok=2",
					    "first_num_dense_layers=2")), 0);
	ck_assert_int_eq(pc.layers, 4);
	ck_assert_int_eq(pc.first_layer, 2);
	ck_assert_int_eq(pc.layers_before, 2);
	ck_assert_int_eq(pc.layers_after, 0);
	ck_assert_int_eq(pc.shape.repeats, 2);
	ck_assert(pc.shape.moe);
	ck_assert_int_eq(pc.shape.outside, PIPE_OUT_BEFORE);
	ck_assert_int_eq(resolve(&pc, 2, KV("ici_pipeline_parallelism=2", "base_num_decoder_layers=6",
					    "num_experts=4", "num_experts_per_tok=2",
					    "first_num_dense_layers=2", "pipeline_parallel_layers=2")), 0);
	ck_assert_int_eq(pc.first_layer, 4);
	ck_assert_int_eq(pc.layers_before, 4);
	ck_assert_int_eq(pc.shape.repeats, 1);
	/* the schedules: 1f1b any M (one chunk), interleaved v chunks, zbv two */
	ck_assert_int_eq(resolve(&pc, 4, KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8",
					    "num_layers_per_pipeline_stage=2", "pipeline_schedule=1f1b",
					    "num_pipeline_microbatches=6", "per_device_batch_size=3",
					    "pipeline_recompute=false")), 0);
	ck_assert_int_eq(pc.shape.sched, PIPE_1F1B);
	ck_assert_int_eq(pc.shape.microbatches, 6);
	ck_assert(!pc.shape.recompute);
	ck_assert_int_eq(pc.shape.repeats, 1);
	ck_assert_int_eq(resolve(&pc, 4, KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8",
					    "pipeline_schedule=interleaved_1f1b")), 0);
	ck_assert_int_eq(pc.shape.repeats, 2);
	ck_assert_int_eq(pc.shape.sched, PIPE_INTERLEAVED);
	ck_assert_int_eq(pc.shape.group, 0);
	/* a group: M need not be a multiple of S when the last group is >= S */
	ck_assert_int_eq(resolve(&pc, 4, KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8",
					    "pipeline_schedule=interleaved_1f1b", "num_pipeline_microbatches=9",
					    "per_device_batch_size=9", "pipeline_interleave_group=5")), 0);
	ck_assert_int_eq(pc.shape.group, 5);
	ck_assert_int_eq(pc.shape.microbatches, 9);
	ck_assert_int_eq(resolve(&pc, 4, KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8",
					    "pipeline_schedule=zbv")), 0);
	ck_assert_int_eq(pc.shape.sched, PIPE_ZBV);
	ck_assert_int_eq(pc.shape.repeats, 2);
	/* the model stores ZB-V's layers in its V: stage s blocks s and 2S-1-s */
	struct model_mesh mm = { 0 };
	pipe_config_model_mesh(&pc, &mm);
	ck_assert(mm.pipe_v);
	ck_assert_int_eq(mm.pipe_repeats, 2);
}
END_TEST

START_TEST(test_keys_refused)
{
	const struct {
		const char *const *kv;
		int devs;
		const char *want[3];
	} cases[] = {
		{ KV("pipeline_fsdp_ag_once=true", "pipeline_fsdp_ag_per_repeat=true"), 1,
		  { "'pipeline_fsdp_ag_once'", "'pipeline_fsdp_ag_per_repeat'", "both true" } },
		{ KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=6"), 4,
		  { "ici_pipeline_parallelism", "'num_layers_per_pipeline_stage'", "must divide the 6 pipelined" } },
		{ KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8", "num_pipeline_repeats=3"), 4,
		  { "'num_pipeline_repeats'", "= 12, but 8 layers", "'pipeline_parallel_layers'" } },
		{ KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8", "num_pipeline_microbatches=6"), 4,
		  { "'num_pipeline_microbatches' (6)", "multiple of the 4 stages", "ici_pipeline_parallelism" } },
		{ KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8", "num_pipeline_microbatches=4",
		     "pipeline_delay_activation_forwarding=true"), 4,
		  { "'pipeline_delay_activation_forwarding'", "'num_pipeline_microbatches' >= 2 x 4 stages = 8", "got 4" } },
		{ KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8", "num_pipeline_microbatches=8",
		     "per_device_batch_size=1"), 4,
		  { "global batch", "'per_device_batch_size' 1 x 4 devices = 4 rows", "'num_pipeline_microbatches' (8)" } },
		{ KV("base_num_decoder_layers=8", "pipeline_parallel_layers=9"), 1,
		  { "'pipeline_parallel_layers'", "[1, 8]", "got 9" } },
		{ KV("num_experts=4", "base_num_decoder_layers=4", "first_num_dense_layers=1",
		     "pipeline_parallel_layers=4"), 1,
		  { "'pipeline_parallel_layers'", "[1, 3]", "MoE" } },
		{ KV("num_layers_per_pipeline_stage=0"), 1,
		  { "'num_layers_per_pipeline_stage'", "got 0", "[1, 2]" } },
		{ KV("num_pipeline_microbatches=0"), 1,
		  { "'num_pipeline_microbatches' (0)", "-1 or a positive", "stages" } },
		{ KV("pipeline_schedule=pipedream"), 1,
		  { "'pipeline_schedule'", "interleaved_1f1b", "'pipedream'" } },
		{ KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8", "pipeline_schedule=1f1b"), 4,
		  { "pipeline_schedule=1f1b runs one chunk per stage", "'num_pipeline_repeats' must be 1, got 2",
		    "'num_layers_per_pipeline_stage' to 2" } },
		{ KV("ici_pipeline_parallelism=2", "pipeline_schedule=zbv", "base_num_decoder_layers=2"), 2,
		  { "pipeline_schedule=zbv runs two chunks", "must be 2, got 1", "'num_layers_per_pipeline_stage'" } },
		{ KV("ici_pipeline_parallelism=2", "pipeline_schedule=1f1b", "num_pipeline_microbatches=4",
		     "pipeline_delay_activation_forwarding=true"), 2,
		  { "'pipeline_delay_activation_forwarding'", "circular only", "pipeline_schedule=1f1b" } },
		{ KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8", "pipeline_schedule=interleaved_1f1b",
		     "num_pipeline_microbatches=8", "pipeline_interleave_group=6"), 4,
		  { "'num_pipeline_microbatches' (8) mod 'pipeline_interleave_group' (6)", "last group of 2",
		    "fewer than the 4 stages" } },
		{ KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8", "pipeline_schedule=interleaved_1f1b",
		     "num_pipeline_microbatches=8", "pipeline_interleave_group=9"), 4,
		  { "'pipeline_interleave_group' (9)", "-1 or in [4, 8]", "'num_pipeline_microbatches'" } },
		{ KV("ici_pipeline_parallelism=4", "base_num_decoder_layers=8", "pipeline_schedule=interleaved_1f1b",
		     "num_pipeline_microbatches=8", "pipeline_interleave_group=3"), 4,
		  { "'pipeline_interleave_group' (3)", "at least the 4 stages", "ici_pipeline_parallelism" } },
		{ KV("ici_pipeline_parallelism=2", "pipeline_schedule=1f1b", "num_pipeline_microbatches=4",
		     "pipeline_interleave_group=4"), 2,
		  { "'pipeline_interleave_group' (4)", "interleaved_1f1b only", "pipeline_schedule=1f1b" } },
		{ KV("ici_pipeline_parallelism=2", "base_num_decoder_layers=8", "pipeline_schedule=interleaved_1f1b",
		     "pipeline_fsdp_ag_per_repeat=true"), 2,
		  { "'pipeline_fsdp_ag_per_repeat'", "pipeline_schedule=interleaved_1f1b", "4 chunks" } },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct pipe_config pc;
		ck_assert_int_eq(resolve(&pc, cases[i].devs, cases[i].kv), -EINVAL);
		ck_assert_msg(!strchr(err, '\n'), "case %zu: not one line: %s", i, err);
		ck_assert_msg(!strncmp(err, "config: ", 8), "case %zu: %s", i, err);
		for (int k = 0; k < 3; k++)
			ck_assert_msg(strstr(err, cases[i].want[k]), "case %zu: no \"%s\" in: %s", i,
				      cases[i].want[k], err);
	}
}
END_TEST

/* ---- meshrun schedule ---- */

/* Runs meshrun with args (proc_run: a timeout, nothing left behind);
 * stdout and stderr into out. Exit code. */
static int run_meshrun(const char *args, char *out, size_t outlen)
{
	struct proc p;
	int rc = proc_run(&p, "schedule", args, 20);
	snprintf(out, outlen, "%s", slurp(p.out));
	return rc;
}

static void setup(void)
{
	proc_setup("check_schedule", 0);
}

/* The cells of the first row that starts with `label` after `from`. */
static int row_cells(const char *out, const char *from, const char *label, char cells[128][16])
{
	const char *p = strstr(out, from);
	ck_assert_msg(p, "no '%s' in:\n%s", from, out);
	p = strstr(p, label);
	ck_assert_msg(p, "no row '%s' in:\n%s", label, out);
	p += strlen(label);
	int n = 0;
	while (*p && *p != '\n' && n < 128) {
		while (*p == ' ')
			p++;
		int len = (int)strcspn(p, " \n");
		if (!len)
			break;
		snprintf(cells[n++], 16, "%.*s", len, p);
		p += len;
	}
	return n;
}

START_TEST(test_command)
{
	static char out[1 << 17];
	char cells[128][16];
	int rc = run_meshrun("schedule --config configs/llama-tiny.yml ici_pipeline_parallelism=4 "
			     "base_num_decoder_layers=8 num_pipeline_microbatches=8", out, sizeof(out));
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
	ck_assert_msg(strstr(out, "T = R*M + d*(S-1) = 2*8 + 1*3 = 19; d*(S-1)/T = 3/19 = 0.158\n"), "%s", out);
	ck_assert_msg(strstr(out, "formula (S-1)/(v*M+S-1) = 3/19 = 0.158"), "%s", out);
	/* stage 3 idles 3 iterations, runs 8 microbatches of repeat 0, then repeat 1 */
	ck_assert_int_eq(row_cells(out, "lockstep", "\nstage 3", cells), 19);
	ck_assert_str_eq(cells[2], ".");
	ck_assert_str_eq(cells[3], "0.0");
	ck_assert_str_eq(cells[10], "7.0");
	ck_assert_str_eq(cells[11], "0.1");
	ck_assert_str_eq(cells[18], "7.1");
	ck_assert_int_eq(row_cells(out, "lockstep", "\nstage 0", cells), 19);
	ck_assert_str_eq(cells[15], "7.1");
	ck_assert_str_eq(cells[16], ".");
	/* each stage saves R*M = 16 chunk inputs (the formula's) */
	ck_assert_int_eq(row_cells(out, "memory per device", "\n  0 ", cells), 8);
	ck_assert_str_eq(cells[0], "16");
	ck_assert_str_eq(cells[1], "16");
	/* stage 0's actions: its owned microbatches embedded first (0 and 4) */
	ck_assert_int_eq(row_cells(out, "actions of each stage", "stage 0:", cells) > 4, 1);
	ck_assert_str_eq(cells[0], "E0");
	ck_assert_str_eq(cells[1], "E4");
	ck_assert_str_eq(cells[2], "F0.0");

	/* 1f1b with --costs: the grid in unit slots; stage 3 alternates */
	rc = run_meshrun("schedule --config configs/llama-tiny.yml ici_pipeline_parallelism=4 "
			 "base_num_decoder_layers=4 num_pipeline_microbatches=8 pipeline_schedule=1f1b "
			 "--costs 1:1:1", out, sizeof(out));
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
	ck_assert_msg(strstr(out, "schedule 1f1b") && strstr(out, "formula (S-1)/(M+S-1) = 3/11 = 0.273"), "%s", out);
	ck_assert_int_eq(row_cells(out, "time in unit slots", "\nstage 3", cells) > 10, 1);
	/* recompute: a backward is F + I + W = 3 slots; stage 3 waits 3 */
	ck_assert_str_eq(cells[2], ".");
	ck_assert_str_eq(cells[3], "F");
	ck_assert_str_eq(cells[4], "B");
	ck_assert_str_eq(cells[6], "B");
	ck_assert_str_eq(cells[7], "F");
	ck_assert_int_eq(row_cells(out, "memory per device", "\n  0 ", cells), 8);
	ck_assert_str_eq(cells[0], "4");
	/* 4 landing buffers (a 4 x 64 x 128 float input is 131072 bytes, far
	 * under 64 MiB / 4); bytes: 131072 x (6 buffers + 1 scratch + 4
	 * landing) + one set of 2131968 */
	ck_assert_str_eq(cells[2], "6");
	ck_assert_str_eq(cells[4], "4");
	ck_assert_str_eq(cells[7], "3573760");
	ck_assert_int_eq(row_cells(out, "memory per device", "\n  3 ", cells), 8);
	ck_assert_str_eq(cells[0], "1");

	/* zbv prints its table, and the stashes of its split backward: a
	 * stage holds at most 2 chunks between their I and their W */
	rc = run_meshrun("schedule --config configs/llama-tiny.yml ici_pipeline_parallelism=2 "
			 "base_num_decoder_layers=4 num_pipeline_microbatches=4 pipeline_schedule=zbv "
			 "pipeline_recompute=false", out, sizeof(out));
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
	ck_assert_msg(!strstr(out, "refuses"), "%s", out);
	ck_assert_msg(strstr(out, "bubble: 0.000"), "%s", out);
	ck_assert_msg(strstr(out, "one layer's stash of the split backward: "), "%s", out);
	ck_assert_int_eq(row_cells(out, "memory per device", "\n  0 ", cells), 8);
	ck_assert_int_ge(atoi(cells[6]), 1);
	ck_assert_int_le(atoi(cells[6]), 2);

	/* interleaved with a group of 8: named, and stage 0 holds 2(S-1) + g + 1 = 15
	 * chunk inputs (11 with the paper's g = S) */
	rc = run_meshrun("schedule --config configs/llama-tiny.yml ici_pipeline_parallelism=4 "
			 "base_num_decoder_layers=8 num_pipeline_microbatches=8 pipeline_schedule=interleaved_1f1b "
			 "pipeline_interleave_group=8", out, sizeof(out));
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
	ck_assert_msg(strstr(out, "group: g=8 microbatches through a chunk"), "%s", out);
	ck_assert_int_eq(row_cells(out, "memory per device", "\n  0 ", cells), 8);
	ck_assert_str_eq(cells[0], "15");
	ck_assert_str_eq(cells[1], "15");
	ck_assert_int_eq(row_cells(out, "actions of each stage", "stage 0:", cells) > 18, 1);
	ck_assert_str_eq(cells[14], "E7");
	ck_assert_str_eq(cells[15], "F7.0");
	ck_assert_str_eq(cells[16], "F0.1");

	/* measured costs: a forward is 2 slots, the backward what it took here */
	rc = run_meshrun("schedule --config configs/llama-tiny.yml ici_pipeline_parallelism=2 "
			 "pipeline_schedule=1f1b --costs measured", out, sizeof(out));
	ck_assert_msg(rc == 0 && strstr(out, "time in unit slots (F 2, B "), "exit %d:\n%s", rc, out);

	rc = run_meshrun("schedule --config configs/llama-tiny.yml ici_pipeline_parallelism=4 "
			 "base_num_decoder_layers=8 num_pipeline_microbatches=6", out, sizeof(out));
	ck_assert_int_eq(rc, 3);
	ck_assert_msg(strstr(out, "'num_pipeline_microbatches' (6)"), "%s", out);
	ck_assert_int_eq(run_meshrun("schedule --config configs/llama-tiny.yml --costs 1:0:1", out, sizeof(out)), 2);
	ck_assert_int_eq(run_meshrun("schedule", out, sizeof(out)), 2);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("schedule");
	TCase *tc = tcase_create("tables");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_tables_match_formulas);
	tcase_add_test(tc, test_schedules_compared);
	tcase_add_test(tc, test_zb_h1_costs);
	tcase_add_test(tc, test_send_cost);
	tcase_add_test(tc, test_group_tables);
	tcase_add_test(tc, test_group_hops);
	tcase_add_test(tc, test_tables_with_moe_outside_recompute);
	tcase_add_test(tc, test_circular_lockstep);
	tcase_add_test(tc, test_shape_refused);
	suite_add_tcase(s, tc);
	tc = tcase_create("weights");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_window_rule);
	tcase_add_test(tc, test_other_weight_modes);
	tcase_add_test(tc, test_maxtext_rule_is_wrong);
	tcase_add_test(tc, test_landing_rule);
	suite_add_tcase(s, tc);
	tc = tcase_create("validator");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_validator_refuses);
	suite_add_tcase(s, tc);
	tc = tcase_create("keys");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_keys_resolve);
	tcase_add_test(tc, test_keys_refused);
	suite_add_tcase(s, tc);
	tc = tcase_create("command");
	tcase_set_timeout(tc, 30);
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, test_command);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
