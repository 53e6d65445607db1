/* The builders (see schedule.h and docs/pipeline.md): each orders one
 * stage's compute, the forward F, backward B (or I then W) of every
 * microbatch through every chunk the stage runs, and nothing else; the
 * lowering (table.c) adds the rest. A builder is a pure function of the
 * shape; adding a schedule is adding one here. */
#include "host/pipeline/orders.h"

static struct pipe_action op(int kind, int mb, int chunk, int iter)
{
	return (struct pipe_action){ .op = (uint8_t)kind, .mb = mb, .chunk = (int16_t)chunk, .peer = -1,
				     .slot = -1, .buf = { -1, -1, -1 }, .iter = iter };
}

/* MaxText's circular schedule: iteration i runs k = i - d*s when
 * 0 <= k < R*M, microbatch k mod M of repeat k / M (chunk repeat*S + s);
 * the backward is the same slots in reverse. */
static int order_circular(const struct pipe_shape *p, int s, struct pipe_action *out)
{
	int M = p->microbatches, S = p->stages, RM = p->repeats * M, n = 0;
	for (int k = 0; k < RM; k++)
		out[n++] = op(PA_F, k % M, (k / M) * S + s, k + p->delay * s);
	for (int k = RM - 1; k >= 0; k--)
		out[n++] = op(PA_B, k % M, (k / M) * S + s, k + p->delay * s);
	return n;
}

/* GPipe: every forward, then every backward, the last microbatch first. */
static int order_gpipe(const struct pipe_shape *p, int s, struct pipe_action *out)
{
	int M = p->microbatches, n = 0;
	for (int m = 0; m < M; m++)
		out[n++] = op(PA_F, m, s, -1);
	for (int m = M - 1; m >= 0; m--)
		out[n++] = op(PA_B, m, s, -1);
	return n;
}

/* Interleaved 1F1B (Narayanan et al. 2021), v chunks a stage; v = 1 is
 * 1F1B. Microbatches go through a chunk in groups of g (the shape's
 * group, S by default; Megatron-LM's microbatch_group_size_per_vp_stage):
 * the j-th forward of a stage is, for j in group G = j / (g v) (of g
 * microbatches, the last one of the M mod g left over when that is not
 * 0), microbatch G g + (j - G g v) mod r of its local chunk (j - G g v) /
 * r, r the group's size; the backward walks the chunks the other way in
 * the same order. Stage s first runs 2(S-1-s) + (v-1)g forwards (S-1-s
 * for v = 1), then alternates one forward and one backward, then drains
 * the backwards. With g = S (and M a multiple of S) this is the paper's
 * order: groups of S microbatches through one chunk, then the next. A
 * larger group gives the ring of stages g - S slots of slack at each
 * chunk change, which absorbs the transfers there, for (v-1)(g-S) more
 * warm-up forwards (saved chunk inputs) on every stage. */

/* The q-th forward (or backward) of stage s in the interleaved order. */
static struct pipe_action interleaved_op(const struct pipe_shape *p, int s, int q, bool fwd)
{
	int v = p->repeats, M = p->microbatches, g = pipe_group(p);
	int first = q / (g * v) * g, r = M - first < g ? M - first : g;
	int off = q - first * v, m = first + off % r, k = off / r;
	return op(fwd ? PA_F : PA_B, m, (fwd ? k : v - 1 - k) * p->stages + s, -1);
}

static int order_interleaved(const struct pipe_shape *p, int s, struct pipe_action *out)
{
	int S = p->stages, v = p->repeats, total = v * p->microbatches, n = 0;
	int warm = v == 1 ? S - 1 - s : 2 * (S - 1 - s) + (v - 1) * pipe_group(p);
	if (warm > total)
		warm = total;
	for (int q = 0; q < warm; q++)
		out[n++] = interleaved_op(p, s, q, true);
	for (int q = 0; q < total - warm; q++) {
		out[n++] = interleaved_op(p, s, warm + q, true);
		out[n++] = interleaved_op(p, s, q, false);
	}
	for (int q = total - warm; q < total; q++)
		out[n++] = interleaved_op(p, s, q, false);
	return n;
}

/* ZB-H1 (Qi et al. 2023): 1F1B's forwards and input backwards, stage s
 * running the weight backward of microbatch m after the input backward
 * of m + s (so every stage holds at most S microbatches, as stage 0 of
 * 1F1B does), the W's it owes filling the end. */
