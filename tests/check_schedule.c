/* Pipeline schedule: the table against the formulas for many (S, M, R, d,
 * Lps) — active slots, transfers and their iterations, the circular
 * storage, layers in sequence — the weight window rule of every mode, the
 * pipeline keys' resolution and refusals, and `meshrun schedule`. */
#include <check.h>
#include <errno.h>
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

#define MAX_SHAPES 1024

/* Every S in [smin, smax], M in S..4S (multiples of S; >= 2S when d = 2),
 * R in 1..5, d in {1, 2}, with layers per stage lps and weight mode w. */
static int sweep(struct pipe_shape *out, int smin, int smax, int lps, enum pipe_wmode w)
{
	int n = 0;
	for (int S = smin; S <= smax; S++)
		for (int d = 1; d <= 2; d++)
			for (int M = S; M <= 4 * S; M += S)
				for (int R = 1; R <= 5; R++) {
					if (d == 2 && M < 2 * S)
						continue;
					ck_assert_int_lt(n, MAX_SHAPES);
					out[n++] = (struct pipe_shape){
						.stages = S, .microbatches = M, .repeats = R,
						.layers_per_stage = lps, .delay = d, .wmode = w,
					};
				}
	return n;
}

static void build(struct pipe_schedule *sc, const struct pipe_shape *p)
{
	int rc = pipe_schedule_circular(sc, p, err, sizeof(err));
	ck_assert_msg(rc == 0, "S=%d M=%d R=%d d=%d: %s", p->stages, p->microbatches, p->repeats,
		      p->delay, err);
}

static bool is_weight_op(enum pipe_op op)
{
	return op == PIPE_GATHER || op == PIPE_RELEASE || op == PIPE_REDUCE_SCATTER;
}

/* Where each non-weight entry sits: [op][iter * S + stage] = its index, or
 * -1. Each op belongs to one pass, and no stage has two of one op in one
 * iteration (checked while indexing). */
static int *where[PIPE_OP_COUNT];

static void index_table(const struct pipe_schedule *sc)
{
	size_t cells = (size_t)sc->iterations * (size_t)sc->shape.stages;
	for (int op = 0; op < PIPE_OP_COUNT; op++) {
		free(where[op]);
		where[op] = malloc(cells * sizeof(int));
		ck_assert_ptr_nonnull(where[op]);
		for (size_t c = 0; c < cells; c++)
			where[op][c] = -1;
	}
	for (int k = 0; k < sc->n; k++) {
		const struct pipe_entry *e = &sc->e[k];
		ck_assert(e->iter >= 0 && e->iter < sc->iterations);
		ck_assert(e->stage >= 0 && e->stage < sc->shape.stages);
		if (is_weight_op(e->op))
			continue;
		ck_assert_int_eq(e->pass, e->op <= PIPE_GIVE_OUTPUT ? PIPE_PASS_FWD : PIPE_PASS_BWD);
		int *c = &where[e->op][(size_t)e->iter * sc->shape.stages + e->stage];
		ck_assert_msg(*c < 0, "two %s at iteration %d stage %d", pipe_op_name(e->op), e->iter, e->stage);
		*c = k;
	}
}

/* The entry of op at (iter, stage), or -1 (index_table first). */
static int find(const struct pipe_schedule *sc, enum pipe_op op, int iter, int stage)
{
	if (iter < 0 || iter >= sc->iterations || stage < 0 || stage >= sc->shape.stages)
		return -1;
	return where[op][(size_t)iter * sc->shape.stages + stage];
}

/* The nearest entry of the same stage before (dir -1) or after (dir +1) k
 * that is not a weight entry. */
static const struct pipe_entry *neighbour(const struct pipe_schedule *sc, int k, int dir)
{
	for (int j = k + dir; j >= 0 && j < sc->n; j += dir)
		if (sc->e[j].stage == sc->e[k].stage && !is_weight_op(sc->e[j].op))
			return &sc->e[j];
	return NULL;
}

/* ---- the table against the formulas ---- */

