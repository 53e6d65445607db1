/* Pairwise exchanges: all-to-all with per-peer sizes (MoE dispatch) and the
 * permute (pipeline shift).
 *
 * Both run two independent streams of segments, sends and receives, each
 * ordered by key (phase, segment) and bounded to a window of outstanding
 * requests (COLL_SEND_WINDOW sends, and no more than COLL_PAIR_SEND_BYTES of
 * them past the first; receives, which only say where data may land,
 * COLL_RECV_AHEAD). In phase p of all-to-all rank r sends to r+p and
 * receives from r-p, so a send and the receive that matches it have the
 * same key on both sides; each device retires what has finished and, when
 * nothing has, blocks on its smallest outstanding key, which depends only
 * on smaller keys elsewhere, so the exchange cannot deadlock. Empty
 * blocks send nothing (both sides know the size). Chunk index = segment
 * index within the pair's block. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "net/coll_int.h"

#define MAXW (COLL_RECV_AHEAD > COLL_SEND_WINDOW ? COLL_RECV_AHEAD : COLL_SEND_WINDOW)

struct stream {
	bool send;
	int window;               /* items outstanding at most */
	size_t max_bytes;         /* and bytes, past the first item (0: no bound) */
	size_t bytes;             /* bytes outstanding */
	int nphase;
	/* position of the next item to post */
	int p;
	size_t s;
	long posted, done;
	struct xreq *req[MAXW];
	uint64_t key[MAXW];
	size_t len[MAXW];
};

struct pairwise {
	struct coll_run *R;
	/* phase p: peer device, buffer and length, per direction */
	void (*block)(const struct pairwise *pw, bool send, int p, int *peer, uint8_t **buf,
		      size_t *len);
	size_t seg;
	/* all-to-all: the own block, copied a segment per pass of the
	 * schedule while the exchange moves, the rest at the end */
	struct coll_copy own;
};

static inline int mod(int a, int n)
{
	a %= n;
	return a < 0 ? a + n : a;
}

static size_t seg_for(const struct pairwise *pw, size_t len)
{
	size_t need = (len + 65534) / 65535;
	need = (need + 3) & ~(size_t)3;
	return need > pw->seg ? need : pw->seg;
}

static _Atomic size_t send_peak;

size_t coll_pair_send_peak(void)
{
	return atomic_load_explicit(&send_peak, memory_order_relaxed);
}

/* The new high of st's bytes outstanding, if it is one (sends only). */
static void note_peak(const struct stream *st)
{
	size_t p = atomic_load_explicit(&send_peak, memory_order_relaxed);
	while (st->send && st->bytes > p &&
	       !atomic_compare_exchange_weak_explicit(&send_peak, &p, st->bytes,
						      memory_order_relaxed, memory_order_relaxed))
		;
}

/* Posts the next item of st; returns 0 and sets *posted if one was posted,
 * *posted = false if st has nothing left. */
static int post_next(struct pairwise *pw, struct stream *st, bool *posted)
{
	*posted = false;
	while (st->p < st->nphase) {
		int peer;
		uint8_t *buf;
		size_t len;
		pw->block(pw, st->send, st->p, &peer, &buf, &len);
		size_t seg = seg_for(pw, len);
		size_t off = st->s * seg;
		if (off >= len) {
			st->p++;
			st->s = 0;
			continue;
		}
		size_t n = len - off < seg ? len - off : seg;
		int slot = (int)(st->posted % st->window);
		int rc = st->send ?
			coll_post_send(pw->R, peer, (uint32_t)st->s, off, buf + off, n, &st->req[slot]) :
			coll_post_recv(pw->R, peer, (uint32_t)st->s, off, buf + off, n, &st->req[slot]);
		if (rc)
			return rc;
		st->key[slot] = ((uint64_t)st->p << 32) | st->s;
		st->len[slot] = n;
		st->bytes += n;
		note_peak(st);
		st->s++;
		st->posted++;
		*posted = true;
		return 0;
	}
	return 0;
}

/* Whether st may post another item: fewer than its window outstanding,
 * and under its byte bound unless none is. */
static bool has_room(const struct stream *st)
{
	if (st->posted >= st->done + st->window)
		return false;
	return st->posted == st->done || !st->max_bytes || st->bytes < st->max_bytes;
}

/* The retired item's bytes leave st's count. */
static void retire(struct stream *st)
{
	st->bytes -= st->len[st->done % st->window];
	st->done++;
}

/* COLL_PAIR_SEND_BYTES, or MESHRUN_PAIR_SEND_BYTES from the environment
 * (0: no byte bound, as before a2a18), for A/B */
static size_t pair_send_bytes(void)
{
	static _Atomic long v = -2;
	long r = atomic_load_explicit(&v, memory_order_relaxed);
	if (r == -2) {
		const char *e = getenv("MESHRUN_PAIR_SEND_BYTES");
		char *end = NULL;
		long x = e && *e ? strtol(e, &end, 10) : -1;
		r = x >= 0 && end && !*end ? x : -1;
		atomic_store_explicit(&v, r, memory_order_relaxed);
	}
	return r >= 0 ? (size_t)r : COLL_PAIR_SEND_BYTES;
}