static int order_zb_h1(const struct pipe_shape *p, int s, struct pipe_action *out)
{
	int S = p->stages, M = p->microbatches, n = 0, w = 0;
	int warm = S - 1 - s < M ? S - 1 - s : M;
	for (int m = 0; m < warm; m++)
		out[n++] = op(PA_F, m, s, -1);
	for (int i = 0; i < M; i++) {
		if (warm + i < M)
			out[n++] = op(PA_F, warm + i, s, -1);
		out[n++] = op(PA_I, i, s, -1);
		for (; w <= i - s; w++)
			out[n++] = op(PA_W, w, s, -1);
	}
	for (; w < M; w++)
		out[n++] = op(PA_W, w, s, -1);
	return n;
}

/* ZB-V (Qi et al. 2024): stage r runs chunk r (going down) and chunk
 * 2S-1-r (coming back). Built as if there were max(M, 2S-1) microbatches
 * and the extra ones dropped. Warm-up: 2(S-r)-1 forwards of the first
 * chunk, then r pairs (second chunk, first chunk), then S-r rounds of the
 * second chunk's F, I, W; steady state: F, I, W of the first chunk, then
 * of the second; cool-down: r pairs of I (first, second), S-r of I and W
 * of the first chunk (in the last, the second chunk's owed W's between
 * the I and the W), then the W's owed. */
struct zbv_state {
	struct pipe_action *out;
	int n, M, chunk[2], cnt[2][3]; /* [first, second][F, I, W] */
};

static void zbv_add(struct zbv_state *z, int which, int kind)
{
	static const int kinds[3] = { PA_F, PA_I, PA_W };
	int m = z->cnt[which][kind]++;
	if (m < z->M)
		z->out[z->n++] = op(kinds[kind], m, z->chunk[which], -1);
}

static int order_zbv(const struct pipe_shape *p, int r, struct pipe_action *out)
{
	int S = p->stages, M = p->microbatches, N = M > 2 * S - 1 ? M : 2 * S - 1;
	struct zbv_state z = { .out = out, .M = M, .chunk = { r, 2 * S - 1 - r } };
	enum { F, I, W };
	for (int k = 0; k < 2 * (S - r) - 1; k++)
		zbv_add(&z, 0, F);
	for (int k = 0; k < r; k++) {
		zbv_add(&z, 1, F);
		zbv_add(&z, 0, F);
	}
	for (int k = 0; k < S - r; k++) {
		zbv_add(&z, 1, F);
		zbv_add(&z, 1, I);
		zbv_add(&z, 1, W);
	}
	while (z.cnt[1][F] < z.cnt[0][F] || z.cnt[0][F] < N) {
		if (z.cnt[0][F] < N)
			zbv_add(&z, 0, F);
		zbv_add(&z, 0, I);
		zbv_add(&z, 0, W);
		zbv_add(&z, 1, F);
		zbv_add(&z, 1, I);
		zbv_add(&z, 1, W);
	}
	for (int k = 0; k < r; k++) {
		zbv_add(&z, 0, I);
		zbv_add(&z, 1, I);
	}
	for (int k = 0; k < S - r; k++) {
		zbv_add(&z, 0, I);
		/* the last round: the second chunk's W's owed go first, so
		 * its last W, after which its FSDP reduce-scatter leaves, is
		 * not right before the first chunk's (nothing waits for
		 * these W's; each chunk's W's keep their order) */
		if (k == S - r - 1)
			while (z.cnt[1][W] < z.cnt[1][I])
				zbv_add(&z, 1, W);
		zbv_add(&z, 0, W);
	}
	while (z.cnt[1][W] < z.cnt[1][I])
		zbv_add(&z, 1, W);
	while (z.cnt[0][W] < z.cnt[0][I])
		zbv_add(&z, 0, W);
	return z.n;
}

int pipe_order(const struct pipe_shape *p, int s, struct pipe_action *out)
{
	switch (p->sched) {
	case PIPE_CIRCULAR:
		return order_circular(p, s, out);
	case PIPE_GPIPE:
		return order_gpipe(p, s, out);
	case PIPE_1F1B:
	case PIPE_INTERLEAVED:
		return order_interleaved(p, s, out);
	case PIPE_ZB_H1:
		return order_zb_h1(p, s, out);
	case PIPE_ZBV:
		return order_zbv(p, s, out);
	default:
		return 0;
	}
}

int pipe_order_max(const struct pipe_shape *p)
{
	return 3 * p->microbatches * (pipe_nchunks(p) / p->stages);
}

/* The counting pass: every forward of the stage, chunk by chunk in chunk
 * order, microbatches in order within each (GPipe's forward). */
int pipe_order_count_pass(const struct pipe_shape *p, int s, struct pipe_action *out)
{
	int n = 0;
	for (int c = 0; c < pipe_nchunks(p); c++) {
		if (pipe_chunk_stage(p, c) != s)
			continue;
		for (int m = 0; m < p->microbatches; m++)
			out[n++] = op(PA_FC, m, c, -1);
	}
	return n;
}
