/* The executor's weights (host/pipeline/exec_int.h): before an action,
 * the owner's weights_needed hook for the groups it reads; its window
 * slot waited (and its gradients zeroed when a gather or reduce-scatter
 * left them to be); the table's GATHER, RELEASE and REDUCE_SCATTER
 * actions on the window; after an action, the grads_done hook for the
 * groups whose gradients it completed, and again (landed) once their
 * last reduce-scatter landed; the leading gathers a prefetch starts
 * before the step; and a layer's F or B in two parts (the model's mid
 * calls). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "host/model/window.h"
#include "host/pipeline/exec_int.h"

/* The weight group a window action names: chunk c, or nchunks for the
 * non-layer tensors, nchunks + 1 for the layers outside the pipeline. */
static int wgroup(const struct pipe_exec *x, const struct pipe_action *a)
{
	return a->chunk >= 0 ? a->chunk : a->chunk == PIPE_G_NONLAYER ? x->t.nchunks : x->t.nchunks + 1;
}

/* Where each group's gradients become final: after the last B or W of a
 * chunk, the last head, the last embedding backward; and which
 * reduce-scatter is a group's last. */
int exec_mark_events(struct pipe_exec *x)
{
	int G = x->t.nchunks + 2, *last = malloc(sizeof(int) * (size_t)(x->t.nchunks + G + 2));
	x->after = calloc((size_t)x->n + 1, 1);
	x->last_rs = calloc((size_t)x->n + 1, sizeof(bool));
	if (!last || !x->after || !x->last_rs) {
		free(last);
		return -ENOMEM;
	}
	int *rs = last + x->t.nchunks, head = -1, eback = -1;
	for (int i = 0; i < x->t.nchunks + G; i++)
		last[i] = -1;
	for (int k = 0; k < x->n; k++) {
		const struct pipe_action *a = &x->a[k];
		if (a->op == PA_B || a->op == PA_W)
			last[a->chunk] = k;
		else if (a->op == PA_HEAD)
			head = k;
		else if (a->op == PA_EMBED_BACK)
			eback = k;
		else if (a->op == PA_REDUCE_SCATTER)
			rs[wgroup(x, a)] = k;
	}
	for (int c = 0; c < x->t.nchunks; c++)
		if (last[c] >= 0)
			x->after[last[c]] |= AFTER_CHUNK;
	if (head >= 0)
		x->after[head] |= AFTER_HEAD;
	if (eback >= 0)
		x->after[eback] |= AFTER_EMBED;
	for (int g = 0; g < G; g++)
		if (rs[g] >= 0)
			x->last_rs[rs[g]] = true;
	x->landing_k = x->landing_nl = -1;
	free(last);
	return 0;
}

/* Inside a layer's F, B or W in parts (model_set_parts): an F waits for
 * the gather of parts (up to the highest); a B sends the reduce-scatter
 * of parts (their gradients are written): at its first call (the
 * feed-forward block's), at later ones only in the table's last B (the
 * others' go at their RS, under the next B, no wait inside for the one
 * in flight); a W (its call, the feed-forward block's, and in a layer
 * cut as layer 0 its second, wo's, wq's and wk's) only when it is its
 * slot's last write before the slot's RS (exec_w_sends). A recomputed
 * forward in a B, or a multi-layer action, no. */
int exec_mid(void *ctx, int l, bool backward, unsigned parts)
{
	struct pipe_exec *x = ctx;
	struct win *w = model_window(x->m);
	(void)l;
	if (x->mid_k < 0 || !parts)
		return 0;
	if (!backward && (x->mid_op == PA_F || x->mid_op == PA_FC))
		return win_wait_part(w, x->mid_k, 31 - __builtin_clz(parts));
	if (backward && x->mid_op == PA_W && x->mid_last) {
		x->mid_sent = true;
		return win_scatter_parts(w, x->mid_k, parts);
	}
	if (backward && x->mid_op == PA_B && (x->mid_last || !x->mid_sent)) {
		x->mid_sent = true;
		return win_scatter_parts(w, x->mid_k, parts);
	}
	return 0;
}

bool exec_w_sends(const struct pipe_exec *x, int k)
{
	int s = wslot(x, &x->a[k]);
	for (int j = k + 1; j < x->n; j++) {
		const struct pipe_action *b = &x->a[j];
		bool writes = b->op == PA_B || b->op == PA_W || b->op == PA_GATHER || b->op == PA_RELEASE;
		if ((writes || b->op == PA_REDUCE_SCATTER) && wslot(x, b) == s)
			return b->op == PA_REDUCE_SCATTER;
	}
	return false;
}

