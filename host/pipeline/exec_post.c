/* Receives posted ahead of their place (host/pipeline/exec_int.h): into
 * their own buffer once no action before them touches it, else into a
 * landing buffer that takes the buffer's place at the RECV. A message
 * over the rendezvous size waits for its receive to be posted, so a
 * receive posted only when the device reaches it (or, the table's
 * buffers being as few as its lifetimes allow, only once the buffer's
 * last reader ran) costs the sender a wake-up of its stream thread to
 * read the RecvReady and write the message, even when it sent long
 * before. Also the W a receive's wait may run ahead (fill_wait in
 * exec.c). */
#include <string.h>

#include "host/model/window.h"
#include "host/pipeline/exec_int.h"

/* ---- filling receive waits ---- */

/* The W the device may run ahead of the receive at k: the first W not
 * run yet (a chunk's W's keep their order), if its I has run and it
 * completes no group (its grads_done hook stays in place); or, when
 * that first W's I has not run, the first W not run yet of another
 * chunk, on the same terms (zbv's cool-down runs the second chunk's
 * last W before the first chunk's owed ones); else -1. */
int exec_owed_w(const struct pipe_exec *x, int k)
{
	int passed = -1;  /* the chunk of a W passed over (its I has not run) */
	for (int j = k + 1; j < x->n; j++) {
		const struct pipe_action *a = &x->a[j];
		if (a->op != PA_W || x->ran[j] || (passed >= 0 && a->chunk == passed))
			continue;
		if (x->w_of_i[j] < k)
			return !x->after[j] ? j : -1;
		if (passed >= 0)
			return -1;
		passed = a->chunk;
	}
	return -1;
}

/* ---- posting receives ahead ---- */

/* Whether a SEND to stage p is in the actions [from, to). */
static bool sends_to(const struct pipe_exec *x, int from, int to, int p)
{
	for (int i = from; i < to; i++)
		if (x->a[i].op == PA_SEND && x->a[i].peer == p)
			return true;
	return false;
}

/* Before the action at k: posts the receives after it (at j > k, up to
 * x->prepost of them outstanding: posted and not yet reached) whose
 * buffer nothing from k up to them names and no send from it is in
 * flight, so each message can land while the device computes and the
 * sender, finding its receive posted, writes it at once from its own
 * thread (a rendezvous send whose receive is not posted yet waits for
 * the RecvReady, which a thread of the sender's must wake to read). The
 * receive at j then takes the posted one; the one at k posts itself. */
int exec_prepost(struct pipe_exec *x, int k)
{
	int out = 0, rc, g = k, k0 = k;
	/* the receives before the next compute are taken in this gap: they
	 * do not count against the bound (so the gap's posts can all come
	 * before its sends) */
	while (g < x->n && !compute_op(x->a[g].op))
		g++;
	while (k0 > x->npre && !compute_op(x->a[k0 - 1].op))
		k0--;
	bool sends_left = false;
	for (int i = k; i < g; i++)
		sends_left |= x->a[i].op == PA_SEND;
	for (int j = g + 1; j < x->n; j++)
		out += x->posted[j];
	memset(x->named, 0, sizeof(bool) * (size_t)x->nbuf);
	for (int j = k; j < x->n && out < x->prepost; j++) {
		const struct pipe_action *a = &x->a[j];
		int b = a->buf[0];
		int l = -1;
		bool free_now = a->op == PA_RECV && !x->named[b] && x->sent[b].dev < 0;
		for (int i = 0; a->op == PA_RECV && !free_now && l < 0 && i < x->nland; i++)
			if (!x->land_busy[i])
				l = i;
		/* a receive from a stage this gap sends to is posted before
		 * that send, and then only (a send above p2p_handoff_bytes
		 * leaves its sealing to the link's stream thread: a post on
		 * its link after it sealed it on this thread in the
		 * RecvReady's flush, or waited for the link while the stream
		 * thread sealed it, 0.2-1.2 ms before the next compute); one
		 * from another stage after the gap's sends, which it would
		 * only delay; later receives wait for it (posts keep table
		 * order) */
		if (a->op == PA_RECV && j > k && !x->posted[j] &&
		    (sends_to(x, k0, k, a->peer) || (sends_left && !sends_to(x, k, g, a->peer))))
			break;
		if (a->op == PA_RECV && j > k && !x->posted[j] && (free_now || l >= 0)) {
			uint32_t kind, idx;
			pipe_val_msg(&x->t, &a->val, &kind, &idx);
			/* its RecvReady rides on the gap's send to its stage
			 * when there is one (no write of its own) */
			rc = x->io->probe(x->io->ctx, x->stage_dev[a->peer], kind, idx,
					  free_now ? x->buf[b] : x->land[l], sizeof(float) * x->nf,
					  x->hold && sends_to(x, k, g, a->peer) ? PIPE_RR_RIDE :
					  x->later ? PIPE_RR_LATER : PIPE_RR_NOW);
			if (rc < 0)
				return rc;
			if (!free_now) {
				x->land_of[j] = (int8_t)l;
				x->land_busy[l] = true;
				x->landed_early++;
			}
			x->posted[j] = true;
			x->preposts++;
			out++;
			if (out > x->prepost_depth)
				x->prepost_depth = out;
		}
		for (int i = 0; i < 3; i++)
			if (a->buf[i] >= 0)
				x->named[a->buf[i]] = true;
	}
	return 0;
}

/* Whether this step fills receive waits: asked for, a transport that
 * probes, and a window that moves no layer weights (so a W needs none
 * of the window's collectives). */
bool exec_can_fill(const struct pipe_exec *x)
{
	return x->fill && x->io && x->io->probe && !win_moves(model_window(x->m), true) &&
	       pipe_split_backward(x->t.shape.sched);
}