static int pairwise_run(struct pairwise *pw, int nphase)
{
	struct stream st[2] = {
		{ .send = false, .window = COLL_RECV_AHEAD, .nphase = nphase },
		{ .send = true, .window = COLL_SEND_WINDOW, .max_bytes = pair_send_bytes(),
		  .nphase = nphase },
	};
	int rc = 0;
	for (;;) {
		for (int i = 0; i < 2; i++) {
			bool more = true;
			while (more && has_room(&st[i]))
				if ((rc = post_next(pw, &st[i], &more)))
					goto out_abandon;
		}
		coll_copy_step(&pw->own, pw->seg);
		/* retire whatever finished meanwhile, oldest first */
		bool moved = false;
		for (int i = 0; i < 2; i++) {
			struct stream *s = &st[i];
			while (s->done < s->posted &&
			       !(rc = coll_test_req(pw->R, &s->req[s->done % s->window]))) {
				retire(s);
				moved = true;
			}
			if (rc && rc != -EAGAIN)
				goto out_abandon;
			rc = 0;
		}
		if (moved)
			continue;
		/* nothing finished: block on the smallest outstanding key */
		int pick = -1;
		for (int i = 0; i < 2; i++) {
			if (st[i].posted == st[i].done)
				continue;
			if (pick < 0 || st[i].key[st[i].done % st[i].window] <
					st[pick].key[st[pick].done % st[pick].window])
				pick = i;
		}
		if (pick < 0) {
			coll_copy_step(&pw->own, 0);
			return 0;
		}
		struct stream *s = &st[pick];
		if ((rc = coll_wait_req(pw->R, &s->req[s->done % s->window])))
			goto out_abandon;
		retire(s);
	}

out_abandon:
	coll_abandon(pw->R, st[0].req, MAXW);
	coll_abandon(pw->R, st[1].req, MAXW);
	return rc;
}

/* ---- all-to-all ---- */

struct a2a {
	struct pairwise pw;
	size_t *soff, *roff;
};

static void a2a_block(const struct pairwise *pw, bool send, int p, int *peer, uint8_t **buf,
		      size_t *len)
{
	const struct a2a *x = (const struct a2a *)pw;
	const struct coll_args *a = pw->R->a;
	/* phase index p = 0..n-2 is distance p+1 */
	int q = send ? mod(a->rank + p + 1, a->n) : mod(a->rank - p - 1, a->n);
	*peer = a->devs[q];
	if (send) {
		*buf = (uint8_t *)a->in + x->soff[q];
		*len = a->send_bytes[q];
	} else {
		*buf = (uint8_t *)a->out + x->roff[q];
		*len = a->recv_bytes[q];
	}
}

int coll_pair_all_to_all(struct coll_run *R)
{
	const struct coll_args *a = R->a;
	int n = a->n;
	size_t small[2 * COLL_DIRECT_MAX_N];
	size_t *offs = n <= COLL_DIRECT_MAX_N ? small : malloc(sizeof(size_t) * 2 * (size_t)n);
	if (!offs)
		return coll_fail(R, -ENOMEM, "out of memory");
	struct a2a x = {
		.pw = { .R = R, .block = a2a_block, .seg = a->seg },
		.soff = offs, .roff = offs + n,
	};
	size_t so = 0, ro = 0;
	for (int i = 0; i < n; i++) {
		x.soff[i] = so;
		x.roff[i] = ro;
		so += a->send_bytes[i];
		ro += a->recv_bytes[i];
	}
	size_t own = a->send_bytes[a->rank];
	uint8_t *dst = (uint8_t *)a->out + x.roff[a->rank];
	const uint8_t *src = (const uint8_t *)a->in + x.soff[a->rank];
	if (own && (dst + own <= src || src + own <= dst))
		x.pw.own = (struct coll_copy){ dst, src, own };
	else if (own && dst != src)
		memmove(dst, src, own);
	int rc = pairwise_run(&x.pw, n - 1);
	if (offs != small)
		free(offs);
	return rc;
}

/* ---- permute ---- */

static void permute_block(const struct pairwise *pw, bool send, int p, int *peer, uint8_t **buf,
			  size_t *len)
{
	const struct coll_args *a = pw->R->a;
	(void)p;
	int sh = mod(a->shift, a->n);
	*peer = a->devs[send ? mod(a->rank + sh, a->n) : mod(a->rank - sh, a->n)];
	*buf = send ? (uint8_t *)a->in : (uint8_t *)a->out;
	*len = a->bytes;
}

int coll_pair_permute(struct coll_run *R)
{
	const struct coll_args *a = R->a;
	if (a->bytes == 0)
		return 0;
	if (mod(a->shift, a->n) == 0) {
		if (a->out != a->in)
			memmove(a->out, a->in, a->bytes);
		return 0;
	}
	struct pairwise pw = { .R = R, .block = permute_block, .seg = a->seg };
	return pairwise_run(&pw, 1);
}