int pipe_exec_set_parts(struct pipe_exec *x, enum pipe_parts mode, char *err, size_t errlen)
{
	int rc, l0 = 0, l1 = 1;
	bool split = false, b = false, on, fits;
	x->mid_k = x->last_b = -1;
	for (int k = 0; k < x->n; k++) {
		split |= x->a[k].op == PA_I || x->a[k].op == PA_W;
		b |= x->a[k].op == PA_B;
		x->last_b = x->a[k].op == PA_B ? k : x->last_b;
	}
	if (x->t.nchunks > 0)
		chunk_layers(x, 0, &l0, &l1);
	/* no pipeline; or a split backward (zbv, zb_h1) of one layer a
	 * chunk, whose F's wait by part and whose W's send the feed-forward
	 * block's part before the layer's RS */
	fits = (x->t.shape.stages == 1 && !split) || (split && !b && l1 - l0 == 1);
	if (mode == PIPE_PARTS_ON && !fits) {
		snprintf(err, errlen, "config: key 'fsdp_layer_parts' needs no pipeline, or a split backward "
			 "(zbv, zb_h1) of one layer a chunk: set 'ici_pipeline_parallelism' and "
			 "'dcn_pipeline_parallelism' to 1");
		return -EINVAL;
	}
	/* auto: where it applies, an FSDP window that gathers layers */
	on = mode == PIPE_PARTS_ON || (mode == PIPE_PARTS_AUTO && fits && win_moves(model_window(x->m), true));
	if ((rc = model_set_parts(x->m, on, exec_mid, x))) {
		snprintf(err, errlen, "pipeline: out of memory");
		return rc;
	}
	x->parts = on;
	exec_mark_hold(x);  /* with parts, a stage may hold more */
	/* a pipeline's split backward: the stage's last W, the step's last
	 * weight gradients it sends (stage 0's is layer 0's, cut fine
	 * already), sends them as layer 0's (model_set_fine: its attention
	 * block's by projection, all but wv's inside the W) */
	if (on && split && x->t.shape.stages > 1) {
		int last = -1;
		for (int k = 0; k < x->n; k++)
			last = x->a[k].op == PA_W ? k : last;
		if (last >= 0) {
			chunk_layers(x, x->a[last].chunk, &l0, &l1);
			model_set_fine(x->m, l0);
		}
	}
	return 0;
}

static int grads_done(struct pipe_exec *x, int l0, int l1, bool landed)
{
	return x->hooks.grads_done ? x->hooks.grads_done(x->hooks.ctx, l0, l1, landed) : 0;
}

/* The layers outside the pipeline that the owner action op runs (before
 * the pipeline: the embedding's; after it: the head's): [*l0, *l1), empty
 * when *l0 == *l1. */
static void outside_of(const struct pipe_exec *x, bool head, int *l0, int *l1)
{
	int nb, a0;
	outside(x, &nb, &a0);
	*l0 = head ? a0 : 0;
	*l1 = head ? model_dims(x->m)->L : nb;
}

/* grads_done(landed) for the window group a reduce-scatter names. */
static int group_landed(struct pipe_exec *x, const struct pipe_action *a)
{
	int l0, l1, nb, a0, rc;
	if (a->chunk == PIPE_G_NONLAYER)
		return (rc = grads_done(x, PIPE_HOOK_HEAD, 0, true)) ? rc : grads_done(x, PIPE_HOOK_EMBED, 0, true);
	if (a->chunk >= 0) {
		chunk_layers(x, a->chunk, &l0, &l1);
	} else {
		outside(x, &nb, &a0);
		l0 = nb ? 0 : a0;
		l1 = nb ? nb : model_dims(x->m)->L;
	}
	return grads_done(x, l0, l1, true);
}

/* The groups whose gradients the action at k completed (grads_done,
 * landed false), in the order they are told: at most 2. */
static int completed(const struct pipe_exec *x, int k, int *l0, int *l1)
{
	int n = 0, o0, o1;
	uint8_t ev = x->after[k];
	if (ev & AFTER_CHUNK) {
		chunk_layers(x, x->a[k].chunk, &l0[n], &l1[n]);
		n++;
	}
	for (int head = 1; head >= 0; head--) {
		if (!(ev & (head ? AFTER_HEAD : AFTER_EMBED)))
			continue;
		l0[n] = head ? PIPE_HOOK_HEAD : PIPE_HOOK_EMBED;
		l1[n++] = 0;
		outside_of(x, head, &o0, &o1);
		if (o0 < o1) {
			l0[n] = o0;
			l1[n++] = o1;
		}
	}
	return n;
}

/* The groups whose weights action a reads (its compute, or a gather of
 * them): at most 2. */
