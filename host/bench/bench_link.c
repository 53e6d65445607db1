/* `meshrun bench link`, the job: each device streams messages both ways
 * through xport and the net thread's TLS links, keeping a window of messages in flight so the figure
 * is the link's, not the round trip's. */
#include "host/bench/bench_link.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/agent/agent.h"
#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/util/clock.h"
#include "proto/meshrun.pb-c.h"

#define LINK_GROUP 0xfffd

/* ---- the job ---- */

static void fill(uint8_t *b, size_t n, int dev)
{
	uint32_t x = 0x9e3779b9u * (uint32_t)(dev + 1);
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		b[i] = (uint8_t)x;
	}
}

struct flight {
	struct xreq *s, *r;
};

static int wait_pair(struct device_ctx *d, struct flight *f, char *why, size_t len)
{
	uint64_t deadline = xport_now_ns() + (uint64_t)(d->cfg->collective_timeout_s * 1e9);
	int e1 = f->s ? xport_wait(f->s, deadline, why, len) : 0;
	int e2 = 0;
	if (f->r)
		e2 = e1 ? xport_wait(f->r, 1, why + strlen(why), 1)
			: xport_wait(f->r, deadline, why, len);
	f->s = f->r = NULL;
	return e1 ? e1 : e2;
}

/* Host 1 tells host 0 what its process spent over its own timed span and
 * how long that span was: { cpu, wall } each. */
static int swap_cpu(struct device_ctx *d, int peer, const struct xmeta *meta, double mine[2],
		    double theirs[2])
{
	struct xreq *r = NULL;
	char why[512] = "";
	size_t len = 2 * sizeof(double);
	int e = d->host_id == 0 ? xport_irecv(d->xport, peer, d->device_id, meta, theirs, len, &r)
				: xport_isend(d->xport, d->device_id, peer, meta, mine, len, &r);
	if (!e)
		e = xport_wait(r, xport_now_ns() + (uint64_t)(d->cfg->collective_timeout_s * 1e9),
			       why, sizeof(why));
	else
		xport_failed(d->xport, why, sizeof(why));
	if (e) {
		snprintf(d->err, sizeof(d->err), "bench link: %s", why[0] ? why : strerror(-e));
		return -EHOSTDOWN;
	}
	return 0;
}

/* --pingpong: host 0 sends a message and host 1 sends it back, one at a
 * time; each side posts its receive before it sends, so every message
 * finds its receive posted (as a pipeline's preposted receives do) and
 * half a round is one message's time from the send call to the woken
 * receiver. Prints `size oneway_us GBps` and the CPU per message; in
 * *send_us, host 0's time in the send call (its device thread's share of
 * the one way: what a pipeline stage pays before its next compute). */