/* Active slots, their microbatch and repeat, forward and backward. */
static void check_slots(const struct pipe_schedule *sc)
{
	const struct pipe_shape *p = &sc->shape;
	int S = p->stages, M = p->microbatches, R = p->repeats, d = p->delay;
	ck_assert_int_eq(sc->iterations, R * M + d * (S - 1));
	for (int i = 0; i < sc->iterations; i++)
		for (int s = 0; s < S; s++) {
			int k = i - d * s;
			bool on = k >= 0 && k < R * M;
			int f = find(sc, PIPE_FORWARD, i, s);
			int b = find(sc, PIPE_BACKWARD, i, s);
			ck_assert_msg((f >= 0) == on && (b >= 0) == on, "S=%d M=%d R=%d d=%d i=%d s=%d",
				      S, M, R, d, i, s);
			if (!on)
				continue;
			ck_assert_int_eq(sc->e[f].mb, k % M);
			ck_assert_int_eq(sc->e[f].repeat, k / M);
			ck_assert_int_eq(sc->e[b].mb, k % M);
			ck_assert_int_eq(sc->e[b].repeat, k / M);
			ck_assert_int_lt(f, b); /* every backward after its forward */
		}
	/* the forward pass, iterations rising, then the backward, falling */
	for (int k = 1; k < sc->n; k++) {
		const struct pipe_entry *a = &sc->e[k - 1], *e = &sc->e[k];
		ck_assert_int_le(a->pass, e->pass);
		if (a->pass == e->pass)
			ck_assert(e->pass == PIPE_PASS_FWD ? a->iter <= e->iter : a->iter >= e->iter);
	}
}

/* Every forward's input comes right before it and its output right after;
 * every send has the one receive that takes it, d iterations later (the
 * circular hop M - d(S-1) later), carrying the same microbatch. */
static void check_forward_transfers(const struct pipe_schedule *sc)
{
	const struct pipe_shape *p = &sc->shape;
	int S = p->stages, M = p->microbatches, R = p->repeats, d = p->delay;
	int sends = 0, recvs = 0;
	for (int k = 0; k < sc->n; k++) {
		const struct pipe_entry *e = &sc->e[k];
		if (e->op == PIPE_RECV)
			recvs++;
		if (e->op == PIPE_FORWARD) {
			const struct pipe_entry *in = neighbour(sc, k, -1), *out = neighbour(sc, k, +1);
			ck_assert_ptr_nonnull(in);
			ck_assert_ptr_nonnull(out);
			bool fresh = e->stage == 0 && e->repeat == 0, last = e->stage == S - 1 && e->repeat == R - 1;
			ck_assert_int_eq(in->op, fresh ? PIPE_TAKE_INPUT : PIPE_RECV);
			ck_assert_int_eq(out->op, last ? PIPE_GIVE_OUTPUT : PIPE_SEND);
			ck_assert(in->iter == e->iter && in->mb == e->mb && in->repeat == e->repeat);
			ck_assert(out->iter == e->iter && out->mb == e->mb && out->repeat == e->repeat);
			/* stage 0 takes fresh microbatches exactly while i < M */
			if (e->stage == 0)
				ck_assert_int_eq(in->op == PIPE_TAKE_INPUT, e->iter < M);
		}
		if (e->op != PIPE_SEND)
			continue;
		sends++;
		bool circ = e->stage == S - 1;
		int gap = circ ? M - d * (S - 1) : d;
		ck_assert_int_eq(e->peer, circ ? 0 : e->stage + 1);
		ck_assert_int_eq(e->peer_iter - e->iter, gap);
		ck_assert_int_ge(gap, d);
		int r = find(sc, PIPE_RECV, e->peer_iter, e->peer);
		ck_assert_int_ge(r, 0);
		const struct pipe_entry *q = &sc->e[r];
		ck_assert(q->peer == e->stage && q->peer_iter == e->iter && q->mb == e->mb);
		ck_assert_int_eq(q->repeat, e->repeat + (circ ? 1 : 0));
	}
	ck_assert_int_eq(sends, recvs);
}

/* The backward mirror: gradients travel to the stage that made the input,
 * d iterations earlier (the circular hop 0 -> S-1, M - d(S-1) earlier). */