static int reads(const struct pipe_exec *x, const struct pipe_action *a, int *l0, int *l1)
{
	int n = 0, nb, a0, L = model_dims(x->m)->L;
	outside(x, &nb, &a0);
	switch (a->op) {
	case PA_EMBED:
	case PA_EMBED_BACK:
	case PA_HEAD: {
		bool head = a->op == PA_HEAD;
		l0[n] = head ? PIPE_HOOK_HEAD : PIPE_HOOK_EMBED;
		l1[n++] = 0;
		if (head ? a0 < L : nb > 0) {
			l0[n] = head ? a0 : 0;
			l1[n++] = head ? L : nb;
		}
		return n;
	}
	case PA_F:
	case PA_FC:
	case PA_B:
	case PA_I:
	case PA_W:
		chunk_layers(x, a->chunk, &l0[0], &l1[0]);
		return 1;
	case PA_GATHER:
		/* a gather that moves nothing reads nothing */
		if (!win_moves(model_window(x->m), a->chunk != PIPE_G_NONLAYER))
			return 0;
		if (a->chunk == PIPE_G_NONLAYER) {
			l0[0] = PIPE_HOOK_HEAD;
			l0[1] = PIPE_HOOK_EMBED;
			l1[0] = l1[1] = 0;
			return 2;
		}
		if (a->chunk == PIPE_G_OUTSIDE) {
			l0[0] = nb ? 0 : a0;
			l1[0] = nb ? nb : L;
		} else {
			chunk_layers(x, a->chunk, &l0[0], &l1[0]);
		}
		return 1;
	default:
		return 0;
	}
}

int exec_before(struct pipe_exec *x, const struct pipe_action *a)
{
	int l0[2], l1[2], n = x->hooks.weights_needed ? reads(x, a, l0, l1) : 0, rc;
	for (int i = 0; i < n; i++)
		if ((rc = x->hooks.weights_needed(x->hooks.ctx, l0[i], l1[i], a->op == PA_GATHER)))
			return rc;
	return 0;
}

int exec_after(struct pipe_exec *x, int k)
{
	int l0[4], l1[4], n = x->after[k] && x->hooks.grads_done ? completed(x, k, l0, l1) : 0, rc;
	for (int i = 0; i < n; i++)
		if ((rc = grads_done(x, l0[i], l1[i], false)))
			return rc;
	return 0;
}

/* The group of the last reduce-scatter of its group, landed. */
int exec_landed(struct pipe_exec *x)
{
	int k = x->landing_k, j = x->landing_nl, rc;
	x->landing_k = x->landing_nl = -1;
	if (k >= 0 && (rc = group_landed(x, &x->a[k])))
		return rc;
	return j >= 0 ? group_landed(x, &x->a[j]) : 0;
}

void pipe_exec_set_hooks(struct pipe_exec *x, const struct pipe_hooks *h)
{
	x->hooks = h ? *h : (struct pipe_hooks){ 0 };
}

/* The table's leading gathers: the actions before its first other. */
static int leading(const struct pipe_exec *x)
{
	int k = 0;
	while (k < x->n && x->a[k].op == PA_GATHER)
		k++;
	return k;
}

/* In a pipeline of two stages or more, of the leading gathers, hold
 * those at the end of them that gather a chunk the table's first chunk
 * action does not read: each stage's first gathers (the ones its first
 * action waits for) then do not share the CPU with gathers it needs
 * only later, nor with another stage's such gathers (zbv with
 * pipeline_fsdp_ag_per_repeat: stage 1's second chunk, stage 0's last;
 * four devices' gathers on two vCPUs at the step's start); they start
 * when the first chunk action starts, on the same communication thread
 * after that action's gathers. A stage whose first chunk action comes
 * after a receive (it waits for an earlier stage's output: a slot or
 * more), with layers in parts (exec's parts: its first F waits for the
 * attention block's part alone, the feed-forward block's under the F's
 * first part), holds its first chunk's gather too: zbv's stage 1 then
 * gathers once stage 0's first output has come, not beside stage 0's
 * first gathers, which its first F waits for (fsdp18). Without a
 * pipeline (one stage, a chunk a layer) the update still starts layers
 * 0 and 1. (MESHRUN_PP_HOLD=0: none held; =1: not the first chunk's,
 * as before fsdp18; to measure against.) */
void exec_mark_hold(struct pipe_exec *x)
{
	const char *e = getenv("MESHRUN_PP_HOLD");
	int n = leading(x), first = n, j = n;
	bool recv = false;
	while (first < x->n && !(compute_op(x->a[first].op) && x->a[first].chunk >= 0))
		recv |= x->a[first++].op == PA_RECV;
	x->lead = x->lead_end = n;
	x->hold_at = -1;
	if (first == x->n || x->t.shape.stages < 2 || (e && *e && !atoi(e)))
		return;
	bool all = recv && x->parts && !(e && *e && atoi(e) == 1);
	while (j > 0 && x->a[j - 1].chunk >= 0 && (all || x->a[j - 1].chunk != x->a[first].chunk))
		j--;
	if (j < n) {
		x->lead = j;
		x->hold_at = first;
	}
}