static int pingpong(struct device_ctx *d, int peer, size_t s, long iters, uint64_t *seq,
		    int si, double *cpu_us, double *busy, double *send_us)
{
	uint8_t *sb = malloc(s), *rb = malloc(s), *want = malloc(s);
	char why[512] = "";
	int rc = 0;
	if (!sb || !rb || !want) {
		snprintf(d->err, sizeof(d->err), "bench link: out of memory for %zu bytes", s);
		free(sb);
		free(rb);
		free(want);
		return -ENOMEM;
	}
	fill(sb, s, d->device_id);
	fill(want, s, peer);
	uint64_t t0 = 0, in_send = 0;
	double cpu0 = 0;
	long warm = 5;
	struct xreq *r = NULL, *snd = NULL;
	struct xmeta meta = { .op = MESHRUN__COLL_OP__COLL_P2P, .group = LINK_GROUP,
			      .step = (uint64_t)si };
	/* host 1's first receive, posted ahead */
	meta.seq = *seq;
	if (d->host_id == 1 && xport_irecv(d->xport, peer, d->device_id, &meta, rb, s, &r))
		rc = -EHOSTDOWN;
	for (long i = 0; i < iters + warm && !rc; i++) {
		uint64_t deadline = xport_now_ns() + (uint64_t)(d->cfg->collective_timeout_s * 1e9);
		struct xmeta ping = meta, pong = meta;
		ping.seq = *seq + 2 * (uint64_t)i;
		pong.seq = ping.seq + 1;
		if (i == warm) {
			t0 = xport_now_ns();
			cpu0 = util_cpu_us();
			in_send = 0;
		}
		int e = 0;
		if (d->host_id == 0) {
			e = xport_irecv(d->xport, peer, d->device_id, &pong, rb, s, &r);
			uint64_t c0 = xport_now_ns();
			if (!e)
				e = xport_isend(d->xport, d->device_id, peer, &ping, sb, s, &snd);
			in_send += xport_now_ns() - c0;
			if (!e)
				e = xport_wait(r, deadline, why, sizeof(why));
			r = NULL;
			if (!e && i + 1 == iters + warm && memcmp(rb, want, s))
				e = -EIO;
		} else {
			e = xport_wait(r, deadline, why, sizeof(why));
			r = NULL;
			if (!e && i + 1 == iters + warm && memcmp(rb, want, s))
				e = -EIO;
			struct xmeta next = ping;
			next.seq = ping.seq + 2;
			if (!e && i + 1 < iters + warm)
				e = xport_irecv(d->xport, peer, d->device_id, &next, rb, s, &r);
			if (!e)
				e = xport_isend(d->xport, d->device_id, peer, &pong, sb, s, &snd);
		}
		if (!e && snd)
			e = xport_wait(snd, deadline, why, sizeof(why));
		snd = NULL;
		if (e == -EIO) {
			snprintf(d->err, sizeof(d->err),
				 "bench link: %zu-byte message from device %d arrived corrupted", s, peer);
			rc = e;
		} else if (e) {
			xport_failed(d->xport, why, sizeof(why));
			snprintf(d->err, sizeof(d->err), "bench link: %s", why[0] ? why : strerror(-e));
			rc = -EHOSTDOWN;
		}
	}
	if (r)
		xport_wait(r, 1, why, sizeof(why));
	*seq += 2 * (uint64_t)(iters + warm);
	double us = (double)(xport_now_ns() - t0) / 1e3 / (double)iters / 2;
	*cpu_us = (util_cpu_us() - cpu0) / (double)iters / 2;
	*busy = us > 0 ? *cpu_us / us : 0;
	*send_us = (double)in_send / 1e3 / (double)iters;
	if (!rc && d->host_id == 0 && d->local_index == 0) {
		if (si == 0)
			printf("size oneway_us GBps\n");
		printf("%zu %.1f %.3f\n", s, us, (double)s / us / 1e3);
		fflush(stdout);
	}
	free(sb);
	free(rb);
	free(want);
	return rc;
}