static void check_backward_transfers(const struct pipe_schedule *sc)
{
	const struct pipe_shape *p = &sc->shape;
	int S = p->stages, M = p->microbatches, R = p->repeats, d = p->delay;
	int sends = 0, recvs = 0;
	for (int k = 0; k < sc->n; k++) {
		const struct pipe_entry *e = &sc->e[k];
		if (e->op == PIPE_RECV_GRAD)
			recvs++;
		if (e->op == PIPE_BACKWARD) {
			const struct pipe_entry *in = neighbour(sc, k, -1), *out = neighbour(sc, k, +1);
			bool first = e->stage == S - 1 && e->repeat == R - 1, last = e->stage == 0 && e->repeat == 0;
			ck_assert_int_eq(in->op, first ? PIPE_TAKE_DOUT : PIPE_RECV_GRAD);
			ck_assert_int_eq(out->op, last ? PIPE_GIVE_DIN : PIPE_SEND_GRAD);
			ck_assert(in->iter == e->iter && in->mb == e->mb && in->repeat == e->repeat);
			ck_assert(out->iter == e->iter && out->mb == e->mb && out->repeat == e->repeat);
		}
		if (e->op != PIPE_SEND_GRAD)
			continue;
		sends++;
		bool circ = e->stage == 0;
		ck_assert_int_eq(e->peer, circ ? S - 1 : e->stage - 1);
		ck_assert_int_eq(e->iter - e->peer_iter, circ ? M - d * (S - 1) : d);
		int r = find(sc, PIPE_RECV_GRAD, e->peer_iter, e->peer);
		ck_assert_int_ge(r, 0);
		const struct pipe_entry *q = &sc->e[r];
		ck_assert(q->peer == e->stage && q->peer_iter == e->iter && q->mb == e->mb);
		ck_assert_int_eq(q->repeat, e->repeat - (circ ? 1 : 0));
		ck_assert_int_lt(k, r); /* sent before it is taken, in table order */
	}
	ck_assert_int_eq(sends, recvs);
}

START_TEST(test_table_matches_formulas)
{
	static struct pipe_shape shapes[MAX_SHAPES];
	int checked = 0;
	for (int lps = 1; lps <= 2; lps++) {
		int n = sweep(shapes, 1, 6, lps, PIPE_W_ITER);
		for (int k = 0; k < n; k++) {
			const struct pipe_shape *p = &shapes[k];
			struct pipe_schedule sc;
			struct pipe_stats st;
			build(&sc, p);
			index_table(&sc);
			check_slots(&sc);
			check_forward_transfers(&sc);
			check_backward_transfers(&sc);
			pipe_schedule_stats(&sc, &st);
			int M = p->microbatches, R = p->repeats;
			int circ = R > 1 ? M - p->delay * (p->stages - 1) : 0;
			ck_assert_int_eq(st.active, R * M);
			ck_assert_int_eq(st.saved_inputs, R * M);
			ck_assert_msg(st.max_circ == circ && st.max_circ_grad == circ,
				      "S=%d M=%d R=%d d=%d: stage 0 holds %d, stage S-1 %d, want %d",
				      p->stages, M, R, p->delay, st.max_circ, st.max_circ_grad, circ);
			pipe_schedule_release(&sc);
			checked++;
		}
	}
	ck_assert_int_gt(checked, 300);
	for (int op = 0; op < PIPE_OP_COUNT; op++) {
		free(where[op]);
		where[op] = NULL;
	}
}
END_TEST

/* Each microbatch meets the pipelined layers in order 0..L-1 in the
 * forward pass and L-1..0 in the backward pass: the pipeline computes
 * what the layers in sequence compute. */
START_TEST(test_layers_in_sequence)
{
	static struct pipe_shape shapes[MAX_SHAPES];
	for (int lps = 1; lps <= 3; lps += 2) {
		int n = sweep(shapes, 1, 5, lps, PIPE_W_REPEAT);
		for (int k = 0; k < n; k++) {
			const struct pipe_shape *p = &shapes[k];
			int S = p->stages, M = p->microbatches, R = p->repeats, d = p->delay;
			int L = S * R * lps;
			struct pipe_schedule sc;
			build(&sc, p);
			for (int m = 0; m < M; m++) {
				int next = 0, last_iter = -1, back = L;
				for (int j = 0; j < sc.n; j++) {
					const struct pipe_entry *e = &sc.e[j];
					if (e->mb != m || (e->op != PIPE_FORWARD && e->op != PIPE_BACKWARD))
						continue;
					if (e->op == PIPE_FORWARD) {
						if (last_iter >= 0) {
							bool wrap = e->stage == 0;
							ck_assert_int_eq(e->iter - last_iter, wrap ? M - d * (S - 1) : d);
						}
						for (int l = 0; l < lps; l++)
							ck_assert_int_eq(pipe_layer(p, e->repeat, e->stage, l), next++);
						last_iter = e->iter;
					} else {
						for (int l = lps - 1; l >= 0; l--)
							ck_assert_int_eq(pipe_layer(p, e->repeat, e->stage, l), --back);
					}
				}
				ck_assert_int_eq(next, L);
				ck_assert_int_eq(back, 0);
			}
			pipe_schedule_release(&sc);
		}
	}
}
END_TEST