int exec_start_held(struct pipe_exec *x)
{
	int rc = 0;
	x->held = false;
	for (int k = x->lead; k < x->lead_end && !rc; k++)
		if (!(rc = exec_before(x, &x->a[k])))
			rc = exec_weights(x, &x->a[k]);
	return rc;
}

int pipe_exec_first_reads(const struct pipe_exec *x, int *l0, int *l1, int *by, int max)
{
	int n = 0, a[2], b[2];
	for (int k = 0; k < x->lead; k++)
		for (int i = 0, c = reads(x, &x->a[k], a, b); i < c; i++, n++)
			if (n < max) {
				l0[n] = a[i];
				l1[n] = b[i];
				if (by)
					by[n] = k;
			}
	return n;
}

int pipe_exec_prefetch(struct pipe_exec *x, const struct model_comm *comm, int upto)
{
	struct win *w = model_window(x->m);
	int n = x->lead < upto ? x->lead : upto, rc = 0;
	if (x->npre >= n || !w || (!win_moves(w, false) && !win_moves(w, true)))
		return 0;
	x->pre_rc = x->npre ? x->pre_rc : 0;
	win_begin(w, comm, &x->pre_rc);
	/* each waits for what it reads as in the step (ZeRO-1's gathers) */
	for (int k = x->npre; k < n && !rc; k++)
		if (!(rc = exec_before(x, &x->a[k])))
			rc = exec_weights(x, &x->a[k]);
	x->npre = n;
	return rc;
}

int pipe_exec_prefetch_drop(struct pipe_exec *x)
{
	struct win *w = model_window(x->m);
	if (!x->npre)
		return 0;
	x->npre = 0;
	return win_end(w);
}

int pipe_exec_grad_order(const struct pipe_exec *x, int *l0, int *l1, int max)
{
	int n = 0, a[4], b[4];
	for (int k = 0; k < x->n; k++)
		for (int i = 0, c = completed(x, k, a, b); i < c; i++, n++)
			if (n < max) {
				l0[n] = a[i];
				l1[n] = b[i];
			}
	return n;
}

int exec_weights(struct pipe_exec *x, const struct pipe_action *a)
{
	struct win *w = model_window(x->m);
	int k = wslot(x, a), l0 = WIN_NONLAYER, l1 = 0, nb, a0, rc;
	/* a W run ahead left its slot's gather (of no weights) unwaited */
	if (x->filling && a->chunk >= 0 && a->op != PA_GATHER && (rc = win_wait(w, k)))
		return rc;
	switch (a->op) {
	case PA_GATHER:
		x->gzero[k] = true;
		if (a->chunk == PIPE_G_OUTSIDE) {
			outside(x, &nb, &a0);
			l0 = nb ? 0 : a0;
			l1 = nb ? nb : model_dims(x->m)->L;
		} else if (a->chunk >= 0) {
			chunk_layers(x, a->chunk, &l0, &l1);
		}
		return win_gather_start(w, k, l0, l1);
	case PA_RELEASE:
		win_release(w, k);
		return 0;
	default: {
		/* the gradients are packed and sent: the next write starts from 0 */
		x->gzero[k] = true;
		/* the non-layer group's goes out beside a layer group's in
		 * flight (both land at the next finish); else the one in
		 * flight lands first: its group may be final now */
		bool beside = win_scatter_beside(w, k);
		/* the slot's rest goes out beside its parts sent ahead, all
		 * that is in flight (whatever was before them has landed) */
		if (win_scatter_follows(w, k) ? (rc = exec_landed(x)) :
		    !beside && ((rc = win_scatter_finish(w)) || (rc = exec_landed(x))))
			return rc;
		if ((rc = win_scatter_start(w, k)))
			return rc;
		if (x->last_rs[a - x->a])
			*(beside ? &x->landing_nl : &x->landing_k) = (int)(a - x->a);
		return 0;
	}
	}
}

/* Waits for window slot k; when grads, zeroes its gradients first if a
 * gather or reduce-scatter left them to be (sleep mode: as writes do). */
int exec_use_slot(struct pipe_exec *x, int k, bool grads)
{
	struct win *w = model_window(x->m);
	int rc = win_wait(w, k);
	if (!rc && grads && x->gzero[k]) {
		win_zero_grads(w, k);
		if (x->sleep)
			win_grads_written(w, k);
		x->gzero[k] = false;
	}
	return rc;
}