int bench_link_job(struct device_ctx *d)
{
	const struct link_opts *o = d->job_arg;
	const struct mesh *m = d->mesh;
	int peer = mesh_device_of(m, 1 - d->host_id, d->local_index);
	uint64_t seq = 0;
	char why[512];
	int rc = 0;

	double cpu_us[BENCH_MAX_LIST] = { 0 }, busy[BENCH_MAX_LIST] = { 0 };
	double send_us[BENCH_MAX_LIST] = { 0 };
	if (o->pingpong) {
		for (int si = 0; si < o->nsizes && !rc; si++) {
			long iters = o->iters ? o->iters : (long)((64ull << 20) / o->sizes[si]);
			iters = iters < 10 ? 10 : iters > 100000 ? 100000 : iters;
			rc = pingpong(d, peer, o->sizes[si], iters, &seq, si, &cpu_us[si], &busy[si],
				      &send_us[si]);
		}
		if (!rc && d->host_id == 0 && d->local_index == 0)
			for (int si = 0; si < o->nsizes; si++)
				printf("# cpu %zu: %.1f us per message, host 0's agent (user+sys); "
				       "%.2f cores busy\n", o->sizes[si], cpu_us[si], busy[si]);
		if (!rc && d->host_id == 0 && d->local_index == 0)
			for (int si = 0; si < o->nsizes; si++)
				printf("# send %zu: %.1f us in the send call (host 0's device thread)\n",
				       o->sizes[si], send_us[si]);
		fflush(stdout);
		return rc;
	}
	for (int si = 0; si < o->nsizes && !rc; si++) {
		size_t s = o->sizes[si];
		int win = (int)((64u << 20) / s);
		win = win < 2 ? 2 : win > 16 ? 16 : win;
		long iters = o->iters ? o->iters : (long)((512ull << 20) / s);
		if (iters < 10)
			iters = 10;
		if (iters > 100000)
			iters = 100000;
		uint8_t *sb = malloc(s), *want = malloc(s), *rb = malloc(s * (size_t)win);
		struct flight *fl = calloc((size_t)win, sizeof(*fl));
		if (!sb || !want || !rb || !fl) {
			snprintf(d->err, sizeof(d->err), "bench link: out of memory for %zu bytes", s);
			rc = -ENOMEM;
			goto next;
		}
		fill(sb, s, d->device_id);
		fill(want, s, peer);
		uint64_t t0 = 0;
		double cpu0 = 0;
		long total = iters + win;   /* the first win are the warm-up */
		for (long i = 0; i < total + win && !rc; i++) {
			struct flight *f = &fl[i % win];
			if (i >= win) {
				why[0] = 0;
				int e = wait_pair(d, f, why, sizeof(why));
				if (e) {
					snprintf(d->err, sizeof(d->err), "bench link: %s", why);
					rc = -EHOSTDOWN;
					break;
				}
				if (i - win == total - 1 && (!o->oneway || d->host_id == 1) &&
				    memcmp(rb + (size_t)(i % win) * s, want, s)) {
					snprintf(d->err, sizeof(d->err),
						 "bench link: %zu-byte message from device %d arrived corrupted",
						 s, peer);
					rc = -EIO;
					break;
				}
			}
			if (i == win) {
				t0 = xport_now_ns();
				cpu0 = util_cpu_us();
			}
			if (i >= total)
				continue;
			struct xmeta meta = { .op = MESHRUN__COLL_OP__COLL_P2P, .group = LINK_GROUP,
					      .seq = seq++, .step = (uint64_t)si };
			uint8_t *dst = rb + (size_t)(i % win) * s;
			bool rx = !o->oneway || d->host_id == 1, tx = !o->oneway || d->host_id == 0;
			int e = rx ? xport_irecv(d->xport, peer, d->device_id, &meta, dst, s, &f->r) : 0;
			if (!e && tx) {
				e = xport_isend(d->xport, d->device_id, peer, &meta, sb, s, &f->s);
				if (e && f->r)
					xport_wait(f->r, 1, why, sizeof(why));
			}
			if (e) {
				xport_failed(d->xport, why, sizeof(why));
				snprintf(d->err, sizeof(d->err), "bench link: %s", why[0] ? why : strerror(-e));
				rc = -EHOSTDOWN;
				break;
			}
		}
		double us = (double)(xport_now_ns() - t0) / 1e3 / (double)(total - 1);
		/* per message, over this host's own span; host 1 sends its pair */
		double mine[2] = { (util_cpu_us() - cpu0) / (double)(total - 1), us }, theirs[2] = { 0 };
		if (!rc && d->local_index == 0 &&
		    (rc = swap_cpu(d, peer, &(struct xmeta){ .op = MESHRUN__COLL_OP__COLL_P2P,
				   .group = LINK_GROUP, .seq = seq++, .step = (uint64_t)si },
				   mine, theirs)))
			goto next;
		if (!rc && d->host_id == 0) {
			/* timed from the completion of message 0 (the window full)
			 * to that of the last: total - 1 messages per direction */
			if (si == 0 && d->local_index == 0)
				printf("size time_us GBps\n");
			if (d->local_index == 0) {
				printf("%zu %.1f %.3f\n", s, us, (double)s / us / 1e3);
				cpu_us[si] = mine[0] + theirs[0];
				/* each agent's CPU against its own span: the spans
				 * of the two hosts are offset by a message or so */
				busy[si] = mine[0] / mine[1] + (theirs[1] > 0 ? theirs[0] / theirs[1] : 0);
			}
			fflush(stdout);
		}
next:
		free(sb);
		free(want);
		free(rb);
		free(fl);
	}
	if (!rc && d->host_id == 0 && d->local_index == 0) {
		/* both agents' CPU per message, each against its own span: near the
		 * core count means the link is CPU-bound on this machine */
		for (int si = 0; si < o->nsizes; si++)
			printf("# cpu %zu: %.1f us per message%s, both agents (user+sys); "
			       "%.2f cores busy\n", o->sizes[si], cpu_us[si],
			       o->oneway ? "" : " each way", busy[si]);
		fflush(stdout);
	}
	return rc;
}