/* ---- weights ---- */

/* What one stage's walk through the table saw. */
struct weight_walk {
	int gather_iter[2][64];   /* [pass][repeat]: iteration of the gather, -1 none */
	int gather_order[2][64];  /* its index among the stage's entries */
	int first_use[2][64];     /* iteration of the first FORWARD / BACKWARD */
	int rs_iter[64];          /* iteration of dW[r]'s reduce-scatter */
	int gathers, reduce_scatters, max_live, max_grads;
};

/* Walks stage s's entries: every slot a FORWARD or BACKWARD reads holds
 * W[r,s] of its own repeat; a gather never lands in a slot whose copy is
 * still live; a gradient buffer takes a new repeat only after the old one
 * was reduce-scattered, and never accumulates after it; each W[r,s] is
 * gathered at most once per pass and each dW[r,s] reduce-scattered once. */
static void walk_weights(const struct pipe_schedule *sc, int s, struct weight_walk *w)
{
	int R = sc->shape.repeats, nslot = sc->weight_slots;
	int holds[64], grad[64], live = 0, order = 0;
	bool scattered[64] = { false };
	ck_assert_int_le(R, 64);
	ck_assert_int_le(nslot, 64);
	memset(w, 0, sizeof(*w));
	for (int i = 0; i < 64; i++) {
		holds[i] = grad[i] = -1;
		w->rs_iter[i] = -1;
		for (int ps = 0; ps < 2; ps++)
			w->gather_iter[ps][i] = w->first_use[ps][i] = -1;
	}
	for (int k = 0; k < sc->n; k++) {
		const struct pipe_entry *e = &sc->e[k];
		if (e->stage != s)
			continue;
		order++;
		int r = e->repeat, ps = e->pass;
		switch (e->op) {
		case PIPE_GATHER:
			ck_assert(e->slot >= 0 && e->slot < nslot);
			ck_assert_msg(holds[e->slot] < 0, "gather W[%d,%d] over live W[%d] in slot %d",
				      r, s, holds[e->slot], e->slot);
			holds[e->slot] = r;
			if (++live > w->max_live)
				w->max_live = live;
			w->gathers++;
			if (w->gather_iter[ps][r] < 0) {
				w->gather_iter[ps][r] = e->iter;
				w->gather_order[ps][r] = order;
			} else {
				ck_assert(sc->shape.wmode == PIPE_W_ITER);
			}
			break;
		case PIPE_RELEASE:
			ck_assert_int_eq(holds[e->slot], r);
			holds[e->slot] = -1;
			live--;
			break;
		case PIPE_FORWARD:
		case PIPE_BACKWARD:
			ck_assert_msg(holds[e->slot] == r, "stage %d %s of repeat %d reads slot %d holding W[%d]",
				      s, pipe_op_name(e->op), r, e->slot, holds[e->slot]);
			if (w->first_use[ps][r] < 0)
				w->first_use[ps][r] = e->iter;
			if (e->op == PIPE_FORWARD)
				break;
			ck_assert(e->gslot >= 0 && e->gslot < sc->grad_slots);
			if (grad[e->gslot] != r) {
				ck_assert_msg(grad[e->gslot] < 0 || scattered[grad[e->gslot]],
					      "dW[%d] overwrites dW[%d] before its reduce-scatter", r, grad[e->gslot]);
				grad[e->gslot] = r;
			}
			ck_assert_msg(!scattered[r] || sc->shape.wmode == PIPE_W_ITER,
				      "dW[%d,%d] accumulates after its reduce-scatter", r, s);
			if (e->gslot + 1 > w->max_grads)
				w->max_grads = e->gslot + 1;
			break;
		case PIPE_REDUCE_SCATTER:
			ck_assert_int_eq(grad[e->slot], r);
			if (sc->shape.wmode != PIPE_W_ITER) {
				ck_assert(!scattered[r]);
				w->rs_iter[r] = e->iter;
			}
			scattered[r] = true;
			w->reduce_scatters++;
			break;
		default:
			break;
		}
	}
	ck_assert_int_eq(live, 0); /* everything released at the end of the step */
	for (int r = 0; r < R; r++)
		ck_assert(scattered[r]);
}

/* The window rule (pipeline_fsdp_ag_per_repeat) for every shape of the
 * sweep, and its backward mirror. */
START_TEST(test_window_rule)
{
	static struct pipe_shape shapes[MAX_SHAPES];
	int n = sweep(shapes, 2, 6, 1, PIPE_W_REPEAT);
	for (int k = 0; k < n; k++) {
		const struct pipe_shape *p = &shapes[k];
		int S = p->stages, M = p->microbatches, R = p->repeats, d = p->delay;
		struct pipe_schedule sc;
		struct pipe_stats st;
		build(&sc, p);
		for (int s = 0; s < S; s++) {
			struct weight_walk w;
			walk_weights(&sc, s, &w);
			ck_assert_int_le(w.max_live, 2);
			ck_assert_int_le(w.max_grads, 2);
			/* W[0,s] before the step (the stage's first entry), W[1,s] at iteration 0 */
			ck_assert_int_eq(w.gather_order[0][0], 1);
			ck_assert_int_eq(w.gather_iter[0][0], 0);
			if (R > 1) {
				ck_assert_int_eq(w.gather_order[0][1], 2);
				ck_assert_int_eq(w.gather_iter[0][1], 0);
			}
			for (int r = 0; r < R; r++) {
				ck_assert_int_eq(w.first_use[0][r], r * M + d * s);
				if (r >= 2) /* issued exactly M iterations before its first use */
					ck_assert_int_eq(w.first_use[0][r] - w.gather_iter[0][r], M);
				/* backward: W[R-1] and W[R-2] stay from the forward pass; the
				 * rest are gathered after reverse iteration (r+2)*M + d*s, with
				 * M iterations between that and the first use */
				ck_assert_int_eq(w.first_use[1][r], r * M + d * s + M - 1);
				if (r >= R - 2) {
					ck_assert_int_eq(w.gather_iter[1][r], -1);
				} else {
					ck_assert_int_eq(w.gather_iter[1][r], (r + 2) * M + d * s);
					ck_assert_int_eq(w.gather_iter[1][r] - w.first_use[1][r] - 1, M);
				}
				/* dW[r,s] reduce-scattered after its last backward slot */
				ck_assert_int_eq(w.rs_iter[r], r * M + d * s);
			}
			ck_assert_int_eq(w.gathers, R + (R > 2 ? R - 2 : 0));
			ck_assert_int_eq(w.reduce_scatters, R);
		}
		pipe_schedule_stats(&sc, &st);
		ck_assert_int_eq(st.max_weights, R < 2 ? R : 2);
		ck_assert_int_eq(st.max_grads, R < 2 ? R : 2);
		ck_assert_int_eq(st.gathers, R + (R > 2 ? R - 2 : 0));
		pipe_schedule_release(&sc);
	}
}
END_TEST

/* Neither flag gathers per slot; pipeline_fsdp_ag_once gathers every
 * repeat once and reduce-scatters them all after the last backward. */
START_TEST(test_other_weight_modes)
{
	static struct pipe_shape shapes[MAX_SHAPES];
	for (int mode = PIPE_W_ITER; mode <= PIPE_W_ONCE; mode++) {
		int n = sweep(shapes, 2, 5, 1, (enum pipe_wmode)mode);
		for (int k = 0; k < n; k++) {
			const struct pipe_shape *p = &shapes[k];
			int S = p->stages, M = p->microbatches, R = p->repeats, d = p->delay;
			struct pipe_schedule sc;
			struct pipe_stats st;
			build(&sc, p);
			for (int s = 0; s < S; s++) {
				struct weight_walk w;
				walk_weights(&sc, s, &w);
				if (mode == PIPE_W_ITER) {
					ck_assert_int_eq(w.max_live, 1);
					ck_assert_int_eq(w.gathers, 2 * R * M);
					ck_assert_int_eq(w.reduce_scatters, R * M);
					continue;
				}
				ck_assert_int_eq(w.max_live, R);
				ck_assert_int_eq(w.max_grads, R);
				ck_assert_int_eq(w.gathers, R);
				ck_assert_int_eq(w.reduce_scatters, R);
				for (int r = 0; r < R; r++) {
					ck_assert_int_eq(w.gather_iter[0][r], 0);
					ck_assert_int_eq(w.gather_iter[1][r], -1);
					ck_assert_int_eq(w.rs_iter[r], 0);
					ck_assert_int_eq(w.first_use[0][r], r * M + d * s);
				}
			}
			pipe_schedule_stats(&sc, &st);
			ck_assert_int_eq(st.max_weights, mode == PIPE_W_ITER ? 1 : R);
			pipe_schedule_release(&sc);
		}
	}
}
END_TEST

/* MaxText fills the new slot at the start of block r with
 * W[floor(max(r*M + 1 - d*s, 0) / M), s]. For d*s >= 2 that is W[r-1],
 * not W[r]: stage s would run repeat r on the weights of repeat r-1, and
 * W[R-1,s] would never be loaded (never trained). Our table gives every
 * slot its own repeat's weights (test_window_rule); this documents why we
 * do not use that rule. */
START_TEST(test_maxtext_rule_is_wrong)
{
	static struct pipe_shape shapes[MAX_SHAPES];
	int n = sweep(shapes, 2, 6, 1, PIPE_W_REPEAT), wrong = 0;
	for (int k = 0; k < n; k++) {
		const struct pipe_shape *p = &shapes[k];
		int M = p->microbatches, R = p->repeats, d = p->delay;
		for (int s = 0; s < p->stages; s++) {
			bool last_loaded = false;
			for (int r = 0; r < R; r++) {
				int x = r * M + 1 - d * s;
				int mt = (x > 0 ? x : 0) / M;
				if (mt == R - 1)
					last_loaded = true;
				if (r == 0 || d * s < 2) {
					ck_assert_int_eq(mt, r);
					continue;
				}
				ck_assert_int_ne(mt, r);
				ck_assert_int_eq(mt, r - 1);
				wrong++;
			}
			if (d * s >= 2 && R > 1)
				ck_assert(!last_loaded);
		}
	}
	ck_assert_int_gt(wrong, 100);
}
END_TEST

/* Each slot's life in one of its out (fwd) or grad buffers, in pass time:
 * from its first write until the receiver took it (INT_MAX: after the
 * pass). Walked off the table independently of pipe_stage_bufs. */
struct life {
	int from, until;
};

static void slot_lives(const struct pipe_schedule *sc, int s, struct life *fo, struct life *fg)
{
	const struct pipe_shape *p = &sc->shape;
	int M = p->microbatches, T = sc->iterations;
	for (int k = 0; k < sc->n; k++) {
		const struct pipe_entry *e = &sc->e[k];
		int q = e->repeat * M + e->mb, rt = T - 1 - e->iter;
		if (e->stage != s)
			continue;
		if (e->op == PIPE_FORWARD)
			fo[q].from = e->iter;
		else if (e->op == PIPE_SEND)
			fo[q].until = e->peer == s ? e->iter : e->peer_iter;
		else if (e->op == PIPE_GIVE_OUTPUT)
			fo[q].until = pipe_owner(p, e->mb) == s ? e->iter : 1 << 30;
		else if (e->op == PIPE_TAKE_DOUT || e->op == PIPE_RECV_GRAD)
			fg[q].from = rt;
		else if (e->op == PIPE_SEND_GRAD)
			fg[q].until = e->peer == s ? rt : T - 1 - e->peer_iter;
		else if (e->op == PIPE_GIVE_DIN)
			fg[q].until = pipe_owner(p, e->mb) == s ? rt : 1 << 30;
	}
}

/* No two slots sharing a buffer live at once; n buffers are all used. */
static void check_buffers(const struct life *lv, const int *buf_of, int RM, int n)
{
	int used[1024] = { 0 };
	ck_assert_int_le(n, RM);
	for (int a = 0; a < RM; a++) {
		ck_assert(buf_of[a] >= 0 && buf_of[a] < n);
		used[buf_of[a]] = 1;
		for (int b = 0; b < RM; b++) {
			if (a == b || buf_of[a] != buf_of[b])
				continue;
			/* one ends (its receiver took it) before the other starts */
			ck_assert_msg(lv[a].until < lv[b].from || lv[b].until < lv[a].from,
				      "slots %d and %d share buffer %d", a, b, buf_of[a]);
		}
	}
	for (int b = 0; b < n; b++)
		ck_assert(used[b]);
}

/* The executor's buffers: R*M saved inputs, outputs and gradients reused
 * only once their receiver took them, four per owned microbatch. */
START_TEST(test_buffers)
{
	static struct pipe_shape sh[MAX_SHAPES];
	int n = sweep(sh, 1, 5, 1, PIPE_W_ITER);
	for (int i = 0; i < n; i++) {
		struct pipe_schedule sc;
		int RM = sh[i].repeats * sh[i].microbatches;
		ck_assert_int_eq(pipe_schedule_circular(&sc, &sh[i], err, sizeof(err)), 0);
		int *oo = malloc(sizeof(int) * (size_t)RM), *go = malloc(sizeof(int) * (size_t)RM);
		struct life *fo = calloc((size_t)RM, sizeof(*fo)), *fg = calloc((size_t)RM, sizeof(*fg));
		for (int s = 0; s < sh[i].stages; s++) {
			struct pipe_bufs b;
			ck_assert_int_eq(pipe_stage_bufs(&sc, s, &b, oo, go), 0);
			ck_assert_int_eq(b.saved, RM);
			ck_assert_int_eq(b.owned, sh[i].microbatches / sh[i].stages);
			ck_assert_int_eq(pipe_bufs_total(&b), RM + b.out + b.grad + 4 * b.owned + 1);
			slot_lives(&sc, s, fo, fg);
			check_buffers(fo, oo, RM, b.out);
			check_buffers(fg, go, RM, b.grad);
		}
		free(oo);
		free(go);
		free(fo);
		free(fg);
		pipe_schedule_release(&sc);
	}
}
END_TEST

START_TEST(test_shape_refused)
{
	struct pipe_schedule sc;
	struct pipe_shape ok = { .stages = 4, .microbatches = 8, .repeats = 2,
				 .layers_per_stage = 1, .delay = 1, .wmode = PIPE_W_REPEAT };
	struct pipe_shape bad[] = { ok, ok, ok, ok, ok };
	bad[0].microbatches = 6;  /* not a multiple of S */
	bad[1].delay = 2;         /* needs M >= 2S = 8 */
	bad[1].microbatches = 4;
	bad[2].delay = 3;
	bad[3].repeats = 0;
	bad[4].stages = 0;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(pipe_schedule_circular(&sc, &bad[i], err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, "pipeline: "), "%s", err);
		ck_assert_ptr_null(sc.e);
	}
	ck_assert_int_eq(pipe_schedule_circular(&sc, &ok, err, sizeof(err)), 0);
	ck_assert_int_eq(sc.iterations, 19);
	pipe_schedule_release(&sc);
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
	/* MoE: the MoE layers are pipelined, the dense ones run before */
	ck_assert_int_eq(resolve(&pc, 2, KV("ici_pipeline_parallelism=2", "base_num_decoder_layers=6",
					    "num_experts=4", "num_experts_per_tok=2",
					    "first_num_dense_layers=2")), 0);
	ck_assert_int_eq(pc.layers, 4);
	ck_assert_int_eq(pc.first_layer, 2);
	ck_assert_int_eq(pc.layers_before, 2);
	ck_assert_int_eq(pc.layers_after, 0);
	ck_assert_int_eq(pc.shape.repeats, 2);
	ck_assert_int_eq(resolve(&pc, 2, KV("ici_pipeline_parallelism=2", "base_num_decoder_layers=6",
					    "num_experts=4", "num_experts_per_tok=2",
					    "first_num_dense_layers=2", "pipeline_parallel_layers=2")), 0);
	ck_assert_int_eq(pc.first_layer, 4);
	ck_assert_int_eq(pc.layers_before, 4);
	ck_assert_int_eq(pc.shape.repeats, 1);
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

/* The cells of the table row that starts with `label` (first block). */
static int row_cells(const char *out, const char *label, char cells[64][16])
{
	const char *p = strstr(out, label);
	ck_assert_msg(p, "no row '%s' in:\n%s", label, out);
	p += strlen(label);
	int n = 0;
	while (*p && *p != '\n' && n < 64) {
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
	static char out[65536];
	char cells[64][16];
	int rc = run_meshrun("schedule --config configs/llama-tiny.yml ici_pipeline_parallelism=4 "
			     "base_num_decoder_layers=8 num_pipeline_microbatches=8", out, sizeof(out));
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
	ck_assert_msg(strstr(out, "T = R*M + d*(S-1) = 2*8 + 1*3 = 19\n"), "%s", out);
	ck_assert_msg(strstr(out, "bubble: d*(S-1)/T = 3/19 = 0.158\n"), "%s", out);
	/* stage 3 idles 3 iterations, runs 8 microbatches of repeat 0, then repeat 1 */
	ck_assert_int_eq(row_cells(out, "\nstage 3", cells), 19);
	ck_assert_str_eq(cells[2], ".");
	ck_assert_str_eq(cells[3], "0.0");
	ck_assert_str_eq(cells[10], "7.0");
	ck_assert_str_eq(cells[11], "0.1");
	ck_assert_str_eq(cells[18], "7.1");
	ck_assert_int_eq(row_cells(out, "\nstage 0", cells), 19);
	ck_assert_str_eq(cells[15], "7.1");
	ck_assert_str_eq(cells[16], ".");
	/* M - d(S-1) = 5 microbatches wait for the circular hop; each stage
	 * saves R*M = 16 inputs; stage 0 holds the circular gradients (7 grad
	 * buffers), stage 3 the circular outputs (7 out buffers) */
	ck_assert_msg(strstr(out, "circular storage: stage 3's outputs waiting for stage 0, at most 5"),
		      "%s", out);
	ck_assert_int_eq(row_cells(out, "\n  0 ", cells), 7);
	ck_assert_str_eq(cells[0], "16");
	ck_assert_str_eq(cells[1], "2");
	ck_assert_str_eq(cells[2], "7");
	ck_assert_str_eq(cells[3], "2");
	ck_assert_str_eq(cells[5], "34");
	ck_assert_int_eq(row_cells(out, "\n  3 ", cells), 7);
	ck_assert_str_eq(cells[1], "7");
	ck_assert_str_eq(cells[2], "2");

	/* the delay: M defaults to 2S = 8, T = 2*8 + 2*3 = 22 */
	rc = run_meshrun("schedule --config configs/llama-tiny.yml ici_pipeline_parallelism=4 "
			 "base_num_decoder_layers=8 pipeline_delay_activation_forwarding=true "
			 "ici_fsdp_parallelism=2 pipeline_fsdp_ag_per_repeat=true", out, sizeof(out));
	ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
	ck_assert_msg(strstr(out, "= 2*8 + 2*3 = 22\n") && strstr(out, "6/22 = 0.273\n"), "%s", out);
	ck_assert_msg(strstr(out, "* pipeline_fsdp_ag_per_repeat"), "%s", out);
	ck_assert_msg(strstr(out, "gathered (over fsdp;"), "%s", out);

	rc = run_meshrun("schedule --config configs/llama-tiny.yml ici_pipeline_parallelism=4 "
			 "base_num_decoder_layers=8 num_pipeline_microbatches=6", out, sizeof(out));
	ck_assert_int_eq(rc, 3);
	ck_assert_msg(strstr(out, "'num_pipeline_microbatches' (6)"), "%s", out);
	rc = run_meshrun("schedule", out, sizeof(out));
	ck_assert_int_eq(rc, 2);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("schedule");
	TCase *tc = tcase_create("table");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_table_matches_formulas);
	tcase_add_test(tc, test_layers_in_sequence);
	tcase_add_test(tc, test_shape_refused);
	tcase_add_test(tc, test_buffers);
	suite_add_tcase(s, tc);
	tc = tcase_create("weights");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_window_rule);
	tcase_add_test(tc, test_other_weight_modes);
	tcase_add_test(tc, test_maxtext_rule_is_wrong);
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
